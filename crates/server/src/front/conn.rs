//! Connections: a cap on how many are open at once, and a time limit on idle ones.
//!
//! Every connection costs a file descriptor. Without a cap, enough idle connections (about
//! 20,000 in a test) exhausted the server's descriptors; accepting then failed at once, over
//! and over, spinning a core, and new clients and `/healthz` timed out. So: past
//! `max_connections` a new connection is closed as soon as it is accepted; a connection with
//! no traffic for `idle_timeout` is closed (a live client exchanges every tick); a failed
//! accept waits a little before the next; and each of these is logged, at most every 10 s.
//!
//! At the cap, idle connections make room: a new connection closes those idle for
//! [`PRESSURE_IDLE`] or more (the longest idle first) and waits a moment for one's place, so a
//! crowd of idle connections never locks live clients (the CLI among them) out for a whole
//! idle timeout. The HTTP port also keeps [`HEALTH_RESERVE`] places past the cap for
//! `/healthz` and `/readyz` alone, so a full port still answers its probes.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tokio_stream::Stream;
use tonic::transport::server::Connected;

/// How many connections, and how long an idle one is kept.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Connections open at once; keep it below the process's open-file limit.
    pub max_connections: usize,
    /// A connection with no traffic for this long is closed.
    pub idle_timeout: Duration,
    /// Requests a second one connection may make (gRPC calls and HTTP requests); past it,
    /// calls are refused with `RESOURCE_EXHAUSTED` (HTTP 429) until the second turns.
    pub max_requests_per_s: u64,
    /// gRPC calls open at once on one connection (HTTP/2 streams).
    pub max_streams: u32,
    /// Groups `/metrics` names one by one; the rest share one series (see [`crate::observe::series`]).
    pub metrics_groups: crate::observe::series::MetricsGroups,
    /// The most one charge may take (see [`crate::front::charges`]).
    pub charge_bound: crate::front::charges::ChargeBound,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: MAX_CONNECTIONS_DEFAULT,
            idle_timeout: Duration::from_secs(300),
            max_requests_per_s: 50_000,
            max_streams: 1024,
            metrics_groups: crate::observe::series::MetricsGroups::default(),
            charge_bound: crate::front::charges::ChargeBound::default(),
        }
    }
}

/// At the cap, a connection idle this long is closed to make room for a new one (a live
/// client exchanges every tick, and a backend reports more often).
pub const PRESSURE_IDLE: Duration = Duration::from_secs(10);
/// Places past the cap on the HTTP port for `/healthz` and `/readyz` alone.
pub const HEALTH_RESERVE: usize = 16;
/// How long a new connection at the cap waits for the place of an idle one closed for it.
pub(crate) const ROOM_WAIT: Duration = Duration::from_secs(1);
/// New connections waiting for a place at once, at most; past it they are closed at once.
pub(crate) const ROOM_WAITERS: usize = 64;
/// Descriptors kept for everything but connections (the data file, etcd, logs, the
/// listening sockets), and the reserve's.
pub const DESCRIPTORS_RESERVE: usize = 256 + HEALTH_RESERVE;

/// The default cap on connections per port.
pub const MAX_CONNECTIONS_DEFAULT: usize = 10_000;

/// The process's open-file limit, raised first to its hard limit (as servers commonly do): the
/// soft limit, or `None` where it cannot be read.
pub fn open_file_limit() -> Option<u64> {
    let mut l = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit only read and write the struct given, which lives here.
    #[allow(unsafe_code)]
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut l) != 0 {
            return None;
        }
        if l.rlim_cur < l.rlim_max {
            let raised = libc::rlimit { rlim_cur: l.rlim_max, rlim_max: l.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raw const raised) == 0 {
                l.rlim_cur = l.rlim_max;
            }
        }
    }
    Some(l.rlim_cur)
}

/// The cap on connections per port that fits `descriptors` (the open-file limit): two ports'
/// connections and [`DESCRIPTORS_RESERVE`]. `asked` is the cap asked for (`None`: the
/// default, lowered to fit, with a note saying so); one that does not fit is an error naming
/// the flag and the limit.
pub fn fit_connections(
    asked: Option<usize>,
    descriptors: Option<u64>,
) -> Result<(usize, Option<String>), String> {
    let Some(limit) = descriptors else { return Ok((asked.unwrap_or(MAX_CONNECTIONS_DEFAULT), None)) };
    let room = usize::try_from(limit).unwrap_or(usize::MAX).saturating_sub(DESCRIPTORS_RESERVE) / 2;
    match asked {
        Some(n) if n > room => Err(format!(
            "--max-connections {n}: two ports of {n} connections and {DESCRIPTORS_RESERVE} other descriptors need {}, \
             but this process may open {limit} files (ulimit -n); raise the limit or give --max-connections {room} or less",
            2 * n + DESCRIPTORS_RESERVE
        )),
        Some(n) => Ok((n, None)),
        None if room == 0 => Err(format!(
            "this process may open only {limit} files (ulimit -n): too few to serve; raise the limit"
        )),
        None if room < MAX_CONNECTIONS_DEFAULT => Ok((
            room,
            Some(format!(
                "connections capped at {room} per port to fit the open-file limit of {limit} (ulimit -n); \
                 raise it for the default {MAX_CONNECTIONS_DEFAULT}"
            )),
        )),
        None => Ok((MAX_CONNECTIONS_DEFAULT, None)),
    }
}

/// The largest request header block taken, in bytes (HTTP/2 and HTTP/1).
pub const HEADERS_MAX_BYTES: u32 = 16 * 1024;

/// How long a failed accept waits before the next.
pub(crate) const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// How often the same complaint is logged at most.
const LOG_EVERY: Duration = Duration::from_secs(10);

pub(crate) fn now() -> Instant {
    crate::clock::instant()
}

/// The instant connections' activity is counted from.
fn base() -> Instant {
    static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *BASE.get_or_init(now)
}

/// A connection's last traffic, shared with the accept loop, which may close it to make room.
#[derive(Debug, Default)]
pub(crate) struct Activity {
    /// Milliseconds from [`base`] to the last read or write.
    last_ms: std::sync::atomic::AtomicU64,
    /// Closed to make room: its next read ends the stream.
    evict: std::sync::atomic::AtomicBool,
    /// Woken to see `evict`.
    waker: std::sync::Mutex<Option<std::task::Waker>>,
}

impl Activity {
    fn touch(&self, at: Instant) {
        let ms = u64::try_from(at.duration_since(base()).as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, std::sync::atomic::Ordering::Relaxed);
    }

    fn last(&self) -> Instant {
        base() + Duration::from_millis(self.last_ms.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// How long since its last traffic.
    pub(crate) fn idle_for(&self, at: Instant) -> Duration {
        at.saturating_duration_since(self.last())
    }

    /// Closes the connection at its next read (woken for it).
    pub(crate) fn evict(&self) {
        self.evict.store(true, std::sync::atomic::Ordering::Release);
        if let Some(w) = self.waker.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take() {
            w.wake();
        }
    }

    fn evicted(&self, cx: &Context<'_>) -> bool {
        if self.evict.load(std::sync::atomic::Ordering::Acquire) {
            return true;
        }
        let mut w = self.waker.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if !w.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            *w = Some(cx.waker().clone());
        }
        drop(w);
        // Evicted between the first look and the waker's registration: seen now.
        self.evict.load(std::sync::atomic::Ordering::Acquire)
    }
}

/// The connections of one listener, for making room at the cap.
#[derive(Debug, Default)]
pub(crate) struct Registry(Vec<std::sync::Weak<Activity>>);

impl Registry {
    /// A new connection's activity, registered.
    pub(crate) fn add(&mut self) -> Arc<Activity> {
        let a = Arc::new(Activity::default());
        a.touch(now());
        if self.0.len() >= 64 && self.0.len() == self.0.capacity() {
            self.0.retain(|w| w.strong_count() > 0);
        }
        self.0.push(Arc::downgrade(&a));
        a
    }

    /// Closes up to `n` connections idle for [`PRESSURE_IDLE`] or more, the longest idle
    /// first; says how many.
    pub(crate) fn make_room(&mut self, n: usize) -> usize {
        let at = now();
        self.0.retain(|w| w.strong_count() > 0);
        let mut idle: Vec<(Duration, Arc<Activity>)> = self
            .0
            .iter()
            .filter_map(std::sync::Weak::upgrade)
            .filter(|a| !a.evict.load(std::sync::atomic::Ordering::Relaxed))
            .map(|a| (a.idle_for(at), a))
            .filter(|(d, _)| *d >= PRESSURE_IDLE)
            .collect();
        idle.sort_unstable_by_key(|a| std::cmp::Reverse(a.0));
        idle.iter().take(n).for_each(|(_, a)| a.evict());
        idle.len().min(n)
    }
}

/// Says when a repeated complaint may be logged again (at most every 10 s).
#[derive(Debug, Default)]
pub(crate) struct LogLimit {
    last: Option<Instant>,
}

impl LogLimit {
    /// Whether it is time to log again.
    pub(crate) fn due(&mut self) -> bool {
        let now = now();
        let due = self.last.is_none_or(|t| now.duration_since(t) >= LOG_EVERY);
        if due {
            self.last = Some(now);
        }
        due
    }
}

/// `incoming`, with the limits applied.
pub struct Limited<I> {
    inner: Pin<Box<I>>,
    permits: Arc<Semaphore>,
    limits: Limits,
    backoff: Option<Pin<Box<Sleep>>>,
    refused: u64,
    log: LogLimit,
}

impl<I> Limited<I> {
    /// Applies `limits` to `incoming`.
    pub fn new(incoming: I, limits: Limits) -> Self {
        Self {
            inner: Box::pin(incoming),
            permits: Arc::new(Semaphore::new(limits.max_connections.max(1))),
            limits,
            backoff: None,
            refused: 0,
            log: LogLimit::default(),
        }
    }
}

impl<I, IO, IE> Stream for Limited<I>
where
    I: Stream<Item = Result<IO, IE>>,
    IE: std::fmt::Display,
{
    type Item = Result<Guarded<IO>, IE>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if let Some(backoff) = self.backoff.as_mut() {
                if backoff.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.backoff = None;
            }
            match self.inner.as_mut().poll_next(cx) {
                Poll::Ready(Some(Ok(io))) => match self.permits.clone().try_acquire_owned() {
                    Ok(permit) => {
                        return Poll::Ready(Some(Ok(Guarded::new(io, permit, self.limits.idle_timeout))));
                    }
                    Err(_) => {
                        // Closed at once: the clients already connected keep their service.
                        drop(io);
                        self.refused += 1;
                        if self.log.due() {
                            let (max, refused) = (self.limits.max_connections, self.refused);
                            tracing::warn!(max, refused, "connection limit reached: closing new connections");
                        }
                    }
                },
                Poll::Ready(Some(Err(e))) => {
                    // Out of descriptors, say: wait before trying again rather than spin.
                    if self.log.due() {
                        tracing::error!(error = %e, "cannot accept connections; trying again shortly");
                    }
                    self.backoff = Some(Box::pin(tokio::time::sleep(ACCEPT_BACKOFF)));
                }
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

/// A connection holding its place under the cap, closed after an idle spell.
///
/// Traffic only notes the time; the idle timer is moved when it fires and finds traffic
/// since it was set, not on every read and write (moving a timer takes the runtime's timer
/// lock, and a busy connection reads and writes thousands of times a second).
pub struct Guarded<IO> {
    io: IO,
    _permit: OwnedSemaphorePermit,
    idle: Duration,
    /// When the connection last read or wrote, and whether it is closed to make room.
    activity: Arc<Activity>,
    deadline: Pin<Box<Sleep>>,
}

impl<IO> Guarded<IO> {
    pub(crate) fn new(io: IO, permit: OwnedSemaphorePermit, idle: Duration) -> Self {
        let activity = Arc::new(Activity::default());
        activity.touch(now());
        Self::registered(io, permit, idle, activity)
    }

    /// With its activity in a listener's [`Registry`].
    pub(crate) fn registered(
        io: IO,
        permit: OwnedSemaphorePermit,
        idle: Duration,
        activity: Arc<Activity>,
    ) -> Self {
        Self { io, _permit: permit, idle, activity, deadline: Box::pin(tokio::time::sleep(idle)) }
    }

    fn active(&mut self) {
        self.activity.touch(now());
    }

    /// Whether the connection has been idle for the whole timeout: the timer fired, and no
    /// traffic came since it was set (else it is set again from the last traffic).
    fn idle_for_good(&mut self, cx: &mut Context<'_>) -> bool {
        loop {
            if self.deadline.as_mut().poll(cx).is_pending() {
                return false;
            }
            let due = self.activity.last() + self.idle;
            if due <= self.deadline.deadline() {
                return true;
            }
            self.deadline.as_mut().reset(due);
        }
    }
}

impl<IO: Connected> Connected for Guarded<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Guarded<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) if buf.filled().len() > before => {
                self.active();
                Poll::Ready(Ok(()))
            }
            Poll::Pending => {
                // Idle too long, or closed to make room: end of stream, and the connection
                // is closed.
                if self.activity.evicted(cx) || self.idle_for_good(cx) {
                    Poll::Ready(Ok(()))
                } else {
                    Poll::Pending
                }
            }
            other => other,
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Guarded<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let written = Pin::new(&mut self.io).poll_write(cx, buf);
        if matches!(written, Poll::Ready(Ok(n)) if n > 0) {
            self.active();
        }
        written
    }

    // Vectored writes passed through: without them HTTP/2 writes a response's frames with
    // one system call each (a frame's head, then its payload) instead of one for them all.
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let written = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        if matches!(written, Poll::Ready(Ok(n)) if n > 0) {
            self.active();
        }
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// The edge of the unsafe calls: the limit read is the soft limit after raising it, and
    /// reading it again (nothing left to raise) gives the same.
    #[test]
    fn the_open_file_limit_is_raised_to_the_hard_limit_and_read_again_alike() {
        let first = open_file_limit().expect("Linux reads it");
        assert!(first > 0);
        assert_eq!(open_file_limit(), Some(first));
        let limits = std::fs::read_to_string("/proc/self/limits").expect("Linux has it");
        let line = limits.lines().find(|l| l.starts_with("Max open files")).expect("the row");
        let soft: Vec<&str> = line.split_whitespace().skip(3).take(2).collect();
        assert_eq!(soft[0], first.to_string(), "{line}");
        assert_eq!(soft[0], soft[1], "raised to the hard limit: {line}");
    }

    #[test]
    fn the_connection_cap_fits_the_open_file_limit() {
        assert_eq!(fit_connections(None, Some(1 << 20)), Ok((MAX_CONNECTIONS_DEFAULT, None)));
        // 20,000 descriptors cannot hold two ports of 10,000: the default is lowered, said.
        let (cap, note) = fit_connections(None, Some(20_000)).unwrap();
        assert_eq!(cap, (20_000 - DESCRIPTORS_RESERVE) / 2);
        assert!(note.is_some_and(|n| n.contains("ulimit -n")));
        // Asked for, it is refused with the flag and the limit named.
        let e = fit_connections(Some(10_000), Some(20_000)).unwrap_err();
        assert!(e.contains("--max-connections 10000") && e.contains("20000"), "{e}");
        assert_eq!(fit_connections(Some(5_000), Some(20_000)), Ok((5_000, None)));
        assert!(fit_connections(None, Some(100)).is_err());
        assert_eq!(fit_connections(Some(7), None), Ok((7, None)));
    }

    fn permit() -> OwnedSemaphorePermit {
        Arc::new(Semaphore::new(1)).try_acquire_owned().expect("a permit")
    }

    /// Traffic moves the idle deadline without re-arming the timer on every read and write:
    /// the timer, when it fires, sets itself again from the last traffic.
    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_is_closed_a_timeout_after_its_last_traffic() {
        let (client, server) = tokio::io::duplex(64);
        let mut guarded = Guarded::new(server, permit(), Duration::from_secs(10));
        let start = now();
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 8];
            let mut got = 0;
            loop {
                match guarded.read(&mut buf).await.expect("read") {
                    0 => return (now(), got),
                    n => got += n,
                }
            }
        });
        let (_keep, mut write) = tokio::io::split(client);
        tokio::time::sleep(Duration::from_secs(6)).await;
        write.write_all(b"x").await.expect("write");
        let (closed, got) = reader.await.expect("the reader");
        assert_eq!(got, 1);
        assert_eq!(closed.duration_since(start), Duration::from_secs(16), "10 s after the byte at 6 s");
    }

    /// Without vectored writes passed through, HTTP/2 wrote a frame's head and its payload
    /// with a system call each.
    #[tokio::test]
    async fn vectored_writes_pass_through_in_one_call() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let mut client =
            tokio::net::TcpStream::connect(listener.local_addr().expect("address")).await.expect("connect");
        let (server, _) = listener.accept().await.expect("accept");
        let mut guarded = Guarded::new(server, permit(), Duration::from_secs(10));
        assert!(guarded.is_write_vectored());
        let parts = [std::io::IoSlice::new(b"head"), std::io::IoSlice::new(b"payload")];
        assert_eq!(guarded.write_vectored(&parts).await.expect("write"), 11, "both parts in one call");
        let mut got = [0u8; 11];
        client.read_exact(&mut got).await.expect("read");
        assert_eq!(&got, b"headpayload");
    }
}

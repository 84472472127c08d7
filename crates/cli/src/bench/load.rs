//! The open-loop load program the service benches share (`tollgate bench surge` and
//! `tollgate bench overload`): requests sent when due over fresh HTTP connections, whatever
//! the earlier ones are doing, each answer kept with its tag.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use tollgate_limiter::clock::TokioClock;
use tollgate_limiter::throttle::ClientThrottle;
use tollgate_model::time::{Clock, Nanos};

/// Requests in flight at most; past it a request is not sent (and counted).
pub(crate) const IN_FLIGHT_MAX: usize = 8000;

/// One answered request: when it was sent (seconds since the start), its tag (a tenant, a
/// class), its HTTP status, how long it took, and whether it was sent at all (a request its
/// client's own throttle refused is kept as answered 429 at once, unsent).
pub(crate) struct Answer<T> {
    pub(crate) at: f64,
    pub(crate) tag: T,
    pub(crate) status: u16,
    pub(crate) latency: f64,
    pub(crate) sent: bool,
}

/// A load on one service, and what it was answered.
pub(crate) struct Load<T> {
    service: SocketAddr,
    clock: TokioClock,
    start: Nanos,
    pub(crate) answers: Mutex<Vec<Answer<T>>>,
    in_flight: AtomicUsize,
    not_sent: AtomicUsize,
    failed: AtomicUsize,
    /// Refused by the client's own adaptive throttle.
    pub(crate) refused_here: AtomicUsize,
}

impl<T: Copy + Send + Sync + 'static> Load<T> {
    /// A load on `service`, its clock starting now.
    pub(crate) fn new(service: SocketAddr) -> Arc<Self> {
        let clock = TokioClock::new();
        Arc::new(Load {
            service,
            start: clock.now(),
            clock,
            answers: Mutex::default(),
            in_flight: AtomicUsize::new(0),
            not_sent: AtomicUsize::new(0),
            failed: AtomicUsize::new(0),
            refused_here: AtomicUsize::new(0),
        })
    }

    /// Seconds since the load began.
    pub(crate) fn secs(&self) -> f64 {
        self.clock.now().since(self.start).as_secs_f64()
    }

    async fn send(self: Arc<Self>, tag: T, request: Vec<u8>, throttle: Option<ClientThrottle>) {
        let at = self.secs();
        let status = http_status(self.service, &request).await;
        let latency = self.secs() - at;
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        if let Some(t) = throttle {
            t.record(!matches!(status, Some(429 | 503) | None));
        }
        match status {
            Some(status) => {
                self.answers.lock().unwrap().push(Answer { at, tag, status, latency, sent: true })
            }
            None => {
                self.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Offers `per_s` requests a second tagged `tag` until `until` (seconds since the start),
    /// the `n`th being `request(n)`, open loop: each is sent when due.
    pub(crate) async fn offer(
        self: Arc<Self>,
        tag: T,
        per_s: f64,
        until: f64,
        request: impl Fn(u64) -> Vec<u8> + Send + 'static,
    ) {
        self.offer_throttled(tag, per_s, until, request, None).await
    }

    /// As [`offer`](Self::offer), each request first asking `throttle`, when given: one it
    /// refuses is not sent, and is kept as answered 429 at once.
    pub(crate) async fn offer_throttled(
        self: Arc<Self>,
        tag: T,
        per_s: f64,
        until: f64,
        request: impl Fn(u64) -> Vec<u8> + Send + 'static,
        throttle: Option<ClientThrottle>,
    ) {
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        let mut owed = 0.0;
        let mut n = 0u64;
        while self.secs() < until {
            tick.tick().await;
            owed += per_s / 100.0;
            while owed >= 1.0 {
                owed -= 1.0;
                n += 1;
                if throttle.as_ref().is_some_and(|t| !t.allow()) {
                    let at = self.secs();
                    self.answers.lock().unwrap().push(Answer {
                        at,
                        tag,
                        status: 429,
                        latency: 0.0,
                        sent: false,
                    });
                    self.refused_here.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                if self.in_flight.fetch_add(1, Ordering::Relaxed) >= IN_FLIGHT_MAX {
                    self.in_flight.fetch_sub(1, Ordering::Relaxed);
                    self.not_sent.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                tokio::spawn(self.clone().send(tag, request(n), throttle.clone()));
            }
        }
    }

    /// Waits for the requests in flight to end (bounded: each has its own deadline).
    pub(crate) async fn drain(&self) {
        for _ in 0..600 {
            if self.in_flight.load(Ordering::Relaxed) == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Says how many requests failed or were not sent, if any did.
    pub(crate) fn say_troubles(&self) {
        let (failed, not_sent) = (self.failed.load(Ordering::Relaxed), self.not_sent.load(Ordering::Relaxed));
        if failed + not_sent > 0 {
            crate::say(format!(
                "requests failed: {failed}, not sent (over {IN_FLIGHT_MAX} in flight): {not_sent}"
            ));
        }
    }
}

/// Sends `request` and reads the whole answer; its status code, or `None` on any failure.
pub(crate) async fn http_status(service: SocketAddr, request: &[u8]) -> Option<u16> {
    let answer = http(service, request).await?;
    answer.split(|&b| b == b' ').nth(1).and_then(|code| std::str::from_utf8(code).ok()?.parse().ok())
}

pub(crate) async fn http(service: SocketAddr, request: &[u8]) -> Option<Vec<u8>> {
    let work = async {
        let mut s = tokio::net::TcpStream::connect(service).await.ok()?;
        s.write_all(request).await.ok()?;
        let mut answer = Vec::new();
        s.read_to_end(&mut answer).await.ok()?;
        Some(answer)
    };
    tokio::time::timeout(Duration::from_secs(60), work).await.ok().flatten()
}

/// CPU seconds (user + system) and peak resident memory (kB) of `pid`.
pub(crate) fn process_usage(pid: u32) -> Option<(f64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let hwm = status.lines().find(|l| l.starts_with("VmHWM:"))?.split_whitespace().nth(1)?.parse().ok()?;
    // Clock ticks per second: 100 on Linux.
    Some((ticks / 100.0, hwm))
}

/// CPU seconds this process has used.
pub(crate) fn own_cpu() -> f64 {
    process_usage(std::process::id()).map_or(0.0, |(cpu, _)| cpu)
}

/// Offers `per_client` requests/s from each of `gates` for `group`, counting the admitted
/// ones after `warmup`; returns (admitted per second, attempts).
pub(crate) async fn offer(
    gates: &[tollgate_limiter::Tollgate],
    group: &str,
    per_client: f64,
    warmup: f64,
    seconds: f64,
) -> (f64, u64) {
    let clients = gates.iter().map(|gate| {
        let handle = gate.group(group).expect("valid group");
        move || std::future::ready(handle.try_acquire(1.0).is_ok())
    });
    open_loop(clients.collect(), per_client, warmup, seconds).await
}

/// Runs one task per client, each offering `per_client` requests/s open loop (every 10 ms,
/// the requests that arrived in it; refused ones are dropped) and deciding each with its
/// `decide`. Counts the admitted ones from `warmup` on, for `seconds`; returns (admitted per
/// second, attempts).
pub(crate) async fn open_loop<D, F>(clients: Vec<D>, per_client: f64, warmup: f64, seconds: f64) -> (f64, u64)
where
    D: FnMut() -> F + Send + 'static,
    F: std::future::Future<Output = bool> + Send,
{
    let admitted = Arc::new(AtomicU64::new(0));
    let attempts = Arc::new(AtomicU64::new(0));
    let counting = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = tokio::task::JoinSet::new();
    for mut decide in clients {
        let (admitted, attempts, counting, stop) =
            (admitted.clone(), attempts.clone(), counting.clone(), stop.clone());
        tasks.spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            let mut owed = 0.0;
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                owed += per_client / 100.0;
                while owed >= 1.0 {
                    owed -= 1.0;
                    attempts.fetch_add(1, Ordering::Relaxed);
                    if decide().await && counting.load(Ordering::Relaxed) {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        });
    }
    tokio::time::sleep(Duration::from_secs_f64(warmup)).await;
    counting.store(true, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    counting.store(false, Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    while tasks.join_next().await.is_some() {}
    (admitted.load(Ordering::Relaxed) as f64 / seconds, attempts.load(Ordering::Relaxed))
}

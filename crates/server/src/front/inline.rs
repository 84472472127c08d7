//! The ports' connections, each served in one task: a connection's calls run beside its
//! framing, not in tasks of their own.
//!
//! hyper runs each HTTP/2 stream's call in a task it hands to an executor. Given tokio's, the
//! runtime's workers steal those tasks, so a call and its connection's framing run on
//! different cores: they take turns at the connection's lock, wake each other across cores,
//! and each frees memory the other allocated. The executor here ([`Calls`]) keeps each call
//! in its connection's own task instead, a set of futures that task polls beside the
//! connection: a connection's work stays on one core at a time and a call costs no spawn.
//! The runtime spreads connections over the cores, not calls; one connection's calls share
//! a core (Envoy opens a connection per worker thread, the clients one each). An HTTP/1.1
//! connection, one request at a time, runs its requests in its task anyway.
//!
//! The gRPC port ([`serve_grpc`]) speaks HTTP/2 alone and puts around each call what tonic's
//! own server does: the connection's [`Connected`] info in the request's extensions (the
//! front ends read the [`crate::front::listen::Peer`] there), the call's `grpc-timeout`
//! honoured (`DEADLINE_EXCEEDED` once it passes), and a failed service answered with its
//! status. The HTTP port ([`serve_http`]) speaks HTTP/1.1 and HTTP/2, and gives axum's
//! routes the connection's info as axum's `ConnectInfo`, as `axum::serve` does.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, Stream, StreamExt};
use futures_util::task::AtomicWaker;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tonic::Status;
use tonic::codegen::http;
use tonic::transport::server::Connected;

/// A call's future, as the connection's task holds it.
type Call = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What [`Calls`] shares with the connection's task.
#[derive(Default)]
struct Queue {
    /// Calls handed over and not yet taken into the task's set.
    handed: Mutex<Vec<Call>>,
    /// Whether the task is polling now (a call handed over then is taken before it yields).
    polling: AtomicBool,
    waker: AtomicWaker,
}

/// The executor a connection's calls are handed to: they run in the connection's own task
/// ([`serve`]). hyper hands calls over while that task polls the connection, and
/// the task takes them before it yields; one handed over at another time wakes it.
#[derive(Clone, Default)]
pub struct Calls {
    queue: Arc<Queue>,
}

impl<F> hyper::rt::Executor<F> for Calls
where
    F: Future<Output = ()> + Send + 'static,
{
    fn execute(&self, call: F) {
        self.queue.handed.lock().unwrap_or_else(PoisonError::into_inner).push(Box::pin(call));
        if !self.queue.polling.load(Ordering::Acquire) {
            self.queue.waker.wake();
        }
    }
}

/// The HTTP/2 settings a connection is served with.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// The most calls in flight on one connection (`None`: hyper's default).
    pub max_streams: Option<u32>,
    /// The largest block of request headers, in bytes.
    pub max_header_list_bytes: u32,
}

/// A connection the port serves: its bytes, and what it tells the calls of itself.
pub trait Link:
    AsyncRead + AsyncWrite + Connected<ConnectInfo: Clone + Send + Sync> + Unpin + Send + 'static
{
}

impl<T> Link for T where
    T: AsyncRead + AsyncWrite + Connected<ConnectInfo: Clone + Send + Sync> + Unpin + Send + 'static
{
}

/// A call as the routes take it, and their answer.
type Req = http::Request<tonic::body::Body>;
type Res = http::Response<tonic::body::Body>;
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What a connection's calls are answered by: tonic's routes under the front ends' layers.
pub trait Routes:
    tower::Service<Req, Response = Res, Future: Send + 'static, Error: Into<BoxError> + Send>
    + Clone
    + Send
    + 'static
{
}

impl<S> Routes for S where
    S: tower::Service<Req, Response = Res, Future: Send + 'static, Error: Into<BoxError> + Send>
        + Clone
        + Send
        + 'static
{
}

/// Serves every connection from `incoming` with `connection` until `stop` completes; then
/// each connection is asked to close once its calls are answered (HTTP/2's GOAWAY, or the
/// end of HTTP/1.1's keep-alive), and this returns when all have closed. A connection that
/// fails to come (a failed accept) is skipped.
async fn serve<I, IO, IE, F, C>(incoming: I, connection: F, stop: impl Future<Output = ()>)
where
    I: Stream<Item = Result<IO, IE>>,
    F: Fn(IO, Stop) -> C,
    C: Future<Output = ()> + Send + 'static,
{
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    // Each connection's task holds a sender: once all are dropped, every connection is closed.
    let (open_tx, mut open_rx) = tokio::sync::mpsc::channel::<Infallible>(1);
    let mut incoming = std::pin::pin!(incoming);
    let mut stop = std::pin::pin!(stop);
    loop {
        let io = tokio::select! {
            () = &mut stop => break,
            io = incoming.next() => io,
        };
        match io {
            Some(Ok(io)) => {
                let served = connection(io, stop_rx.clone());
                let open = open_tx.clone();
                tokio::spawn(async move {
                    served.await;
                    drop(open);
                });
            }
            Some(Err(_)) => continue,
            None => break,
        }
    }
    let _ = stop_tx.send(true);
    drop(open_tx);
    let _ = open_rx.recv().await;
}

/// Turns true when the server stops.
type Stop = tokio::sync::watch::Receiver<bool>;

/// Serves the gRPC port: every connection from `incoming`, HTTP/2 alone, its calls answered
/// by `service`, until `stop` completes (see [`serve`]).
pub async fn serve_grpc<I, IO, IE, S>(
    incoming: I,
    service: S,
    settings: Settings,
    stop: impl Future<Output = ()>,
) where
    I: Stream<Item = Result<IO, IE>>,
    IO: Link,
    S: Routes,
{
    let connection = |io: IO, stop: Stop| {
        let per_call = PerCall { info: io.connect_info(), inner: service.clone() };
        let calls = Calls::default();
        let mut builder = hyper::server::conn::http2::Builder::new(calls.clone());
        builder
            .timer(TokioTimer::new())
            .max_concurrent_streams(settings.max_streams)
            .max_header_list_size(settings.max_header_list_bytes);
        let conn = builder.serve_connection(TokioIo::new(io), per_call);
        drive(conn, calls, stop, |conn| conn.graceful_shutdown())
    };
    serve(incoming, connection, stop).await;
}

/// Serves the HTTP port: every connection from `incoming`, HTTP/1.1 or HTTP/2 (told apart by
/// its first bytes), its requests answered by `router` with the connection's
/// [`axum::extract::ConnectInfo`], until `stop` completes (see [`serve`]).
pub async fn serve_http<I, IO, IE>(incoming: I, router: axum::Router, stop: impl Future<Output = ()>)
where
    I: Stream<Item = Result<IO, IE>>,
    IO: Link,
{
    let connection = |io: IO, stop: Stop| {
        let per_request =
            PerRequest { info: axum::extract::ConnectInfo(io.connect_info()), router: router.clone() };
        let calls = Calls::default();
        let builder = hyper_util::server::conn::auto::Builder::new(calls.clone());
        let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), per_request).into_owned();
        drive(conn, calls, stop, |conn| conn.graceful_shutdown())
    };
    serve(incoming, connection, stop).await;
}

/// Drives one connection, its calls in this task, until it closes; once `stop` turns true,
/// `graceful` asks it to close when its calls are answered.
async fn drive<C: Future>(conn: C, calls: Calls, mut stop: Stop, graceful: impl Fn(Pin<&mut C>)) {
    let mut conn = std::pin::pin!(conn);
    let mut running = FuturesUnordered::<Call>::new();
    // Done once `stop` turns true, or its sender is gone.
    let mut stopped = std::pin::pin!(async move {
        let _ = stop.wait_for(|stop| *stop).await;
    });
    let mut stopping = false;
    std::future::poll_fn(|cx| {
        if !stopping && stopped.as_mut().poll(cx).is_ready() {
            stopping = true;
            graceful(conn.as_mut());
        }
        poll_together(conn.as_mut(), &mut running, &calls.queue, cx)
    })
    .await;
}

/// Polls the connection, then the calls it handed over, then the calls it holds, until
/// neither hands over more: `Ready` once the connection has closed (its calls are dropped
/// with it).
fn poll_together<C>(
    mut conn: Pin<&mut C>,
    running: &mut FuturesUnordered<Call>,
    queue: &Queue,
    cx: &mut Context<'_>,
) -> Poll<()>
where
    C: Future,
{
    queue.waker.register(cx.waker());
    queue.polling.store(true, Ordering::Release);
    let closed = loop {
        let closed = conn.as_mut().poll(cx).is_ready();
        let handed = std::mem::take(&mut *queue.handed.lock().unwrap_or_else(PoisonError::into_inner));
        let more = !handed.is_empty();
        running.extend(handed);
        while let Poll::Ready(Some(())) = running.poll_next_unpin(cx) {}
        // Calls taken in may have answered at once: the connection writes their answers now.
        if closed || !more {
            break closed;
        }
    };
    queue.polling.store(false, Ordering::Release);
    // A call handed over between the last look and the flag's fall is taken now.
    if !queue.handed.lock().unwrap_or_else(PoisonError::into_inner).is_empty() {
        cx.waker().wake_by_ref();
    }
    if closed { Poll::Ready(()) } else { Poll::Pending }
}

/// Each call on a connection: the connection's info in the request's extensions, its
/// `grpc-timeout` honoured, a failed service answered with its status.
#[derive(Clone)]
struct PerCall<S, C> {
    info: C,
    inner: S,
}

type Answer = Pin<Box<dyn Future<Output = Result<Res, Infallible>> + Send>>;

impl<S, C> hyper::service::Service<http::Request<Incoming>> for PerCall<S, C>
where
    S: Routes,
    C: Clone + Send + Sync + 'static,
{
    type Response = Res;
    type Error = Infallible;
    type Future = Answer;

    fn call(&self, req: http::Request<Incoming>) -> Answer {
        let mut req = req.map(tonic::body::Body::new);
        req.extensions_mut().insert(self.info.clone());
        answer(self.inner.clone(), req)
    }
}

/// `inner`'s answer to `req`, within the call's `grpc-timeout` (see [`within`]).
///
/// The services are ready at once (tonic's routes always are): the call is made here, and
/// the future boxed holds the call's answer alone, not the request and the service beside it
/// (a kilobyte, which took the allocator's slow path at every call). One not ready yet is
/// waited for.
fn answer<S: Routes>(mut inner: S, req: Req) -> Answer {
    let timeout = match grpc_timeout(req.headers()) {
        Ok(t) => t,
        Err(status) => return Box::pin(std::future::ready(Ok(status.into_http()))),
    };
    match inner.poll_ready(&mut Context::from_waker(std::task::Waker::noop())) {
        Poll::Ready(Ok(())) => Box::pin(within(timeout, inner.call(req))),
        Poll::Ready(Err(e)) => Box::pin(std::future::ready(Ok(failed(e.into()).into_http()))),
        Poll::Pending => Box::pin(when_ready(inner, req, timeout)),
    }
}

/// Each request on an HTTP connection: the connection's info in its extensions, as axum's
/// `ConnectInfo`.
#[derive(Clone)]
struct PerRequest<C> {
    info: axum::extract::ConnectInfo<C>,
    router: axum::Router,
}

impl<C> hyper::service::Service<http::Request<Incoming>> for PerRequest<C>
where
    C: Clone + Send + Sync + 'static,
{
    type Response = axum::response::Response;
    type Error = Infallible;
    type Future = axum::routing::future::RouteFuture<Infallible>;

    fn call(&self, mut req: http::Request<Incoming>) -> Self::Future {
        req.extensions_mut().insert(self.info.clone());
        tower::Service::call(&mut self.router.clone(), req)
    }
}

/// `inner`'s answer to `req` once it is ready, within `timeout` (see [`within`]).
async fn when_ready<S>(mut inner: S, req: Req, timeout: Option<Duration>) -> Result<Res, Infallible>
where
    S: tower::Service<Req, Response = Res, Error: Into<BoxError>>,
{
    use tower::ServiceExt;
    within(timeout, async move { inner.ready().await?.call(req).await }).await
}

/// The answer `call` comes to, within the call's `grpc-timeout` (`DEADLINE_EXCEEDED` once it
/// passes); a failed service's status as the answer.
async fn within<E: Into<BoxError>>(
    timeout: Option<Duration>,
    call: impl Future<Output = Result<Res, E>>,
) -> Result<Res, Infallible> {
    let answered = match timeout {
        None => call.await,
        Some(t) => match tokio::time::timeout(t, call).await {
            Ok(answered) => answered,
            Err(_) => return Ok(Status::deadline_exceeded("the call's grpc-timeout passed").into_http()),
        },
    };
    Ok(answered.unwrap_or_else(|e| failed(e.into()).into_http()))
}

/// A service's error as the status the call is answered with.
fn failed(e: BoxError) -> Status {
    match e.downcast::<Status>() {
        Ok(status) => *status,
        Err(e) => Status::internal(e.to_string()),
    }
}

/// The most digits a `grpc-timeout` may have (the gRPC protocol's rule).
const TIMEOUT_DIGITS_MAX: usize = 8;

/// The call's deadline from its `grpc-timeout` header (digits, then a unit: `H`, `M`, `S`,
/// `m`, `u` or `n`); none when it has none.
fn grpc_timeout(headers: &http::HeaderMap) -> Result<Option<Duration>, Status> {
    // A name made once: looked up by a string, the name is parsed and checked at every call.
    const GRPC_TIMEOUT: http::HeaderName = http::HeaderName::from_static("grpc-timeout");
    let Some(v) = headers.get(GRPC_TIMEOUT) else { return Ok(None) };
    let bad = || {
        Status::invalid_argument(format!(
            "grpc-timeout: {:?} is not 1 to {TIMEOUT_DIGITS_MAX} digits and a unit (H, M, S, m, u or n)",
            String::from_utf8_lossy(v.as_bytes())
        ))
    };
    let v = v.as_bytes();
    let (digits, unit) = v.split_at(v.len().saturating_sub(1));
    if digits.is_empty() || digits.len() > TIMEOUT_DIGITS_MAX || !digits.iter().all(u8::is_ascii_digit) {
        return Err(bad());
    }
    let n: u64 = std::str::from_utf8(digits).ok().and_then(|d| d.parse().ok()).ok_or_else(bad)?;
    let d = match unit {
        b"H" => Duration::from_secs(n * 3_600),
        b"M" => Duration::from_secs(n * 60),
        b"S" => Duration::from_secs(n),
        b"m" => Duration::from_millis(n),
        b"u" => Duration::from_micros(n),
        b"n" => Duration::from_nanos(n),
        _ => return Err(bad()),
    };
    Ok(Some(d))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Answers each call with the id of the task it ran in; a call to `/held` first says it
    /// has come (`came`) and waits for `release`.
    #[derive(Clone)]
    struct TaskIds {
        came: tokio::sync::mpsc::UnboundedSender<()>,
        release: Arc<tokio::sync::Notify>,
    }

    impl tower::Service<http::Request<tonic::body::Body>> for TaskIds {
        type Response = http::Response<tonic::body::Body>;
        type Error = Infallible;
        type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
            let this = self.clone();
            Box::pin(async move {
                if req.uri().path() == "/held" {
                    let _ = this.came.send(());
                    this.release.notified().await;
                }
                let id = tokio::task::id().to_string();
                Ok(http::Response::new(tonic::body::Body::new(id)))
            })
        }
    }

    /// The whole body of `answer`, as text.
    async fn text(answer: http::Response<Incoming>) -> String {
        let mut body = std::pin::pin!(answer.into_body());
        let mut read = Vec::new();
        while let Some(frame) =
            std::future::poll_fn(|cx| http_body::Body::poll_frame(body.as_mut(), cx)).await
        {
            if let Ok(data) = frame.expect("the body reads").into_data() {
                read.extend_from_slice(&data);
            }
        }
        String::from_utf8(read).expect("text")
    }

    /// A listener that has taken `ios` and stays open.
    fn listening<const N: usize>(
        ios: [tokio::io::DuplexStream; N],
    ) -> impl Stream<Item = Result<tokio::io::DuplexStream, std::io::Error>> {
        futures_util::stream::iter(ios.map(Ok)).chain(futures_util::stream::pending())
    }

    /// An HTTP/2 client over `io`, and its connection to drive.
    async fn h2_client(
        io: tokio::io::DuplexStream,
    ) -> (
        hyper::client::conn::http2::SendRequest<String>,
        hyper::client::conn::http2::Connection<
            TokioIo<tokio::io::DuplexStream>,
            String,
            hyper_util::rt::TokioExecutor,
        >,
    ) {
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), TokioIo::new(io))
            .await
            .expect("the HTTP/2 handshake")
    }

    /// The distinct answers to `n` concurrent GETs of `path` over one HTTP/2 connection.
    async fn answers_to_concurrent_gets(
        send: &hyper::client::conn::http2::SendRequest<String>,
        path: &str,
        n: usize,
    ) -> std::collections::HashSet<String> {
        let calls = (0..n).map(|_| {
            let mut send = send.clone();
            async move { text(send.send_request(get(path)).await.expect("an answer")).await }
        });
        futures_util::future::join_all(calls).await.into_iter().collect()
    }

    fn get(path: &str) -> http::Request<String> {
        http::Request::builder().uri(format!("http://tollgate{path}")).body(String::new()).expect("a request")
    }

    #[tokio::test]
    async fn a_connections_calls_run_in_its_task_and_a_stop_lets_the_one_in_flight_finish() {
        let (client_io, server_io) = tokio::io::duplex(64 * 1024);
        let (came, mut came_rx) = tokio::sync::mpsc::unbounded_channel();
        let release = Arc::new(tokio::sync::Notify::new());
        let service = TaskIds { came, release: release.clone() };
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        // One connection, and the listener stays open.
        let incoming = listening([server_io]);
        let settings = Settings { max_streams: None, max_header_list_bytes: 16 * 1024 };
        let server = tokio::spawn(serve_grpc(incoming, service, settings, async {
            let _ = stop_rx.await;
        }));
        let (send, conn) = h2_client(client_io).await;
        tokio::spawn(conn);

        let ids = answers_to_concurrent_gets(&send, "/now", 32).await;
        assert_eq!(ids.len(), 1, "32 calls ran in the tasks {ids:?}, not in their connection's one");

        let held = tokio::spawn({
            let mut send = send.clone();
            async move { text(send.send_request(get("/held")).await.expect("an answer")).await }
        });
        came_rx.recv().await.expect("the held call came");
        stop_tx.send(()).expect("the server runs");
        // The call in flight is answered after the stop; then the connection closes, and the
        // server returns.
        release.notify_one();
        assert_eq!(held.await.expect("the held call"), ids.into_iter().next().unwrap());
        server.await.expect("the server stopped");
        let mut send = send.clone();
        assert!(send.send_request(get("/now")).await.is_err(), "a call after the stop was taken");
    }

    /// [`TaskIds`], not ready at first: each clone's first `poll_ready` is pending (and wakes
    /// its task at once).
    #[derive(Clone)]
    struct ReadyLater {
        inner: TaskIds,
        pending: bool,
    }

    impl tower::Service<http::Request<tonic::body::Body>> for ReadyLater {
        type Response = http::Response<tonic::body::Body>;
        type Error = Infallible;
        type Future = <TaskIds as tower::Service<http::Request<tonic::body::Body>>>::Future;

        fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            if std::mem::take(&mut self.pending) {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            self.inner.poll_ready(cx)
        }

        fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
            self.inner.call(req)
        }
    }

    #[tokio::test]
    async fn a_service_not_ready_at_once_is_waited_for() {
        let (client_io, server_io) = tokio::io::duplex(64 * 1024);
        let (came, _came_rx) = tokio::sync::mpsc::unbounded_channel();
        let service = ReadyLater {
            inner: TaskIds { came, release: Arc::new(tokio::sync::Notify::new()) },
            pending: true,
        };
        let settings = Settings { max_streams: None, max_header_list_bytes: 16 * 1024 };
        let server =
            tokio::spawn(serve_grpc(listening([server_io]), service, settings, std::future::pending()));
        let (send, conn) = h2_client(client_io).await;
        tokio::spawn(conn);
        let ids = answers_to_concurrent_gets(&send, "/now", 8).await;
        assert_eq!(ids.len(), 1, "8 calls, each first not ready, answered from the tasks {ids:?}");
        server.abort();
    }

    #[tokio::test]
    async fn the_http_port_serves_both_versions_with_the_connections_info_and_h2_calls_in_one_task() {
        let router = axum::Router::new().route(
            "/id",
            axum::routing::get(
                |axum::extract::ConnectInfo(who): axum::extract::ConnectInfo<()>| async move {
                    format!("{who:?} {}", tokio::task::id())
                },
            ),
        );
        let (h2_client_io, h2_server) = tokio::io::duplex(64 * 1024);
        let (h1_client, h1_server) = tokio::io::duplex(64 * 1024);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let incoming = listening([h2_server, h1_server]);
        let server = tokio::spawn(serve_http(incoming, router, async {
            let _ = stop_rx.await;
        }));

        let (h2, conn) = h2_client(h2_client_io).await;
        let h2_closed = tokio::spawn(conn);
        let answers = answers_to_concurrent_gets(&h2, "/id", 16).await;
        assert_eq!(answers.len(), 1, "16 requests over HTTP/2 ran in the tasks {answers:?}");
        assert!(answers.iter().all(|a| a.starts_with("() ")), "{answers:?}");

        let (mut h1, conn) = hyper::client::conn::http1::handshake(TokioIo::new(h1_client))
            .await
            .expect("the HTTP/1.1 handshake");
        let h1_closed = tokio::spawn(conn);
        let answer = h1.send_request(get("/id")).await.expect("an answer");
        assert_eq!(answer.status(), http::StatusCode::OK);
        assert!(text(answer).await.starts_with("() "));

        stop_tx.send(()).expect("the server runs");
        server.await.expect("the server stopped");
        h2_closed.await.expect("joined").expect("HTTP/2 closed cleanly");
        h1_closed.await.expect("joined").expect("HTTP/1.1 closed cleanly");
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_past_its_grpc_timeout_is_answered_deadline_exceeded() {
        let never = tower::service_fn(|_: http::Request<tonic::body::Body>| async {
            std::future::pending::<Result<http::Response<tonic::body::Body>, Infallible>>().await
        });
        let mut req = http::Request::new(tonic::body::Body::empty());
        req.headers_mut().insert("grpc-timeout", http::HeaderValue::from_static("50m"));
        let answered = answer(never, req).await.expect("an answer");
        let status = Status::from_header_map(answered.headers()).expect("a status");
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded);

        let mut req = http::Request::new(tonic::body::Body::empty());
        req.headers_mut().insert("grpc-timeout", http::HeaderValue::from_static("soon"));
        let answered = answer(never, req).await.expect("an answer");
        let status = Status::from_header_map(answered.headers()).expect("a status");
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
    }

    fn timeout_of(v: &str) -> Result<Option<Duration>, Status> {
        let mut h = http::HeaderMap::new();
        h.insert("grpc-timeout", http::HeaderValue::from_str(v).unwrap());
        grpc_timeout(&h)
    }

    #[test]
    fn a_grpc_timeout_is_read_in_each_unit_and_a_bad_one_is_named() {
        assert_eq!(grpc_timeout(&http::HeaderMap::new()).unwrap(), None);
        assert_eq!(timeout_of("2H").unwrap(), Some(Duration::from_secs(7_200)));
        assert_eq!(timeout_of("3M").unwrap(), Some(Duration::from_secs(180)));
        assert_eq!(timeout_of("1S").unwrap(), Some(Duration::from_secs(1)));
        assert_eq!(timeout_of("250m").unwrap(), Some(Duration::from_millis(250)));
        assert_eq!(timeout_of("99999999u").unwrap(), Some(Duration::from_micros(99_999_999)));
        assert_eq!(timeout_of("5n").unwrap(), Some(Duration::from_nanos(5)));
        for bad in ["", "S", "10", "1x", "123456789S", "-1S", "1.5S"] {
            let e = timeout_of(bad).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{bad}");
            assert!(e.message().starts_with("grpc-timeout: "), "{bad}: {}", e.message());
        }
    }
}

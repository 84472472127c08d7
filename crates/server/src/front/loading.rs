//! What the HTTP port answers while the server reads its store at start: `/healthz` says the
//! process is alive, `/readyz` says it is still loading, and every other path is refused with
//! a problem document asking to try again, so that a probe or a client never meets a port
//! that accepts connections and answers nothing. Once the store is read, the port is handed
//! to the real front end; connections opened meanwhile are closed after their answer.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::sync::{Mutex, oneshot};

use crate::front::listen::{Conn, Incoming};

/// The HTTP port's answers while loading, until [`finish`](Self::finish) takes the port back.
pub(crate) struct Loading {
    lent: Arc<Mutex<Incoming>>,
    stop: oneshot::Sender<()>,
    back: oneshot::Receiver<()>,
}

impl Loading {
    /// Starts answering on `incoming`.
    pub(crate) fn start(incoming: Incoming) -> Loading {
        let local = incoming.local_addr();
        let lent = Arc::new(Mutex::new(incoming));
        let (stop, stopped) = oneshot::channel::<()>();
        let (gone, back) = oneshot::channel();
        let listener = Lent { inner: Some(lent.clone()), local, gone: Some(gone) };
        let app = Router::new()
            .route("/healthz", get(|| async { closing(StatusCode::OK, "text/plain", "ok\n".into()) }))
            .route(
                "/readyz",
                get(|| async { closing(StatusCode::SERVICE_UNAVAILABLE, "text/plain", LOADING.into()) }),
            )
            .fallback(|| async { refused() });
        // A dropped `Loading` (a start that failed) ends the answers as `finish` does.
        tokio::spawn(async move {
            let stopped = async move {
                let _ = stopped.await;
            };
            let _ = axum::serve(listener, app).with_graceful_shutdown(stopped).await;
        });
        Loading { lent, stop, back }
    }

    /// Stops answering and gives the port back (connections still open finish on their own).
    pub(crate) async fn finish(self) -> Incoming {
        let _ = self.stop.send(());
        // The server lets its listener go as soon as it stops accepting.
        let _ = self.back.await;
        match Arc::try_unwrap(self.lent) {
            Ok(m) => m.into_inner(),
            Err(_) => unreachable!("the loading answers hold the port only through their listener"),
        }
    }
}

/// `/readyz`'s answer while loading.
pub const LOADING: &str = "loading: reading the store\n";

fn closing(status: StatusCode, kind: &'static str, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, kind), (header::CONNECTION, "close")], body).into_response()
}

const DETAIL: &str = "the server is loading its store; try again shortly";

fn refused() -> Response {
    let body = serde_json::json!({
        "type": "about:blank",
        "title": "Service Unavailable",
        "status": 503,
        "detail": DETAIL,
        "error": DETAIL,
    });
    let mut r = closing(StatusCode::SERVICE_UNAVAILABLE, "application/problem+json", body.to_string());
    r.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    r
}

/// The port, lent to the loading answers: says when it is let go.
struct Lent {
    inner: Option<Arc<Mutex<Incoming>>>,
    local: SocketAddr,
    gone: Option<oneshot::Sender<()>>,
}

impl Drop for Lent {
    fn drop(&mut self) {
        // Its share of the port first, so that the port is whole when it says so.
        drop(self.inner.take());
        if let Some(gone) = self.gone.take() {
            let _ = gone.send(());
        }
    }
}

impl axum::serve::Listener for Lent {
    type Io = Conn;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Conn, SocketAddr) {
        let Some(inner) = &self.inner else { return std::future::pending().await };
        let mut incoming = inner.lock().await;
        axum::serve::Listener::accept(&mut *incoming).await
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.local)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    async fn fetch(addr: SocketAddr, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes()).await.unwrap();
        let mut out = String::new();
        // The answer closes the connection.
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn while_loading_the_probes_answer_and_then_the_port_is_handed_on() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let incoming = Incoming::start(listener, None, crate::front::conn::Limits::default(), None).unwrap();
        let addr = incoming.local_addr();
        let loading = Loading::start(incoming);
        let health = fetch(addr, "/healthz").await;
        assert!(health.starts_with("HTTP/1.1 200") && health.ends_with("ok\n"), "{health}");
        let ready = fetch(addr, "/readyz").await;
        assert!(ready.starts_with("HTTP/1.1 503") && ready.ends_with(LOADING), "{ready}");
        let other = fetch(addr, "/v1/groups").await.to_ascii_lowercase();
        assert!(other.starts_with("http/1.1 503") && other.contains("retry-after: 1"), "{other}");
        assert!(other.contains("application/problem+json") && other.contains("loading its store"), "{other}");
        // Handed on: the next server answers on the same port.
        let incoming = loading.finish().await;
        let app = Router::new().route("/readyz", get_ready());
        tokio::spawn(async move { axum::serve(incoming, app).await.unwrap() });
        let ready = fetch(addr, "/readyz").await;
        assert!(ready.starts_with("HTTP/1.1 200") && ready.ends_with("ready\n"), "{ready}");
    }

    fn get_ready() -> axum::routing::MethodRouter {
        get(|| async { closing(StatusCode::OK, "text/plain", "ready\n".into()) })
    }
}

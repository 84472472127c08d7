//! Listening: TCP connections under the connection cap, with TLS when configured, each with
//! what the front ends check per call (the peer's address, its certificate's name, its
//! request budget).
//!
//! Accepting never waits on a handshake: each runs in a task of its own, bounded by
//! [`HANDSHAKE_TIMEOUT`], so a client that opens a connection and sends nothing holds a
//! place under the cap for that long and nobody else waits. Certificates and keys are read
//! again when their files change (checked every [`RELOAD_EVERY`]); a file that fails to load
//! leaves the previous ones in use, and says why.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_rustls::server::TlsStream;
use tonic::codegen::http;
use tonic::transport::server::Connected;

use crate::front::conn::{Guarded, Limits};

/// How long a TLS handshake may take.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the certificate files are checked for changes.
pub const RELOAD_EVERY: Duration = Duration::from_secs(5);
/// The most names on the client certificate allow-list.
pub const ALLOWED_NAMES_MAX: usize = 1000;

/// The server's certificate and key, and for mutual TLS the authority client certificates
/// must be signed by, with an optional allow-list of their common names.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TlsFiles {
    /// PEM certificate chain.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
    /// PEM authority for client certificates (mutual TLS); `None`: clients need none.
    pub client_ca: Option<PathBuf>,
    /// Client certificate common names allowed (empty: any the authority signed).
    pub allowed_names: Vec<String>,
    /// PEM authority the other controllers' certificates are signed by, which a follower
    /// trusts when it calls the leader; `None`: `client_ca`, else the system's authorities.
    pub peer_ca: Option<PathBuf>,
}

/// What the front ends know about a connection.
#[derive(Debug, Clone)]
pub struct Peer {
    /// The remote address.
    pub addr: SocketAddr,
    /// The client certificate's common name, under mutual TLS.
    pub cert_name: Option<Arc<str>>,
    /// Whether the connection is TLS.
    pub tls: bool,
    /// Requests left this second.
    pub(crate) budget: Arc<Budget>,
    /// Taken in past the cap, on a place kept for `/healthz` and `/readyz`: it may ask for
    /// nothing else.
    pub health_only: bool,
}

/// A connection's request budget: a bucket of `rate` requests refilled each second.
#[derive(Debug)]
pub(crate) struct Budget {
    rate: f64,
    state: Mutex<(f64, tokio::time::Instant)>,
}

impl Budget {
    fn new(rate: u64) -> Self {
        Self { rate: rate as f64, state: Mutex::new((rate as f64, crate::front::conn::now())) }
    }

    /// Takes one request; false when the connection is over its rate.
    pub(crate) fn take(&self) -> bool {
        let now = crate::front::conn::now();
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let refill = now.duration_since(s.1).as_secs_f64() * self.rate;
        s.0 = (s.0 + refill).min(self.rate);
        s.1 = now;
        if s.0 >= 1.0 {
            s.0 -= 1.0;
            true
        } else {
            false
        }
    }

    /// The rate, requests a second.
    pub(crate) fn rate(&self) -> u64 {
        self.rate as u64
    }
}

/// A plain or TLS stream.
enum Io {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// One accepted connection.
pub struct Conn {
    io: Guarded<Io>,
    /// A gRPC connection's count of writes, shared by all of them. A gRPC connection says it
    /// takes no vectored writes: see [`SliceAnswers`].
    grpc_writes: Option<Arc<AtomicU64>>,
    /// Whether its writes wait for the answers of the requests read with them.
    batch: Batch,
    peer: Peer,
}

/// An HTTP/2 connection's answers go out together: before each write the connection's task
/// steps aside once (it wakes itself and yields), so that the tasks answering the requests
/// read in the same read run first and their frames join the write: with 4 connections of
/// 32 streams each, about one call in ten pays for a send (each answer alone would take
/// one), and the peer is woken as seldom. An HTTP/1.1 connection has one request in flight and gains nothing: its writes
/// go at once. Which one a connection speaks is told by its first bytes (the HTTP/2
/// preface, after TLS); the gRPC port speaks only HTTP/2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Batch {
    /// Nothing read yet.
    Unknown,
    /// HTTP/1.1: writes go at once.
    Never,
    /// HTTP/2, about to write: the task steps aside first.
    Due,
    /// HTTP/2, stepped aside: the write goes now.
    Stepped,
}

/// What an HTTP/2 client sends first (RFC 9113, section 3.4), as far as told apart from
/// HTTP/1.1.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0";

impl Batch {
    /// Before a write: whether to step aside now (the task is woken again at once).
    fn step_aside(&mut self, cx: &mut Context<'_>) -> bool {
        if *self != Batch::Due {
            return false;
        }
        *self = Batch::Stepped;
        cx.waker().wake_by_ref();
        true
    }

    /// After a write: the next one steps aside again.
    fn wrote<T>(&mut self, written: &Poll<T>) {
        if *self == Batch::Stepped && written.is_ready() {
            *self = Batch::Due;
        }
    }
}

impl Conn {
    /// What is known about its peer.
    pub fn peer(&self) -> &Peer {
        &self.peer
    }
}

impl Connected for Conn {
    type ConnectInfo = Peer;

    fn connect_info(&self) -> Peer {
        self.peer.clone()
    }
}

impl AsyncRead for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Io::Plain(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let read = Pin::new(&mut this.io).poll_read(cx, buf);
        if this.batch == Batch::Unknown && buf.filled().len() > before {
            let first = &buf.filled()[before..];
            let n = first.len().min(H2_PREFACE.len());
            this.batch = if first[..n] == H2_PREFACE[..n] { Batch::Due } else { Batch::Never };
        }
        read
    }
}

impl Conn {
    fn count(&self, written: &Poll<std::io::Result<usize>>) {
        if let (Some(writes), Poll::Ready(Ok(1..))) = (&self.grpc_writes, written) {
            writes.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if this.batch.step_aside(cx) {
            return Poll::Pending;
        }
        let written = Pin::new(&mut this.io).poll_write(cx, buf);
        this.batch.wrote(&written);
        this.count(&written);
        written
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if this.batch.step_aside(cx) {
            return Poll::Pending;
        }
        let written = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.batch.wrote(&written);
        this.count(&written);
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.grpc_writes.is_none() && self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// gRPC's answers with their data cut into frames below 1,024 bytes
/// ([`tollgate_proto::frames::Slices`]): the HTTP/2 layer copies such frames, with the
/// answer's head and trailers, into its buffer and writes them out at once. The gRPC
/// connections say they take no vectored writes, which is what raises that limit from 256
/// bytes to 1,024; without both an exchange's answer took two writes, a head and its data
/// then the trailers.
#[derive(Debug, Clone)]
pub struct SliceAnswers<S>(pub S);

impl<S, B> tower::Service<http::Request<B>> for SliceAnswers<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let answer = self.0.call(req);
        Box::pin(async move {
            answer
                .await
                .map(|r| r.map(|body| tonic::body::Body::new(tollgate_proto::frames::Slices::new(body))))
        })
    }
}

/// The TLS configuration in use, reloaded when its files change.
pub struct Tls {
    files: TlsFiles,
    alpn: Vec<Vec<u8>>,
    config: RwLock<Arc<rustls::ServerConfig>>,
    stamp: Mutex<Vec<Option<SystemTime>>>,
}

fn read_certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("{what} {}: {e}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{what} {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{what} {}: no PEM certificate in it", path.display()));
    }
    Ok(certs)
}

impl Tls {
    /// Loads the files for a listener speaking `alpn` (`h2` for gRPC, `http/1.1` for HTTP);
    /// an error names the file and what is wrong with it.
    pub fn load(files: &TlsFiles, alpn: &[&[u8]]) -> Result<Arc<Tls>, String> {
        let alpn: Vec<Vec<u8>> = alpn.iter().map(|p| p.to_vec()).collect();
        let config = Self::build(files, &alpn)?;
        Ok(Arc::new(Tls {
            files: files.clone(),
            alpn,
            config: RwLock::new(config),
            stamp: Mutex::new(Self::stamps(files)),
        }))
    }

    fn stamps(files: &TlsFiles) -> Vec<Option<SystemTime>> {
        [Some(&files.cert), Some(&files.key), files.client_ca.as_ref()]
            .into_iter()
            .flatten()
            .map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
            .collect()
    }

    fn build(files: &TlsFiles, alpn: &[Vec<u8>]) -> Result<Arc<rustls::ServerConfig>, String> {
        let certs = read_certs(&files.cert, "--tls-cert")?;
        let key = PrivateKeyDer::from_pem_file(&files.key)
            .map_err(|e| format!("--tls-key {}: {e}", files.key.display()))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?;
        let builder = match &files.client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for c in read_certs(ca, "--tls-client-ca")? {
                    roots.add(c).map_err(|e| format!("--tls-client-ca {}: {e}", ca.display()))?;
                }
                let verifier =
                    rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .build()
                        .map_err(|e| format!("--tls-client-ca {}: {e}", ca.display()))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder
            .with_single_cert(certs, key)
            .map_err(|e| format!("--tls-cert and --tls-key do not make a usable pair: {e}"))?;
        config.alpn_protocols = alpn.to_vec();
        Ok(Arc::new(config))
    }

    /// The configuration for the next handshake.
    fn current(&self) -> Arc<rustls::ServerConfig> {
        self.config.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Reads the files again if any changed; says whether the new ones are in use.
    pub fn reload_if_changed(&self) -> bool {
        let now = Self::stamps(&self.files);
        let mut stamp = self.stamp.lock().unwrap_or_else(PoisonError::into_inner);
        if *stamp == now {
            return false;
        }
        *stamp = now;
        match Self::build(&self.files, &self.alpn) {
            Ok(config) => {
                *self.config.write().unwrap_or_else(PoisonError::into_inner) = config;
                tracing::info!(cert = %self.files.cert.display(), "TLS certificate files changed; new connections use them");
                true
            }
            Err(e) => {
                tracing::error!(error = %e, "TLS certificate files changed but cannot be used; keeping the previous ones");
                false
            }
        }
    }
}

/// The common name in a DER certificate's subject.
fn common_name(der: &[u8]) -> Option<Arc<str>> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let cn = cert.subject().iter_common_name().next()?.as_str().ok()?;
    Some(Arc::from(cn))
}

/// Connections accepted on one listener, for the gRPC server (as a stream) or the HTTP
/// server (as an axum listener).
pub struct Incoming {
    rx: mpsc::Receiver<Conn>,
    local: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Incoming {
    fn drop(&mut self) {
        // The accept loop holds the listening socket: stop it, so the port is free.
        self.task.abort();
    }
}

impl Incoming {
    /// Starts accepting on `listener` under `limits`, with TLS when `tls` is given. For the
    /// gRPC listener, `grpc_writes` counts its connections' writes (and they take no vectored
    /// writes, see [`SliceAnswers`]).
    pub fn start(
        listener: TcpListener,
        tls: Option<Arc<Tls>>,
        limits: Limits,
        grpc_writes: Option<Arc<AtomicU64>>,
    ) -> std::io::Result<Incoming> {
        let local = listener.local_addr()?;
        let (tx, rx) = mpsc::channel(1024);
        // The HTTP port (the one whose writes are not counted) keeps places for its probes.
        let reserve =
            grpc_writes.is_none().then(|| Arc::new(Semaphore::new(crate::front::conn::HEALTH_RESERVE)));
        let task = tokio::spawn(accept_loop(listener, tls, limits, grpc_writes, reserve, tx));
        Ok(Incoming { rx, local, task })
    }

    /// The next connection, or `None` once the listener has stopped.
    pub async fn next(&mut self) -> Option<Conn> {
        self.rx.recv().await
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }
}

/// As a stream of connections, for tonic.
impl tokio_stream::Stream for Incoming {
    type Item = Result<Conn, std::io::Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().rx.poll_recv(cx).map(|c| c.map(Ok))
    }
}

impl axum::serve::Listener for Incoming {
    type Io = Conn;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Conn, SocketAddr) {
        match self.next().await {
            Some(c) => {
                let addr = c.peer.addr;
                (c, addr)
            }
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.local)
    }
}

/// Where an accepted connection stands under the cap.
enum Place {
    /// A place of its own.
    Taken(OwnedSemaphorePermit),
    /// Idle connections were closed for it: it waits (holding a waiter's place) for one's.
    Waiting(OwnedSemaphorePermit),
    /// A place kept for the health probes.
    Health(OwnedSemaphorePermit),
}

/// The connection's place, once it has one: a waiter waits for a connection's place to free
/// within [`ROOM_WAIT`](crate::front::conn::ROOM_WAIT), then takes a probe's if one is kept;
/// `None` when there is none. Says too whether the place is a probe's.
async fn settle(
    place: Place,
    permits: Arc<Semaphore>,
    reserve: Option<Arc<Semaphore>>,
) -> Option<(OwnedSemaphorePermit, bool)> {
    match place {
        Place::Taken(p) => Some((p, false)),
        Place::Health(p) => Some((p, true)),
        Place::Waiting(waiter) => {
            let room = tokio::time::timeout(crate::front::conn::ROOM_WAIT, permits.acquire_owned()).await;
            drop(waiter);
            match room {
                Ok(Ok(p)) => Some((p, false)),
                _ => reserve.and_then(|r| r.try_acquire_owned().ok()).map(|p| (p, true)),
            }
        }
    }
}

/// The connection's stream, through TLS when it is configured, with the client certificate's
/// name; `None` (and `complain` told why) when the handshake fails or takes too long.
async fn handshake(
    tcp: tokio::net::TcpStream,
    tls: Option<Arc<Tls>>,
    complain: impl Fn(&dyn std::fmt::Display),
) -> Option<(Io, Option<Arc<str>>)> {
    match tls {
        None => Some((Io::Plain(tcp), None)),
        Some(tls) => {
            let handshake = tokio_rustls::TlsAcceptor::from(tls.current()).accept(tcp);
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
                Ok(Ok(stream)) => {
                    let name = stream
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|c| c.first())
                        .and_then(|c| common_name(c.as_ref()));
                    Some((Io::Tls(Box::new(stream)), name))
                }
                Ok(Err(e)) => {
                    complain(&e);
                    None
                }
                Err(_) => {
                    complain(&"timed out");
                    None
                }
            }
        }
    }
}

/// Where a new connection goes: a place of its own; else, once the registry made room by
/// closing idle connections, a wait for one; else a health probe's reserved place. `None`
/// when there is none.
fn place(
    permits: &Arc<Semaphore>,
    waiters: &Arc<Semaphore>,
    registry: &mut crate::front::conn::Registry,
    reserve: Option<&Arc<Semaphore>>,
) -> Option<Place> {
    if let Ok(permit) = permits.clone().try_acquire_owned() {
        return Some(Place::Taken(permit));
    }
    let made = registry.make_room(8);
    if let Some(waiter) = (made > 0).then(|| waiters.clone().try_acquire_owned().ok()).flatten() {
        return Some(Place::Waiting(waiter));
    }
    reserve.and_then(|r| r.clone().try_acquire_owned().ok()).map(Place::Health)
}

/// Logs a failed TLS handshake from `addr`: an operator should hear of refused clients, but of
/// a flood of them only once in a while.
fn log_failed_handshake(
    failed: &Mutex<crate::front::conn::LogLimit>,
    addr: std::net::SocketAddr,
    why: &dyn std::fmt::Display,
) {
    if failed.lock().unwrap_or_else(PoisonError::into_inner).due() {
        tracing::warn!(%addr, error = %why, "TLS handshake failed (such failures are logged at most every 10 s)");
    } else {
        tracing::debug!(%addr, error = %why, "TLS handshake failed");
    }
}

async fn accept_loop(
    listener: TcpListener,
    tls: Option<Arc<Tls>>,
    limits: Limits,
    grpc_writes: Option<Arc<AtomicU64>>,
    reserve: Option<Arc<Semaphore>>,
    tx: mpsc::Sender<Conn>,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let waiters = Arc::new(Semaphore::new(crate::front::conn::ROOM_WAITERS));
    let mut registry = crate::front::conn::Registry::default();
    let mut log = crate::front::conn::LogLimit::default();
    let failed_handshakes = Arc::new(Mutex::new(crate::front::conn::LogLimit::default()));
    let mut refused = 0u64;
    loop {
        let (tcp, addr) = match listener.accept().await {
            Ok(a) => a,
            Err(e) => {
                // Out of descriptors, say: wait before trying again rather than spin.
                if log.due() {
                    tracing::error!(error = %e, "cannot accept connections; trying again shortly");
                }
                tokio::time::sleep(crate::front::conn::ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let Some(place) = place(&permits, &waiters, &mut registry, reserve.as_ref()) else {
            // Closed at once: the clients already connected keep their service.
            drop(tcp);
            refused += 1;
            if log.due() {
                let max = limits.max_connections;
                tracing::warn!(max, refused, "connection limit reached: closing new connections");
            }
            continue;
        };
        let activity = registry.add();
        let (permits, reserve) = (permits.clone(), reserve.clone());
        let _ = tcp.set_nodelay(true);
        let (tx, tls, failed, grpc_writes) =
            (tx.clone(), tls.clone(), failed_handshakes.clone(), grpc_writes.clone());
        let complain = move |why: &dyn std::fmt::Display| log_failed_handshake(&failed, addr, why);
        tokio::spawn(async move {
            let Some((permit, health_only)) = settle(place, permits, reserve).await else { return };
            let Some((io, cert_name)) = handshake(tcp, tls, complain).await else { return };
            let tls = matches!(io, Io::Tls(_));
            let peer = Peer {
                addr,
                cert_name,
                tls,
                budget: Arc::new(Budget::new(limits.max_requests_per_s)),
                health_only,
            };
            // A probe's place is let go soon: it is there for a probe, not for keeping.
            let idle = if health_only {
                crate::front::conn::PRESSURE_IDLE.min(limits.idle_timeout)
            } else {
                limits.idle_timeout
            };
            let io = Guarded::registered(io, permit, idle, activity);
            let _ = tx.send(Conn { io, grpc_writes, batch: Batch::Unknown, peer }).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// An accepted connection and the client's end of it.
    async fn accepted() -> (Conn, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let client = TcpStream::connect(addr).await.expect("connect");
        let (stream, peer) = listener.accept().await.expect("accept");
        let permit = Arc::new(tokio::sync::Semaphore::new(1)).try_acquire_owned().expect("a permit");
        let peer = Peer {
            addr: peer,
            cert_name: None,
            tls: false,
            budget: Arc::new(Budget::new(10)),
            health_only: false,
        };
        let io = Guarded::new(Io::Plain(stream), permit, Duration::from_secs(10));
        (Conn { io, grpc_writes: None, batch: Batch::Unknown, peer }, client)
    }

    /// Counts its wakes.
    #[derive(Default)]
    struct Wakes(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Reads what the client sent first, then writes `b"answer"` twice, polling by hand:
    /// whether each write went at once, and the wakes of the connection's task.
    async fn first_writes(first: &[u8]) -> (Vec<bool>, usize) {
        let (mut conn, mut client) = accepted().await;
        client.write_all(first).await.expect("send");
        let mut got = vec![0u8; first.len()];
        conn.read_exact(&mut got).await.expect("read");
        let wakes = Arc::new(Wakes::default());
        let waker = std::task::Waker::from(wakes.clone());
        let mut cx = Context::from_waker(&waker);
        let mut at_once = Vec::new();
        let mut written = 0;
        while written < 2 {
            match Pin::new(&mut conn).poll_write(&mut cx, b"answer") {
                Poll::Ready(n) => {
                    assert_eq!(n.expect("write"), 6);
                    at_once.push(true);
                    written += 1;
                }
                Poll::Pending => at_once.push(false),
            }
        }
        (at_once, wakes.0.load(Ordering::Relaxed))
    }

    /// An HTTP/2 connection steps aside once before each write (and wakes itself to come
    /// back), so that the answers of the requests read with it join the write; an HTTP/1.1
    /// one writes at once.
    #[tokio::test]
    async fn http2_connections_batch_their_writes_and_http1_ones_do_not() {
        let (h2, h2_wakes) = first_writes(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await;
        assert_eq!(h2, [false, true, false, true]);
        assert_eq!(h2_wakes, 2, "woken for each step aside");
        let (h1, h1_wakes) = first_writes(b"POST /v1/check HTTP/1.1\r\nhost: x\r\n\r\n").await;
        assert_eq!(h1, [true, true]);
        assert_eq!(h1_wakes, 0);
    }

    /// Every layer of an accepted connection passes vectored writes through (see
    /// `conn::Guarded`): a response's frames go out in one system call.
    #[tokio::test]
    async fn an_accepted_connection_writes_vectored() {
        let (mut conn, mut client) = accepted().await;
        assert!(conn.is_write_vectored());
        let parts = [std::io::IoSlice::new(b"head"), std::io::IoSlice::new(b"payload")];
        assert_eq!(conn.write_vectored(&parts).await.expect("write"), 11, "both parts in one call");
        let mut got = [0u8; 11];
        client.read_exact(&mut got).await.expect("read");
        assert_eq!(&got, b"headpayload");
    }
}

//! Tollgate's controller server: the core pipeline behind gRPC (admission exchanges, backend
//! reports, administration) and HTTP (Prometheus metrics, health, status), with settings
//! kept durably in an embedded database.
//!
//! [`Server::bind`] opens the store and binds both listeners (port 0 picks a free port, as
//! tests do); [`Server::run`] serves until the shutdown future completes.

pub mod controller;
pub mod convert;
pub mod grpc;
pub mod http;
pub mod store;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tollgate_core::time::{Nanos, duration_nanos};
use tollgate_proto::v1::{
    admin_server::AdminServer, admission_server::AdmissionServer, backend_server::BackendServer,
};

use crate::controller::Controller;
use crate::store::{Store, StoreError};

/// Where and how to serve.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// The data directory (settings database).
    pub data: PathBuf,
    /// The gRPC listen address.
    pub grpc: SocketAddr,
    /// The HTTP listen address.
    pub http: SocketAddr,
    /// The pipeline's tick, which is also the exchange period clients are asked to keep.
    pub tick: Duration,
    /// How long a grant holds without renewal; past it clients enter safe mode.
    pub lease: Duration,
    /// How many of the worst zones saturation limiting ignores (FoundationDB: 1).
    pub ignore_worst_zones: usize,
    /// Units/s a group must put on a backend for that backend to limit it.
    pub limiting_threshold: f64,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            data: PathBuf::from("tollgate-data"),
            grpc: SocketAddr::from(([127, 0, 0, 1], 7460)),
            http: SocketAddr::from(([127, 0, 0, 1], 7461)),
            tick: Duration::from_secs(1),
            lease: Duration::from_secs(10),
            ignore_worst_zones: 1,
            limiting_threshold: 409_600.0,
        }
    }
}

/// Why the server could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The settings store.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A listener could not be bound.
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind {
        /// gRPC or HTTP.
        what: &'static str,
        /// The address.
        addr: SocketAddr,
        /// What the system said.
        source: std::io::Error,
    },
    /// Serving failed.
    #[error("{0}")]
    Serve(String),
}

/// The server's clock: tokio's, counted from the server's start.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    origin: tokio::time::Instant,
}

impl Clock {
    fn new() -> Self {
        #[allow(clippy::disallowed_methods)] // the server's edge: tokio time only
        let origin = tokio::time::Instant::now();
        Self { origin }
    }

    /// Now, as the pipeline sees it.
    pub fn now(&self) -> Nanos {
        #[allow(clippy::disallowed_methods)]
        let now = tokio::time::Instant::now();
        Nanos(duration_nanos(now.duration_since(self.origin)))
    }
}

/// A server with its store open and its listeners bound.
pub struct Server {
    controller: Arc<Controller>,
    grpc: tokio::net::TcpListener,
    http: tokio::net::TcpListener,
    clock: Clock,
}

impl Server {
    /// Opens the store and binds both listeners.
    pub async fn bind(opts: &ServerOptions) -> Result<Server, ServerError> {
        let store = Store::open(&opts.data)?;
        let controller = Arc::new(Controller::new(store, opts)?);
        let grpc = tokio::net::TcpListener::bind(opts.grpc).await.map_err(|source| ServerError::Bind {
            what: "gRPC",
            addr: opts.grpc,
            source,
        })?;
        let http = tokio::net::TcpListener::bind(opts.http).await.map_err(|source| ServerError::Bind {
            what: "HTTP",
            addr: opts.http,
            source,
        })?;
        Ok(Server { controller, grpc, http, clock: Clock::new() })
    }

    /// The bound gRPC address.
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc.local_addr().expect("a bound listener has an address")
    }

    /// The bound HTTP address.
    pub fn http_addr(&self) -> SocketAddr {
        self.http.local_addr().expect("a bound listener has an address")
    }

    /// Serves until `shutdown` completes, then stops accepting and returns.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<(), ServerError> {
        let Server { controller, grpc, http, clock } = self;
        let latency = Arc::new(http::Latency::default());
        let services = grpc::Services { controller: controller.clone(), clock, latency: latency.clone() };
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);

        let ticker = {
            let controller = controller.clone();
            let mut stop = stop_rx.clone();
            tokio::spawn(async move {
                let mut interval = tokio::time::interval(controller.tick_period());
                interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = interval.tick() => controller.tick(clock.now()),
                        _ = stop.changed() => return,
                    }
                }
            })
        };
        let waiter = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|stopped| *stopped).await;
        };
        let http_server = axum::serve(http, http::router(controller.clone(), latency))
            .with_graceful_shutdown(waiter(stop_rx.clone()));
        let grpc_server = tonic::transport::Server::builder()
            .add_service(AdmissionServer::new(services.clone()))
            .add_service(BackendServer::new(services.clone()))
            .add_service(AdminServer::new(services))
            .serve_with_incoming_shutdown(tonic::transport::server::TcpIncoming::from(grpc), waiter(stop_rx));
        tokio::spawn(async move {
            shutdown.await;
            let _ = stop_tx.send(true);
        });
        let (g, h) = tokio::join!(grpc_server, http_server);
        let _ = ticker.await;
        g.map_err(|e| ServerError::Serve(format!("gRPC: {e}")))?;
        h.map_err(|e| ServerError::Serve(format!("HTTP: {e}")))?;
        Ok(())
    }
}

/// Completes on SIGINT (Ctrl-C) or SIGTERM.
pub async fn shutdown_signal() {
    let interrupt = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {}
        () = terminate => {}
    }
}

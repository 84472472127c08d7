//! Tollgate's controller server: the core engine behind gRPC (admission exchanges, backend
//! reports, administration) and HTTP (Prometheus metrics, health, status), with settings
//! kept durably in an embedded database.
//!
//! [`Server::bind`] opens the store and binds both listeners (port 0 picks a free port, as
//! tests do); [`Server::run`] serves until the shutdown future completes. [`serve`] takes any
//! stream of incoming connections instead (a simulated network in tests, in the manner of
//! turmoil), with the same controller and background work.
//!
//! **Layers**, each a folder, calls going one way (down):
//!
//! ```text
//! front      gRPC, HTTP API and schema, RLS, RLQS, dashboard, listeners    (callers reach it)
//! settings   followed files, imports of other systems' configurations
//! observe    metrics, status, history, trace, process, memory              (reads only)
//! cluster    election, shard map and routing, regions, upstream lease
//! access     credentials, roles, audit
//! controller the engine behind a lock, its ticks, flushes and settings
//! store      the embedded file, etcd, memory
//! ```
//!
//! A front end calls any layer below it; the cluster calls the controller and the store
//! (and other controllers' front ends over the network, never its own); the controller calls
//! the store, and reaches up only to two leaves: the trace buffer it writes into
//! (`observe::trace`) and the JSON form of settings its audit records take (`front::json`);
//! the store calls nothing of the server's. `Node` ties one of each together.

mod access;
pub mod blocking;
mod clock;
pub mod cluster;
mod controller;
mod error;
pub mod front;
mod node;
pub mod observe;
mod pace;
pub mod settings;
pub use tollgate_proto::convert;
mod options;
pub mod store;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio_stream::Stream;
use tollgate_proto::v1::admin_server::AdminServer;
use tonic::transport::server::Connected;

use crate::access::auth;
pub use crate::access::auth::{Caller, Credential, NewCredential, Refused};
pub use crate::access::credentials::Access;
pub use crate::clock::{Clock, wall_ms};
use crate::cluster::shard_routing;
use crate::cluster::upstream_lease::{self, Global};
#[cfg(feature = "etcd")]
use crate::cluster::{election, shard_map};
pub use crate::controller::{
    Admin, Controller, DIAGNOSTICS_SHOWN_MAX, ExchangeAnswer, Ownership, Pacer, PutMode, QUOTA_WRITE_EVERY,
    Readings, SETTINGS_WATCHERS_MAX, Writes,
};
pub use crate::error::AdminError;
pub use crate::front::rlqs::RlqsStats;
pub use crate::front::rls::RlsRules;
use crate::front::{conn, direct, grpc, guard, holds, http, inline, listen, loading, rlqs, rls};
pub use crate::node::Node;
use crate::observe::status::Latency;
pub use crate::observe::trace::{TRACE_SUBSCRIBERS_MAX, TraceLine, Tracer, Wanted};
use crate::observe::{history, memory};
pub use crate::options::{
    DEFAULT_ELECTION_LEASE, DEFAULT_ETCD_PREFIX, EtcdTarget, ServerOptions, UPSTREAM_URLS_MAX, Upstream,
    check_region,
};
use crate::settings::files;
use crate::store::{RedbStore, StoreError};

/// Why the server could not start or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
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
    /// A TLS file cannot be used.
    #[error("TLS: {0}")]
    Tls(String),
    /// The first admin token could not be made or written.
    #[error("--auth: {0}")]
    Auth(String),
    /// Another live controller advertises the same address.
    #[error("another controller advertises {0}; give each controller its own --advertise")]
    AdvertisedTwice(String),
}

/// A server with its store open and its listeners bound.
pub struct Server {
    node: Node,
    grpc: tokio::net::TcpListener,
    http: listen::Incoming,
    /// TLS for gRPC and for HTTP (the same files, each listener its own protocol).
    tls: TlsPair,
    allowed_names: Vec<String>,
    /// With `--auth` and no admin token yet: where the first one was written.
    first_token: Option<std::path::PathBuf>,
    clock: Clock,
    flush_interval: Duration,
    limits: conn::Limits,
    etcd: EtcdFollow,
    /// With an election: where it is held, the address advertised, and the election lease.
    election: Option<(EtcdTarget, String, Duration)>,
    /// The region this controller serves (`None`: the global tier), and where it reaches the
    /// global tier when not on its etcd.
    region: Option<(String, Option<Upstream>)>,
}

/// With settings in etcd: where, and the revision they were read at.
type EtcdFollow = Option<(EtcdTarget, i64)>;

/// Opens the settings store the options name: etcd, or the file in the data directory.
fn open_store(opts: &ServerOptions) -> Result<(Box<dyn store::SettingsStore>, EtcdFollow), StoreError> {
    match &opts.etcd {
        None => Ok((Box::new(RedbStore::open(&opts.data)?), None)),
        #[cfg(feature = "etcd")]
        Some(target) => {
            let mut store = store::etcd::EtcdStore::connect(target.clone())?;
            store::SettingsStore::load(&mut store)?;
            let revision = store.revision();
            Ok((Box::new(store), Some((target.clone(), revision))))
        }
        #[cfg(not(feature = "etcd"))]
        Some(target) => Err(StoreError::Etcd {
            target: target.describe(),
            reason: "this tollgate was built without etcd support; build it with \
                     `cargo build --release -p tollgate-cli --features etcd` (needs protoc)"
                .into(),
        }),
    }
}

/// Writes the groups and node settings of `--config` the store does not hold yet.
fn apply_defaults(
    store: &mut dyn store::SettingsStore,
    config: &tollgate_model::config::Config,
) -> Result<(), ServerError> {
    let done = store::apply_defaults(store, config)?;
    let names = |v: &[tollgate_model::settings::GroupName]| {
        v.iter().map(|n| n.as_str()).collect::<Vec<_>>().join(", ")
    };
    tracing::info!(
        added = %names(&done.added),
        kept = %names(&done.kept),
        node = if done.node { "written" } else { "kept as stored" },
        "defaults from --config applied where the store held none"
    );
    Ok(())
}

/// The first admin token, where calls need one: written to the data directory when no
/// admin token is live, or the one given with `--admin-token-file` made live.
fn first_token(access: &Access, opts: &ServerOptions) -> Result<Option<std::path::PathBuf>, ServerError> {
    Ok(match (opts.auth, &opts.admin_token) {
        (false, _) => None,
        (true, None) => write_first_token(access, &opts.data)?,
        (true, Some(given)) => {
            let taken =
                access.ensure_admin_token(Some(given)).map_err(|e| ServerError::Auth(e.to_string()))?;
            if taken.is_some() {
                tracing::info!("no admin token was live: the one given (--admin-token-file) is now");
            }
            None
        }
    })
}

/// Makes `node` a candidate in the election on `target`: its advertised address (checked
/// free), its shards and its peer credentials; nobody is served until the election says who
/// leads. Returns the election's target, the address and the lease.
async fn join_election(
    node: &Node,
    target: &crate::store::target::EtcdTarget,
    grpc: &tokio::net::TcpListener,
    clock: Clock,
    opts: &ServerOptions,
) -> Result<(crate::store::target::EtcdTarget, String, Duration), ServerError> {
    let local = grpc.local_addr().map_err(|e| ServerError::Serve(e.to_string()))?;
    let scheme = if opts.tls.is_some() { "https" } else { "http" };
    let advertise = opts.advertise.clone().unwrap_or_else(|| format!("{scheme}://{local}"));
    // A region's controllers elect their own leader, apart from the global tier's.
    let target = match &opts.region {
        Some(region) => target.region(region),
        None => target.clone(),
    };
    wait_for_address(&target, &advertise, opts.election_lease).await?;
    check_shards(&target, opts.shards).await?;
    if let Some(n) = opts.shards {
        node.cluster.set_sharding(Arc::new(shard_routing::Sharding::new(advertise.clone(), n)));
    }
    let access = peer_access(&node.access, &advertise, opts)?;
    node.cluster.link().set_peer(cluster::role::Peer { advertise: advertise.clone(), access });
    // Nobody is served until the election says who leads.
    node.cluster
        .set_role(clock.now(), cluster::role::RoleView { role: cluster::role::Role::Follower, leader: None });
    Ok((target, advertise, opts.election_lease))
}

impl Server {
    /// Opens the store and binds both listeners.
    pub async fn bind(opts: &ServerOptions) -> Result<Server, ServerError> {
        check_region_options(opts)?;
        // The ports first: a port in use stops the start before anything is written (no data
        // directory or file is made for a server that cannot serve).
        let (grpc, http, tls) = bind_ports(opts).await?;
        let http = listen::Incoming::start(http, tls.as_ref().map(|(_, h)| h.clone()), opts.limits, None)
            .map_err(|e| ServerError::Serve(e.to_string()))?;
        let loading = loading::Loading::start(http);
        let opened = {
            let opts = opts.clone();
            crate::blocking::spawn(move || open_store(&opts))
                .await
                .map_err(|e| ServerError::Serve(format!("opening the store: {e}")))?
        };
        let (mut store, etcd) = opened?;
        if let Some(config) = &opts.defaults {
            apply_defaults(store.as_mut(), config)?;
        }
        let clock = Clock::new();
        let settings = opts.engine_settings();
        let mut node = crate::blocking::spawn(move || Node::open(store, settings, clock.now(), wall_ms()))
            .await
            .map_err(|e| ServerError::Serve(format!("loading the store: {e}")))??;
        let at_start = opts.defaults_text.as_deref().zip(opts.defaults.clone());
        node.files = Arc::new(files::Files::new(opts.follow.clone(), at_start));
        // Import files apply at once; a settings file's changes from here on.
        let n = node.clone();
        crate::blocking::spawn(move || n.files.check(n.file_parts(), false))
            .await
            .map_err(|e| ServerError::Serve(format!("reading the settings files: {e}")))?;
        node.access.require_auth(opts.auth);
        node.controller.admin().set_cost_model(opts.cost_model);
        node.controller.admin().log_warnings();
        let first_token = first_token(&node.access, opts)?;
        let election = match &etcd {
            None => None,
            Some((target, _)) => Some(join_election(&node, target, &grpc, clock, opts).await?),
        };
        if let Some(region) = &opts.region {
            node.controller.ownership().set_regional();
            if opts.upstream.is_some() {
                node.controller.admin().copy_groups_by(cluster::upstream_settings::copier(region));
            }
        }
        let http = loading.finish().await;
        Ok(Server {
            node,
            grpc,
            http,
            tls,
            allowed_names: opts.tls.as_ref().map(|t| t.allowed_names.clone()).unwrap_or_default(),
            first_token,
            clock,
            flush_interval: opts.flush_interval,
            limits: opts.limits,
            etcd,
            election,
            region: opts.region.clone().map(|r| (r, opts.upstream.clone())),
        })
    }

    /// The bound gRPC address.
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc.local_addr().expect("a bound listener has an address")
    }

    /// The bound HTTP address.
    pub fn http_addr(&self) -> SocketAddr {
        self.http.local_addr()
    }

    /// With `--auth`, when this start made the first admin token: the file it is in.
    pub fn first_token_file(&self) -> Option<&std::path::Path> {
        self.first_token.as_deref()
    }

    /// Serves until `shutdown` completes, then stops accepting, writes consumption to the
    /// store and returns.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<(), ServerError> {
        let Server {
            node,
            grpc,
            http,
            tls,
            allowed_names,
            first_token: _,
            clock,
            flush_interval,
            limits,
            etcd,
            election,
            region,
        } = self;
        // A region on the global tier's etcd finds it there; one with a store of its own, at
        // its URLs.
        let (on_etcd, upstream) = match region {
            Some((name, None)) => (Some(name), None),
            Some((name, Some(up))) => (None, Some((name, up))),
            None => (None, None),
        };
        let upstream = upstream
            .map(|(name, up)| tokio::spawn(upstream_lease::run(node.clone(), Global::Urls(up), name, clock)));
        #[cfg(feature = "etcd")]
        let following =
            etcd.map(|(target, revision)| etcd_tasks(&node, clock, (target, revision), election, on_etcd));
        #[cfg(not(feature = "etcd"))]
        let _ = (etcd, election, on_etcd);
        let reload = tls.clone().map(|(g, h)| {
            tokio::spawn(async move {
                let mut every = tokio::time::interval(listen::RELOAD_EVERY);
                loop {
                    every.tick().await;
                    g.reload_if_changed();
                    h.reload_if_changed();
                }
            })
        });
        // The HTTP port has answered since the start (`loading`); the gRPC port from here on.
        let grpc_tls = tls.map(|(g, _)| g);
        let incoming =
            listen::Incoming::start(grpc, grpc_tls, limits, Some(node.controller.grpc_write_counter()))
                .map_err(|e| ServerError::Serve(e.to_string()))?;
        let front = guard::Front {
            allowed_names: Arc::new(allowed_names),
            max_streams: limits.max_streams,
            metrics_groups: limits.metrics_groups,
            charge_bound: limits.charge_bound,
        };
        let served = serve(node, clock, flush_interval, incoming, Some(http), front, shutdown).await;
        if let Some(r) = reload {
            r.abort();
        }
        if let Some(u) = upstream {
            u.abort();
        }
        #[cfg(feature = "etcd")]
        if let Some((follow, elect, lease)) = following {
            follow.abort();
            for task in elect.into_iter().chain(lease) {
                task.abort();
            }
        }
        served
    }
}

/// How a controller on etcd calls the leader while it follows. With `--auth`, a client token of
/// its own for every group, named after its address ([`auth::peer_token_name`]); the one an
/// earlier start made is revoked first, so a controller holds one whatever its restarts.
/// With TLS, the authority in `--tls-peer-ca` (else `--tls-client-ca`, else the system's) and,
/// for a leader that asks for client certificates, this controller's own certificate.
fn peer_access(
    access: &access::credentials::Access,
    advertise: &str,
    opts: &ServerOptions,
) -> Result<tollgate_limiter::access::Access, ServerError> {
    let mut peer = tollgate_limiter::access::Access::default();
    if opts.auth {
        let name = auth::peer_token_name(advertise);
        for old in access.tokens().into_iter().filter(|c| c.name == name) {
            access.revoke_token(&old.id, &name).map_err(|e| ServerError::Auth(e.to_string()))?;
        }
        let (_, token) = access.create_peer_token(&name).map_err(|e| ServerError::Auth(e.to_string()))?;
        peer.token = Some(token);
    }
    if let Some(tls) = &opts.tls {
        peer.ca_file = tls.peer_ca.clone().or_else(|| tls.client_ca.clone());
        if tls.client_ca.is_some() {
            peer.identity = Some((tls.cert.clone(), tls.key.clone()));
        }
        // Read now: a file that cannot be used is an error at the start, not at a failover.
        if advertise.starts_with("https://") {
            peer.endpoint(advertise).map_err(|e| ServerError::Tls(format!("calling the leader: {e}")))?;
        }
    }
    Ok(peer)
}

/// The file the first admin token is written to, in the data directory.
pub const FIRST_TOKEN_FILE: &str = "admin.token";

/// With `--auth` and no admin token that has not expired: makes one and writes it to
/// `DATA/admin.token`, readable by its owner only; returns the file.
fn write_first_token(
    access: &Access,
    data: &std::path::Path,
) -> Result<Option<std::path::PathBuf>, ServerError> {
    let Some(token) = access.ensure_admin_token(None).map_err(|e| ServerError::Auth(e.to_string()))? else {
        return Ok(None);
    };
    let path = data.join(FIRST_TOKEN_FILE);
    let write = || -> std::io::Result<()> {
        std::fs::create_dir_all(data)?;
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = options.open(&path)?;
        #[cfg(unix)]
        file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
        std::io::Write::write_all(&mut file, format!("{token}\n").as_bytes())?;
        file.sync_all()
    };
    write().map_err(|e| {
        ServerError::Auth(format!(
            "the first admin token was made but cannot be written to {}: {e}; \
             revoke it (tollgate token list) after starting once more without --auth",
            path.display()
        ))
    })?;
    Ok(Some(path))
}

/// A region's options: its name, and a way to the global tier (its etcd or `--upstream`).
fn check_region_options(opts: &ServerOptions) -> Result<(), ServerError> {
    if let Some(region) = &opts.region {
        options::check_region(region).map_err(ServerError::Serve)?;
        if opts.etcd.is_none() && opts.upstream.is_none() {
            return Err(ServerError::Serve(
                "--region: a region reaches the global tier through its etcd (--etcd) or at its URLs (--upstream); give one".into(),
            ));
        }
    }
    if let Some(up) = &opts.upstream {
        if opts.region.is_none() {
            return Err(ServerError::Serve(
                "--upstream: only for a region's controllers; give --region".into(),
            ));
        }
        up.check().map_err(ServerError::Serve)?;
    }
    Ok(())
}

/// TLS for gRPC and for HTTP: the same files, each listener its own protocol.
type TlsPair = Option<(Arc<listen::Tls>, Arc<listen::Tls>)>;

/// Binds the gRPC and HTTP ports and loads the TLS files, naming what failed.
async fn bind_ports(
    opts: &ServerOptions,
) -> Result<(tokio::net::TcpListener, tokio::net::TcpListener, TlsPair), ServerError> {
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
    let tls = match &opts.tls {
        None => None,
        Some(files) => Some((
            listen::Tls::load(files, &[b"h2"]).map_err(ServerError::Tls)?,
            listen::Tls::load(files, &[b"http/1.1"]).map_err(ServerError::Tls)?,
        )),
    };
    Ok((grpc, http, tls))
}

/// The tasks a controller on etcd runs beside its serving: the settings followed, the
/// election, and the region's lease and the shard map's loops where they apply.
#[cfg(feature = "etcd")]
fn etcd_tasks(
    node: &Node,
    clock: Clock,
    (target, revision): (EtcdTarget, i64),
    election: Option<(EtcdTarget, String, Duration)>,
    region: Option<String>,
) -> (tokio::task::JoinHandle<()>, Option<tokio::task::JoinHandle<()>>, Vec<tokio::task::JoinHandle<()>>) {
    let elect = election.map(|(at, advertise, lease)| {
        tokio::spawn(election::run(at, advertise, lease, node.cluster.clone(), clock))
    });
    let lease = region
        .map(|r| tokio::spawn(upstream_lease::run(node.clone(), Global::Etcd(target.clone()), r, clock)));
    let sharded = node.cluster.sharding().cloned().map(|s| {
        [
            tokio::spawn(shard_map::follow(target.clone(), s.clone(), node.controller.clone(), clock)),
            tokio::spawn(shard_map::coordinate(target.clone(), node.cluster.clone(), s.clone())),
            tokio::spawn(shard_map::share_capacity(target.clone(), s, node.controller.clone())),
        ]
    });
    let lease: Vec<_> = lease.into_iter().chain(sharded.into_iter().flatten()).collect();
    (tokio::spawn(follow_etcd(node.clone(), target, revision)), elect, lease)
}

/// Waits, up to one election lease and a second, for no other live controller to advertise
/// `advertise` (one killed a moment ago still holds it until its lease ends).
#[cfg(feature = "etcd")]
async fn wait_for_address(target: &EtcdTarget, advertise: &str, lease: Duration) -> Result<(), ServerError> {
    const STEP: Duration = Duration::from_millis(200);
    let mut waits = (lease + Duration::from_secs(1)).as_millis() / STEP.as_millis();
    loop {
        match election::advertised_elsewhere(target, advertise).await {
            Ok(false) => return Ok(()),
            Ok(true) if waits > 0 => {
                waits -= 1;
                tokio::time::sleep(STEP).await;
            }
            Ok(true) => return Err(ServerError::AdvertisedTwice(advertise.to_string())),
            Err(e) => {
                return Err(ServerError::Store(StoreError::Etcd { target: target.describe(), reason: e }));
            }
        }
    }
}

/// Refuses a start whose `--shards` the map in etcd does not match.
#[cfg(feature = "etcd")]
async fn check_shards(target: &EtcdTarget, shards: Option<u16>) -> Result<(), ServerError> {
    shard_map::check(target, shards).await.map_err(ServerError::Serve)
}

#[cfg(not(feature = "etcd"))]
async fn check_shards(_: &EtcdTarget, _: Option<u16>) -> Result<(), ServerError> {
    Ok(())
}

#[cfg(not(feature = "etcd"))]
async fn wait_for_address(_: &EtcdTarget, _: &str, _: Duration) -> Result<(), ServerError> {
    Ok(())
}

/// Keeps the controller in step with the settings other controllers write to etcd: a watch
/// from the revision read at start; when it breaks, everything is read again (a change missed
/// meanwhile is caught up) and a new watch starts from there.
#[cfg(feature = "etcd")]
async fn follow_etcd(node: Node, target: EtcdTarget, mut revision: i64) {
    let apply = |n: &Node, change: store::etcd::StoredChange| match change {
        store::etcd::StoredChange::Group(name, settings) => {
            if n.controller.admin().sync_group(name.clone(), settings.map(|s| *s), wall_ms()) {
                tracing::info!(group = %name, "settings changed by another controller");
            }
        }
        store::etcd::StoredChange::Node(node) => {
            if n.controller.admin().sync_node(node) {
                tracing::info!("node settings changed by another controller");
            }
        }
        store::etcd::StoredChange::RlsRules(json) => {
            if n.rls_rules.sync(&json) {
                tracing::info!("RLS rules changed by another controller");
            }
        }
        store::etcd::StoredChange::Credential(id, record) => {
            if n.access.sync_credential(&id, record.as_deref()) {
                tracing::info!(%id, "a credential changed through another controller");
            }
        }
    };
    loop {
        let (reached, result) = store::etcd::watch(&target, revision, |change| apply(&node, change)).await;
        revision = reached;
        if let Err(e) = result {
            tracing::warn!(error = %e, "etcd watch broken; reading the settings again");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let t = target.clone();
        let reread = crate::blocking::spawn(move || {
            let mut s = store::etcd::EtcdStore::connect(t)?;
            let stored = store::SettingsStore::load(&mut s)?;
            Ok::<_, StoreError>((stored, s.revision()))
        })
        .await;
        match reread {
            Ok(Ok((stored, at))) => {
                let held: Vec<_> = node.controller.admin().groups().into_iter().map(|(n, _)| n).collect();
                for name in held {
                    if !stored.groups.contains_key(&name) {
                        apply(&node, store::etcd::StoredChange::Group(name, None));
                    }
                }
                for (name, settings) in stored.groups {
                    apply(&node, store::etcd::StoredChange::Group(name, Some(Box::new(settings))));
                }
                if stored.node_stored {
                    apply(&node, store::etcd::StoredChange::Node(stored.node));
                }
                if let Some(json) = stored.rls_rules {
                    apply(&node, store::etcd::StoredChange::RlsRules(json));
                }
                for held in node.access.tokens() {
                    if !stored.credentials.contains_key(&held.id) {
                        apply(&node, store::etcd::StoredChange::Credential(held.id.clone(), None));
                    }
                }
                for (id, record) in stored.credentials {
                    apply(&node, store::etcd::StoredChange::Credential(id, Some(record)));
                }
                revision = at;
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "etcd: settings not read; trying again"),
            Err(e) => tracing::warn!(error = %e, "etcd: settings not read; trying again"),
        }
    }
}

/// How often permits whose leases ran out are given back.
const HOLDS_SWEEP: Duration = Duration::from_millis(250);

/// Gives back the permits in `holds` whose leases ran out, until `stop` completes.
async fn expire_holds(holds: Arc<holds::Holds>, clock: Clock, stop: impl Future<Output = ()>) {
    let sweep = async {
        loop {
            tokio::time::sleep(HOLDS_SWEEP).await;
            let n = holds.expire(clock.now());
            if n > 0 {
                tracing::debug!(permits = n, "permits given back as their leases ran out");
            }
        }
    };
    tokio::select! {
        () = sweep => {}
        () = stop => {}
    }
}

/// Serves `node` over gRPC on `incoming` (any stream of connections: tokio's TCP, a
/// simulated network, in-memory pipes; wrap it in [`conn::Limited`] to cap and time out
/// connections) and, given a listener, over HTTP; runs its ticks and flushes until `shutdown`
/// completes, then writes consumption to the store once more.
pub async fn serve<I, IO, IE>(
    node: Node,
    clock: Clock,
    flush_interval: Duration,
    incoming: I,
    http: Option<listen::Incoming>,
    front: guard::Front,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError>
where
    I: Stream<Item = Result<IO, IE>>,
    IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
    IE: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let latency = Arc::new(Latency::default());
    let services = grpc::Services { node: node.clone(), clock, latency: latency.clone() };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let history = Arc::new(history::History::default());
    let background =
        tokio::spawn(background(node.clone(), history.clone(), clock, flush_interval, stop_rx.clone()));
    let waiter = until_stopped;
    tokio::spawn(follow_files(node.clone(), waiter(stop_rx.clone())));
    let http_front = front.clone();
    // Envoy's rate-limit service and `POST /v1/check`: one in-process client of the grants.
    // Permits held from admission until the work ends (HTTP's acquire, Envoy's request to its
    // stream's end), given back when their leases run out.
    let holds = Arc::new(holds::Holds::default());
    tokio::spawn(expire_holds(holds.clone(), clock, waiter(stop_rx.clone())));
    let (rls_front, rlqs_front) = envoy_fronts(&node, clock, holds.clone(), front.charge_bound);
    let gate = rls_front.gate().clone();
    let front_gate = gate.clone();
    let http_server = async {
        if let Some(listener) = http {
            let router = http::router(node.clone(), latency, history, clock, http_front, gate, holds);
            inline::serve_http(listener, router, waiter(stop_rx.clone())).await;
        }
    };
    let settings = inline::Settings {
        max_streams: (front.max_streams > 0).then_some(front.max_streams),
        max_header_list_bytes: conn::HEADERS_MAX_BYTES,
    };
    let routes = tonic::service::Routes::new(grpc::ExchangeFront::new(services.clone()))
        .add_service(grpc::ReportFront::new(services.clone()))
        .add_service(AdminServer::new(services))
        .add_service(rlqs_front)
        .prepare();
    let grpc_service = tower::ServiceBuilder::new()
        .layer(guard::GrpcGuardLayer { access: node.access.clone(), front })
        .layer(tower::layer::layer_fn(listen::SliceAnswers))
        .layer(direct::DirectRls::layer(rls_front))
        .service(routes);
    let grpc_server = inline::serve_grpc(incoming, grpc_service, settings, waiter(stop_rx.clone()));
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    tokio::join!(grpc_server, http_server);
    let _ = background.await;
    last_flush(&node, clock, &front_gate).await;
    Ok(())
}

/// Completes once `rx` says the server stops.
async fn until_stopped(mut rx: tokio::sync::watch::Receiver<bool>) {
    let _ = rx.wait_for(|stopped| *stopped).await;
}

/// Envoy's fronts: the rate-limit service (with `POST /v1/check`, one in-process client of
/// the grants) and the quota service (each stream a client of the grants).
fn envoy_fronts(
    node: &Node,
    clock: Clock,
    holds: Arc<holds::Holds>,
    charge_bound: front::charges::ChargeBound,
) -> (
    rls::Rls,
    envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaServiceServer<rlqs::Rlqs>,
){
    let rls = rls::Rls::start(
        node.controller.clone(),
        node.cluster.clone(),
        node.rls_rules.clone(),
        clock,
        holds,
        charge_bound,
    );
    let rlqs = rlqs::Rlqs::new(
        node.controller.clone(),
        node.cluster.clone(),
        node.rls_rules.clone(),
        clock,
        node.rlqs.clone(),
    );
    (rls, envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaServiceServer::new(rlqs))
}

/// At a clean stop: what the front ends' client counted since its last exchange is reported
/// (within a second), then consumption is written, so that none of it is lost.
async fn last_flush(node: &Node, clock: Clock, gate: &tollgate_limiter::Tollgate) {
    let _ = tokio::time::timeout(Duration::from_secs(1), gate.report_now()).await;
    if let Err(e) = node.flush(clock.now(), wall_ms()) {
        tracing::error!(error = %e, "could not write consumption at shutdown");
    }
}

/// Ticks the engine every tick (and once more between two, at once, when a backend's report
/// shows it newly saturated), samples the dashboard's history about once a second, and
/// writes consumption every flush interval.
async fn background(
    node: Node,
    history: Arc<history::History>,
    clock: Clock,
    flush_interval: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let controller = node.controller.clone();
    let mut ticks = tokio::time::interval(controller.pacer().tick_period());
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut flushes = tokio::time::interval(flush_interval);
    flushes.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    flushes.tick().await;
    let mut quota_writes = tokio::time::interval(QUOTA_WRITE_EVERY);
    quota_writes.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let flushing = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut ticker = Ticker {
        controller: controller.clone(),
        history,
        clock,
        give_back: memory::GiveBack::default(),
        sampling: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        sampled: None,
    };
    loop {
        tokio::select! {
            _ = ticks.tick() => ticker.tick(false).await,
            () = controller.pacer().saturation_onset() => {
                // Unless a regular tick took the report meanwhile, or one ran early already.
                if controller.pacer().take_early_tick() {
                    tracing::debug!("a backend is newly saturated: ticking before the tick's turn");
                    ticker.tick(true).await;
                }
            }
            _ = flushes.tick() => {
                let now = clock.now();
                write_beside(&node, &flushing, "consumption", move |n| n.flush(now, wall_ms()));
            }
            _ = quota_writes.tick() => {
                // A flush writes these meters too.
                write_beside(&node, &flushing, "the quota groups' consumption", |n| {
                    n.write_quota_meters(wall_ms()).map(drop)
                });
            }
            _ = stop.changed() => return,
        }
    }
}

/// Runs `write` (a write of `what` to the store) beside the ticks, never in their way: a write
/// waits for the disk or etcd, which may take seconds, and the grants must go on being
/// computed meanwhile. One write at a time (`busy`): a turn that finds one under way is
/// skipped, and what it would have written is written at the next.
fn write_beside(
    node: &Node,
    busy: &Arc<std::sync::atomic::AtomicBool>,
    what: &'static str,
    write: impl FnOnce(Node) -> Result<(), StoreError> + Send + 'static,
) {
    if busy.swap(true, std::sync::atomic::Ordering::AcqRel) {
        return;
    }
    let (n, busy) = (node.clone(), busy.clone());
    tokio::spawn(async move {
        match crate::blocking::spawn(move || write(n)).await {
            Ok(Err(e)) => tracing::warn!(error = %e, "could not write {what}; will try again"),
            Err(e) => tracing::warn!(error = %e, "could not write {what}; will try again"),
            Ok(Ok(())) => {}
        }
        busy.store(false, std::sync::atomic::Ordering::Release);
    });
}

/// What a tick needs beside the controller: the history it samples and the memory it gives
/// back.
struct Ticker {
    controller: Arc<Controller>,
    history: Arc<history::History>,
    clock: Clock,
    give_back: memory::GiveBack,
    sampling: Arc<std::sync::atomic::AtomicBool>,
    sampled: Option<tollgate_model::time::Nanos>,
}

impl Ticker {
    /// Runs a tick: at its turn, or `early`.
    async fn tick(&mut self, early: bool) {
        let controller = &self.controller;
        let now = self.clock.now();
        // On the blocking pool: a tick of many groups takes tens of milliseconds, in slices
        // between which the exchanges waiting go first, paced so that it takes a share of a
        // core rather than a whole one.
        let c = controller.clone();
        let mut pacer = pace::TickPacer::new(c.pacer().tick_period());
        let run = move || {
            if early {
                c.pacer().tick_early_paced(now, || pacer.pause());
            } else {
                c.pacer().tick_paced(now, || pacer.pause());
            }
            c.roll_short_windows(wall_ms());
        };
        if let Err(e) = crate::blocking::spawn(run).await {
            tracing::error!(error = %e, "a tick failed");
        }
        controller.pacer().set_tick_span(self.clock.now().since(now));
        // One sample a second at most, on the blocking pool (it reads every group), and never
        // two at once.
        if self.sampled.is_none_or(|at| now.since(at) >= Duration::from_millis(990))
            && !self.sampling.swap(true, std::sync::atomic::Ordering::AcqRel)
        {
            self.sampled = Some(now);
            let (c, h, busy) = (controller.clone(), self.history.clone(), self.sampling.clone());
            crate::blocking::spawn(move || {
                let capacity = c.admin().node().capacity;
                c.with_engine(|e| h.sample(e, capacity, wall_ms()));
                busy.store(false, std::sync::atomic::Ordering::Release);
            });
        }
        let (groups, clients) = controller.with_engine(|e| (e.tracked_groups(), e.clients()));
        if self.give_back.after_tick(groups + clients) {
            memory::release();
            tracing::debug!(groups, clients, "expired groups and clients forgotten; memory given back");
        }
    }
}

/// Follows the settings files for `node`: every [`files::LOOK_EVERY`] and on SIGHUP, until
/// `stop` resolves.
async fn follow_files(node: Node, stop: impl Future<Output = ()>) {
    if node.files.is_empty() {
        stop.await;
        return;
    }
    let mut hup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "cannot take SIGHUP: settings files are followed as they change only");
            None
        }
    };
    let mut every = tokio::time::interval(files::LOOK_EVERY);
    tokio::pin!(stop);
    loop {
        let hangup = async {
            match hup.as_mut() {
                Some(h) => h.recv().await,
                None => std::future::pending().await,
            }
        };
        let force = tokio::select! {
            _ = every.tick() => false,
            Some(()) = hangup => true,
            () = &mut stop => return,
        };
        let n = node.clone();
        if crate::blocking::spawn(move || n.files.check(n.file_parts(), force)).await.is_err() {
            tracing::error!("reading the settings files failed");
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_controller_calls_the_leader_with_one_token_of_its_own_whatever_its_restarts() {
        let store = Box::new(store::MemoryStore::default());
        let settings = tollgate_model::engine::EngineSettings::default();
        let node = Node::open(store, settings, tollgate_model::time::Nanos(0), 0).unwrap();
        let opts = ServerOptions { auth: true, ..ServerOptions::default() };
        let bearer = |a: &tollgate_limiter::access::Access| format!("Bearer {}", a.token.as_deref().unwrap());
        let first = peer_access(&node.access, "http://10.0.0.1:7460", &opts).unwrap();
        let again = peer_access(&node.access, "http://10.0.0.1:7460", &opts).unwrap();
        let _other = peer_access(&node.access, "http://10.0.0.2:7460", &opts).unwrap();
        // One token per address: a restart revokes the one it made before.
        let names: Vec<String> = node.access.tokens().iter().map(|c| c.name.clone()).collect();
        assert_eq!(names.len(), 2, "{names:?}");
        assert!(names.contains(&auth::peer_token_name("http://10.0.0.1:7460")));
        assert!(node.access.authenticate(Some(bearer(&first).as_bytes())).is_err());
        // A client of every group, with the unthrottled privilege the front ends have in process.
        let held = node.access.authenticate(Some(bearer(&again).as_bytes())).unwrap();
        assert_eq!(held.role, Ok(auth::Role::Client));
        assert!(held.allows_group("any-group") && held.unthrottled);
        // Without --auth, no token.
        assert!(
            peer_access(&node.access, "http://10.0.0.3:7460", &ServerOptions::default())
                .unwrap()
                .token
                .is_none()
        );
    }
}

//! How a server is started: addresses, the data directory, and the engine's knobs.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use tollgate_model::engine::{EngineSettings, SaturationSettings};

/// Where and how to serve.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// The data directory (settings database).
    pub data: PathBuf,
    /// The gRPC listen address.
    pub grpc: SocketAddr,
    /// The HTTP listen address.
    pub http: SocketAddr,
    /// The engine's tick, which is also the exchange period clients are asked to keep.
    pub tick: Duration,
    /// How long a grant holds without renewal; past it clients enter safe mode.
    pub lease: Duration,
    /// The cost model the clients price requests with: the server prices nothing itself, but
    /// status says what a unit counts by it.
    pub cost_model: tollgate_model::cost::CostModel,
    /// FoundationDB's saturation knobs: queue target and spring, limiting threshold, worst
    /// zones ignored.
    pub saturation: SaturationSettings,
    /// Folding time of the average-cost smoothers.
    pub cost_folding: Duration,
    /// Over how long remote clients take up a raised grant (TiDB's trickle).
    pub trickle: Duration,
    /// The most groups the engine tracks with their own state (`--max-groups`).
    pub max_groups: usize,
    /// How often consumption and resumable ramps are written to the store.
    pub flush_interval: Duration,
    /// The cap on gRPC connections and how long an idle one is kept.
    pub limits: crate::front::conn::Limits,
    /// A settings file's node settings and groups, written at start where the store holds
    /// none (`--config`), and its text.
    pub defaults: Option<tollgate_model::config::Config>,
    /// The text `defaults` was read from (its revision, for the file's changes to follow).
    pub defaults_text: Option<String>,
    /// The settings files to follow as they change and on SIGHUP (`--config`, `--import`):
    /// see [`crate::settings::files`].
    pub follow: Vec<crate::settings::followed::FollowedFile>,
    /// Keep the settings in etcd rather than in the data directory (`--etcd`); controllers on
    /// the same etcd and prefix elect one leader.
    pub etcd: Option<EtcdTarget>,
    /// The gRPC URL other controllers and clients are told (`--advertise`); by default
    /// `http://` (`https://` with TLS) and the bound gRPC address.
    pub advertise: Option<String>,
    /// The election lease: how long a dead leader holds the election (`--election-lease-s`).
    pub election_lease: Duration,
    /// Serve this region's clients, leasing each group's share for the region from the
    /// global tier (`--region`; see [`check_region`]): found in `etcd` (the global tier's),
    /// or at `upstream`. `None`: this controller is of the global tier.
    pub region: Option<String>,
    /// With `region`: reach the global tier at these gRPC URLs rather than through its etcd
    /// (`--upstream`), the region keeping its own store (its own etcd, or the embedded one).
    pub upstream: Option<Upstream>,
    /// With `etcd`: shard the groups over the controllers in this many shards (`--shards`,
    /// 1 to 4096; every controller on the etcd and prefix the same). `None`: one leader
    /// grants for every group.
    pub shards: Option<u16>,
    /// TLS on both listeners (`--tls-cert`, `--tls-key`, `--tls-client-ca`,
    /// `--tls-allow-name`); `None`: plain TCP.
    pub tls: Option<crate::front::listen::TlsFiles>,
    /// Calls need a token whose role covers them (`--auth`).
    pub auth: bool,
    /// With `auth`, the first admin token to take when no admin token is live
    /// (`--admin-token-file`), rather than one made and written to `DATA/admin.token`.
    pub admin_token: Option<String>,
}

/// Checks a region's name: 1 to 63 lowercase letters, digits and `-`, beginning with a letter
/// (it is part of etcd keys and of a client id).
pub fn check_region(name: &str) -> Result<(), String> {
    let ok = (1..=63).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "--region: {name:?} must be 1 to 63 lowercase letters, digits and -, beginning with a letter"
        ))
    }
}

/// Where a region with a store of its own reaches the global tier (`--upstream`).
#[derive(Debug, Clone, PartialEq)]
pub struct Upstream {
    /// The global tier's controllers' gRPC URLs, tried in turn (a follower passes the
    /// region's exchanges on to its leader); 1 to [`UPSTREAM_URLS_MAX`].
    pub urls: Vec<String>,
    /// The token (a `region` role's) and TLS authority the region calls them with.
    pub access: tollgate_limiter::access::Access,
}

/// The most URLs `--upstream` takes.
pub const UPSTREAM_URLS_MAX: usize = 16;

impl Upstream {
    /// Checks the URLs: 1 to [`UPSTREAM_URLS_MAX`], each `http://` or `https://` and a
    /// host and port, and the access usable with them.
    pub fn check(&self) -> Result<(), String> {
        if self.urls.is_empty() || self.urls.len() > UPSTREAM_URLS_MAX {
            return Err(format!("--upstream: 1 to {UPSTREAM_URLS_MAX} URLs, got {}", self.urls.len()));
        }
        for url in &self.urls {
            crate::cluster::role::check_advertise(url).map_err(|e| format!("--upstream: {e}"))?;
            self.access.endpoint(url).map_err(|e| format!("--upstream: {e}"))?;
        }
        self.access.bearer().map(drop).map_err(|e| format!("--upstream-token-file: {e}"))
    }
}

/// The default election lease.
pub const DEFAULT_ELECTION_LEASE: Duration = Duration::from_secs(2);

pub use crate::store::target::{DEFAULT_ETCD_PREFIX, EtcdTarget};

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            data: PathBuf::from("tollgate-data"),
            grpc: SocketAddr::from(([127, 0, 0, 1], 7460)),
            http: SocketAddr::from(([127, 0, 0, 1], 7461)),
            tick: Duration::from_secs(1),
            lease: Duration::from_secs(10),
            cost_model: tollgate_model::cost::CostModel::Count,
            saturation: SaturationSettings::default(),
            cost_folding: EngineSettings::default().cost_folding,
            trickle: Duration::ZERO,
            max_groups: EngineSettings::default().max_tracked_groups,
            flush_interval: Duration::from_secs(10),
            limits: crate::front::conn::Limits::default(),
            defaults: None,
            defaults_text: None,
            follow: Vec::new(),
            etcd: None,
            advertise: None,
            election_lease: DEFAULT_ELECTION_LEASE,
            region: None,
            upstream: None,
            shards: None,
            tls: None,
            auth: false,
            admin_token: None,
        }
    }
}

impl ServerOptions {
    /// The engine's settings these options give (capacity and mode come from the store).
    pub fn engine_settings(&self) -> EngineSettings {
        EngineSettings {
            tick: self.tick,
            lease: self.lease,
            saturation: self.saturation.clone(),
            cost_folding: self.cost_folding,
            trickle: self.trickle,
            max_tracked_groups: self.max_groups,
            ..EngineSettings::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_engine_tracks_as_many_groups_as_the_options_say() {
        assert_eq!(ServerOptions::default().engine_settings().max_tracked_groups, 100_000);
        let many = ServerOptions { max_groups: 1_000_000, ..ServerOptions::default() };
        assert_eq!(many.engine_settings().max_tracked_groups, 1_000_000);
    }

    #[test]
    fn targets_are_checked_field_by_field() {
        let t = EtcdTarget::parse("http://127.0.0.1:2379, http://10.0.0.2:2379", "/tollgate").unwrap();
        assert_eq!(t.endpoints, ["http://127.0.0.1:2379", "http://10.0.0.2:2379"]);
        for (urls, prefix, expect) in [
            ("127.0.0.1:2379", "/t", "--etcd: \"127.0.0.1:2379\" must be an http:// URL"),
            ("http://host", "/t", "must be http://HOST:PORT"),
            ("http://host:0", "/t", "must be http://HOST:PORT"),
            ("http://h:1", "t", "--etcd-prefix"),
            ("http://h:1", "/t/", "--etcd-prefix"),
            ("http://h:1", "/", "--etcd-prefix"),
        ] {
            let e = EtcdTarget::parse(urls, prefix).unwrap_err();
            assert!(e.contains(expect), "{urls} {prefix}: {e}");
        }
    }
}

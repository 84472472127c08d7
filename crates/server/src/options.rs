//! How a server is started: addresses, the data directory, and the engine's knobs.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use tollgate_core::engine::{EngineSettings, SaturationSettings};

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
    /// FoundationDB's saturation knobs: queue target and spring, limiting threshold, worst
    /// zones ignored.
    pub saturation: SaturationSettings,
    /// Folding time of the average-cost smoothers.
    pub cost_folding: Duration,
    /// Over how long remote clients take up a raised grant (TiDB's trickle).
    pub trickle: Duration,
    /// How often consumption and resumable ramps are written to the store.
    pub flush_interval: Duration,
    /// The cap on gRPC connections and how long an idle one is kept.
    pub limits: crate::conn::Limits,
    /// A settings file's node settings and groups, written at start where the store holds
    /// none (`--config`).
    pub defaults: Option<tollgate_core::config::Config>,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            data: PathBuf::from("tollgate-data"),
            grpc: SocketAddr::from(([127, 0, 0, 1], 7460)),
            http: SocketAddr::from(([127, 0, 0, 1], 7461)),
            tick: Duration::from_secs(1),
            lease: Duration::from_secs(10),
            saturation: SaturationSettings::default(),
            cost_folding: EngineSettings::default().cost_folding,
            trickle: Duration::ZERO,
            flush_interval: Duration::from_secs(10),
            limits: crate::conn::Limits::default(),
            defaults: None,
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
            ..EngineSettings::default()
        }
    }
}

//! One controller's parts, each with one job, made from one read of the store: the
//! [`Controller`] (the engine behind the contract, with durable settings), [`Access`] (who may
//! do what), [`Cluster`] (its role among controllers), [`Tracer`] (the live trace) and
//! [`RlsRules`] (how Envoy's descriptors and buckets name groups), the quota streams'
//! counters and the settings files followed. The front ends take the parts they use from here.

use std::sync::Arc;

use tollgate_model::engine::EngineSettings;
use tollgate_model::time::Nanos;

use crate::access::credentials::Access;
use crate::cluster::role::Cluster;
use crate::controller::Controller;
use crate::front::rlqs::RlqsStats;
use crate::front::rls::RlsRules;
use crate::observe::trace::Tracer;
use crate::store::{SettingsStore, Shared, StoreError};

/// One controller's parts. Clones share them.
#[derive(Clone)]
pub struct Node {
    /// The engine behind the contract, with durable settings.
    pub controller: Arc<Controller>,
    /// Credentials, and the client ids they own.
    pub access: Arc<Access>,
    /// The role among controllers sharing one etcd.
    pub cluster: Arc<Cluster>,
    /// The live trace.
    pub tracer: Arc<Tracer>,
    /// The RLS mapping rules (RLQS buckets follow them too).
    pub rls_rules: Arc<RlsRules>,
    /// The RLQS streams' counters.
    pub rlqs: Arc<RlqsStats>,
    /// The settings files followed (`--config`, `--import`), and where each is at.
    pub files: Arc<crate::settings::files::Files>,
    /// The high-water marks per group and per client token.
    pub peaks: Arc<crate::observe::peaks::Peaks>,
}

impl Node {
    /// The parts over `store`, with everything it holds. `now` is the engine's time at
    /// start; `wall_ms` the Unix time in milliseconds (for ramps that may resume within their
    /// TTL and budgets counted per period).
    pub fn open(
        mut store: Box<dyn SettingsStore>,
        settings: EngineSettings,
        now: Nanos,
        wall_ms: u64,
    ) -> Result<Node, StoreError> {
        let mut stored = store.load()?;
        let credentials = std::mem::take(&mut stored.credentials);
        let rls = stored.rls_rules.take();
        let shared = Shared::new(store);
        let tracer = Arc::new(Tracer::default());
        let access = Arc::new(Access::new(shared.clone(), &credentials)?);
        let rls_rules = Arc::new(RlsRules::new(shared.clone(), rls.as_deref())?);
        let controller =
            Arc::new(Controller::with_stored(shared, stored, settings, now, wall_ms, tracer.clone())?);
        let cluster = Arc::new(Cluster::new(controller.clone()));
        Ok(Node {
            controller,
            access,
            cluster,
            tracer,
            rls_rules,
            rlqs: Arc::default(),
            files: Arc::default(),
            peaks: Arc::default(),
        })
    }

    /// What the settings files followed apply to.
    pub fn file_parts(&self) -> crate::settings::files::Parts<'_> {
        crate::settings::files::Parts { controller: &self.controller, rls_rules: &self.rls_rules }
    }

    /// Writes consumption and resumable ramps to the store ([`Writes::flush`](crate::controller::Writes::flush)) while this
    /// controller serves clients: only the leader's consumption is current, a follower's is not
    /// written. With the groups sharded, each controller writes its own groups'.
    pub fn flush(&self, now: Nanos, wall_ms: u64) -> Result<(), StoreError> {
        if !self.writes_consumption() {
            return Ok(());
        }
        match self.cluster.sharding() {
            None => self.controller.writes().flush(now, wall_ms, None),
            Some(s) => self.controller.writes().flush(now, wall_ms, Some(&|root| s.owns_root(root))),
        }
    }

    /// Writes the meters of groups with quotas between flushes
    /// ([`Writes::quota_meters`](crate::controller::Writes::quota_meters)), as
    /// [`flush`](Self::flush) writes: the leader's, or each owner's of its own groups.
    pub fn write_quota_meters(&self, wall_ms: u64) -> Result<usize, StoreError> {
        if !self.writes_consumption() {
            return Ok(0);
        }
        match self.cluster.sharding() {
            None => self.controller.writes().quota_meters(wall_ms, None),
            Some(s) => self.controller.writes().quota_meters(wall_ms, Some(&|root| s.owns_root(root))),
        }
    }

    /// Whether this controller's consumption is current, to be written: not a follower's,
    /// unless the groups are sharded (each owner writes its own).
    fn writes_consumption(&self) -> bool {
        self.cluster.role().role != crate::cluster::role::Role::Follower || self.cluster.sharding().is_some()
    }
}

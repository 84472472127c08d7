//! The settings desk: group and node settings changed through the store (durable and
//! audited before the engine sees them, one change at a time), taken from other controllers
//! through the store's watch, and read back; the warnings they raise; what backends schedule
//! by; the usage records and the audit log.

use std::sync::{Mutex, PoisonError};

use tollgate_model::allocate::AllocationMode;
use tollgate_model::engine::Engine;
use tollgate_model::settings::{GroupName, GroupSettings};
use tollgate_proto::check::REPORT_VALUE_MAX;
use tollgate_proto::v1;

use super::ownership::CapacityShare;
use super::readings::Views;
use super::{PutMode, SETTINGS_WATCHERS_MAX};
use crate::convert;
use crate::error::AdminError;
use crate::store::{AuditRecord, NodeChange, Shared, StoreError, StoredNode, audited};

/// The settings desk's own state.
pub(super) struct AdminState {
    /// The settings' warnings last logged: a change logs only the new ones.
    warned: Mutex<Vec<String>>,
    /// The cost model clients price with, as the operator says it: what a unit counts.
    cost_model: std::sync::OnceLock<tollgate_model::cost::CostModel>,
    /// The settings' version: bumped by every change, watched by backends.
    settings_version: tokio::sync::watch::Sender<u64>,
    /// In a region with a store of its own: who copies the groups from the global tier, the
    /// only one whose group changes are taken.
    copied_by: std::sync::OnceLock<String>,
}

impl AdminState {
    /// The desk at a start at Unix time `wall_ms`.
    pub(super) fn new(wall_ms: u64) -> Self {
        Self {
            warned: Mutex::new(Vec::new()),
            cost_model: std::sync::OnceLock::new(),
            // Unique across restarts: the start's wall time, then one more per change. Backends
            // only compare versions for equality.
            settings_version: tokio::sync::watch::channel(wall_ms.max(1).saturating_mul(1_000_000)).0,
            copied_by: std::sync::OnceLock::new(),
        }
    }
}

fn check_capacity(capacity: Option<f64>) -> Result<(), AdminError> {
    match capacity {
        Some(c) if !(c.is_finite() && c > 0.0 && c <= REPORT_VALUE_MAX) => Err(AdminError::invalid(
            "capacity",
            format!("must be a finite number above 0 and at most {REPORT_VALUE_MAX:e}, got {c}"),
        )),
        _ => Ok(()),
    }
}

/// A group's settings as the audit log shows them.
fn group_json(s: &GroupSettings) -> String {
    crate::front::json::group_settings(&convert::settings_to_proto(s)).to_string()
}

/// Gives the engine the node settings.
fn apply_node(engine: &mut Engine, node: StoredNode) {
    engine.set_capacity(node.capacity);
    engine.set_mode(node.mode);
    engine.set_slow_start(node.slow_start);
    engine.set_shadow(node.shadow);
    engine.set_throttling(node.throttling);
}

/// The node settings as the audit log shows them.
fn node_json(n: &StoredNode) -> String {
    serde_json::json!({
        "capacity": n.capacity,
        "mode": if n.mode == AllocationMode::Fcfs { "fcfs" } else { "share" },
        "slow_start": n.slow_start,
        "shadow": n.shadow,
        "throttling": if n.throttling { "on" } else { "off" },
    })
    .to_string()
}

/// The settings desk ([`Controller::admin`](super::Controller::admin)).
pub struct Admin<'a> {
    pub(super) engine: &'a parking_lot::Mutex<Engine>,
    pub(super) store: &'a Shared,
    pub(super) state: &'a AdminState,
    pub(super) capacity: &'a Mutex<CapacityShare>,
    pub(super) views: &'a Views,
}

impl Admin<'_> {
    /// Takes group changes from `copier` alone from now on (a region copying the global
    /// tier's groups, [`crate::cluster::upstream_settings`]): any other is refused, naming
    /// where groups are set. Set once, at start.
    pub fn copy_groups_by(&self, copier: String) {
        let _ = self.state.copied_by.set(copier);
    }

    /// Refuses a group change by `who` when the groups are copied by another.
    fn check_copier(&self, who: &str) -> Result<(), AdminError> {
        match self.state.copied_by.get() {
            Some(copier) if copier != who => Err(AdminError::Refused(format!(
                "the groups here are copied from the global tier ({copier}): change them there"
            ))),
            _ => Ok(()),
        }
    }

    /// Starts the quota windows a settings change at `wall_ms` made due; one that cannot is
    /// logged and left to the next flush.
    fn refresh_after_change(&self, wall_ms: u64) {
        if let Err(e) = super::refresh_budget_periods(self.engine, self.store, wall_ms) {
            tracing::warn!(error = %e, "budget periods not refreshed; the next flush tries again");
        }
    }

    fn changed(&self) {
        self.views.forget();
        self.state.settings_version.send_modify(|v| *v = v.wrapping_add(1).max(1));
        self.log_warnings();
    }

    /// The settings that are allowed but probably not meant (reservations past the capacity,
    /// a limit above it, a priority or weight in `fcfs` mode), in words for people.
    pub fn warnings(&self) -> Vec<String> {
        self.engine.lock().warnings()
    }

    /// Logs each warning the settings hold that was not logged since it last held: once at
    /// start, then as changes bring new ones.
    pub fn log_warnings(&self) {
        let now = self.warnings();
        let mut warned = self.state.warned.lock().unwrap_or_else(PoisonError::into_inner);
        for w in now.iter().filter(|w| !warned.contains(w)) {
            tracing::warn!("{w}");
        }
        *warned = now;
    }

    /// Says which cost model the clients price requests with (`--cost-model`, or the
    /// `[cost]` of `--config`): status shows what a unit counts. Set once; later calls are
    /// ignored.
    pub fn set_cost_model(&self, model: tollgate_model::cost::CostModel) {
        let _ = self.state.cost_model.set(model);
    }

    /// The cost model the clients price with (the `count` model unless said otherwise).
    pub fn cost_model(&self) -> &tollgate_model::cost::CostModel {
        self.state.cost_model.get().unwrap_or(&tollgate_model::cost::CostModel::Count)
    }

    /// The group settings backends schedule by: the version, then every group (or nothing
    /// but the version, `unchanged`, when the backend's `known` version is current).
    pub fn backend_settings(&self, known: u64) -> v1::BackendSettings {
        // The version first: groups read after it are at least as new, so a backend never
        // holds older settings under a current version.
        let version = *self.state.settings_version.borrow();
        if known == version {
            return v1::BackendSettings { version, unchanged: true, groups: Vec::new() };
        }
        let groups = self
            .engine
            .lock()
            .groups()
            .into_iter()
            .map(|(n, s)| v1::GroupInfo {
                name: n.to_string(),
                settings: Some(convert::settings_to_proto(s)),
            })
            .collect();
        v1::BackendSettings { version, unchanged: false, groups }
    }

    /// Follows the settings' version (for backends watching them); `None` when
    /// [`SETTINGS_WATCHERS_MAX`] already do.
    pub fn watch_settings(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        (self.state.settings_version.receiver_count() < SETTINGS_WATCHERS_MAX)
            .then(|| self.state.settings_version.subscribe())
    }

    /// Creates or alters a group at Unix time `wall_ms` (where its quota windows start); only
    /// the fields the patch sets change. Durable before it returns.
    pub fn put_group(
        &self,
        name: GroupName,
        patch: &v1::GroupPatch,
        mode: PutMode,
        who: &str,
        wall_ms: u64,
    ) -> Result<GroupSettings, AdminError> {
        self.check_copier(who)?;
        let mut store = self.store.lock();
        let current = self.engine.lock().group(&name).cloned();
        match (mode, &current) {
            (PutMode::Create, Some(_)) => return Err(AdminError::AlreadyExists(name.to_string())),
            (PutMode::Alter, None) => return Err(AdminError::NotFound(name.to_string())),
            _ => {}
        }
        let settings =
            convert::apply_patch(current.clone().unwrap_or_default(), patch).map_err(AdminError::Invalid)?;
        self.check_pattern(&name, &settings)?;
        self.check_nesting(&name, Some(&settings))?;
        audited(
            &mut store,
            who,
            format!("group.put {name}"),
            current.as_ref().map(group_json),
            Some(group_json(&settings)),
        )
        .put_group(&name, &settings)?;
        self.engine.lock().set_group(name.clone(), settings.clone());
        drop(store);
        self.changed();
        self.refresh_after_change(wall_ms);
        Ok(settings)
    }

    /// Sets a group's whole settings at Unix time `wall_ms`. Durable before it returns.
    pub fn set_group(
        &self,
        name: GroupName,
        settings: GroupSettings,
        who: &str,
        wall_ms: u64,
    ) -> Result<(), AdminError> {
        self.check_copier(who)?;
        self.check_pattern(&name, &settings)?;
        self.check_nesting(&name, Some(&settings))?;
        let mut store = self.store.lock();
        let before = self.engine.lock().group(&name).map(group_json);
        audited(&mut store, who, format!("group.put {name}"), before, Some(group_json(&settings)))
            .put_group(&name, &settings)?;
        self.engine.lock().set_group(name.clone(), settings.clone());
        drop(store);
        self.changed();
        self.refresh_after_change(wall_ms);
        Ok(())
    }

    /// A pattern's rules: no reservation, and at most
    /// [`PATTERNS_MAX`](tollgate_model::settings::PATTERNS_MAX) of them.
    fn check_pattern(&self, name: &GroupName, settings: &GroupSettings) -> Result<(), AdminError> {
        use tollgate_model::settings::{PATTERNS_MAX, check_pattern, is_pattern};
        check_pattern(name.as_str(), settings).map_err(|e| AdminError::invalid(&e.field, e.rule))?;
        let engine = self.engine.lock();
        if is_pattern(name.as_str())
            && engine.group(name).is_none()
            && engine.groups().iter().filter(|(n, _)| is_pattern(n.as_str())).count() >= PATTERNS_MAX
        {
            return Err(AdminError::invalid(
                "name",
                format!("at most {PATTERNS_MAX} patterns (names with *)"),
            ));
        }
        Ok(())
    }

    /// The nesting rules ([`tollgate_model::hierarchy::check`]) with `name` set to `settings`
    /// (`None`: dropped): only what the change breaks is refused, by the field that breaks it.
    fn check_nesting(&self, name: &GroupName, settings: Option<&GroupSettings>) -> Result<(), AdminError> {
        let engine = self.engine.lock();
        let groups = engine.groups();
        let child = groups.iter().find(|(_, s)| s.parent() == Some(name)).map(|(n, _)| *n);
        let Some(settings) = settings else {
            return match child {
                Some(child) => Err(AdminError::invalid(
                    "name",
                    format!(
                        "{name} is the parent of {child}: give its children another parent, or none, first"
                    ),
                )),
                None => Ok(()),
            };
        };
        if settings.parent().is_none() && child.is_none() {
            return Ok(());
        }
        let all = groups.iter().filter(|(n, _)| *n != name).copied().chain(std::iter::once((name, settings)));
        let errors = tollgate_model::hierarchy::check(all);
        let touched = |g: &GroupName| g == name || settings.parent() == Some(g);
        match errors.iter().find(|e| touched(&e.group)) {
            Some(e) if &e.group == name => Err(AdminError::invalid(&e.error.field, e.error.rule.clone())),
            Some(e) => Err(AdminError::invalid("reserved", format!("parent {}: {}", e.group, e.error.rule))),
            None => Ok(()),
        }
    }

    /// Drops a group; says whether it existed. Durable before it returns.
    pub fn drop_group(&self, name: &GroupName, who: &str) -> Result<bool, AdminError> {
        self.check_copier(who)?;
        self.check_nesting(name, None)?;
        let mut store = self.store.lock();
        let before = self.engine.lock().group(name).map(group_json);
        // Recorded only if the group was there: a drop of nothing writes nothing.
        let existed =
            audited(&mut store, who, format!("group.drop {name}"), before, None).drop_group(name)?;
        self.engine.lock().remove_group(name);
        drop(store);
        self.changed();
        Ok(existed)
    }

    /// Usage records: per group, its consumption minute by minute from `since_unix_ms` (and
    /// the last record before, to measure from). What is not flushed yet is not in them.
    pub fn usage(
        &self,
        group: Option<&GroupName>,
        since_unix_ms: u64,
        limit: usize,
    ) -> Result<Vec<crate::store::UsageRecord>, StoreError> {
        self.store.lock().usage(group, since_unix_ms, limit)
    }

    /// The audit log: changes made at or after `since_unix_ms`, oldest first, at most `limit`.
    pub fn audit_log(&self, since_unix_ms: u64, limit: usize) -> Result<Vec<AuditRecord>, StoreError> {
        self.store.lock().audit(since_unix_ms, limit)
    }

    /// Takes a group's settings as another controller stored them (seen through the shared
    /// store's watch): the engine follows, nothing is written back. `None`: the group was
    /// dropped. Says whether anything changed.
    pub fn sync_group(&self, name: GroupName, settings: Option<GroupSettings>, wall_ms: u64) -> bool {
        let mut engine = self.engine.lock();
        if engine.group(&name) == settings.as_ref() {
            return false;
        }
        match settings {
            Some(s) => engine.set_group(name, s),
            None => drop(engine.remove_group(&name)),
        }
        drop(engine);
        self.changed();
        self.refresh_after_change(wall_ms);
        true
    }

    /// Puts the node settings in force: a capacity that changes while groups are sharded
    /// scales the part in force, or starts at an even share ([`CapacityShare::in_force`](super::ownership::CapacityShare::in_force)),
    /// until the next part is set.
    fn apply_node(&self, mut node: StoredNode) {
        let mut share = self.capacity.lock().unwrap_or_else(PoisonError::into_inner);
        let mut engine = self.engine.lock();
        node.capacity = share.in_force(node.capacity, engine.settings().capacity);
        apply_node(&mut engine, node);
    }

    /// Takes the node settings as another controller stored them; nothing is written back.
    pub fn sync_node(&self, node: StoredNode) -> bool {
        if self.node() == node {
            return false;
        }
        self.apply_node(node);
        self.changed();
        true
    }

    /// Sets the node capacity (`None`: no capacity). Durable before it returns.
    pub fn set_capacity(&self, capacity: Option<f64>, who: &str) -> Result<StoredNode, AdminError> {
        check_capacity(capacity)?;
        self.set_node(who, |n| n.capacity = capacity)
    }

    /// Turns slow start on or off. Durable before it returns.
    pub fn set_slow_start(&self, on: bool, who: &str) -> Result<StoredNode, AdminError> {
        self.set_node(who, |n| n.slow_start = on)
    }

    /// Puts every group in shadow mode, or takes the node out of it. Durable and audited
    /// before it returns; clients take it up at their next exchange.
    pub fn set_shadow(&self, on: bool, who: &str) -> Result<StoredNode, AdminError> {
        self.set_node(who, |n| n.shadow = on)
    }

    /// The one switch: throttling on or off for the whole node, every setting kept. Durable
    /// and audited before it returns; clients take it up at their next exchange.
    pub fn set_throttling(&self, on: bool, who: &str) -> Result<StoredNode, AdminError> {
        self.set_node(who, |n| n.throttling = on)
    }

    /// Applies a node properties document's change in one durable write.
    pub fn change_node(&self, change: NodeChange, who: &str) -> Result<StoredNode, AdminError> {
        if let Some(c) = change.capacity {
            check_capacity(c)?;
        }
        self.set_node(who, |n| {
            if let Some(c) = change.capacity {
                n.capacity = c;
            }
            if let Some(m) = change.mode {
                n.mode = m;
            }
            if let Some(on) = change.slow_start {
                n.slow_start = on;
            }
            if let Some(on) = change.shadow {
                n.shadow = on;
            }
            if let Some(on) = change.throttling {
                n.throttling = on;
            }
        })
    }

    /// Sets how free capacity is shared. Durable before it returns.
    pub fn set_mode(&self, mode: AllocationMode, who: &str) -> Result<StoredNode, AdminError> {
        self.set_node(who, |n| n.mode = mode)
    }

    fn set_node(&self, who: &str, change: impl FnOnce(&mut StoredNode)) -> Result<StoredNode, AdminError> {
        let mut store = self.store.lock();
        let before = self.node();
        let mut node = before;
        change(&mut node);
        audited(&mut store, who, "node.set".into(), Some(node_json(&before)), Some(node_json(&node)))
            .set_node(node)?;
        self.apply_node(node);
        drop(store);
        self.changed();
        Ok(node)
    }

    /// The node settings (the configured capacity, whatever part of it this controller
    /// shares out while groups are sharded).
    pub fn node(&self) -> StoredNode {
        let configured = self.capacity.lock().unwrap_or_else(PoisonError::into_inner).configured;
        let engine = self.engine.lock();
        let s = engine.settings();
        StoredNode {
            capacity: configured.unwrap_or(s.capacity),
            mode: s.mode,
            slow_start: s.slow_start,
            shadow: s.shadow,
            throttling: s.throttling,
        }
    }

    /// A group's settings.
    pub fn group(&self, name: &GroupName) -> Option<GroupSettings> {
        self.engine.lock().group(name).cloned()
    }

    /// The settings that apply to a group: its own, a pattern's that matches it, or the
    /// `default` group's.
    pub fn settings_for(&self, name: &GroupName) -> Option<GroupSettings> {
        self.engine.lock().settings_for(name).cloned()
    }

    /// `f` of the settings `name` has, read in place (nothing cloned): `None` when no group
    /// or pattern names it.
    pub fn with_settings<R>(&self, name: &GroupName, f: impl FnOnce(&GroupSettings) -> R) -> Option<R> {
        self.engine.lock().settings_for(name).map(f)
    }

    /// Every configured group, by name.
    pub fn groups(&self) -> Vec<(GroupName, GroupSettings)> {
        self.engine.lock().groups().into_iter().map(|(n, s)| (n.clone(), s.clone())).collect()
    }
}

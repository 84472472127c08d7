//! Durable settings behind a narrow trait: what the controller keeps across restarts.
//!
//! The controller writes through [`SettingsStore`] and acknowledges a change only once the
//! store has made it durable. Two stores ship: [`RedbStore`], an embedded database file (the
//! default), and [`MemoryStore`], which keeps everything in memory (the simulator and tests).
//!
//! Besides group and node settings the store keeps each configured group's consumption (its
//! [`Meter`]: what a tenant is billed on and what its budget is checked against) and the value of
//! every resumable ramp, both written every flush interval and at a clean shutdown.

#[cfg(feature = "etcd")]
pub mod etcd;
#[cfg(test)]
mod faults;
mod file;
mod seal;
pub mod target;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

pub use self::file::{FILE_NAME, RedbStore};
use thiserror::Error;
use tollgate_model::allocate::AllocationMode;
use tollgate_model::engine::Meter;
use tollgate_model::settings::{GroupName, GroupSettings};

/// Why the store failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The data directory could not be created or used.
    #[error("cannot use data directory {path}: {source}")]
    Directory {
        /// The directory.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// Another process has the file open.
    #[error("data file {path} is in use by another process (is another tollgate server running?)")]
    Locked {
        /// The file.
        path: PathBuf,
    },
    /// The file could not be opened or read: corrupt, or not a Tollgate data file.
    #[error("data file {path} cannot be opened: {reason}")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// A stored record does not decode.
    #[error("data file {path}: stored {what} is corrupt: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Which record.
        what: String,
        /// What went wrong.
        reason: String,
    },
    /// A read or write failed.
    #[error("data file {path}: {reason}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// etcd could not be reached, refused a call, or holds something that is not Tollgate's.
    #[error("{target}: {reason}")]
    Etcd {
        /// The endpoints and prefix.
        target: String,
        /// What went wrong.
        reason: String,
    },
}

impl StoreError {
    /// Whether retrying may help (a failed write may succeed later; a corrupt file won't).
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Io { .. } | StoreError::Etcd { .. })
    }
}

/// The node's settings as stored.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StoredNode {
    /// Units/s shared by allocation; `None`: no capacity.
    pub capacity: Option<f64>,
    /// How free capacity is shared.
    pub mode: AllocationMode,
    /// Couchbase's slow start.
    pub slow_start: bool,
    /// Every group in shadow mode.
    pub shadow: bool,
    /// The one switch: `false` turns throttling off, every setting kept.
    pub throttling: bool,
}

impl Default for StoredNode {
    fn default() -> Self {
        Self {
            capacity: None,
            mode: AllocationMode::Share,
            slow_start: false,
            shadow: false,
            throttling: true,
        }
    }
}

impl StoredNode {
    /// In the contract's form.
    pub fn to_proto(self) -> tollgate_proto::v1::NodeInfo {
        tollgate_proto::v1::NodeInfo {
            capacity: self.capacity,
            mode: crate::convert::mode_to_proto(self.mode) as i32,
            slow_start: self.slow_start,
            shadow: self.shadow,
            throttling_off: !self.throttling,
        }
    }

    /// From the contract's form.
    pub fn from_proto(m: &tollgate_proto::v1::NodeInfo) -> Self {
        Self {
            capacity: m.capacity,
            mode: crate::convert::mode_from_proto(m.mode()),
            slow_start: m.slow_start,
            shadow: m.shadow,
            throttling: !m.throttling_off,
        }
    }
}

/// A resumable ramp's value, and until when (Unix milliseconds) it may be resumed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StoredRamp {
    /// The ramp's value.
    pub value: f64,
    /// Unix time in milliseconds after which it starts again at its minimum.
    pub until_unix_ms: u64,
}

/// Everything the store holds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stored {
    /// Groups by name.
    pub groups: BTreeMap<GroupName, GroupSettings>,
    /// Node settings.
    pub node: StoredNode,
    /// Whether node settings were ever written (else `node` is the default).
    pub node_stored: bool,
    /// Configured groups' consumption.
    pub meters: BTreeMap<GroupName, Meter>,
    /// Resumable ramps.
    pub ramps: BTreeMap<GroupName, StoredRamp>,
    /// Credentials by id, each as JSON (see [`Credential::to_json`](crate::Credential::to_json)).
    pub credentials: BTreeMap<String, String>,
    /// The RLS mapping rules as JSON ([`tollgate_model::rls`]), when ever set.
    pub rls_rules: Option<String>,
}

/// What a change to the node settings sets (each `None` leaves its setting as it is): what a
/// node properties document, or any other surface, asks for.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct NodeChange {
    /// `Some(None)`: no capacity (`"unlimited"`).
    pub capacity: Option<Option<f64>>,
    /// How free capacity is shared.
    pub mode: Option<AllocationMode>,
    /// Couchbase's slow start.
    pub slow_start: Option<bool>,
    /// Every group in shadow mode.
    pub shadow: Option<bool>,
    /// The one switch.
    pub throttling: Option<bool>,
}

/// One change to the settings, as the audit log keeps it: who made it, what it changed, the
/// value before and after (JSON, `None` where there was none), and when.
#[derive(Debug, Clone, PartialEq)]
pub struct AuditRecord {
    /// Unix time in milliseconds.
    pub at_unix_ms: u64,
    /// Who: the caller's address (and, once credentials exist, their name).
    pub who: String,
    /// What: `group.put NAME`, `group.drop NAME`, `node.set`.
    pub what: String,
    /// The value before, as JSON.
    pub before: Option<String>,
    /// The value after, as JSON.
    pub after: Option<String>,
}

/// A group's cumulative consumption as it stood in one minute (the last flush in it).
#[derive(Debug, Clone, PartialEq)]
pub struct UsageRecord {
    /// The minute's start, Unix milliseconds (a multiple of 60,000).
    pub minute_unix_ms: u64,
    /// The group.
    pub group: GroupName,
    /// Its meter: cumulative units consumed, requests admitted, refused and waited.
    pub meter: Meter,
}

/// The most usage records a store keeps; past it the oldest minutes go.
pub const USAGE_MAX: usize = 1_000_000;

/// Where a look for the groups with traffic lately starts ([`SettingsStore::recent_groups`]),
/// at Unix time `wall_ms` with grants of `lease`: a lease and the longest flush interval (a
/// minute) back, at the start of that minute.
pub fn recent_since(wall_ms: u64, lease: std::time::Duration) -> u64 {
    let back = lease + std::time::Duration::from_secs(60);
    minute_of(wall_ms.saturating_sub(u64::try_from(back.as_millis()).unwrap_or(u64::MAX)))
}

/// The first `limit` distinct names of `names`.
pub(crate) fn distinct(names: impl Iterator<Item = GroupName>, limit: usize) -> Vec<GroupName> {
    let mut seen = std::collections::HashSet::new();
    names.filter(|g| seen.insert(g.clone())).take(limit).collect()
}

/// The start of the minute `wall_ms` falls in.
pub fn minute_of(wall_ms: u64) -> u64 {
    wall_ms - wall_ms % 60_000
}

/// Picks usage records from every record, fed in minute order: per group (only `group` when
/// given), the last record before `since_unix_ms` (what a span's consumption is measured
/// from), then the records at or after it, in minute order; at most `limit` in all. Holds only
/// what it returns.
pub struct UsageSelector<'a> {
    group: Option<&'a GroupName>,
    since_unix_ms: u64,
    limit: usize,
    baselines: BTreeMap<GroupName, UsageRecord>,
    span: Vec<UsageRecord>,
}

impl<'a> UsageSelector<'a> {
    /// A selector for `group` (all when `None`) from `since_unix_ms`, at most `limit`.
    pub fn new(group: Option<&'a GroupName>, since_unix_ms: u64, limit: usize) -> Self {
        Self { group, since_unix_ms, limit, baselines: BTreeMap::new(), span: Vec::new() }
    }

    /// Whether a record of `group` would be looked at (decode only those).
    pub fn wants(&self, group: &str) -> bool {
        self.group.is_none_or(|g| g.as_str() == group)
    }

    /// The next record in minute order.
    pub fn push(&mut self, r: UsageRecord) {
        if !self.wants(r.group.as_str()) {
            return;
        }
        if r.minute_unix_ms < self.since_unix_ms {
            if self.baselines.len() < self.limit || self.baselines.contains_key(&r.group) {
                self.baselines.insert(r.group.clone(), r);
            }
        } else if self.span.len() < self.limit {
            self.span.push(r);
        }
    }

    /// The records picked.
    pub fn finish(self) -> Vec<UsageRecord> {
        let mut out: Vec<UsageRecord> = self.baselines.into_values().collect();
        out.sort_by_key(|r| r.minute_unix_ms);
        out.truncate(self.limit);
        let room = self.limit - out.len();
        out.extend(self.span.into_iter().take(room));
        out
    }
}

/// The most audit records a store keeps; past it the oldest go.
pub const AUDIT_MAX: usize = 100_000;

impl AuditRecord {
    /// As one line of JSON.
    pub fn to_json(&self) -> String {
        let parse = |v: &Option<String>| {
            v.as_deref().map(|t| {
                serde_json::from_str::<serde_json::Value>(t).unwrap_or(serde_json::Value::String(t.into()))
            })
        };
        serde_json::json!({
            "at_unix_ms": self.at_unix_ms,
            "who": self.who,
            "what": self.what,
            "before": parse(&self.before),
            "after": parse(&self.after),
        })
        .to_string()
    }

    /// From a line of JSON written by [`to_json`](Self::to_json).
    pub fn from_json(text: &str) -> Result<AuditRecord, String> {
        let v: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let s = |k: &str| v.get(k).and_then(serde_json::Value::as_str).map(str::to_string);
        let j = |k: &str| v.get(k).filter(|x| !x.is_null()).map(serde_json::Value::to_string);
        Ok(AuditRecord {
            at_unix_ms: v
                .get("at_unix_ms")
                .and_then(serde_json::Value::as_u64)
                .ok_or("at_unix_ms missing")?,
            who: s("who").ok_or("who missing")?,
            what: s("what").ok_or("what missing")?,
            before: j("before"),
            after: j("after"),
        })
    }
}

/// A store's key for the next audit record: the time in milliseconds above 12 bits of
/// sequence, strictly after `last`, so records sort in the order they were made.
pub(crate) fn audit_key(at_unix_ms: u64, last: Option<u64>) -> u64 {
    let at = at_unix_ms.saturating_mul(1 << 12);
    last.map_or(at, |l| at.max(l.saturating_add(1)))
}

/// What a defaults file (`tollgate server --config`) did at start.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DefaultsApplied {
    /// Groups the store did not hold, now written.
    pub added: Vec<GroupName>,
    /// Groups the store held already, left as they were.
    pub kept: Vec<GroupName>,
    /// Whether the node settings were written (the store held none).
    pub node: bool,
}

/// Writes what `config` sets and the store does not hold yet: each group it lacks, and the node
/// settings if none were ever stored. What the store holds (changed at run time) wins. Each
/// write is durable; a failure stops it where it is.
pub fn apply_defaults(
    store: &mut dyn SettingsStore,
    config: &tollgate_model::config::Config,
) -> Result<DefaultsApplied, StoreError> {
    let stored = store.load()?;
    let mut done = DefaultsApplied::default();
    let mut adding = Vec::new();
    for (name, settings) in &config.groups {
        if stored.groups.contains_key(name) {
            done.kept.push(name.clone());
        } else {
            adding.push((name, settings));
            done.added.push(name.clone());
        }
    }
    // In one write where the store can: a file of a million groups is stored in seconds.
    store.put_groups(&adding)?;
    if stored.rls_rules.is_none()
        && let Some(rules) = &config.rls_rules
    {
        store.set_rls_rules(&tollgate_model::rls::RuleSet::of_rules(rules.clone()).to_json())?;
    }
    if !stored.node_stored {
        let n = &config.node;
        store.set_node(StoredNode {
            capacity: n.capacity,
            mode: n.mode,
            slow_start: n.slow_start,
            shadow: n.shadow,
            throttling: n.throttling,
        })?;
        done.node = true;
    }
    Ok(done)
}

/// A durable home for the controller's settings. Every write is durable when it returns.
pub trait SettingsStore: Send {
    /// Everything stored.
    fn load(&mut self) -> Result<Stored, StoreError>;
    /// Stores a group's settings.
    fn put_group(&mut self, name: &GroupName, settings: &GroupSettings) -> Result<(), StoreError>;
    /// Stores many groups' settings: by default one after the other, in one transaction
    /// where the store overrides it.
    fn put_groups(&mut self, groups: &[(&GroupName, &GroupSettings)]) -> Result<(), StoreError> {
        groups.iter().try_for_each(|(name, settings)| self.put_group(name, settings))
    }
    /// Removes a group and its meter; says whether it was there.
    fn drop_group(&mut self, name: &GroupName) -> Result<bool, StoreError>;
    /// Stores the node settings.
    fn set_node(&mut self, node: StoredNode) -> Result<(), StoreError>;
    /// Stores meters and replaces the resumable ramps, in one transaction; the meters are
    /// also the groups' usage records for the minute starting at `minute_unix_ms` (written
    /// again within the minute, the record is replaced: a rewrite changes nothing).
    fn put_meters(
        &mut self,
        meters: &[(GroupName, Meter)],
        ramps: &[(GroupName, StoredRamp)],
        minute_unix_ms: u64,
    ) -> Result<(), StoreError>;
    /// As [`put_meters`](Self::put_meters), with the groups sharded over the controllers: of
    /// the stored ramps, only those of the groups in `scope` (this controller's own) are
    /// replaced, so that no controller deletes another's. Only etcd is shared by controllers
    /// that shard the groups (`--shards` needs `--etcd`); a store of one process replaces every
    /// ramp.
    fn put_meters_of(
        &mut self,
        meters: &[(GroupName, Meter)],
        ramps: &[(GroupName, StoredRamp)],
        minute_unix_ms: u64,
        scope: &std::collections::HashSet<GroupName>,
    ) -> Result<(), StoreError> {
        let _ = scope;
        self.put_meters(meters, ramps, minute_unix_ms)
    }
    /// Stores meters and their usage records for the minute starting at `minute_unix_ms`,
    /// leaving the resumable ramps as they are: the meters of groups with quotas, written
    /// between flushes so that a successor loses little of what their longer windows counted.
    fn put_running_meters(
        &mut self,
        meters: &[(GroupName, Meter)],
        minute_unix_ms: u64,
    ) -> Result<(), StoreError>;
    /// For each of `windows` (a group, and the start of one of its quota windows in Unix
    /// milliseconds), the group's consumption as of its last usage record before that start
    /// (`None` without one): what the window is counted from when the metering of its start
    /// is not at hand (at start, or for a group taken over). By default a look-up each; a
    /// store whose look-ups each read every record overrides it with one read.
    fn consumed_before(&mut self, windows: &[(GroupName, u64)]) -> Result<Vec<Option<f64>>, StoreError> {
        windows
            .iter()
            .map(|(group, start)| {
                let records = self.usage(Some(group), *start, 1)?;
                Ok(records.first().filter(|r| r.minute_unix_ms < *start).map(|r| r.meter.consumed))
            })
            .collect()
    }
    /// Stores usage records alone, for the minute starting at `minute_unix_ms`: the metering
    /// of groups whose running totals are not kept (groups in traffic that are not configured,
    /// served by the `default` group's settings). Written again within the minute, a record is
    /// replaced.
    fn put_usage(&mut self, usage: &[(GroupName, Meter)], minute_unix_ms: u64) -> Result<(), StoreError>;
    /// Usage records, as [`UsageSelector`] picks them.
    fn usage(
        &mut self,
        group: Option<&GroupName>,
        since_unix_ms: u64,
        limit: usize,
    ) -> Result<Vec<UsageRecord>, StoreError>;
    /// The groups with a usage record of a minute at or after `since_unix_ms`, at most
    /// `limit` of them: those with traffic lately, whose clients may still hold grants when a
    /// controller starts again.
    fn recent_groups(&mut self, since_unix_ms: u64, limit: usize) -> Result<Vec<GroupName>, StoreError>;
    /// Appends a record to the audit log (durable when it returns), dropping the oldest past
    /// [`AUDIT_MAX`].
    fn append_audit(&mut self, record: &AuditRecord) -> Result<(), StoreError>;
    /// Makes `record` part of the next settings write (a group, the node, a credential or the
    /// RLS rules put or dropped): both are written in one transaction, so a change is never
    /// acknowledged without its record, nor a record kept for a change that failed. If that
    /// write fails, the record goes with it.
    fn audited(&mut self, record: AuditRecord) -> &mut dyn SettingsStore;
    /// The audit records made at or after `since_unix_ms`, oldest first, at most `limit`.
    fn audit(&mut self, since_unix_ms: u64, limit: usize) -> Result<Vec<AuditRecord>, StoreError>;
    /// Stores a credential: its id and its record as JSON.
    fn put_credential(&mut self, id: &str, record: &str) -> Result<(), StoreError>;
    /// Removes a credential; says whether it was there.
    fn drop_credential(&mut self, id: &str) -> Result<bool, StoreError>;
    /// Stores the RLS mapping rules, as JSON.
    fn set_rls_rules(&mut self, json: &str) -> Result<(), StoreError>;
    /// What is wrong, while the store cannot take writes (a full disk); `None` when it can.
    fn health(&self) -> Option<String> {
        None
    }
}

/// The one store a controller's parts write through (the controller, its credentials, its RLS
/// rules): its lock is held across each change's check and write, so one admin change runs at
/// a time and a change is checked against what is stored.
#[derive(Clone)]
pub struct Shared {
    store: Arc<Mutex<Box<dyn SettingsStore>>>,
    /// What [`SettingsStore::health`] said when the lock was last let go: read by the health
    /// probes without the lock, which a write holds for as long as the disk takes.
    health: Arc<std::sync::RwLock<Option<String>>>,
}

impl Shared {
    /// Shares `store`.
    pub fn new(store: Box<dyn SettingsStore>) -> Shared {
        let health = Arc::new(std::sync::RwLock::new(store.health()));
        Shared { store: Arc::new(Mutex::new(store)), health }
    }

    /// The store, for one change or one read.
    pub fn lock(&self) -> StoreGuard<'_> {
        // A panic mid-change leaves nothing half written: each write is one transaction.
        StoreGuard { guard: self.store.lock().unwrap_or_else(PoisonError::into_inner), health: &self.health }
    }

    /// What is wrong with the store, as of its last use; never waits for a write under way.
    pub fn health(&self) -> Option<String> {
        self.health.read().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

/// The store, held: its health is noted for [`Shared::health`] when it is let go.
pub struct StoreGuard<'a> {
    guard: MutexGuard<'a, Box<dyn SettingsStore>>,
    health: &'a std::sync::RwLock<Option<String>>,
}

impl std::ops::Deref for StoreGuard<'_> {
    type Target = Box<dyn SettingsStore>;

    fn deref(&self) -> &Self::Target {
        &self.guard
    }
}

impl std::ops::DerefMut for StoreGuard<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.guard
    }
}

impl Drop for StoreGuard<'_> {
    fn drop(&mut self) {
        let now = self.guard.health();
        let mut held = self.health.write().unwrap_or_else(PoisonError::into_inner);
        if *held != now {
            *held = now;
        }
    }
}

/// The store, with the audit record of the change about to be written to it: the change and
/// its record are written in one transaction (see [`SettingsStore::audited`]).
pub(crate) fn audited<'s>(
    store: &'s mut Box<dyn SettingsStore>,
    who: &str,
    what: String,
    before: Option<String>,
    after: Option<String>,
) -> &'s mut dyn SettingsStore {
    store.audited(AuditRecord {
        at_unix_ms: crate::clock::wall_ms(),
        who: who.to_string(),
        what,
        before,
        after,
    })
}

/// A store in memory: nothing survives the process. Clones share one store, so a controller
/// made again over a clone sees what the last one wrote (a restart, in the simulator and tests).
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    stored: Arc<Mutex<Stored>>,
    audit: Arc<Mutex<std::collections::VecDeque<AuditRecord>>>,
    usage: Arc<Mutex<BTreeMap<(u64, GroupName), Meter>>>,
    /// The audit record of the next settings write.
    staged: Option<AuditRecord>,
}

impl MemoryStore {
    /// A store that starts with `stored`.
    pub fn with(stored: Stored) -> Self {
        Self { stored: Arc::new(Mutex::new(stored)), ..Self::default() }
    }

    fn stored(&self) -> MutexGuard<'_, Stored> {
        self.stored.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl MemoryStore {
    /// Writes the staged audit record, with the change just made.
    fn write_staged(&mut self) -> Result<(), StoreError> {
        match self.staged.take() {
            Some(record) => self.append_audit(&record),
            None => Ok(()),
        }
    }
}

impl SettingsStore for MemoryStore {
    fn load(&mut self) -> Result<Stored, StoreError> {
        Ok(self.stored().clone())
    }

    fn put_group(&mut self, name: &GroupName, settings: &GroupSettings) -> Result<(), StoreError> {
        self.stored().groups.insert(name.clone(), settings.clone());
        self.write_staged()
    }

    fn drop_group(&mut self, name: &GroupName) -> Result<bool, StoreError> {
        let existed = {
            let mut stored = self.stored();
            stored.meters.remove(name);
            stored.groups.remove(name).is_some()
        };
        self.write_staged()?;
        Ok(existed)
    }

    fn set_node(&mut self, node: StoredNode) -> Result<(), StoreError> {
        {
            let mut stored = self.stored();
            stored.node = node;
            stored.node_stored = true;
        }
        self.write_staged()
    }

    fn put_meters(
        &mut self,
        meters: &[(GroupName, Meter)],
        ramps: &[(GroupName, StoredRamp)],
        minute_unix_ms: u64,
    ) -> Result<(), StoreError> {
        let mut stored = self.stored();
        stored.meters.extend(meters.iter().cloned());
        stored.ramps = ramps.iter().cloned().collect();
        drop(stored);
        self.put_usage(meters, minute_unix_ms)
    }

    fn put_running_meters(
        &mut self,
        meters: &[(GroupName, Meter)],
        minute_unix_ms: u64,
    ) -> Result<(), StoreError> {
        self.stored().meters.extend(meters.iter().cloned());
        self.put_usage(meters, minute_unix_ms)
    }

    fn put_usage(&mut self, meters: &[(GroupName, Meter)], minute_unix_ms: u64) -> Result<(), StoreError> {
        let mut usage = self.usage.lock().unwrap_or_else(PoisonError::into_inner);
        for (name, meter) in meters {
            usage.insert((minute_unix_ms, name.clone()), *meter);
        }
        while usage.len() > USAGE_MAX {
            usage.pop_first();
        }
        Ok(())
    }

    fn usage(
        &mut self,
        group: Option<&GroupName>,
        since_unix_ms: u64,
        limit: usize,
    ) -> Result<Vec<UsageRecord>, StoreError> {
        let usage = self.usage.lock().unwrap_or_else(PoisonError::into_inner);
        let mut pick = UsageSelector::new(group, since_unix_ms, limit);
        for ((minute, name), meter) in usage.iter() {
            pick.push(UsageRecord { minute_unix_ms: *minute, group: name.clone(), meter: *meter });
        }
        Ok(pick.finish())
    }

    fn recent_groups(&mut self, since_unix_ms: u64, limit: usize) -> Result<Vec<GroupName>, StoreError> {
        let usage = self.usage.lock().unwrap_or_else(PoisonError::into_inner);
        let names = usage.iter().filter(|((minute, _), _)| *minute >= since_unix_ms).map(|((_, g), _)| g);
        Ok(distinct(names.cloned(), limit))
    }

    fn put_credential(&mut self, id: &str, record: &str) -> Result<(), StoreError> {
        self.stored().credentials.insert(id.to_string(), record.to_string());
        self.write_staged()
    }

    fn drop_credential(&mut self, id: &str) -> Result<bool, StoreError> {
        let existed = self.stored().credentials.remove(id).is_some();
        self.write_staged()?;
        Ok(existed)
    }

    fn set_rls_rules(&mut self, json: &str) -> Result<(), StoreError> {
        self.stored().rls_rules = Some(json.to_string());
        self.write_staged()
    }

    fn audited(&mut self, record: AuditRecord) -> &mut dyn SettingsStore {
        self.staged = Some(record);
        self
    }

    fn append_audit(&mut self, record: &AuditRecord) -> Result<(), StoreError> {
        let mut audit = self.audit.lock().unwrap_or_else(PoisonError::into_inner);
        audit.push_back(record.clone());
        while audit.len() > AUDIT_MAX {
            audit.pop_front();
        }
        Ok(())
    }

    fn audit(&mut self, since_unix_ms: u64, limit: usize) -> Result<Vec<AuditRecord>, StoreError> {
        let audit = self.audit.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(audit.iter().filter(|r| r.at_unix_ms >= since_unix_ms).take(limit).cloned().collect())
    }
}

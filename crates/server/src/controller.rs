//! The controller's state: the core pipeline, the settings, and what the front ends read.
//!
//! Exchanges and backend reports feed the pipeline under one short lock. The pipeline ticks
//! every `tick` (tokio time), computing targets and grants; an exchange is answered with
//! the client's grant from the last tick, or, for a client the last tick did not know yet,
//! an even part of the group's target. Admin changes are written to the store, durably,
//! before they are applied and acknowledged; one admin change runs at a time.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tollgate_core::pipeline::{ClientReport, Health, Pipeline, PipelineSettings};
use tollgate_core::settings::{GroupName, GroupSettings, SettingErrors};
use tollgate_core::time::Nanos;
use tollgate_proto::v1;

use crate::convert;
use crate::store::{Store, StoreError};

/// Per group, what the front ends report beyond the pipeline's outcome.
#[derive(Debug, Clone, Default)]
pub struct GroupCounters {
    /// Units consumed, all time (from client reports).
    pub consumed_total: f64,
    /// Requests admitted, all time.
    pub admitted_total: u64,
    /// Requests refused, all time.
    pub throttled_total: u64,
    /// Units consumed since the last tick, and over the last tick (units/s).
    consumed_since_tick: f64,
    throttled_since_tick: f64,
    /// Units/s consumed over the last tick.
    pub admitted_rate: f64,
    /// Requests/s refused over the last tick.
    pub throttled_rate: f64,
}

/// A group's state as `status` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupView {
    /// Its name.
    pub name: GroupName,
    /// Its settings, if configured.
    pub settings: Option<GroupSettings>,
    /// Target units/s; `None` when not throttled.
    pub target: Option<f64>,
    /// Units/s consumed over the last tick.
    pub admitted: f64,
    /// Requests/s refused over the last tick.
    pub throttled: f64,
    /// Units/s asked for.
    pub demand: f64,
    /// Limited by saturation below its cap.
    pub busy: bool,
    /// Clients with a live grant.
    pub clients: u32,
    /// All-time counters.
    pub consumed_total: f64,
    /// All-time admitted requests.
    pub admitted_total: u64,
    /// All-time refused requests.
    pub throttled_total: u64,
}

struct Inner {
    pipeline: Pipeline,
    groups: BTreeMap<GroupName, GroupSettings>,
    capacity: Option<f64>,
    client_ids: HashMap<String, u64>,
    counters: BTreeMap<GroupName, GroupCounters>,
    exchanges: u64,
    last_tick: Nanos,
    /// Grants made since the last tick to clients it did not know, per group.
    provisional: BTreeMap<GroupName, HashMap<u64, f64>>,
}

/// Why an admin change failed.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The settings break rules; nothing changed.
    #[error("{0}")]
    Invalid(SettingErrors),
    /// No such group.
    #[error("group {0:?} does not exist")]
    NotFound(String),
    /// The group exists already.
    #[error("group {0:?} already exists")]
    AlreadyExists(String),
    /// The store failed; nothing changed.
    #[error("{0}")]
    Store(#[from] StoreError),
}

/// The controller.
pub struct Controller {
    inner: Mutex<Inner>,
    admin: tokio::sync::Mutex<Store>,
    tick: Duration,
    lease: Duration,
}

impl Controller {
    /// A controller over `store`, with the settings it holds.
    pub fn new(store: Store, opts: &crate::ServerOptions) -> Result<Controller, StoreError> {
        let stored = store.load()?;
        let (tick, lease) = (opts.tick, opts.lease);
        let settings = PipelineSettings {
            capacity: stored.capacity,
            lease,
            ignore_worst_zones: opts.ignore_worst_zones,
            limiting_threshold: opts.limiting_threshold,
            ..PipelineSettings::default()
        };
        let lease = settings.lease;
        let mut pipeline = Pipeline::new(settings);
        for (name, s) in &stored.groups {
            pipeline.set_group(name.clone(), s.clone());
        }
        Ok(Controller {
            inner: Mutex::new(Inner {
                pipeline,
                groups: stored.groups,
                capacity: stored.capacity,
                client_ids: HashMap::new(),
                counters: BTreeMap::new(),
                exchanges: 0,
                last_tick: Nanos::ZERO,
                provisional: BTreeMap::new(),
            }),
            admin: tokio::sync::Mutex::new(store),
            tick,
            lease,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // The state is plain data, consistent at every await-free step.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The tick period.
    pub fn tick_period(&self) -> Duration {
        self.tick
    }

    /// Runs one pipeline tick at `now`.
    pub fn tick(&self, now: Nanos) {
        let mut inner = self.lock();
        let elapsed = now.since(inner.last_tick).as_secs_f64().max(1e-9);
        inner.last_tick = now;
        inner.pipeline.tick(now);
        inner.provisional.clear();
        for c in inner.counters.values_mut() {
            c.admitted_rate = c.consumed_since_tick / elapsed;
            c.throttled_rate = c.throttled_since_tick / elapsed;
            c.consumed_since_tick = 0.0;
            c.throttled_since_tick = 0.0;
        }
    }

    /// Answers an exchange (already validated).
    pub fn exchange(
        &self,
        now: Nanos,
        req: &v1::ExchangeRequest,
        groups: &[GroupName],
    ) -> v1::ExchangeResponse {
        let mut inner = self.lock();
        inner.exchanges += 1;
        let next_id = inner.client_ids.len() as u64 + 1;
        let client = *inner.client_ids.entry(req.client_id.clone()).or_insert(next_id);
        let mut grants = Vec::with_capacity(req.groups.len());
        for (usage, name) in req.groups.iter().zip(groups) {
            let report = ClientReport {
                demand: usage.demand,
                consumed: usage.consumed,
                requests: usage.admitted as f64,
            };
            inner.pipeline.client_report(now, client, name, report);
            let c = inner.counters.entry(name.clone()).or_default();
            c.consumed_total += usage.consumed;
            c.consumed_since_tick += usage.consumed;
            c.admitted_total += usage.admitted;
            c.throttled_total += usage.throttled;
            c.throttled_since_tick += usage.throttled as f64;
            let grant = self.grant_for(&inner, name, client);
            let known = inner.pipeline.outcome(name).is_some_and(|o| o.grants.contains_key(&client));
            if !known && !grant.unlimited {
                inner.provisional.entry(name.clone()).or_default().insert(client, grant.rate);
            }
            grants.push(grant);
        }
        v1::ExchangeResponse { grants, next_exchange_ms: duration_ms(self.tick) }
    }

    fn grant_for(&self, inner: &Inner, name: &GroupName, client: u64) -> v1::Grant {
        let reserved = inner.groups.get(name).map_or(0.0, GroupSettings::reserved);
        let lease_ms = duration_ms(self.lease);
        let unlimited = v1::Grant {
            group: name.to_string(),
            unlimited: true,
            rate: 0.0,
            burst: 0.0,
            lease_ms,
            reserved,
            clients: 1,
        };
        let Some(outcome) = inner.pipeline.outcome(name) else {
            // Not ticked yet: bounded by the settings alone, shared by no one known yet.
            return match inner.groups.get(name).map(|s| s.limit().as_f64()).filter(|l| l.is_finite()) {
                Some(limit) => v1::Grant { unlimited: false, rate: limit, burst: limit, ..unlimited },
                None => unlimited,
            };
        };
        let clients = outcome.grants.len().max(1) as u32;
        let Some(target) = outcome.target else { return v1::Grant { clients, ..unlimited } };
        let (rate, burst) = match outcome.grants.get(&client) {
            Some(g) => (g.rate, g.burst),
            // A client the last tick did not know: until the next tick it gets only what the
            // target has left after every grant already made, so the grants never add up to
            // more than the target (the controller relearns conservatively).
            None => {
                let granted: f64 = outcome.grants.values().map(|g| g.rate).sum::<f64>()
                    + inner.provisional.get(name).map_or(0.0, |p| p.values().sum());
                let part = (target - granted).max(0.0);
                (part, part)
            }
        };
        v1::Grant { unlimited: false, rate, burst, clients, ..unlimited }
    }

    /// Records a backend's report (already validated).
    pub fn backend_report(&self, now: Nanos, r: &v1::BackendReport, loads: &[(GroupName, f64)]) {
        let health = match r.health {
            Some(v1::backend_report::Health::QueueBytes(q)) => Health::QueueBytes(q),
            Some(v1::backend_report::Health::Utilisation(u)) => Health::Utilisation(u),
            None => Health::Utilisation(0.0),
        };
        tracing::debug!(backend = %r.backend_id, zone = %r.zone, ?health, ?loads, "backend report");
        self.lock().pipeline.backend_report(now, &r.backend_id, &r.zone, health, loads);
    }

    /// Creates or alters a group. Durable before it returns.
    pub async fn put_group(
        &self,
        name: GroupName,
        patch: &v1::GroupPatch,
        mode: v1::PutMode,
    ) -> Result<GroupSettings, AdminError> {
        let store = self.admin.lock().await;
        let current = self.lock().groups.get(&name).cloned();
        match (mode, &current) {
            (v1::PutMode::Create, Some(_)) => return Err(AdminError::AlreadyExists(name.to_string())),
            (v1::PutMode::Alter, None) => return Err(AdminError::NotFound(name.to_string())),
            _ => {}
        }
        let settings =
            convert::apply_patch(current.unwrap_or_default(), patch).map_err(AdminError::Invalid)?;
        store.put_group(&name, &settings)?;
        let mut inner = self.lock();
        inner.pipeline.set_group(name.clone(), settings.clone());
        inner.groups.insert(name, settings.clone());
        Ok(settings)
    }

    /// Drops a group; says whether it existed. Durable before it returns.
    pub async fn drop_group(&self, name: &GroupName) -> Result<bool, AdminError> {
        let store = self.admin.lock().await;
        let existed = store.drop_group(name)?;
        let mut inner = self.lock();
        inner.pipeline.remove_group(name);
        inner.groups.remove(name);
        Ok(existed)
    }

    /// Sets the node capacity. Durable before it returns.
    pub async fn set_capacity(&self, capacity: Option<f64>) -> Result<(), AdminError> {
        if let Some(c) = capacity
            && !(c.is_finite() && c > 0.0)
        {
            return Err(AdminError::Invalid(SettingErrors(vec![
                tollgate_core::settings::SettingError::new(
                    "capacity",
                    format!("must be a finite number above 0, got {c}"),
                ),
            ])));
        }
        let store = self.admin.lock().await;
        store.set_capacity(capacity)?;
        let mut inner = self.lock();
        inner.pipeline.set_capacity(capacity);
        inner.capacity = capacity;
        Ok(())
    }

    /// A group's settings.
    pub fn group(&self, name: &GroupName) -> Option<GroupSettings> {
        self.lock().groups.get(name).cloned()
    }

    /// Every configured group.
    pub fn groups(&self) -> BTreeMap<GroupName, GroupSettings> {
        self.lock().groups.clone()
    }

    /// The node capacity.
    pub fn capacity(&self) -> Option<f64> {
        self.lock().capacity
    }

    /// Exchanges answered so far.
    pub fn exchanges(&self) -> u64 {
        self.lock().exchanges
    }

    /// Every group configured or seen in traffic, with its state as of the last tick.
    pub fn view(&self) -> Vec<GroupView> {
        let inner = self.lock();
        let mut names: Vec<GroupName> = inner.groups.keys().cloned().collect();
        for (name, _) in inner.pipeline.outcomes() {
            if !names.contains(name) {
                names.push(name.clone());
            }
        }
        names.sort();
        names
            .into_iter()
            .map(|name| {
                let outcome = inner.pipeline.outcome(&name);
                let c = inner.counters.get(&name).cloned().unwrap_or_default();
                GroupView {
                    settings: inner.groups.get(&name).cloned(),
                    target: outcome.and_then(|o| o.target),
                    admitted: c.admitted_rate,
                    throttled: c.throttled_rate,
                    demand: outcome.map_or(0.0, |o| o.demand),
                    busy: outcome.is_some_and(|o| o.busy),
                    clients: outcome.map_or(0, |o| o.grants.len() as u32),
                    consumed_total: c.consumed_total,
                    admitted_total: c.admitted_total,
                    throttled_total: c.throttled_total,
                    name,
                }
            })
            .collect()
    }
}

fn duration_ms(d: Duration) -> u32 {
    u32::try_from(d.as_millis()).unwrap_or(u32::MAX)
}

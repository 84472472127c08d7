//! Envoy's rate-limit service (RLS v3, `envoy.service.ratelimit.v3.RateLimitService`) on the
//! gRPC port.
//!
//! Envoy, Istio, Envoy Gateway and Gloo ask a rate-limit service about each request with a
//! domain and descriptors. Here each descriptor names a group (by the mapping rules,
//! [`tollgate_model::rls`]) and costs `hits_addend` units. The decision comes from a client of
//! this controller's own grants, living in the server process: its buckets are fed by
//! exchanges with the controller like any remote client's, so an Envoy fleet and Rust clients
//! share one group's limit. A request is admitted only when every descriptor's group admits
//! it; then each descriptor's units are consumed; otherwise none are.
//!
//! Two kinds of descriptor are not decisions. One carrying the entry [`CHARGE_KEY`] (any value)
//! charges work already done, as Envoy's `apply_on_stream_done` calls send it after the
//! response with a `hits_addend` known only then: always charged, into debt when the group
//! has no more, never refused (Envoy ignores that answer). One with `is_negative_hits` gives
//! its hits back (a deposit). Both are answered OK and take no part in the all-or-nothing.
//!
//! A descriptor carrying the entry [`CLASS_KEY`] (`critical`, `normal` or `sheddable`) is
//! admitted in that request class (see [`tollgate_model::class`]); one carrying
//! [`UNTHROTTLED_KEY`] is admitted whatever its group has left, still counted (only for a
//! caller with the unthrottled privilege). Neither entry takes part in naming the group.
//!
//! In-flight quotas through Envoy: a request whose descriptors carry [`HOLD_KEY`] with the
//! request's id (Envoy's `x-request-id`) keeps the permits it is admitted with (their
//! in-flight slots) until a later call's descriptor carries [`RELEASE_KEY`] with the same id,
//! as Envoy's `apply_on_stream_done` sends it once the response has ended (settled at that
//! descriptor's `hits_addend` when it has one), or until the hold's lease runs out
//! ([`LEASE_KEY`] seconds, 60 by default; see [`crate::front::holds`]). A release for an id that
//! holds nothing (a refused request) does nothing.

use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit, rate_limit::Unit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tollgate_limiter::{AcquireError, GroupHandle, RemoteOptions, Tollgate};
use tollgate_model::class::RequestClass;
use tollgate_model::rls::{Decision, RuleSet};
use tollgate_model::settings::GroupName;
use tonic::{Request, Response, Status};

use crate::access::auth::Caller;
use crate::clock::Clock;
use crate::cluster::role::{Cluster, Route};
use crate::controller::Controller;
use crate::error::AdminError;
use crate::front::holds::HoldKey;
use crate::store::{Shared, StoreError, audited};

/// The most descriptors in one request.
pub const DESCRIPTORS_MAX: usize = 64;
/// The most entries in one descriptor.
pub const ENTRIES_MAX: usize = 64;
/// The longest domain, key or value, in bytes.
pub const TEXT_MAX_BYTES: usize = 1024;
/// The most units one descriptor may cost.
pub const HITS_MAX: u64 = 1_000_000_000;
/// How long a request waits, at most, for a group's first grant: answered in microseconds,
/// but a machine loaded to the full may hold the exchange up (Envoy's own timeout, 250 ms in
/// the example, ends its wait sooner).
const FIRST_GRANT_WAIT: Duration = Duration::from_secs(1);
/// The client id the front end exchanges under.
pub const CLIENT_ID: &str = "tollgate-rls";

/// How Envoy's descriptors name groups: the mapping rules in use, durable in the store and in
/// its audit log, and followed when another controller changes them.
pub struct RlsRules {
    store: Shared,
    rules: RwLock<Arc<RuleSet>>,
}

impl RlsRules {
    /// The rules as stored (JSON; none when never set), written through `store`.
    pub fn new(store: Shared, stored: Option<&str>) -> Result<RlsRules, StoreError> {
        let rules = match stored {
            None => RuleSet::default(),
            Some(json) => RuleSet::from_json(json).map_err(|reason| StoreError::Corrupt {
                path: Default::default(),
                what: "RLS rules".into(),
                reason,
            })?,
        };
        Ok(RlsRules { store, rules: RwLock::new(Arc::new(rules)) })
    }

    /// The rules in use.
    pub fn get(&self) -> Arc<RuleSet> {
        self.rules.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Replaces the rules (checked; durable before it returns; in the audit log).
    pub fn set(&self, rules: RuleSet, who: &str) -> Result<(), AdminError> {
        rules.check().map_err(AdminError::Rule)?;
        let json = rules.to_json();
        let mut store = self.store.lock();
        let before = self.get().to_json();
        audited(&mut store, who, "rls.set".into(), Some(before), Some(json.clone())).set_rls_rules(&json)?;
        *self.rules.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(rules);
        Ok(())
    }

    /// Takes the rules as another controller stored them; says whether they changed.
    pub fn sync(&self, json: &str) -> bool {
        match RuleSet::from_json(json) {
            Ok(rules) if *self.get() != rules => {
                *self.rules.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(rules);
                true
            }
            Ok(_) => false,
            Err(e) => {
                tracing::error!(error = %e, "stored RLS rules cannot be read; keeping the ones in use");
                false
            }
        }
    }
}

/// How long the front end's exchange waits, in all, for an election to name a leader.
const LEADER_WAIT: Duration = Duration::from_secs(2);
/// How often it looks while it waits.
const LEADER_LOOK: Duration = Duration::from_millis(20);

/// The rate-limit service over a controller.
#[derive(Clone)]
pub struct Rls {
    controller: Arc<Controller>,
    rules: Arc<RlsRules>,
    gate: Tollgate,
    /// The patterns the descriptors' own limits made (at most [`OVERRIDES_MAX`]).
    overrides: Arc<std::sync::Mutex<std::collections::HashSet<GroupName>>>,
    /// Permits held from a request until its stream's end.
    holds: Arc<crate::front::holds::Holds>,
    clock: Clock,
    /// The most one charge may take.
    charges: crate::front::charges::ChargeBound,
}

impl Rls {
    /// The front end over the grants of `cluster`'s leader (`controller` itself while it
    /// grants), with its exchange loop started on the current runtime, keeping held permits in
    /// `holds`.
    pub fn start(
        controller: Arc<Controller>,
        cluster: Arc<Cluster>,
        rules: Arc<RlsRules>,
        clock: Clock,
        holds: Arc<crate::front::holds::Holds>,
        charges: crate::front::charges::ChargeBound,
    ) -> Rls {
        // On the server's own time (tokio's), read when a check comes: the default clock would
        // keep a thread refreshing a coarse time every millisecond for the life of the server,
        // waking a core a thousand times a second whether or not any check ever comes.
        let opts = RemoteOptions {
            client_id: Some(cluster.link().front_client_id(CLIENT_ID)),
            clock: Some(Arc::new(tollgate_limiter::clock::TokioClock::new())),
            ..RemoteOptions::default()
        };
        let (gate, driver) = Tollgate::remote_driven(opts).expect("the default remote options are valid");
        // An exchange in process costs no round trip: a new group's first grant is asked for
        // the moment it appears, not up to 50 ms later.
        let driver = driver.with_early_spacing(Duration::ZERO);
        // The engine here while this controller grants; the leader while it follows.
        let c = cluster.clone();
        tokio::spawn(driver.run_with(move |request| {
            let c = c.clone();
            async move {
                // A follower that knows no leader yet (an election under way) waits for one
                // rather than failing: a failure before any answer would put this client in
                // safe mode, refusing new groups until its backoff ran out, although the
                // leader is known a moment later.
                let mut waited = Duration::ZERO;
                while matches!(c.route(false), Ok(Route::Leader(None))) && waited < LEADER_WAIT {
                    tokio::time::sleep(LEADER_LOOK).await;
                    waited += LEADER_LOOK;
                }
                c.exchange(clock.now(), request).await
            }
        }));
        Rls { controller, rules, gate, overrides: Arc::default(), holds, clock, charges }
    }

    /// The in-process client its decisions come from (`POST /v1/check` shares it).
    pub fn gate(&self) -> &Tollgate {
        &self.gate
    }
}

/// A group this front end has not met yet admits nothing until its first grant, which is
/// asked for at once (an exchange in process, answered in microseconds): wait for it (at most
/// a second) rather than refuse.
///
/// The wait is boxed, as every wait on the decision's path: a caller's future then carries a
/// pointer, not the timer, and a decision that waits for nothing (nearly all) makes its
/// future small (a few hundred bytes, which the allocator hands out from its per-thread
/// cache, where kilobytes took a thousand instructions to allocate and free).
pub(crate) async fn wait_for_first_grant(handle: &tollgate_limiter::GroupHandle) {
    if !handle.has_grant() {
        let _ = Box::pin(tokio::time::timeout(FIRST_GRANT_WAIT, handle.wait_for_grant())).await;
    }
}

/// How long a check waits, in all, for the allotments its group's quotas need: each is
/// answered in microseconds in process (a group's allotment runs out after about log₂ of its
/// quota's units, asking again at once).
const ALLOTMENT_WAIT: Duration = Duration::from_secs(1);
/// How long one look for an answer waits before trying again.
const ALLOTMENT_LOOK: Duration = Duration::from_millis(10);

/// Admits `cost` in `class` through a front end's handle: at once, or, when the group's
/// quota allotment ran out while its controller had units left (or its window ended), as
/// soon as the allotment asked for comes (within [`ALLOTMENT_WAIT`]): a quota is refused
/// only once it is spent, never because this front end had not asked for its part yet. The
/// wait for an allotment is boxed (see [`wait_for_first_grant`]).
pub(crate) async fn admit_now(
    handle: &tollgate_limiter::GroupHandle,
    cost: f64,
    class: RequestClass,
) -> Result<tollgate_limiter::Permit<'_>, AcquireError> {
    match handle.try_acquire_class(cost, class) {
        Err(AcquireError::Throttled { .. }) if handle.quota().is_some_and(|q| q.asks_more(cost)) => {
            Box::pin(admit_after_allotments(handle, cost, class)).await
        }
        other => other,
    }
}

/// [`admit_now`] once the group's allotment ran short: asks again as each answer comes,
/// within [`ALLOTMENT_WAIT`] in all.
async fn admit_after_allotments(
    handle: &tollgate_limiter::GroupHandle,
    cost: f64,
    class: RequestClass,
) -> Result<tollgate_limiter::Permit<'_>, AcquireError> {
    let mut waited = Duration::ZERO;
    loop {
        let _ = tokio::time::timeout(ALLOTMENT_LOOK, handle.wait_for_answer()).await;
        waited += ALLOTMENT_LOOK;
        match handle.try_acquire_class(cost, class) {
            Err(AcquireError::Throttled { .. })
                if waited < ALLOTMENT_WAIT && handle.quota().is_some_and(|q| q.asks_more(cost)) => {}
            other => return other,
        }
    }
}

/// The units left at once, as Envoy's `limit_remaining` carries them: whole units, and 0 for
/// a group nothing bounds (its status names no limit either), never `u32::MAX`.
fn remaining(available: f64) -> u32 {
    if available.is_finite() { available.floor().clamp(0.0, f64::from(u32::MAX)) as u32 } else { 0 }
}

/// The limit Envoy is told a group has: its quota of the shortest window Envoy can name
/// (minute, hour, day, week, month), else its rate per second; `None` for a group nothing
/// bounds. The window comes with it (`None`: the rate).
fn current_limit(
    s: &tollgate_model::settings::GroupSettings,
) -> Option<(f64, Unit, Option<tollgate_model::settings::BudgetPeriod>)> {
    use tollgate_model::settings::BudgetPeriod;
    let window = s.quotas().find_map(|(w, units)| match w {
        BudgetPeriod::Minute => Some((units, Unit::Minute, Some(w))),
        BudgetPeriod::Hour => Some((units, Unit::Hour, Some(w))),
        BudgetPeriod::Day => Some((units, Unit::Day, Some(w))),
        BudgetPeriod::Week => Some((units, Unit::Week, Some(w))),
        BudgetPeriod::Month => Some((units, Unit::Month, Some(w))),
        BudgetPeriod::Total => None,
        // A window of seconds Envoy's units can name: envoy/ratelimit's own (a week, a month of
        // 30 days and a year of 365, from the epoch), or a minute, hour or day.
        BudgetPeriod::Every(s) | BudgetPeriod::FromFirst(s) => {
            let unit = match s {
                1 => Unit::Second,
                60 => Unit::Minute,
                3_600 => Unit::Hour,
                86_400 => Unit::Day,
                604_800 => Unit::Week,
                2_592_000 => Unit::Month,
                31_536_000 => Unit::Year,
                _ => return None,
            };
            Some((units, unit, Some(w)))
        }
    });
    window.or_else(|| Some((s.limit().as_f64(), Unit::Second, None)).filter(|(l, _, _)| l.is_finite()))
}

/// The units a front end's handle may admit at once: what is left of the group's quotas
/// (this front end's allotment and the controller's units beyond it), else the bucket's
/// tokens.
pub(crate) fn units_left(handle: &tollgate_limiter::GroupHandle) -> f64 {
    match handle.quota() {
        Some(q) => q.remaining().min(handle.available()),
        None => handle.available(),
    }
}

/// How long until the limit Envoy is told of starts afresh (`duration_until_reset`): the
/// end of its window for a quota (`window`), else, admitted, until a second of the rate has
/// come back, and refused, the retry hint `refused_for`.
fn until_reset(
    handle: &tollgate_limiter::GroupHandle,
    window: Option<tollgate_model::settings::BudgetPeriod>,
    refused_for: Option<Duration>,
) -> Duration {
    if let Some(w) = window {
        let wall = crate::clock::wall_ms();
        return Duration::from_millis(w.end_of(wall).map_or(0, |end| end.saturating_sub(wall)));
    }
    if let Some(d) = refused_for {
        return d;
    }
    let rate = handle.allowance();
    if rate.is_finite() && rate > 0.0 {
        Duration::from_secs_f64((1.0 - handle.available() / rate).clamp(0.0, 1.0))
    } else {
        Duration::ZERO
    }
}

fn invalid(field: String, rule: impl std::fmt::Display) -> Status {
    Status::invalid_argument(format!("{field}: {rule}"))
}

pub(crate) fn text(field: impl Fn() -> String, v: &str, may_be_empty: bool) -> Result<(), Status> {
    if (!may_be_empty && v.is_empty()) || v.len() > TEXT_MAX_BYTES || v.chars().any(char::is_control) {
        let least = if may_be_empty { 0 } else { 1 };
        return Err(invalid(field(), format!("must be {least} to {TEXT_MAX_BYTES} bytes of printable text")));
    }
    Ok(())
}

/// The descriptor entry key that marks a charge for work already done; it takes no part in
/// naming the group.
pub const CHARGE_KEY: &str = "tollgate_charge";

/// The descriptor entry key whose value is the request's class; it takes no part in naming
/// the group.
pub const CLASS_KEY: &str = "tollgate_class";

/// The descriptor entry key that admits the descriptor unthrottled (any value).
pub const UNTHROTTLED_KEY: &str = "tollgate_unthrottled";

/// The descriptor entry key whose value (the request's id) keeps the request's permits held
/// until it is released.
pub const HOLD_KEY: &str = "tollgate_hold";

/// The descriptor entry key whose value (a request's id) releases what that request holds in
/// the descriptor's group.
pub const RELEASE_KEY: &str = "tollgate_release";

/// The descriptor entry key whose value is a hold's lease in seconds (1 to 86,400).
pub const LEASE_KEY: &str = "tollgate_lease";

/// Whether a descriptor entry key is Tollgate's own, taking no part in naming a group.
fn reserved(key: &str) -> bool {
    matches!(key, CHARGE_KEY | CLASS_KEY | UNTHROTTLED_KEY | HOLD_KEY | RELEASE_KEY | LEASE_KEY)
}

/// What one descriptor asks of its group.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Ask {
    /// Admit this many units in this class, or refuse; in envoy/ratelimit's quota mode, a
    /// refusal refuses the request only when every descriptor in quota mode is refused.
    Admit(f64, RequestClass, QuotaMode),
    /// Give this many units back (`is_negative_hits`).
    Refund(f64),
    /// Charge this many units for work done, whatever the group has left.
    Charge(f64),
    /// Admit this many units in this class whatever the group has left, still counted.
    Unthrottled(f64, RequestClass),
    /// Release what the request named by the plan's release id holds in the group, settled
    /// at this many units when given.
    Release(Option<f64>),
    /// Nothing: another descriptor's limit `replaces` this one's, so it has no limit here.
    Lifted,
    /// Nothing limits it (a domain's envoy/ratelimit tree has no limit for it).
    NoLimit,
    /// envoy/ratelimit's `unlimited: true`: answered OK with no limit and all remaining.
    Unlimited,
}

/// Whether a descriptor's limit is in envoy/ratelimit's quota mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum QuotaMode {
    Off,
    On,
}

/// What a request asks: each group and what of it, and how the answer is made.
#[derive(Debug)]
struct Planned {
    asks: Vec<(GroupName, Ask)>,
    /// Each descriptor counted on its own (a domain imported from envoy/ratelimit, counted as
    /// it counts: a descriptor within its limit is counted even when another refuses the
    /// request), rather than all or nothing.
    each_alone: bool,
    /// A status per descriptor in the answer (a domain imported from Limitador, whose limits
    /// are not the descriptors', answers with the verdict alone, as Limitador does).
    statuses: bool,
    /// The request's id its admitted permits are held under, and the hold's lease.
    hold: Option<(String, Duration)>,
    /// The request id whose holds the descriptors asking [`Ask::Release`] release.
    release: Option<String>,
}

/// A request's descriptors as groups and what to ask of each. A descriptor that no rule names
/// a group for goes to `fallback` when there is one (the caller's token's default group), else
/// to `default`. In a domain imported from Limitador, the groups are those of every limit the
/// request meets, each asked for the request's hits.
fn plan(rules: &RuleSet, r: &RateLimitRequest, fallback: Option<&GroupName>) -> Result<Planned, Status> {
    text(|| "domain".into(), &r.domain, false)?;
    if r.descriptors.is_empty() || r.descriptors.len() > DESCRIPTORS_MAX {
        return Err(invalid(
            "descriptors".into(),
            format!("give 1 to {DESCRIPTORS_MAX}, got {}", r.descriptors.len()),
        ));
    }
    let request_hits = match r.hits_addend {
        0 => 1,
        n => u64::from(n),
    };
    let mut asks = Vec::with_capacity(r.descriptors.len());
    let mut decisions = Vec::with_capacity(r.descriptors.len());
    for (i, d) in r.descriptors.iter().enumerate() {
        let (decision, ask) = descriptor(rules, &r.domain, i, d, request_hits)?;
        asks.push(ask);
        decisions.push(decision);
    }
    if let Some(set) = rules.limit_set(&r.domain) {
        return limits_plan(set, r, asks[0], request_hits);
    }
    let lifted = tollgate_model::rls::lifted(&decisions);
    let mut planned = Vec::with_capacity(asks.len());
    for (i, ((decision, ask), lifted)) in decisions.into_iter().zip(asks).zip(lifted).enumerate() {
        let (group, ask) = match decision {
            _ if lifted => (DEFAULT.clone(), Ask::Lifted),
            Decision::NoLimit => (DEFAULT.clone(), Ask::NoLimit),
            Decision::Unlimited { .. } => (DEFAULT.clone(), Ask::Unlimited),
            Decision::Group { group, matched, quota_mode, .. } => {
                let group = match fallback {
                    Some(f) if !matched && group == tollgate_model::settings::DEFAULT_GROUP => f.clone(),
                    _ => checked_group(i, &group)?,
                };
                let ask = match ask {
                    Ask::Admit(cost, class, _) if quota_mode => Ask::Admit(cost, class, QuotaMode::On),
                    a => a,
                };
                (group, ask)
            }
        };
        planned.push((group, ask));
    }
    let (hold, release) = holds_of(r)?;
    Ok(Planned { asks: planned, each_alone: rules.tree(&r.domain).is_some(), statuses: true, hold, release })
}

/// A request in a domain imported from Limitador: every limit it meets, each asked for the
/// request's hits as the first descriptor asks (admitted, charged or given back), all or
/// nothing.
fn limits_plan(
    set: &tollgate_model::rls::LimitSet,
    r: &RateLimitRequest,
    first: Ask,
    hits: u64,
) -> Result<Planned, Status> {
    let descriptors: Vec<Vec<(&str, &str)>> = r
        .descriptors
        .iter()
        .map(|d| {
            d.entries
                .iter()
                .filter(|e| !reserved(&e.key))
                .map(|e| (e.key.as_str(), e.value.as_str()))
                .collect()
        })
        .collect();
    let hits = hits as f64;
    let ask = match first {
        Ask::Admit(_, class, mode) => Ask::Admit(hits, class, mode),
        Ask::Refund(_) => Ask::Refund(hits),
        Ask::Charge(_) => Ask::Charge(hits),
        Ask::Unthrottled(_, class) => Ask::Unthrottled(hits, class),
        other => other,
    };
    let asks = set
        .applying(&descriptors)
        .into_iter()
        .map(|g| checked_group(0, &g).map(|g| (g, ask)))
        .collect::<Result<Vec<_>, Status>>()?;
    let (hold, release) = holds_of(r)?;
    Ok(Planned { asks, each_alone: false, statuses: false, hold, release })
}

/// The request id a request's permits are held under (with the hold's lease), and the one
/// whose holds it releases, from its descriptors' [`HOLD_KEY`], [`LEASE_KEY`] and
/// [`RELEASE_KEY`] entries: each names one id in a request, and a descriptor holds or
/// releases, not both.
#[allow(clippy::type_complexity)]
fn holds_of(r: &RateLimitRequest) -> Result<(Option<(String, Duration)>, Option<String>), Status> {
    let (mut hold, mut release, mut lease) = (None::<&str>, None::<&str>, None);
    for (i, d) in r.descriptors.iter().enumerate() {
        let mut kinds = 0;
        for (j, e) in d.entries.iter().enumerate() {
            let field = || format!("descriptors[{i}].entries[{j}].value");
            let slot = match e.key.as_str() {
                HOLD_KEY => &mut hold,
                RELEASE_KEY => &mut release,
                LEASE_KEY => {
                    let secs: f64 =
                        e.value.trim().parse().map_err(|_| invalid(field(), "a number of seconds"))?;
                    lease = Some(
                        crate::front::holds::lease_of(Some(secs)).map_err(|rule| invalid(field(), rule))?,
                    );
                    continue;
                }
                _ => continue,
            };
            kinds += 1;
            if e.value.is_empty() || e.value.len() > crate::front::holds::REQUEST_ID_MAX_BYTES {
                let rule =
                    format!("a request id of 1 to {} bytes", crate::front::holds::REQUEST_ID_MAX_BYTES);
                return Err(invalid(field(), rule));
            }
            match slot {
                Some(id) if *id != e.value => {
                    return Err(invalid(
                        field(),
                        format!("one request id a request, and this one named {id:?}"),
                    ));
                }
                _ => *slot = Some(e.value.as_str()),
            }
        }
        if kinds > 1 {
            return Err(invalid(
                format!("descriptors[{i}].entries"),
                format!("{HOLD_KEY} and {RELEASE_KEY}: a descriptor holds or releases, not both"),
            ));
        }
    }
    let lease = lease.unwrap_or(crate::front::holds::LEASE_DEFAULT);
    Ok((hold.map(|id| (id.to_owned(), lease)), release.map(str::to_owned)))
}

/// The group a descriptor names, checked against the naming rules.
fn checked_group(i: usize, name: &str) -> Result<GroupName, Status> {
    GroupName::new(name).map_err(|e| {
        invalid(format!("descriptors[{i}]"), format!("names group {name:?}, which breaks a rule: {}", e.rule))
    })
}

/// The group's name that descriptors with no limit of their own are listed under (they are
/// never asked of it).
static DEFAULT: std::sync::LazyLock<GroupName> = std::sync::LazyLock::new(|| {
    GroupName::new(tollgate_model::settings::DEFAULT_GROUP).expect("a valid name")
});

fn descriptor<'r>(
    rules: &'r RuleSet,
    domain: &str,
    i: usize,
    d: &RateLimitDescriptor,
    request_hits: u64,
) -> Result<(Decision<'r>, Ask), Status> {
    if d.entries.is_empty() || d.entries.len() > ENTRIES_MAX {
        return Err(invalid(
            format!("descriptors[{i}].entries"),
            format!("give 1 to {ENTRIES_MAX}, got {}", d.entries.len()),
        ));
    }
    for (j, e) in d.entries.iter().enumerate() {
        text(|| format!("descriptors[{i}].entries[{j}].key"), &e.key, false)?;
        text(|| format!("descriptors[{i}].entries[{j}].value"), &e.value, true)?;
    }
    let own = d.limit.as_ref().map(|l| override_limit(i, l)).transpose()?;
    let hits = d.hits_addend.as_ref().map_or(request_hits, |h| h.value);
    if hits > HITS_MAX {
        return Err(invalid(
            format!("descriptors[{i}].hits_addend"),
            format!("at most {HITS_MAX}, got {hits}"),
        ));
    }
    let charge = d.entries.iter().any(|e| e.key == CHARGE_KEY);
    let mut class = RequestClass::Normal;
    for (j, e) in d.entries.iter().enumerate().filter(|(_, e)| e.key == CLASS_KEY) {
        class = RequestClass::from_name(&e.value)
            .map_err(|rule| invalid(format!("descriptors[{i}].entries[{j}].value"), rule))?;
    }
    let entries: Vec<(&str, &str)> =
        d.entries.iter().filter(|e| !reserved(&e.key)).map(|e| (e.key.as_str(), e.value.as_str())).collect();
    let has = |key: &str| d.entries.iter().any(|e| e.key == key);
    let ask = match (d.is_negative_hits, charge) {
        _ if has(RELEASE_KEY) => Ask::Release(d.hits_addend.as_ref().map(|h| h.value as f64)),
        (true, _) => Ask::Refund(hits as f64),
        (false, true) => Ask::Charge(hits as f64),
        (false, false) if has(UNTHROTTLED_KEY) => Ask::Unthrottled(hits as f64, class),
        (false, false) => Ask::Admit(hits as f64, class, QuotaMode::Off),
    };
    match own {
        Some(own) => Ok((own.decision(domain, &entries), ask)),
        None => Ok((rules.decide(domain, &entries), ask)),
    }
}

/// The most patterns the descriptors' own limits (Envoy's per-route overrides) make.
pub const OVERRIDES_MAX: usize = 1000;

/// The group names the descriptors' own limits count under begin with this.
pub const OVERRIDE_PREFIX: &str = "rls-override";

/// A descriptor's own limit (Envoy's `RateLimitDescriptor.limit`, its per-route override):
/// `requests_per_unit` per `unit`, counted as envoy/ratelimit counts it.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Override {
    per_unit: u32,
    window: tollgate_model::settings::BudgetPeriod,
}

fn override_limit(
    i: usize,
    l: &envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride,
) -> Result<Override, Status> {
    use tollgate_model::settings::BudgetPeriod;
    let window = match Unit::try_from(l.unit) {
        Ok(Unit::Second) => BudgetPeriod::Every(1),
        Ok(Unit::Minute) => BudgetPeriod::Minute,
        Ok(Unit::Hour) => BudgetPeriod::Hour,
        Ok(Unit::Day) => BudgetPeriod::Day,
        Ok(Unit::Week) => BudgetPeriod::Every(7 * 86_400),
        Ok(Unit::Month) => BudgetPeriod::Every(30 * 86_400),
        Ok(Unit::Year) => BudgetPeriod::Every(365 * 86_400),
        _ => {
            return Err(invalid(
                format!("descriptors[{i}].limit.unit"),
                format!("must be SECOND, MINUTE, HOUR, DAY, WEEK, MONTH or YEAR, got {}", l.unit),
            ));
        }
    };
    Ok(Override { per_unit: l.requests_per_unit, window })
}

impl Override {
    /// The group a descriptor with this limit counts under: one per descriptor's entries and
    /// limit, as envoy/ratelimit keeps one counter per descriptor and limit.
    fn decision<'r>(&self, domain: &str, entries: &[(&str, &str)]) -> Decision<'r> {
        Decision::Group {
            group: self.name(domain, entries, false),
            matched: true,
            name: "",
            replaces: &[],
            quota_mode: false,
        }
    }

    /// The group's name, or (`pattern`) the pattern its settings go on, every value a `*`.
    fn name(&self, domain: &str, entries: &[(&str, &str)], pattern: bool) -> String {
        let parts: Vec<String> =
            entries.iter().map(|(k, v)| format!("{k}={}", if pattern { "*" } else { v })).collect();
        format!("{OVERRIDE_PREFIX}/{domain}/{}/{}-per-{}", parts.join("/"), self.per_unit, self.window.name())
    }

    /// The settings its pattern holds.
    fn settings(&self) -> tollgate_model::settings::GroupSettings {
        let b = tollgate_model::settings::GroupSettings::builder();
        let b =
            if self.per_unit == 0 { b.limit(0.0) } else { b.quota(self.window, f64::from(self.per_unit)) };
        b.build().expect("a count per window is valid settings")
    }
}

fn seconds(d: Duration) -> prost_types_duration::Duration {
    prost_types_duration::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

/// Envoy's `google.protobuf.Duration`, as envoy-types names it.
mod prost_types_duration {
    pub use envoy_types::pb::google::protobuf::Duration;
}

impl Ask {
    /// Whether the descriptor is asked of a group (the others have no limit here).
    fn names_group(self) -> bool {
        !matches!(self, Ask::Lifted | Ask::NoLimit | Ask::Unlimited)
    }
}

impl Rls {
    /// Makes sure the pattern of every descriptor's own limit in `r` holds that limit: set
    /// (durable, audited) the first time it is met, at most [`OVERRIDES_MAX`] of them.
    async fn ensure_overrides(&self, r: &RateLimitRequest) -> Result<(), Status> {
        for (i, d) in r.descriptors.iter().enumerate() {
            let Some(l) = &d.limit else { continue };
            let own = override_limit(i, l)?;
            let entries: Vec<(&str, &str)> = d
                .entries
                .iter()
                .filter(|e| !reserved(&e.key))
                .map(|e| (e.key.as_str(), e.value.as_str()))
                .collect();
            let name = own.name(&r.domain, &entries, true);
            let pattern = checked_group(i, &name)?;
            let settings = own.settings();
            if self.controller.admin().group(&pattern).as_ref() == Some(&settings) {
                continue;
            }
            {
                let mut made = self.overrides.lock().unwrap_or_else(PoisonError::into_inner);
                if !made.contains(&pattern) && made.len() >= OVERRIDES_MAX {
                    return Err(Status::resource_exhausted(format!(
                        "descriptors[{i}].limit: at most {OVERRIDES_MAX} descriptors' own limits are kept (patterns {OVERRIDE_PREFIX}/…); drop some, or give the limit in the groups' settings"
                    )));
                }
                made.insert(pattern.clone());
            }
            let c = self.controller.clone();
            crate::blocking::spawn(move || {
                c.admin().set_group(
                    pattern,
                    settings,
                    "rls (a descriptor's own limit)",
                    crate::clock::wall_ms(),
                )
            })
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map_err(|e| Status::invalid_argument(format!("descriptors[{i}].limit: {e}")))?;
        }
        Ok(())
    }

    /// Keeps `permits` (their in-flight slots) under the request id `id` for at most
    /// `lease`, each under its group; with no room, gives them all back and says so.
    fn hold(
        &self,
        id: &str,
        lease: Duration,
        permits: Vec<tollgate_limiter::Permit<'static>>,
    ) -> Result<(), Status> {
        let now = self.clock.now();
        let mut left = permits.into_iter();
        while let Some(p) = left.next() {
            let group = p.group().to_owned();
            let key = HoldKey::Request(group.clone(), id.to_owned());
            if let Err(e) = self.holds.hold(key, &group, p, now, lease) {
                for p in left {
                    p.dropped();
                }
                return Err(Status::resource_exhausted(format!("{HOLD_KEY}: {e}")));
            }
        }
        Ok(())
    }

    /// A decided descriptor's status as envoy/ratelimit sends it: a refused descriptor has
    /// nothing left; every descriptor with a limit says when it starts afresh.
    fn status(
        &self,
        group: &GroupName,
        handle: &GroupHandle,
        code: Code,
        until: Duration,
    ) -> DescriptorStatus {
        // Read in place under the engine's lock: a clone of the settings at every decision
        // held that lock long enough to queue the other calls behind it.
        let limit = self.controller.admin().with_settings(group, current_limit).flatten();
        let left = if code == Code::OverLimit { 0 } else { remaining(units_left(handle)) };
        let refused_for = (code == Code::OverLimit).then_some(until);
        DescriptorStatus {
            code: code as i32,
            current_limit: limit.map(|(l, unit, _)| RateLimit {
                name: group.as_str().to_owned(),
                requests_per_unit: l.round().clamp(0.0, f64::from(u32::MAX)) as u32,
                unit: unit as i32,
            }),
            limit_remaining: left,
            duration_until_reset: limit
                .map(|(_, _, window)| seconds(until_reset(handle, window, refused_for))),
            ..DescriptorStatus::default()
        }
    }

    /// One descriptor's answer: its status as envoy/ratelimit would send it, and the permit
    /// it took, if it was admitted.
    async fn answer(
        &self,
        group: &GroupName,
        ask: Ask,
        release: Option<&str>,
    ) -> Result<(DescriptorStatus, Option<tollgate_limiter::Permit<'static>>), Status> {
        let ok = |remaining: u32| DescriptorStatus {
            code: Code::Ok as i32,
            limit_remaining: remaining,
            ..DescriptorStatus::default()
        };
        match ask {
            Ask::Lifted | Ask::NoLimit => return Ok((ok(0), None)),
            // As envoy/ratelimit answers an unlimited descriptor: everything remains.
            Ask::Unlimited => return Ok((ok(u32::MAX), None)),
            Ask::Release(cost) => {
                let key = release.map(|id| HoldKey::Request(group.to_string(), id.to_owned()));
                if let Some(held) = key.and_then(|k| self.holds.release(&k))
                    && let Some(cost) = cost
                {
                    held.permit.settle(cost).map_err(|e| Status::invalid_argument(e.to_string()))?;
                }
                return Ok((ok(0), None));
            }
            _ => {}
        }
        // The unthrottled view is made only when asked for: the common path takes no clone.
        let unthrottled;
        let gate = if matches!(ask, Ask::Unthrottled(..)) {
            unthrottled = self.gate.unthrottled();
            &unthrottled
        } else {
            &self.gate
        };
        let handle = gate.group(group.as_str()).map_err(|e| Status::internal(e.to_string()))?;
        wait_for_first_grant(&handle).await;
        let mut permit = None;
        let (code, until) = match ask {
            // A deposit (never past the burst) or a charge for work done (into debt when the
            // group has no more): answered OK, no part of the verdict.
            Ask::Refund(units) => {
                handle.refund(units).map_err(|e| Status::invalid_argument(e.to_string()))?;
                (Code::Ok, Duration::ZERO)
            }
            Ask::Charge(units) => {
                let bounded = self
                    .controller
                    .admin()
                    .with_settings(group, |s| self.charges.check(group.as_str(), Some(s), units));
                bounded.transpose().map_err(Status::invalid_argument)?;
                handle.charge(units).map_err(|e| Status::invalid_argument(e.to_string()))?;
                (Code::Ok, Duration::ZERO)
            }
            Ask::Admit(cost, class, _) | Ask::Unthrottled(cost, class) => {
                match admit_now(&handle, cost, class).await {
                    Ok(p) => {
                        permit = Some(p.into_owned());
                        (Code::Ok, Duration::ZERO)
                    }
                    Err(AcquireError::Throttled { retry_after, .. }) => (Code::OverLimit, retry_after),
                    // Larger than the group's burst can ever hold: over the limit for good.
                    Err(AcquireError::NeverAdmissible { .. }) => (Code::OverLimit, Duration::from_secs(1)),
                    Err(e) => return Err(Status::invalid_argument(e.to_string())),
                }
            }
            Ask::Lifted | Ask::NoLimit | Ask::Unlimited | Ask::Release(_) => unreachable!("answered above"),
        };
        Ok((self.status(group, &handle, code, until), permit))
    }
}

#[tonic::async_trait]
impl RateLimitService for Rls {
    async fn should_rate_limit(
        &self,
        req: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let caller = req.extensions().get::<Caller>().cloned();
        self.decide(caller.as_ref(), &req.into_inner()).await.map(Response::new)
    }
}

impl Rls {
    /// The answer to `r`, asked by `caller` (none when the server takes no tokens): what the
    /// service answers, with no request or response around it.
    pub(crate) async fn decide(
        &self,
        caller: Option<&Caller>,
        r: &RateLimitRequest,
    ) -> Result<RateLimitResponse, Status> {
        let fallback = caller.and_then(|Caller(c)| GroupName::new(&c.default_group).ok());
        let rules = self.rules.get();
        let Planned { asks: planned, each_alone, statuses: answer_statuses, hold, release } =
            plan(&rules, r, fallback.as_ref())?;
        if let Some(Caller(c)) = caller {
            may_ask(c, &planned)?;
        }
        // Descriptors' own limits are rare: their settings (a write to the store) are made
        // in a boxed future, so that the decision's own stays small (see
        // `wait_for_first_grant`).
        if r.descriptors.iter().any(|d| d.limit.is_some()) {
            Box::pin(self.ensure_overrides(r)).await?;
        }
        let mut permits: Vec<tollgate_limiter::Permit<'static>> = Vec::with_capacity(planned.len());
        let mut statuses = Vec::with_capacity(planned.len());
        // envoy/ratelimit's verdict: refused when a descriptor not in quota mode is over its
        // limit, or when every one in quota mode is over its own.
        let (mut over, mut quota_asked, mut quota_over) = (false, 0, 0);
        for (group, ask) in &planned {
            let (status, permit) = self.answer(group, *ask, release.as_deref()).await?;
            let refused = status.code == Code::OverLimit as i32;
            match ask {
                Ask::Admit(_, _, QuotaMode::On) => {
                    quota_asked += 1;
                    quota_over += usize::from(refused);
                }
                _ => over |= refused,
            }
            permits.extend(permit);
            statuses.push(status);
        }
        over |= quota_asked > 0 && quota_over == quota_asked;
        if over && !each_alone {
            // All or nothing: what the other descriptors took goes back. (A domain imported
            // from envoy/ratelimit counts each descriptor within its limit, as it does.)
            for p in permits.drain(..) {
                p.dropped();
            }
        }
        // A refused request never runs: it holds nothing (what each descriptor counted stays
        // counted, in a domain counted descriptor by descriptor).
        if let Some((id, lease)) = hold
            && !over
        {
            self.hold(&id, lease, permits)?;
        }
        let overall = if over { Code::OverLimit } else { Code::Ok };
        if !answer_statuses {
            statuses.clear();
        }
        Ok(RateLimitResponse { overall_code: overall as i32, statuses, ..RateLimitResponse::default() })
    }
}

/// Whether the credential `c` may ask for `planned`: unthrottled work only with the privilege
/// (or as an admin), and only the groups its patterns cover.
fn may_ask(c: &crate::access::auth::Credential, planned: &[(GroupName, Ask)]) -> Result<(), Status> {
    if !(c.unthrottled || c.role == Ok(crate::access::auth::Role::Admin))
        && planned.iter().any(|(_, a)| matches!(a, Ask::Unthrottled(..)))
    {
        return Err(Status::permission_denied(format!(
            "descriptors: {UNTHROTTLED_KEY} needs a token with the unthrottled privilege, and {} lacks it",
            c.label()
        )));
    }
    if let Some((g, _)) = planned.iter().find(|(g, a)| a.names_group() && !c.allows_group(g.as_str())) {
        let refused = crate::access::auth::Refused::Group {
            who: c.label(),
            group: g.to_string(),
            patterns: c.groups.clone(),
        };
        return Err(refused.status());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;

    fn request(domain: &str, descriptors: Vec<Vec<(&str, &str)>>) -> RateLimitRequest {
        RateLimitRequest {
            domain: domain.into(),
            descriptors: descriptors
                .into_iter()
                .map(|entries| RateLimitDescriptor {
                    entries: entries
                        .into_iter()
                        .map(|(k, v)| Entry { key: k.into(), value: v.into() })
                        .collect(),
                    ..RateLimitDescriptor::default()
                })
                .collect(),
            hits_addend: 0,
        }
    }

    /// Regression: an unbounded group's units left went out as 4294967295.
    #[test]
    fn the_units_left_are_whole_and_never_the_largest_u32_for_an_unbounded_group() {
        assert_eq!(remaining(f64::INFINITY), 0);
        assert_eq!(remaining(f64::NAN), 0);
        assert_eq!(remaining(-3.5), 0);
        assert_eq!(remaining(41.9), 41);
        assert_eq!(remaining(1e12), u32::MAX);
    }

    #[test]
    fn holds_and_releases_name_one_request_id_each() {
        let r = request("edge", vec![vec![("tenant", "a"), (HOLD_KEY, "r-1"), (LEASE_KEY, "5")]]);
        assert_eq!(holds_of(&r).unwrap(), (Some(("r-1".into(), Duration::from_secs(5))), None));
        let r = request("edge", vec![vec![("tenant", "a"), (RELEASE_KEY, "r-1")]]);
        assert_eq!(holds_of(&r).unwrap(), (None, Some("r-1".into())));
        let r = request("edge", vec![vec![("tenant", "a")], vec![("tenant", "b"), (HOLD_KEY, "r-2")]]);
        assert_eq!(holds_of(&r).unwrap(), (Some(("r-2".into(), crate::front::holds::LEASE_DEFAULT)), None));
        for (bad, field) in [
            (vec![vec![(HOLD_KEY, "r-1"), (RELEASE_KEY, "r-1")]], "descriptors[0].entries"),
            (vec![vec![(HOLD_KEY, "r-1")], vec![(HOLD_KEY, "r-2")]], "descriptors[1].entries[0].value"),
            (vec![vec![(HOLD_KEY, "")]], "descriptors[0].entries[0].value"),
            (vec![vec![(HOLD_KEY, "r"), (LEASE_KEY, "0")]], "descriptors[0].entries[1].value"),
            (vec![vec![(HOLD_KEY, "r"), (LEASE_KEY, "soon")]], "descriptors[0].entries[1].value"),
        ] {
            let e = holds_of(&request("edge", bad.clone())).unwrap_err();
            assert!(e.message().starts_with(field), "{bad:?}: {}", e.message());
        }
        // Tollgate's own keys name no group.
        let rules = RuleSet::default();
        let d = &request("edge", vec![vec![("tenant", "a"), (HOLD_KEY, "r"), (UNTHROTTLED_KEY, "1")]])
            .descriptors[0];
        let (decision, ask) = descriptor(&rules, "edge", 0, d, 1).unwrap();
        assert!(matches!(decision, Decision::Group { ref group, .. } if group == "a"), "{decision:?}");
        assert_eq!(ask, Ask::Unthrottled(1.0, RequestClass::Normal));
    }

    #[test]
    fn bad_requests_are_named_by_field() {
        for (r, expect) in [
            (request("", vec![vec![("tenant", "a")]]), "domain: must be 1 to"),
            (request("edge", vec![]), "descriptors: give 1 to 64, got 0"),
            (request("edge", vec![vec![]]), "descriptors[0].entries: give 1 to 64, got 0"),
            (request("edge", vec![vec![("", "a")]]), "descriptors[0].entries[0].key"),
            (request("edge", vec![vec![("k", "a")]; 65]), "descriptors: give 1 to 64, got 65"),
            (request("edge", vec![vec![("tenant", &"v".repeat(2000))]]), "descriptors[0].entries[0].value"),
            (request("edge", vec![vec![("tenant", &"g".repeat(300))]]), "descriptors[0]: names group \"ggg"),
        ] {
            let e = plan(&RuleSet::default(), &r, None).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
            assert!(e.message().contains(expect), "{expect}: {}", e.message());
        }
        let mut r = request("edge", vec![vec![("tenant", "a")], vec![("user", "x")]]);
        r.hits_addend = 0;
        let planned = plan(&RuleSet::default(), &r, None).unwrap().asks;
        assert_eq!(
            planned.iter().map(|(g, c)| (g.as_str(), *c)).collect::<Vec<_>>(),
            [
                ("a", Ask::Admit(1.0, RequestClass::Normal, QuotaMode::Off)),
                ("default", Ask::Admit(1.0, RequestClass::Normal, QuotaMode::Off))
            ]
        );
        // A token's default group takes what names no group (and only that).
        let bound = GroupName::new("checkout").unwrap();
        let planned = plan(&RuleSet::default(), &r, Some(&bound)).unwrap().asks;
        assert_eq!(planned.iter().map(|(g, _)| g.as_str()).collect::<Vec<_>>(), ["a", "checkout"]);
        r.hits_addend = 7;
        r.descriptors[1].hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value: 3 });
        let planned = plan(&RuleSet::default(), &r, None).unwrap().asks;
        assert_eq!(
            planned.iter().map(|(_, c)| *c).collect::<Vec<_>>(),
            [
                Ask::Admit(7.0, RequestClass::Normal, QuotaMode::Off),
                Ask::Admit(3.0, RequestClass::Normal, QuotaMode::Off)
            ]
        );
        // A negative hit is a refund of its units.
        r.descriptors[1].is_negative_hits = true;
        let planned = plan(&RuleSet::default(), &r, None).unwrap().asks;
        assert_eq!(planned[1].1, Ask::Refund(3.0));
        // A charge entry makes a charge, and names no group.
        r.descriptors[1].is_negative_hits = false;
        r.descriptors[1].entries.push(Entry { key: CHARGE_KEY.into(), value: "after".into() });
        let planned = plan(&RuleSet::default(), &r, None).unwrap().asks;
        assert_eq!((planned[1].0.as_str(), planned[1].1), ("default", Ask::Charge(3.0)));
        // A class entry sets the request's class, and names no group; a bad one is named.
        r.descriptors[1].entries = vec![Entry { key: CLASS_KEY.into(), value: "sheddable".into() }];
        let planned = plan(&RuleSet::default(), &r, None).unwrap().asks;
        assert_eq!(
            (planned[1].0.as_str(), planned[1].1),
            ("default", Ask::Admit(3.0, RequestClass::Sheddable, QuotaMode::Off))
        );
        r.descriptors[1].entries[0].value = "urgent".into();
        let e = plan(&RuleSet::default(), &r, None).unwrap_err();
        assert!(e.message().starts_with("descriptors[1].entries[0].value: "), "{}", e.message());
    }

    #[test]
    fn a_rule_that_replaces_another_lifts_that_descriptor_in_the_same_request() {
        let rules = RuleSet::of_rules(vec![
            tollgate_model::rls::RlsRule {
                key: "vip".into(),
                group: "vip".into(),
                replaces: vec!["each".into()],
                ..Default::default()
            },
            tollgate_model::rls::RlsRule {
                key: "user".into(),
                group: "u-{value}".into(),
                name: "each".into(),
                ..Default::default()
            },
        ]);
        let both = request("edge", vec![vec![("user", "ann")], vec![("vip", "yes")]]);
        let asks: Vec<_> =
            plan(&rules, &both, None).unwrap().asks.into_iter().map(|(g, a)| (g.to_string(), a)).collect();
        assert_eq!(
            asks,
            [
                ("default".to_string(), Ask::Lifted),
                ("vip".to_string(), Ask::Admit(1.0, RequestClass::Normal, QuotaMode::Off))
            ]
        );
        let alone = request("edge", vec![vec![("user", "ann")]]);
        assert_eq!(
            plan(&rules, &alone, None).unwrap().asks[0].1,
            Ask::Admit(1.0, RequestClass::Normal, QuotaMode::Off)
        );
    }
}

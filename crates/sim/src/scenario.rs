//! Scenario files: what to simulate and what to expect.
//!
//! The format is TOML (see `docs/simulation.md`). [`Scenario::parse`] reports every problem
//! with its line and key, like the settings file, and builds nothing if there is one.

use std::collections::BTreeSet;
use std::time::Duration;

use tollgate_model::allocate::AllocationMode;
use tollgate_model::config::{ConfigError, ConfigErrors, line_of};
use tollgate_model::cost::{CostModel, Usage};
use tollgate_model::engine::{COST_FOLDING_S, LimitingLaw};
use tollgate_model::settings::{GroupName, GroupSettings, check_group_name};
use tollgate_model::toml_reader::{Fields, GROUP_KEYS, Reader, Value};
use toml::de::{DeTable, DeValue};

/// A whole scenario.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    /// Its name.
    pub name: String,
    /// The seed, unless the command line gives another.
    pub seed: u64,
    /// How requests are priced.
    pub cost_model: CostModel,
    /// Controller knobs.
    pub controller: ControllerSpec,
    /// Backends, expanded (one entry per backend).
    pub backends: Vec<BackendSpec>,
    /// Configured groups.
    pub groups: Vec<(GroupName, GroupSettings)>,
    /// Clients, expanded (one entry per client).
    pub clients: Vec<ClientSpec>,
    /// Applied at time 0, before the first phase.
    pub actions: Vec<Action>,
    /// Phases, run one after the other.
    pub phases: Vec<Phase>,
    /// Faults at given times (`[[fault]]`).
    pub faults: Vec<crate::faults::Fault>,
    /// Faults drawn from the seed (`[faults]`).
    pub random_faults: Option<crate::faults::RandomFaults>,
}

/// Controller knobs.
#[derive(Debug, Clone, PartialEq)]
pub struct ControllerSpec {
    /// Worst zones ignored when limiting.
    pub ignore_worst_zones: usize,
    /// Units/s a group must put on a backend to be limited by it.
    pub limiting_threshold: f64,
    /// Node capacity, units/s.
    pub capacity: Option<f64>,
    /// How the free capacity is shared.
    pub mode: AllocationMode,
    /// Couchbase's slow start.
    pub slow_start: bool,
    /// Queue bytes at a backend's target (saturation ratio 1).
    pub queue_target_bytes: f64,
    /// Queue bytes over which the ratio falls from 1 to 0.5.
    pub queue_spring_bytes: f64,
    /// Folding time of the average-cost smoothers.
    pub cost_folding: Duration,
    /// How saturation limits a group.
    pub limiting_law: LimitingLaw,
    /// Over how long clients take up a raised grant (TiDB's trickle).
    pub trickle: Duration,
    /// The most groups each controller's engine tracks with their own state (the server's
    /// `--max-groups`).
    pub max_groups: usize,
    /// Controller tick (and client exchange) period.
    pub tick: Duration,
    /// How often the backends report; `None`: at each tick, just before it. Reports between
    /// two ticks let a backend newly saturated get a tick at once, as in the server.
    pub report_every: Option<Duration>,
    /// Regions under the controller (0: none): client `i` is served by region `i mod
    /// regions`, a regional controller that leases each group's share from the controller, as
    /// `tollgate server --region` does.
    pub regions: usize,
    /// Controllers the groups are sharded over (1: one controller computes every group): each
    /// owns the shards the shard map gives it, the others' clients' exchanges reach each
    /// group's owner, and a crash takes one controller down, whose shards move to the others.
    pub controllers: usize,
    /// Shards the groups are spread over, with several controllers.
    pub shards: u16,
}

impl Default for ControllerSpec {
    fn default() -> Self {
        Self {
            ignore_worst_zones: 1,
            limiting_threshold: 0.0,
            capacity: None,
            mode: AllocationMode::Share,
            slow_start: false,
            queue_target_bytes: 800e6,
            queue_spring_bytes: 200e6,
            cost_folding: Duration::from_secs(2),
            limiting_law: LimitingLaw::Rate,
            trickle: Duration::ZERO,
            max_groups: tollgate_model::engine::EngineSettings::default().max_tracked_groups,
            tick: Duration::from_secs(1),
            report_every: None,
            regions: 0,
            controllers: 1,
            shards: 64,
        }
    }
}

/// One backend.
#[derive(Debug, Clone, PartialEq)]
pub struct BackendSpec {
    /// Its name.
    pub name: String,
    /// Units/s at utilisation 1.
    pub capacity: f64,
    /// Its zone.
    pub zone: String,
    /// The folding time of the load it reports, seconds (10 unless `folding_s` says; the
    /// server's backend reporter folds over 1 s by default).
    pub folding_s: f64,
    /// With `workers`, a queueing backend: that many requests are served at once, the rest
    /// share them (latency grows with the work in flight), and the backend learns its own
    /// limit from latency instead of reporting its capacity (`tollgate_model::adaptive`).
    pub workers: Option<u32>,
}

/// Folding time of the mock backends' load, seconds, unless a backend sets its own.
pub const BACKEND_FOLDING_S: f64 = 10.0;

/// One client.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientSpec {
    /// The group it works for (the first, with several).
    pub group: GroupName,
    /// The other groups it works for, each asked as much as the first (a client serving many
    /// tenants).
    pub also: Vec<GroupName>,
    /// Requests per second it attempts for each of its groups.
    pub rate: f64,
    /// What each request does.
    pub usage: Usage,
    /// The units each request asks for up front, when they differ from what it costs: it is
    /// admitted at these and settled at its cost (an application that guesses 1 RU a request
    /// and settles with the real usage). `None`: it asks for its cost.
    pub asks: Option<f64>,
    /// Indexes into [`Scenario::backends`] its requests are spread over.
    pub backends: Vec<usize>,
    /// Always admitted, still counted.
    pub unthrottled: bool,
    /// Whether a refused request waits in the client's queue to be tried again (an
    /// application with its own queue) or is answered at once and gone (a front end such as
    /// a controller's rate-limit service).
    pub queue: bool,
    /// The share of its requests in each class: critical, normal, sheddable (adding up to 1).
    pub mix: [f64; 3],
}

impl ClientSpec {
    /// Every group it works for, the first first.
    pub fn groups(&self) -> impl Iterator<Item = &GroupName> {
        std::iter::once(&self.group).chain(&self.also)
    }
}

/// A change to the world.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// A backend's new capacity.
    SetBackend {
        /// Index into [`Scenario::backends`].
        backend: usize,
        /// Units/s at utilisation 1.
        capacity: f64,
    },
    /// A group's new settings (created if new).
    SetGroup {
        /// The group.
        name: GroupName,
        /// Its settings after the change (boxed: the largest action by far).
        settings: Box<GroupSettings>,
    },
    /// A group's settings are removed.
    RemoveGroup(GroupName),
    /// Every client of a group settles one request `units` dearer than it was admitted at:
    /// a post-hoc cost that becomes debt.
    Settle {
        /// The group.
        group: GroupName,
        /// Units beyond the admitted cost, per client.
        units: f64,
    },
    /// Every client of a group attempts a new number of requests per second: a step in
    /// demand.
    SetClients {
        /// The group.
        group: GroupName,
        /// Requests per second each client attempts from then on.
        rate: f64,
    },
    /// One client attempts a new number of requests per second (0: it stops): load that
    /// moves from some clients to others.
    SetClient {
        /// Index into [`Scenario::clients`]: the clients in the order they are declared, each
        /// `count` expanded.
        index: usize,
        /// Requests per second it attempts from then on.
        rate: f64,
    },
}

/// A phase: actions, then expectations to hold.
#[derive(Debug, Clone, PartialEq)]
pub struct Phase {
    /// Give up after this long.
    pub timeout: Duration,
    /// Consecutive one-second checks every expectation must hold for.
    pub hold_checks: u32,
    /// Applied when the phase starts.
    pub actions: Vec<Action>,
    /// What must hold.
    pub expects: Vec<Expect>,
}

/// Where a metric is read.
#[derive(Debug, Clone, PartialEq)]
pub enum Subject {
    /// A group's metric.
    Group(GroupName),
    /// A backend's metric.
    Backend(usize),
    /// A cluster-wide metric.
    Cluster,
}

/// One expectation.
#[derive(Debug, Clone, PartialEq)]
pub struct Expect {
    /// Whose metric.
    pub subject: Subject,
    /// Which metric.
    pub metric: String,
    /// The value expected; `None` with `absent`.
    pub value: Option<f64>,
    /// The group must not be throttled at all.
    pub absent: bool,
    /// Relative to the observed value.
    pub tolerance: f64,
}

/// Metrics of a group.
pub const GROUP_METRICS: &[&str] = &[
    "target_rps",
    "target_units",
    "client_rps",
    "admitted_rps",
    "admitted_units",
    "busy",
    "demand_units",
    "critical_rps",
    "normal_rps",
    "sheddable_rps",
];
/// Cluster-wide metrics.
pub const CLUSTER_METRICS: &[&str] = &["total_target_rps", "busy_groups", "tracked_groups"];
/// Metrics of a backend.
pub const BACKEND_METRICS: &[&str] =
    &["utilisation", "learned_limit", "learned_capacity", "goodput", "latency_ms"];

const SIM_LIMIT: u64 = 1_000_000;
/// The most clients a scenario may have, in all.
pub const CLIENTS_MAX: usize = 100_000;
/// The most backends a scenario may have, in all.
pub const BACKENDS_MAX: usize = 10_000;
/// The most (client, backend) links, and (group, backend) pairs, a scenario may have: what a
/// run keeps in memory grows with them.
pub const LINKS_MAX: usize = 2_000_000;
/// The most groups a scenario's clients may spread over.
pub const SPREAD_MAX: usize = 1_000_000;
/// The most groups one simulated client may work for.
pub const CLIENT_GROUPS_MAX: usize = 1_000;
/// Requests per second one simulated client may attempt at most.
pub const CLIENT_RATE_MAX: f64 = 100_000.0;

impl Scenario {
    /// Parses a scenario, reporting every problem with its line and key.
    pub fn parse(src: &str) -> Result<Scenario, ConfigErrors> {
        let mut r = Reader::new(src);
        let scenario = match DeTable::parse(src) {
            Ok(doc) => read(&mut r, doc.get_ref()),
            Err(e) => {
                let line = e.span().map_or(1, |s| line_of(src, s.start));
                r.errors.push(ConfigError {
                    line,
                    field: "(syntax)".into(),
                    rule: e.message().trim().to_string(),
                });
                None
            }
        };
        match scenario {
            Some(s) if r.errors.is_empty() => Ok(s),
            _ => {
                let mut errors = r.errors;
                errors.sort_by_key(|e| e.line);
                Err(ConfigErrors(errors))
            }
        }
    }
}

/// A scenario's name, seed and cost model.
fn read_head(r: &mut Reader<'_>, doc: &DeTable<'_>, s: &mut Scenario) {
    let get = |key: &str| doc.get(key);
    match get("name") {
        Some(v) => {
            let name = r.string("name", v).unwrap_or_default();
            // The name is also a directory name (sim-out/NAME): nothing that walks elsewhere.
            let ok = (1..=100).contains(&name.len())
                && !name.starts_with('.')
                && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
            if !ok {
                r.error(v.span(), "name", format!("must be 1 to 100 letters, digits, '-', '_' or '.', not starting with '.'; got {name:?}"));
            }
            s.name = name.to_string();
        }
        None => r.error(0..0, "name", "is required"),
    }
    if let Some(v) = get("seed") {
        s.seed = r.integer("seed", v, 0, u64::MAX >> 1).unwrap_or(1);
    }
    if let Some(v) = get("cost_model") {
        s.cost_model = match r.string("cost_model", v) {
            Some("count") => CostModel::Count,
            Some("fdb") => CostModel::fdb(),
            Some("ru") => CostModel::ru(),
            Some("couchbase") => CostModel::couchbase(),
            Some(other) => {
                r.error(
                    v.span(),
                    "cost_model",
                    format!("must be count, fdb, ru or couchbase, got {other:?}"),
                );
                CostModel::Count
            }
            None => CostModel::Count,
        };
    }
    // Or the settings file's `[cost]` table, as `tollgate calibrate` prints it (the `linear`
    // model and its coefficients, or any model with its own).
    if let Some(v) = get("cost") {
        if get("cost_model").is_some() {
            r.error(v.span(), "cost", "give cost_model or a [cost] table, not both");
        }
        s.cost_model = r.cost(v);
    }
}

/// A scenario's `[[group]]` tables, each name once.
fn read_groups(r: &mut Reader<'_>, doc: &DeTable<'_>, s: &mut Scenario) {
    let mut names = BTreeSet::new();
    for (i, v) in array(r, doc, "group").into_iter().enumerate() {
        let path = format!("group[{i}]");
        let Some(mut f) = r.fields(&path, v) else { continue };
        let name = take_name(r, &mut f, &path);
        let settings =
            r.group_from(&mut f, GroupSettings::builder(), v.span(), &format!("name, {GROUP_KEYS}"));
        if let Some(settings) = &settings {
            refuse_backend_only(r, &path, v, settings);
        }
        if let (Some(name), Some(settings)) = (name, settings) {
            if !names.insert(name.clone()) {
                r.error(v.span(), format!("{path}.name"), format!("group {name:?} is defined twice"));
            }
            s.groups.push((name, settings));
        }
    }
}

/// Names each top-level key a scenario does not know.
fn refuse_unknown_keys(r: &mut Reader<'_>, doc: &DeTable<'_>) {
    for (key, _) in doc.iter() {
        let k: &str = key.get_ref();
        if ![
            "name",
            "seed",
            "cost_model",
            "cost",
            "controller",
            "backend",
            "group",
            "client",
            "action",
            "phase",
            "fault",
            "faults",
        ]
        .contains(&k)
        {
            r.error(
                key.span(),
                k,
                "unknown key; expected name, seed, cost_model, cost, controller, backend, group, client, action, phase, fault or faults",
            );
        }
    }
}

fn read(r: &mut Reader<'_>, doc: &DeTable<'_>) -> Option<Scenario> {
    let mut s = Scenario {
        name: String::new(),
        seed: 1,
        cost_model: CostModel::Count,
        controller: ControllerSpec::default(),
        backends: Vec::new(),
        groups: Vec::new(),
        clients: Vec::new(),
        actions: Vec::new(),
        phases: Vec::new(),
        faults: Vec::new(),
        random_faults: None,
    };
    let get = |key: &str| doc.get(key);
    read_head(r, doc, &mut s);
    if let Some(v) = get("controller") {
        s.controller = controller(r, v);
    }
    for (i, v) in array(r, doc, "backend").into_iter().enumerate() {
        backends(r, &format!("backend[{i}]"), v, &mut s.backends);
    }
    read_groups(r, doc, &mut s);
    for (i, v) in array(r, doc, "client").into_iter().enumerate() {
        clients(r, &format!("client[{i}]"), v, &s.backends, &mut s.clients);
    }
    for (i, v) in array(r, doc, "action").into_iter().enumerate() {
        if let Some(a) = action(r, &format!("action[{i}]"), v, &s, &[]) {
            s.actions.push(a);
        }
    }
    for (i, v) in array(r, doc, "phase").into_iter().enumerate() {
        if let Some(p) = phase(r, &format!("phase[{i}]"), v, &s) {
            s.phases.push(p);
        }
    }
    let faults = array(r, doc, "fault");
    if faults.len() > crate::faults::FAULTS_MAX {
        r.error(0..0, "fault", format!("at most {} faults, got {}", crate::faults::FAULTS_MAX, faults.len()));
    } else {
        for (i, v) in faults.into_iter().enumerate() {
            let (clients, regions) = (s.clients.len(), s.controller.regions);
            if let Some(f) = crate::faults::read_fault(r, &format!("fault[{i}]"), v, clients, regions) {
                s.faults.push(f);
            }
        }
    }
    if let Some(v) = get("faults") {
        s.random_faults = crate::faults::read_random(r, v);
        if s.clients.is_empty() {
            r.error(v.span(), "faults", "faults act on clients: the scenario has none");
        }
    }
    refuse_unknown_keys(r, doc);
    if s.phases.is_empty() && r.errors.is_empty() {
        r.error(0..0, "phase", "at least one [[phase]] is required");
    }
    // Each bound alone is not enough: what a run holds grows with their products (clients
    // and their links are checked as they are read, before any is made).
    let groups: BTreeSet<&GroupName> =
        s.groups.iter().map(|(n, _)| n).chain(s.clients.iter().flat_map(|c| c.groups())).collect();
    let pairs = groups.len().saturating_mul(s.backends.len());
    if pairs > LINKS_MAX {
        r.error(0..0, "backend", format!("at most {LINKS_MAX} (group, backend) pairs in all, got {pairs}"));
    }
    Some(s)
}

/// The tables of an array of tables (`[[key]]`).
fn array<'t, 'a>(r: &mut Reader<'_>, doc: &'t DeTable<'a>, key: &str) -> Vec<&'t Value<'a>> {
    match doc.get(key).map(|v| (v, v.get_ref())) {
        None => Vec::new(),
        Some((_, DeValue::Array(items))) => items.iter().collect(),
        Some((v, other)) => {
            r.error(
                v.span(),
                key,
                format!("must be an array of tables ([[{key}]]), got {}", other.type_str()),
            );
            Vec::new()
        }
    }
}

/// The settings only a backend's scheduler applies: the mock backends serve whatever is
/// admitted and queue nothing, so a scenario that sets them would see them ignored.
fn refuse_backend_only(r: &mut Reader<'_>, path: &str, v: &Value<'_>, settings: &GroupSettings) {
    for (key, set) in
        [("backend_limit", settings.backend_limit().is_some()), ("background", settings.background())]
    {
        if set {
            r.error(
                v.span(),
                format!("{path}.{key}"),
                "the simulator's backends do not schedule work; a backend's Scheduler applies it (docs/backend.md)",
            );
        }
    }
    if settings.max_in_flight().is_some() {
        r.error(
            v.span(),
            format!("{path}.max_in_flight"),
            "the simulator's clients send rates, not requests that stay in flight; the behavioural suite covers in-flight quotas",
        );
    }
}

fn take_name(r: &mut Reader<'_>, f: &mut Fields<'_, '_>, path: &str) -> Option<GroupName> {
    let Some((p, v)) = f.take("name") else {
        r.error(0..0, format!("{path}.name"), "is required");
        return None;
    };
    let name = r.string(&p, v)?;
    match GroupName::new(name) {
        Ok(n) => Some(n),
        Err(e) => {
            r.error(v.span(), p, e.rule);
            None
        }
    }
}

/// A folding time in seconds, within [`COST_FOLDING_S`]; `None` (and the error recorded)
/// otherwise.
fn folding(r: &mut Reader<'_>, path: &str, v: &Value<'_>) -> Option<f64> {
    let s = r.positive(path, v)?;
    if COST_FOLDING_S.contains(&s) {
        return Some(s);
    }
    let (lo, hi) = (COST_FOLDING_S.start(), COST_FOLDING_S.end());
    r.error(v.span(), path, format!("must be from {lo} to {hi} seconds, got {s}"));
    None
}

/// The most regions a scenario may have.
pub const REGIONS_MAX: usize = 64;
/// The most controllers a scenario may shard its groups over.
pub const CONTROLLERS_MAX: usize = 64;

/// The controller's keys for saturation: the queue's target and spring, cost folding and the
/// limiting law.
fn saturation_keys(r: &mut Reader<'_>, f: &mut Fields<'_, '_>, c: &mut ControllerSpec, v: &Value<'_>) {
    if let Some((p, v)) = f.take("queue_target_bytes") {
        c.queue_target_bytes = r.positive(&p, v).unwrap_or(c.queue_target_bytes);
    }
    if let Some((p, v)) = f.take("queue_spring_bytes") {
        c.queue_spring_bytes = r.positive(&p, v).unwrap_or(c.queue_spring_bytes);
    }
    if let Some((p, v)) = f.take("cost_folding_s")
        && let Some(s) = folding(r, &p, v)
    {
        c.cost_folding = Duration::from_secs_f64(s);
    }
    if let Some((p, v)) = f.take("limiting_law")
        && let Some(name) = r.string(&p, v)
    {
        match LimitingLaw::from_name(name) {
            Some(law) => c.limiting_law = law,
            None => r.error(v.span(), p, format!("must be rate, quota or multiplicative, got {name:?}")),
        }
    }
    if c.queue_spring_bytes > c.queue_target_bytes {
        let rule = format!("must be at most queue_target_bytes ({})", c.queue_target_bytes);
        r.error(v.span(), "controller.queue_spring_bytes", rule);
    }
}

/// The controller's keys for the cluster: regions, controllers and shards.
fn cluster_keys(r: &mut Reader<'_>, f: &mut Fields<'_, '_>, c: &mut ControllerSpec, v: &Value<'_>) {
    if let Some((p, v)) = f.take("regions") {
        c.regions = r.integer(&p, v, 0, REGIONS_MAX as u64).unwrap_or(0) as usize;
    }
    if let Some((p, v)) = f.take("controllers") {
        c.controllers = r.integer(&p, v, 1, CONTROLLERS_MAX as u64).unwrap_or(1) as usize;
    }
    if let Some((p, v)) = f.take("shards") {
        let max = u64::from(tollgate_model::shard::MAX_SHARDS);
        c.shards = r.integer(&p, v, 1, max).unwrap_or(64) as u16;
    }
    if c.controllers > 1 && c.regions > 0 {
        r.error(
            v.span(),
            "controller.controllers",
            "must be 1 with regions (a region's global tier is one controller here)",
        );
    }
}

fn controller(r: &mut Reader<'_>, v: &Value<'_>) -> ControllerSpec {
    let mut c = ControllerSpec::default();
    let Some(mut f) = r.fields("controller", v) else { return c };
    if let Some((p, v)) = f.take("ignore_worst_zones") {
        c.ignore_worst_zones = r.integer(&p, v, 0, 1000).unwrap_or(1) as usize;
    }
    if let Some((p, v)) = f.take("limiting_threshold") {
        c.limiting_threshold = r.non_negative(&p, v).unwrap_or(c.limiting_threshold);
    }
    if let Some((p, v)) = f.take("capacity") {
        c.capacity = r.positive(&p, v);
    }
    if let Some((p, v)) = f.take("free_pool") {
        match r.string(&p, v) {
            // "fair" was this key's first name for sharing by priority and weight.
            Some("share" | "fair") => c.mode = AllocationMode::Share,
            Some("fcfs") => c.mode = AllocationMode::Fcfs,
            Some(other) => r.error(v.span(), p, format!("must be share or fcfs, got {other:?}")),
            None => {}
        }
    }
    if let Some((p, v)) = f.take("slow_start")
        && let Some(b) = r.boolean(&p, v)
    {
        c.slow_start = b;
    }
    saturation_keys(r, &mut f, &mut c, v);
    if let Some((p, v)) = f.take("trickle_ms") {
        c.trickle = Duration::from_millis(r.integer(&p, v, 0, 60_000).unwrap_or(0));
    }
    if let Some((p, v)) = f.take("max_groups") {
        let most = tollgate_model::config::MAX_TRACKED_GROUPS_MAX;
        c.max_groups = r.integer(&p, v, 1, most).map_or(c.max_groups, |n| n as usize);
    }
    if let Some((p, v)) = f.take("tick_ms") {
        c.tick = Duration::from_millis(r.integer(&p, v, 10, 60_000).unwrap_or(1000));
    }
    if let Some((p, v)) = f.take("report_ms")
        && let Some(ms) = r.integer(&p, v, 10, 60_000)
    {
        // The simulation moves in steps of 10 ms.
        if ms % 10 == 0 {
            c.report_every = Some(Duration::from_millis(ms));
        } else {
            r.error(v.span(), p, format!("must be a multiple of 10 (the simulation's step), got {ms}"));
        }
    }
    cluster_keys(r, &mut f, &mut c, v);
    r.finish(
        f,
        "ignore_worst_zones, limiting_threshold, limiting_law, queue_target_bytes, queue_spring_bytes, cost_folding_s, capacity, free_pool, slow_start, trickle_ms, max_groups, tick_ms, report_ms, regions, controllers, shards",
    );
    c
}

fn backends(r: &mut Reader<'_>, path: &str, v: &Value<'_>, out: &mut Vec<BackendSpec>) {
    let Some(mut f) = r.fields(path, v) else { return };
    let name = match f.take("name") {
        Some((p, v)) => r.string(&p, v).map(str::to_string),
        None => {
            r.error(v.span(), format!("{path}.name"), "is required");
            None
        }
    };
    let count = match f.take("count") {
        Some((p, v)) => r.integer(&p, v, 1, 10_000).unwrap_or(1),
        None => 1,
    };
    let capacity = match f.take("capacity") {
        Some((p, v)) => r.positive(&p, v),
        None => {
            r.error(v.span(), format!("{path}.capacity"), "is required (units/s at utilisation 1)");
            None
        }
    };
    let zone = match f.take("zone") {
        Some((p, v)) => r.string(&p, v).map(str::to_string),
        None => None,
    };
    let folding_s = f.take("folding_s").and_then(|(p, v)| folding(r, &p, v)).unwrap_or(BACKEND_FOLDING_S);
    let workers = f.take("workers").and_then(|(p, v)| r.integer(&p, v, 1, 10_000)).map(|w| w as u32);
    r.finish(f, "name, count, capacity, zone, folding_s, workers");
    let (Some(name), Some(capacity)) = (name, capacity) else { return };
    if out.len().saturating_add(count as usize) > BACKENDS_MAX {
        r.error(
            v.span(),
            format!("{path}.count"),
            format!("at most {BACKENDS_MAX} backends in all, got {}", out.len() + count as usize),
        );
        return;
    }
    for i in 0..count {
        let name = if count > 1 { format!("{name}-{i}") } else { name.clone() };
        if out.iter().any(|b| b.name == name) {
            r.error(v.span(), format!("{path}.name"), format!("backend {name:?} is defined twice"));
        }
        let zone = zone.clone().unwrap_or_else(|| name.clone());
        out.push(BackendSpec { name, capacity, zone, folding_s, workers });
    }
}

fn backend_index(r: &mut Reader<'_>, path: &str, v: &Value<'_>, backends: &[BackendSpec]) -> Option<usize> {
    let name = r.string(path, v)?;
    let found = backends.iter().position(|b| b.name == name);
    if found.is_none() {
        r.error(v.span(), path, format!("no backend is named {name:?}"));
    }
    found
}

fn clients(
    r: &mut Reader<'_>,
    path: &str,
    v: &Value<'_>,
    backends: &[BackendSpec],
    out: &mut Vec<ClientSpec>,
) {
    let Some(mut f) = r.fields(path, v) else { return };
    let group = take_group(r, &mut f, path, v);
    let count = match f.take("count") {
        Some((p, v)) => r.integer(&p, v, 1, 100_000).unwrap_or(1),
        None => 1,
    };
    let rate = match f.take("rate") {
        Some((p, v)) => client_rate(r, &p, v),
        None => {
            r.error(v.span(), format!("{path}.rate"), "is required (requests/s each client attempts)");
            None
        }
    };
    let usage = match f.take("cost") {
        Some((p, v)) => cost(r, &p, v),
        None => Some(Usage::units(1.0)),
    };
    let chosen = match f.take("backends") {
        Some((p, v)) => match v.get_ref() {
            DeValue::Array(items) => {
                let list: Vec<usize> = items
                    .iter()
                    .enumerate()
                    .filter_map(|(i, item)| backend_index(r, &format!("{p}[{i}]"), item, backends))
                    .collect();
                if list.is_empty() && items.is_empty() {
                    r.error(v.span(), p, "must name at least one backend");
                }
                list
            }
            other => {
                r.error(v.span(), p, format!("must be an array of backend names, got {}", other.type_str()));
                Vec::new()
            }
        },
        None => (0..backends.len()).collect(),
    };
    let unthrottled = flag(r, &mut f, "unthrottled", false);
    let queue = flag(r, &mut f, "queue", true);
    let asks = match f.take("asks") {
        Some((p, v)) => r.positive(&p, v).and_then(|a| {
            if a > tollgate_model::settings::UNITS_MAX {
                r.error(
                    v.span(),
                    p,
                    format!("must be at most {:e} units", tollgate_model::settings::UNITS_MAX),
                );
                None
            } else {
                Some(a)
            }
        }),
        None => None,
    };
    let mix = class_mix(r, &mut f, path, v);
    let spread = match f.take("spread") {
        Some((p, v)) => r.integer(&p, v, 1, SPREAD_MAX as u64).map(|n| n as usize),
        None => None,
    };
    let each = groups_each(r, &mut f, spread);
    r.finish(
        f,
        "group, count, rate, cost, asks, backends, unthrottled, queue, class, classes, spread, groups",
    );
    let (Some(group), Some(rate), Some(usage)) = (group, rate, usage) else { return };
    // Checked before they are made: a run holds every client and its links.
    let links: usize = out.iter().map(|c| (1 + c.also.len()) * c.backends.len().max(1)).sum();
    let count = count as usize;
    if out.len().saturating_add(count) > CLIENTS_MAX {
        r.error(
            v.span(),
            format!("{path}.count"),
            format!("at most {CLIENTS_MAX} clients in all, got {}", out.len().saturating_add(count)),
        );
        return;
    }
    let adding = count.saturating_mul(each).saturating_mul(chosen.len().max(1));
    if links.saturating_add(adding) > LINKS_MAX {
        r.error(
            v.span(),
            format!("{path}.count"),
            format!(
                "at most {LINKS_MAX} links from clients to their backends in all, got {}",
                links.saturating_add(adding)
            ),
        );
        return;
    }
    let names = match spread.map(|n| spread_names(&group, n.min(count * each))) {
        None => vec![group],
        Some(Ok(names)) => names,
        Some(Err(e)) => {
            return r.error(v.span(), format!("{path}.group"), format!("spread over {group}-N: {e}"));
        }
    };
    // Client k asks for GROUP-(k mod N), or with `groups = G` for GROUP-((k G + j) mod N), j
    // from 0 to G - 1.
    for k in 0..count {
        let mut mine = (0..each).map(|j| names[(k * each + j) % names.len()].clone());
        out.push(ClientSpec {
            group: mine.next().expect("at least one group each"),
            also: mine.collect(),
            rate,
            usage,
            asks,
            backends: chosen.clone(),
            unthrottled,
            queue,
            mix,
        });
    }
}

/// The `n` groups a table's clients spread over: GROUP-0 to GROUP-(n - 1).
fn spread_names(
    group: &GroupName,
    n: usize,
) -> Result<Vec<GroupName>, tollgate_model::settings::SettingError> {
    (0..n).map(|k| GroupName::new(&format!("{group}-{k}"))).collect()
}

/// How many groups of its `spread` each client of a table works for (`groups`): 1 unless
/// given.
fn groups_each(r: &mut Reader<'_>, f: &mut Fields<'_, '_>, spread: Option<usize>) -> usize {
    let Some((p, v)) = f.take("groups") else { return 1 };
    match (r.integer(&p, v, 1, CLIENT_GROUPS_MAX as u64), spread) {
        (Some(n), Some(spread)) if n as usize > spread => {
            r.error(v.span(), p, format!("must be at most spread ({spread}), got {n}"));
            1
        }
        (Some(n), Some(_)) => n as usize,
        (Some(_), None) => {
            r.error(v.span(), p, "needs spread: the groups each client asks are taken from it");
            1
        }
        (None, _) => 1,
    }
}

/// A true-or-false key of `f`, `default` when absent.
fn flag(r: &mut Reader<'_>, f: &mut Fields<'_, '_>, key: &str, default: bool) -> bool {
    match f.take(key) {
        Some((p, v)) => match v.get_ref() {
            DeValue::Boolean(b) => *b,
            other => {
                r.error(v.span(), p, format!("must be true or false, got {}", other.type_str()));
                default
            }
        },
        None => default,
    }
}

/// A client's request classes: `class = "sheddable"` (all of them), or `classes = {
/// critical = 0.1, sheddable = 0.4 }` (shares of its requests, normal the rest); all normal
/// without either.
fn class_mix(r: &mut Reader<'_>, f: &mut Fields<'_, '_>, path: &str, v: &Value<'_>) -> [f64; 3] {
    use tollgate_model::class::RequestClass;
    let mut mix = [0.0, 1.0, 0.0];
    let one = f.take("class");
    let shares = f.take("classes");
    if one.is_some() && shares.is_some() {
        r.error(v.span(), format!("{path}.classes"), "give class or classes, not both");
        return mix;
    }
    if let Some((p, value)) = one {
        match r.string(&p, value).map(RequestClass::from_name) {
            Some(Ok(class)) => mix = std::array::from_fn(|i| if i == class as usize { 1.0 } else { 0.0 }),
            Some(Err(rule)) => r.error(value.span(), p, rule),
            None => {}
        }
    }
    if let Some((p, value)) = shares
        && let Some(mut t) = r.fields(&p, value)
    {
        for class in [RequestClass::Critical, RequestClass::Sheddable] {
            if let Some((q, x)) = t.take(class.name())
                && let Some(share) = r.non_negative(&q, x)
            {
                mix[class as usize] = share;
            }
        }
        r.finish(t, "critical, sheddable (normal is the rest)");
        let others = mix[0] + mix[2];
        if others > 1.0 {
            r.error(
                value.span(),
                p,
                format!("the critical and sheddable shares must add up to at most 1, got {others}"),
            );
        } else {
            mix[1] = 1.0 - others;
        }
    }
    mix
}

fn cost(r: &mut Reader<'_>, path: &str, v: &Value<'_>) -> Option<Usage> {
    let mut f = r.fields(path, v)?;
    let read = f.take("read_bytes").and_then(|(p, v)| r.integer(&p, v, 0, u64::MAX >> 1));
    let write = f.take("write_bytes").and_then(|(p, v)| r.integer(&p, v, 0, u64::MAX >> 1));
    let units = f.take("units").and_then(|(p, v)| r.non_negative(&p, v));
    let cpu_ms = f.take("cpu_ms").and_then(|(p, v)| r.non_negative(&p, v)).unwrap_or(0.0);
    let replicas = f.take("replicas").and_then(|(p, v)| r.integer(&p, v, 1, 100)).unwrap_or(1) as u32;
    let durable = matches!(f.take("durable").map(|(_, v)| v.get_ref()), Some(DeValue::Boolean(true)));
    r.finish(f, "read_bytes, write_bytes, units, cpu_ms, replicas, durable");
    let base = match (read, write, units) {
        (Some(b), None, None) => Usage::read(b),
        (None, Some(b), None) => Usage::write(b),
        (None, None, Some(u)) => Usage::units(u),
        (None, None, None) if cpu_ms > 0.0 => Usage::read(0),
        _ => {
            r.error(v.span(), path, "must give exactly one of read_bytes, write_bytes or units");
            return None;
        }
    };
    let mut usage = base.with_cpu_ms(cpu_ms).with_replicas(replicas);
    if durable {
        usage = usage.durable();
    }
    Some(usage)
}

fn action(r: &mut Reader<'_>, path: &str, v: &Value<'_>, s: &Scenario, pending: &[Action]) -> Option<Action> {
    let mut f = r.fields(path, v)?;
    // Every branch reports its own problems; unknown keys are reported whatever happened.
    let mut read = |r: &mut Reader<'_>| -> Option<Action> {
        if let Some((p, v)) = f.take("set_backend") {
            let mut bf = r.fields(&p, v)?;
            let backend =
                required(r, &mut bf, &p, v, "name", |r, bp, bv| backend_index(r, bp, bv, &s.backends));
            let capacity = required(r, &mut bf, &p, v, "capacity", |r, kp, kv| r.positive(kp, kv));
            r.finish(bf, "name, capacity");
            Some(Action::SetBackend { backend: backend?, capacity: capacity? })
        } else if let Some((p, v)) = f.take("set_group") {
            let mut gf = r.fields(&p, v)?;
            let name = take_name(r, &mut gf, &p)?;
            // Start from the group's settings as they will stand when this action runs: only
            // the keys given change.
            let base = settings_before(s, pending, &name).unwrap_or_default();
            let settings =
                r.group_from(&mut gf, base.to_builder(), v.span(), &format!("name, {GROUP_KEYS}"))?;
            refuse_backend_only(r, &p, v, &settings);
            Some(Action::SetGroup { name, settings: Box::new(settings) })
        } else if let Some((p, v)) = f.take("remove_group") {
            let name = r.string(&p, v)?;
            if let Err(e) = check_group_name(name) {
                r.error(v.span(), p, e.rule);
                return None;
            }
            Some(Action::RemoveGroup(GroupName::new(name).ok()?))
        } else if let Some((p, v)) = f.take("settle") {
            let mut sf = r.fields(&p, v)?;
            let group = take_group(r, &mut sf, &p, v);
            let units = required(r, &mut sf, &p, v, "units", |r, kp, kv| r.positive(kp, kv));
            r.finish(sf, "group, units");
            Some(Action::Settle { group: group?, units: units? })
        } else if let Some((p, v)) = f.take("set_clients") {
            let mut cf = r.fields(&p, v)?;
            let group = take_group(r, &mut cf, &p, v);
            let rate = required(r, &mut cf, &p, v, "rate", client_rate);
            r.finish(cf, "group, rate");
            Some(Action::SetClients { group: group?, rate: rate? })
        } else if let Some((p, v)) = f.take("set_client") {
            set_client(r, &p, v, s.clients.len())
        } else {
            r.error(
                v.span(),
                path,
                "must hold one of set_backend, set_group, remove_group, settle, set_clients or set_client",
            );
            None
        }
    };
    let result = read(r);
    r.finish(f, "set_backend, set_group, remove_group, settle, set_clients, set_client");
    result
}

/// The key `key` of the table at `path` (`v`), read by `read`; its absence is reported.
fn required<'t, 'a, T>(
    r: &mut Reader<'_>,
    f: &mut Fields<'t, 'a>,
    path: &str,
    v: &Value<'_>,
    key: &str,
    read: impl FnOnce(&mut Reader<'_>, &str, &'t Value<'a>) -> Option<T>,
) -> Option<T> {
    match f.take(key) {
        Some((kp, kv)) => read(r, &kp, kv),
        None => {
            r.error(v.span(), format!("{path}.{key}"), "is required");
            None
        }
    }
}

/// `set_client = { index = 2, rate = 0 }`: one of the scenario's `clients` asks a new rate.
fn set_client(r: &mut Reader<'_>, p: &str, v: &Value<'_>, clients: usize) -> Option<Action> {
    let mut cf = r.fields(p, v)?;
    let index = required(r, &mut cf, p, v, "index", |r, kp, kv| {
        if clients == 0 {
            r.error(kv.span(), kp, "names a client, and the scenario has none");
            return None;
        }
        r.integer(kp, kv, 0, clients as u64 - 1)
    });
    let rate = required(r, &mut cf, p, v, "rate", |r, kp, kv| {
        let rate = r.non_negative(kp, kv)?;
        if rate > CLIENT_RATE_MAX {
            r.error(kv.span(), kp, format!("must be at most {CLIENT_RATE_MAX} requests/s, got {rate}"));
            return None;
        }
        Some(rate)
    });
    r.finish(cf, "index, rate");
    Some(Action::SetClient { index: index? as usize, rate: rate? })
}

/// Requests per second a client attempts: above 0, at most [`CLIENT_RATE_MAX`].
fn client_rate(r: &mut Reader<'_>, path: &str, v: &Value<'_>) -> Option<f64> {
    let rate = r.positive(path, v)?;
    if rate > CLIENT_RATE_MAX {
        r.error(v.span(), path, format!("must be at most {CLIENT_RATE_MAX} requests/s, got {rate}"));
        return None;
    }
    Some(rate)
}

/// The `group` key of an action: a valid group name.
fn take_group(r: &mut Reader<'_>, f: &mut Fields<'_, '_>, path: &str, v: &Value<'_>) -> Option<GroupName> {
    match f.take("group") {
        Some((gp, gv)) => {
            let name = r.string(&gp, gv)?;
            match GroupName::new(name) {
                Ok(n) => Some(n),
                Err(e) => {
                    r.error(gv.span(), gp, e.rule);
                    None
                }
            }
        }
        None => {
            r.error(v.span(), format!("{path}.group"), "is required");
            None
        }
    }
}

/// A group's settings after every action parsed so far (top level, earlier phases, then
/// `pending` in this phase), in the order the simulation applies them.
fn settings_before(s: &Scenario, pending: &[Action], name: &GroupName) -> Option<GroupSettings> {
    let mut current = s.groups.iter().find(|(n, _)| n == name).map(|(_, g)| g.clone());
    let all = s.actions.iter().chain(s.phases.iter().flat_map(|p| p.actions.iter())).chain(pending);
    for a in all {
        match a {
            Action::SetGroup { name: n, settings } if n == name => current = Some((**settings).clone()),
            Action::RemoveGroup(n) if n == name => current = None,
            _ => {}
        }
    }
    current
}

fn phase(r: &mut Reader<'_>, path: &str, v: &Value<'_>, s: &Scenario) -> Option<Phase> {
    let mut f = r.fields(path, v)?;
    let timeout = match f.take("timeout_s") {
        Some((p, v)) => r.integer(&p, v, 1, SIM_LIMIT).map(Duration::from_secs),
        None => Some(Duration::from_secs(600)),
    };
    let hold_checks = match f.take("hold_s") {
        Some((p, v)) => r.integer(&p, v, 1, SIM_LIMIT).map(|n| n as u32),
        None => Some(10),
    };
    let mut actions = Vec::new();
    if let Some((p, v)) = f.take("action") {
        if let DeValue::Array(items) = v.get_ref() {
            for (i, item) in items.iter().enumerate() {
                if let Some(a) = action(r, &format!("{p}[{i}]"), item, s, &actions) {
                    actions.push(a);
                }
            }
        } else {
            r.error(v.span(), p, "must be an array of tables ([[phase.action]])");
        }
    }
    let mut expects = Vec::new();
    if let Some((p, v)) = f.take("expect") {
        if let DeValue::Array(items) = v.get_ref() {
            for (i, item) in items.iter().enumerate() {
                if let Some(e) = expect(r, &format!("{p}[{i}]"), item, s) {
                    expects.push(e);
                }
            }
        } else {
            r.error(v.span(), p, "must be an array of tables ([[phase.expect]])");
        }
    }
    r.finish(f, "timeout_s, hold_s, action, expect");
    if expects.is_empty() {
        r.error(v.span(), format!("{path}.expect"), "a phase needs at least one [[phase.expect]]");
    }
    Some(Phase { timeout: timeout?, hold_checks: hold_checks?, actions, expects })
}

fn expect(r: &mut Reader<'_>, path: &str, v: &Value<'_>, s: &Scenario) -> Option<Expect> {
    let mut f = r.fields(path, v)?;
    let group = f.take("group");
    let backend = f.take("backend");
    let subject = match (group, backend) {
        (Some(_), Some((p, bv))) => {
            r.error(bv.span(), p, "give group or backend, not both");
            return None;
        }
        (Some((p, gv)), None) => {
            let name = r.string(&p, gv)?;
            match GroupName::new(name) {
                Ok(n) => Subject::Group(n),
                Err(e) => {
                    r.error(gv.span(), p, e.rule);
                    return None;
                }
            }
        }
        (None, Some((p, bv))) => Subject::Backend(backend_index(r, &p, bv, &s.backends)?),
        (None, None) => Subject::Cluster,
    };
    let (metric, metric_span) = match f.take("metric") {
        Some((p, mv)) => (r.string(&p, mv).map(str::to_string), mv.span()),
        None => {
            r.error(v.span(), format!("{path}.metric"), "is required");
            (None, v.span())
        }
    };
    let value = f.take("value").and_then(|(p, vv)| r.number(&p, vv));
    let absent = match f.take("absent") {
        Some((p, av)) => match av.get_ref() {
            DeValue::Boolean(b) => *b,
            other => {
                r.error(av.span(), p, format!("must be true or false, got {}", other.type_str()));
                false
            }
        },
        None => false,
    };
    let tolerance = match f.take("tolerance") {
        Some((p, tv)) => r.positive(&p, tv).unwrap_or(0.1),
        None => 0.1,
    };
    r.finish(f, "group, backend, metric, value, absent, tolerance");
    let metric = metric?;
    let known = match subject {
        Subject::Group(_) => GROUP_METRICS,
        Subject::Backend(_) => BACKEND_METRICS,
        Subject::Cluster => CLUSTER_METRICS,
    };
    if !known.contains(&metric.as_str()) {
        r.error(
            metric_span,
            format!("{path}.metric"),
            format!("must be one of {}, got {metric:?}", known.join(", ")),
        );
        return None;
    }
    if value.is_some() == absent {
        r.error(v.span(), path, "give either value or absent = true");
        return None;
    }
    if absent && !matches!(subject, Subject::Group(_)) {
        r.error(v.span(), format!("{path}.absent"), "applies to a group's metric only");
        return None;
    }
    Some(Expect { subject, metric, value, absent, tolerance })
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "name = \"t\"\n[[backend]]\nname = \"ss\"\ncount = 3\ncapacity = 100\nzone = \"z\"\n\
        [[group]]\nname = \"g\"\nlimit = 50\nreserved = 10\n[[client]]\ngroup = \"g\"\ncount = 2\nrate = 1.0\n";

    fn phase(body: &str) -> String {
        format!("{BASE}[[phase]]\n{body}[[phase.expect]]\ngroup = \"g\"\nmetric = \"busy\"\nvalue = 0\n")
    }

    /// Regression: the `linear` model that `tollgate calibrate` prints could not be simulated.
    #[test]
    fn a_cost_table_takes_the_calibrated_linear_model() {
        // The table after the top-level keys, before the arrays of tables.
        let with = |top: &str, table: &str| {
            phase("").replacen("name = \"t\"\n", &format!("name = \"t\"\n{top}{table}"), 1)
        };
        let table = "[cost]\nmodel = \"linear\"\nread_base = 0.5\nread_per_byte = 0.001\n";
        let s = Scenario::parse(&with("", table)).unwrap();
        let CostModel::Linear(k) = &s.cost_model else { panic!("{:?}", s.cost_model) };
        assert_eq!((k.read_base, k.read_per_byte), (0.5, 0.001));
        let e = Scenario::parse(&with("cost_model = \"ru\"\n", table)).unwrap_err().to_string();
        assert!(e.contains("cost_model or a [cost] table, not both"), "{e}");
        let bad = with("", "[cost]\nmodel = \"linear\"\nread_base = -1\n");
        assert!(Scenario::parse(&bad).unwrap_err().to_string().contains("cost.read_base"));
    }

    #[test]
    fn counts_expand_and_defaults_apply() {
        let s = Scenario::parse(&phase("")).unwrap();
        let names: Vec<&str> = s.backends.iter().map(|b| b.name.as_str()).collect();
        assert_eq!(names, ["ss-0", "ss-1", "ss-2"]);
        assert!(s.backends.iter().all(|b| b.zone == "z"));
        assert_eq!(s.clients.len(), 2);
        assert_eq!(s.clients[0].backends, vec![0, 1, 2]);
        assert_eq!(s.phases[0].timeout, Duration::from_secs(600));
        assert_eq!(s.phases[0].hold_checks, 10);
        assert_eq!(s.phases[0].expects[0].tolerance, 0.1);
    }

    #[test]
    fn a_client_works_for_several_groups_of_its_spread() {
        let with = |keys: &str| {
            Scenario::parse(
                &phase("").replace("count = 2\nrate = 1.0\n", &format!("count = 3\nrate = 1.0\n{keys}")),
            )
        };
        let s = with("spread = 5\ngroups = 2\n").unwrap();
        let mine: Vec<Vec<&str>> =
            s.clients.iter().map(|c| c.groups().map(GroupName::as_str).collect()).collect();
        assert_eq!(mine, [["g-0", "g-1"], ["g-2", "g-3"], ["g-4", "g-0"]]);
        let one = with("spread = 2\n").unwrap();
        assert!(one.clients.iter().all(|c| c.also.is_empty()));
        let e = with("groups = 2\n").unwrap_err().to_string();
        assert!(e.contains("client[0].groups: needs spread"), "{e}");
        let e = with("spread = 2\ngroups = 3\n").unwrap_err().to_string();
        assert!(e.contains("client[0].groups: must be at most spread (2), got 3"), "{e}");
    }

    #[test]
    fn set_group_changes_only_the_keys_given_in_order() {
        let s = Scenario::parse(&phase(
            "[[phase.action]]\nset_group = { name = \"g\", limit = 80 }\n\
             [[phase.action]]\nset_group = { name = \"g\", weight = 3 }\n",
        ))
        .unwrap();
        let Action::SetGroup { settings, .. } = &s.phases[0].actions[1] else { panic!("set_group") };
        assert_eq!(settings.limit().as_f64(), 80.0);
        assert_eq!(settings.reserved(), 10.0);
        assert_eq!(settings.weight(), 3.0);
    }

    #[test]
    fn a_backends_folding_time_is_read_and_checked() {
        let with = |extra: &str| {
            let src = phase("").replace("capacity = 100\n", &format!("capacity = 100\n{extra}"));
            Scenario::parse(&src)
        };
        assert_eq!(with("").unwrap().backends[0].folding_s, BACKEND_FOLDING_S);
        assert_eq!(with("folding_s = 1\n").unwrap().backends[0].folding_s, 1.0);
        let bad = with("folding_s = 1000\n").unwrap_err().to_string();
        assert!(bad.contains("backend[0].folding_s: must be from 0.1 to 600 seconds, got 1000"), "{bad}");
    }

    #[test]
    fn the_most_groups_a_controller_tracks_is_read_and_checked() {
        let parse = |v: &str| Scenario::parse(&format!("{}[controller]\nmax_groups = {v}\n", phase("")));
        let s = parse("1000000").unwrap();
        assert_eq!(crate::run::engine_settings(&s).max_tracked_groups, 1_000_000);
        let e = parse("0").unwrap_err().to_string();
        assert!(e.contains("controller.max_groups"), "{e}");
    }

    #[test]
    fn the_backends_report_interval_is_read_and_checked() {
        let parse = |v: &str| Scenario::parse(&format!("{}[controller]\nreport_ms = {v}\n", phase("")));
        assert_eq!(parse("250").unwrap().controller.report_every, Some(Duration::from_millis(250)));
        assert_eq!(Scenario::parse(&phase("")).unwrap().controller.report_every, None, "at the ticks");
        let bad = parse("255").unwrap_err().to_string();
        assert!(
            bad.contains("controller.report_ms: must be a multiple of 10 (the simulation's step), got 255"),
            "{bad}"
        );
        let bad = parse("5").unwrap_err().to_string();
        assert!(bad.contains("controller.report_ms"), "{bad}");
    }

    #[test]
    fn the_saturation_knobs_are_read_and_checked() {
        let ok = Scenario::parse(&format!(
            "{}[controller]\nqueue_target_bytes = 4e8\nqueue_spring_bytes = 1e8\ncost_folding_s = 5\n",
            phase("")
        ))
        .unwrap();
        assert_eq!(
            (ok.controller.queue_target_bytes, ok.controller.queue_spring_bytes, ok.controller.cost_folding),
            (4e8, 1e8, Duration::from_secs(5))
        );
        let bad = Scenario::parse(&format!(
            "{}[controller]\nqueue_target_bytes = 1e8\nqueue_spring_bytes = 2e8\ncost_folding_s = 1000\n",
            phase("")
        ))
        .unwrap_err()
        .to_string();
        assert!(
            bad.contains("controller.cost_folding_s: must be from 0.1 to 600 seconds, got 1000"),
            "{bad}"
        );
        assert!(
            bad.contains("controller.queue_spring_bytes: must be at most queue_target_bytes (100000000)"),
            "{bad}"
        );
    }

    #[test]
    fn settings_only_a_backend_applies_are_refused_by_name() {
        let src = phase("[[phase.action]]\nset_group = { name = \"g\", background = true }\n")
            .replace("reserved = 10\n", "reserved = 10\nbackend_limit = 20\n");
        let got: Vec<String> = Scenario::parse(&src).unwrap_err().0.iter().map(ToString::to_string).collect();
        // The action's group still holds the file's backend_limit too: both are named.
        assert_eq!(got.len(), 3, "{got:?}");
        for (line, field) in [
            (0, "group[0].backend_limit"),
            (1, "phase[0].action[0].set_group.backend_limit"),
            (2, "phase[0].action[0].set_group.background"),
        ] {
            assert!(
                got[line].contains(&format!("{field}: the simulator's backends do not schedule work")),
                "{got:?}"
            );
        }
        let src = phase("").replace("reserved = 10\n", "reserved = 10\nmax_in_flight = 4\n");
        let got = Scenario::parse(&src).unwrap_err().to_string();
        assert!(got.contains("group[0].max_in_flight: the simulator's clients send rates"), "{got}");
    }

    #[test]
    fn a_clients_classes_are_read_and_bad_ones_named() {
        let with = |line: &str| phase("").replace("rate = 1.0\n", &format!("rate = 1.0\n{line}\n"));
        let s = Scenario::parse(&with("classes = { critical = 0.25, sheddable = 0.5 }")).unwrap();
        assert_eq!(s.clients[0].mix, [0.25, 0.25, 0.5]);
        let s = Scenario::parse(&with("class = \"sheddable\"")).unwrap();
        assert_eq!(s.clients[0].mix, [0.0, 0.0, 1.0]);
        for (line, says) in [
            ("class = \"urgent\"", "client[0].class: must be critical, normal or sheddable"),
            (
                "classes = { critical = 0.75, sheddable = 0.5 }",
                "client[0].classes: the critical and sheddable shares must add up to at most 1",
            ),
            ("classes = { normal = 0.5 }", "client[0].classes.normal: unknown field"),
        ] {
            let e = Scenario::parse(&with(line)).unwrap_err().to_string();
            assert!(e.contains(says), "{line}: {e}");
        }
    }

    #[test]
    fn faults_are_read_and_every_bad_one_named() {
        let ok = Scenario::parse(&format!(
            "{}[[fault]]\nat_s = 5\npartition = {{ clients = [1], duration_s = 3 }}\n[faults]\nrandom = 2\nto_s = 9\n",
            phase("")
        ))
        .unwrap();
        assert_eq!(ok.faults.len(), 1);
        assert_eq!(ok.faults[0].end(), Some(Duration::from_secs(8)));
        assert_eq!(ok.random_faults.as_ref().map(|r| r.count), Some(2));
        let bad = Scenario::parse(&format!(
            "{}[[fault]]\nat_s = 5\npartition = {{ clients = [7], duration_s = 3 }}\n\
             [[fault]]\nat_s = 1\nloss = {{ p = 2, duration_s = 1 }}\n\
             [[fault]]\nat_s = 1\nmeteor = {{}}\n\
             [[fault]]\nat_s = 1\ndrift = {{ rate = 0.5 }}\n\
             [faults]\nrandom = 0\nfrom_s = 9\nto_s = 9\n",
            phase("")
        ))
        .unwrap_err()
        .to_string();
        for expected in [
            "fault[0].partition.clients[0]: no client 7: the scenario has 2 (0 to 1)",
            "fault[1].loss.p: must be a probability from 0 to 1, got 2",
            "fault[2].meteor: unknown field; expected one of at_s, crash, failover, partition, loss, delay, drift",
            "fault[3].drift.rate: must be from -0.1 to 0.1",
            "faults.random",
        ] {
            assert!(bad.contains(expected), "{expected}\n{bad}");
        }
    }

    #[test]
    fn regions_and_their_cuts_are_read_and_bad_ones_named() {
        let read = |src: &str| Scenario::parse(&format!("{}{src}", phase("")));
        let ok = read("[controller]\nregions = 2\n[[fault]]\nat_s = 5\nregion_cut = { regions = [1], duration_s = 3 }\n")
            .unwrap();
        assert_eq!(ok.controller.regions, 2);
        assert_eq!(
            ok.faults[0].kind,
            crate::faults::FaultKind::RegionCut { regions: vec![1], duration: Duration::from_secs(3) }
        );
        let bad = |src: &str| read(src).unwrap_err().to_string();
        let none = bad("[[fault]]\nat_s = 5\nregion_cut = { duration_s = 3 }\n");
        assert!(none.contains("the scenario has no regions: set controller.regions"), "{none}");
        let many = bad("[controller]\nregions = 65\n");
        assert!(many.contains("controller.regions"), "{many}");
        let which = bad(
            "[controller]\nregions = 2\n[[fault]]\nat_s = 5\nregion_cut = { regions = [2], duration_s = 3 }\n",
        );
        assert!(which.contains("fault[0].region_cut.regions[0]: no region 2: the scenario has 2"), "{which}");
    }

    #[test]
    fn a_regions_failover_is_read_with_the_election_lease_by_default() {
        let read = |src: &str| Scenario::parse(&format!("{}[controller]\nregions = 3\n{src}", phase("")));
        let ok = read("[[fault]]\nat_s = 5\nregion_failover = { regions = [0, 2] }\n").unwrap();
        assert_eq!(
            ok.faults[0].kind,
            crate::faults::FaultKind::RegionFailover { regions: vec![0, 2], down: Duration::from_secs(2) }
        );
        let bad =
            read("[[fault]]\nat_s = 5\nregion_failover = { regions = [0], down_s = -1 }\n").unwrap_err();
        assert!(bad.to_string().contains("region_failover.down_s"), "{bad}");
    }

    #[test]
    fn a_demand_step_is_read_and_its_rate_checked() {
        let ok = Scenario::parse(&phase("[[phase.action]]\nset_clients = { group = \"g\", rate = 20 }\n"))
            .unwrap();
        assert_eq!(
            ok.phases[0].actions,
            [Action::SetClients { group: GroupName::new("g").unwrap(), rate: 20.0 }]
        );
        for (action, expected) in [
            ("set_clients = { group = \"g\" }", "phase[0].action[0].set_clients.rate: is required"),
            ("set_clients = { group = \"g\", rate = 0 }", "set_clients.rate: must be above 0, got 0"),
            (
                "set_clients = { group = \"g\", rate = 1e9 }",
                "set_clients.rate: must be at most 100000 requests/s",
            ),
            (
                "set_clients = { rate = 5, speed = 1 }",
                "set_clients.speed: unknown field; expected one of group, rate",
            ),
        ] {
            let bad =
                Scenario::parse(&phase(&format!("[[phase.action]]\n{action}\n"))).unwrap_err().to_string();
            assert!(bad.contains(expected), "{expected}\n{bad}");
        }
        let bad = Scenario::parse("name = \"x\"\n[[client]]\ngroup = \"g\"\nrate = 200000\n")
            .unwrap_err()
            .to_string();
        assert!(bad.contains("client[0].rate: must be at most 100000 requests/s, got 200000"), "{bad}");
    }

    #[test]
    fn one_clients_step_and_a_front_ends_refusals_are_read_and_checked() {
        let ok = Scenario::parse(&phase("[[phase.action]]\nset_client = { index = 1, rate = 0 }\n")).unwrap();
        assert_eq!(ok.phases[0].actions, [Action::SetClient { index: 1, rate: 0.0 }]);
        assert!(ok.clients.iter().all(|c| c.queue), "clients queue by default");
        for (action, expected) in [
            ("set_client = { rate = 5 }", "phase[0].action[0].set_client.index: is required"),
            ("set_client = { index = 2, rate = 5 }", "set_client.index: must be"),
            ("set_client = { index = 0, rate = -1 }", "set_client.rate: must not be negative, got -1"),
            ("set_client = { index = 0, rate = 1e9 }", "set_client.rate: must be at most 100000 requests/s"),
            ("set_client = { index = 0, rate = 1, group = \"g\" }", "expected one of index, rate"),
        ] {
            let bad =
                Scenario::parse(&phase(&format!("[[phase.action]]\n{action}\n"))).unwrap_err().to_string();
            assert!(bad.contains(expected), "{expected}\n{bad}");
        }
        let front = phase("").replace("rate = 1.0\n", "rate = 1.0\nqueue = false\n");
        assert!(Scenario::parse(&front).unwrap().clients.iter().all(|c| !c.queue));
        let bad = Scenario::parse(&front.replace("queue = false", "queue = 1")).unwrap_err().to_string();
        assert!(bad.contains("client[0].queue: must be true or false"), "{bad}");
    }

    #[test]
    fn broken_rules_and_unknown_keys_are_reported_by_line() {
        let src = phase("[[phase.action]]\nset_group = { name = \"g\", limit = 5 }\nspeed = 1\n");
        let errors = Scenario::parse(&src).unwrap_err().0;
        let got: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(
            got,
            [
                "line 17: phase[0].action[0].set_group.reserved: must not exceed limit (10 > 5)",
                "line 18: phase[0].action[0].speed: unknown field; expected one of set_backend, set_group, remove_group, settle, set_clients, set_client",
            ]
        );
    }

    #[test]
    fn a_group_can_ramp() {
        let src = phase("").replace(
            "reserved = 10\n",
            "reserved = 10\nramp = { min = 1, max = 50, duration_s = 10, mode = \"scheduled\" }\n",
        );
        let s = Scenario::parse(&src).unwrap();
        assert_eq!(s.groups[0].1.ramp().unwrap().max, 50.0);
    }
}

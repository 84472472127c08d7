//! Faults a scenario injects, and the invariants checked while they happen (TigerBeetle's and
//! FoundationDB's simulators are the models): the run is the real controller and the real
//! clients, so what breaks here breaks in production.
//!
//! ```toml
//! [[fault]]
//! at_s = 20
//! crash = { down_s = 5 }            # the controller dies; a new one starts on the same store
//! # failover = { down_s = 2 }       # another controller takes over after the election lease
//! # partition = { clients = [0, 1], duration_s = 10 }   # or clients = "all"
//! # loss = { p = 0.3, duration_s = 20 }                  # exchanges lost
//! # delay = { ms = 300, duration_s = 20 }                # answers late
//! # drift = { clients = [2], rate = 0.02 }               # a client's clock runs 2 % fast
//! # restart = { clients = [0, 1] }                       # clients restart (same ids, sequence from 1)
//! # churn = { names = 1500, duration_s = 10 }            # new tenants, through the first client
//! # store_loss = { duration_s = 30 }                     # etcd gone: the leader holds its lease, then none leads
//! # region_cut = { regions = [0], duration_s = 20 }      # regions (controller.regions) cut off from the global tier
//! # region_failover = { regions = [1], down_s = 2 }      # a region's leader killed; another of its controllers leads
//!
//! [faults]                          # more, drawn from the seed
//! random = 5
//! from_s = 10
//! to_s = 100
//! ```

use std::time::Duration;

use tollgate_model::toml_reader::{Fields, Reader, Value};
use toml::de::DeValue;

use crate::rng::SplitMix64;

/// One fault, and when it starts.
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    /// When it starts, from the run's start.
    pub at: Duration,
    /// What it does.
    pub kind: FaultKind,
}

/// What a fault does.
#[derive(Debug, Clone, PartialEq)]
pub enum FaultKind {
    /// The controller dies; after `down` a new one starts over the same store and relearns.
    Crash {
        /// How long no controller answers.
        down: Duration,
    },
    /// The leader dies and another controller, which followed it, leads after `down` (the
    /// election lease), starting a learning lease.
    Failover {
        /// How long no controller leads.
        down: Duration,
    },
    /// Some clients cannot reach the controller.
    Partition {
        /// Which clients (indexes in the order the scenario expands them).
        clients: Vec<usize>,
        /// For how long.
        duration: Duration,
    },
    /// Each exchange is lost (the client hears nothing) with probability `p`.
    Loss {
        /// The probability, 0 to 1.
        p: f64,
        /// For how long.
        duration: Duration,
    },
    /// Every answer arrives `delay` late.
    Delay {
        /// How late.
        delay: Duration,
        /// For how long.
        duration: Duration,
    },
    /// Some clients' clocks run fast (or slow, below 0) by `rate` from `at` on.
    Drift {
        /// Which clients.
        clients: Vec<usize>,
        /// Relative error: 0.02 is 2 % fast.
        rate: f64,
    },
    /// Some clients restart: new processes under the same ids, numbering their exchanges from
    /// 1, holding no grant and nothing waiting.
    Restart {
        /// Which clients.
        clients: Vec<usize>,
    },
    /// `names` new tenants appear over `duration`, each asked for once a second through the
    /// first client from its first ask to the end: past 1,000, more groups than one exchange
    /// carries.
    Churn {
        /// How many new names.
        names: u32,
        /// Over how long.
        duration: Duration,
    },
    /// The settings store (etcd) is gone for `duration`: the leader goes on granting for its
    /// election lease ([`ELECTION_LEASE`]), then no controller leads until the store returns,
    /// when the same controller leads again (relearning for a lease).
    StoreLoss {
        /// For how long.
        duration: Duration,
    },
    /// Some regions (with `controller.regions`) cannot reach the global tier: each goes on
    /// granting its last shares for their lease, then decays them.
    RegionCut {
        /// Which regions (0 to `controller.regions - 1`).
        regions: Vec<usize>,
        /// For how long.
        duration: Duration,
    },
    /// Some regions' leaders are killed: each region's clients go unanswered for `down`
    /// (riding on their grants), then another of its controllers leads, relearning what they
    /// hold, and takes the region's lease on the global tier over from the first exchange
    /// (the global tier releasing the dead leader's shares).
    RegionFailover {
        /// Which regions (0 to `controller.regions - 1`).
        regions: Vec<usize>,
        /// How long until another controller leads the region.
        down: Duration,
    },
}

/// The election lease a [`FaultKind::StoreLoss`] lets the leader lead on for (the server's
/// default).
pub const ELECTION_LEASE: Duration = Duration::from_secs(2);
/// The most names a churn may bring.
pub const CHURN_NAMES_MAX: u32 = 100_000;

impl Fault {
    /// When it stops acting (`None`: a drift, which never does).
    pub fn end(&self) -> Option<Duration> {
        let len = match &self.kind {
            FaultKind::Crash { down }
            | FaultKind::Failover { down }
            | FaultKind::RegionFailover { down, .. } => *down,
            FaultKind::Partition { duration, .. }
            | FaultKind::Loss { duration, .. }
            | FaultKind::Delay { duration, .. }
            | FaultKind::Churn { duration, .. }
            | FaultKind::StoreLoss { duration }
            | FaultKind::RegionCut { duration, .. } => *duration,
            FaultKind::Restart { .. } => Duration::ZERO,
            FaultKind::Drift { .. } => return None,
        };
        Some(self.at + len)
    }

    /// Its name in the scenario's keys.
    pub fn name(&self) -> &'static str {
        match self.kind {
            FaultKind::Crash { .. } => "crash",
            FaultKind::Failover { .. } => "failover",
            FaultKind::Partition { .. } => "partition",
            FaultKind::Loss { .. } => "loss",
            FaultKind::Delay { .. } => "delay",
            FaultKind::Drift { .. } => "drift",
            FaultKind::Restart { .. } => "restart",
            FaultKind::Churn { .. } => "churn",
            FaultKind::StoreLoss { .. } => "store_loss",
            FaultKind::RegionCut { .. } => "region_cut",
            FaultKind::RegionFailover { .. } => "region_failover",
        }
    }
}

/// Faults drawn from the seed: `count` of them, starting between `from` and `to`.
#[derive(Debug, Clone, PartialEq)]
pub struct RandomFaults {
    /// How many.
    pub count: u32,
    /// The earliest start.
    pub from: Duration,
    /// The latest start.
    pub to: Duration,
}

/// The most faults a scenario may list, and draw.
pub const FAULTS_MAX: usize = 1000;
/// The longest a fault may last.
const FAULT_SECONDS_MAX: u64 = 86_400;

const FAULT_KINDS: &str =
    "crash, failover, partition, loss, delay, drift, restart, churn, store_loss, region_cut, region_failover";

/// Reads `[[fault]]` number `i`.
pub(crate) fn read_fault(
    r: &mut Reader<'_>,
    path: &str,
    v: &Value<'_>,
    clients: usize,
    regions: usize,
) -> Option<Fault> {
    let mut f = r.fields(path, v)?;
    let at = match f.take("at_s") {
        Some((p, v)) => r.integer(&p, v, 0, FAULT_SECONDS_MAX).map(Duration::from_secs),
        None => {
            r.error(v.span(), format!("{path}.at_s"), "is required: the second the fault starts");
            None
        }
    };
    let mut kind = None;
    for name in [
        "crash",
        "failover",
        "partition",
        "loss",
        "delay",
        "drift",
        "restart",
        "churn",
        "store_loss",
        "region_cut",
        "region_failover",
    ] {
        if let Some((p, fv)) = f.take(name) {
            if kind.is_some() {
                r.error(fv.span(), p, format!("one kind per [[fault]]: {FAULT_KINDS}"));
                continue;
            }
            kind = Some(read_kind(r, &p, name, fv, (clients, regions)));
        }
    }
    r.finish(f, &format!("at_s, {FAULT_KINDS}"));
    match kind {
        None => {
            r.error(v.span(), path, format!("give one kind of fault: {FAULT_KINDS}"));
            None
        }
        Some(k) => Some(Fault { at: at?, kind: k? }),
    }
}

fn seconds(r: &mut Reader<'_>, path: &str, v: &Value<'_>) -> Option<Duration> {
    let s = r.positive(path, v)?;
    if s > FAULT_SECONDS_MAX as f64 {
        r.error(v.span(), path, format!("must be at most {FAULT_SECONDS_MAX} seconds, got {s}"));
        return None;
    }
    r.duration(path, v, s)
}

/// The required `duration_s` of a fault.
fn duration_of(r: &mut Reader<'_>, f: &mut Fields<'_, '_>, path: &str, v: &Value<'_>) -> Option<Duration> {
    match f.take("duration_s") {
        Some((p, dv)) => seconds(r, &p, dv),
        None => {
            r.error(v.span(), format!("{path}.duration_s"), "is required");
            None
        }
    }
}

/// A list of clients (`what` = "client") or regions, as indexes below `clients`, or "all".
fn client_list(
    r: &mut Reader<'_>,
    path: &str,
    v: &Value<'_>,
    (clients, what): (usize, &str),
) -> Option<Vec<usize>> {
    match v.get_ref() {
        DeValue::String(s) if s.as_ref() == "all" => Some((0..clients).collect()),
        DeValue::Array(items) => {
            let mut out = Vec::new();
            for (i, item) in items.iter().enumerate() {
                let p = format!("{path}[{i}]");
                let n = r.integer(&p, item, 0, u64::MAX >> 1)? as usize;
                if n >= clients {
                    r.error(
                        item.span(),
                        p,
                        format!(
                            "no {what} {n}: the scenario has {clients} (0 to {})",
                            clients.saturating_sub(1)
                        ),
                    );
                    return None;
                }
                out.push(n);
            }
            if out.is_empty() {
                r.error(v.span(), path, format!("name at least one {what}"));
                return None;
            }
            Some(out)
        }
        other => {
            r.error(
                v.span(),
                path,
                format!("must be \"all\" or a list of {what} indexes, got {}", other.type_str()),
            );
            None
        }
    }
}

/// The indexes listed under `key` (`what`s below `count`), every one unless given.
fn listed(
    r: &mut Reader<'_>,
    f: &mut Fields<'_, '_>,
    key: &str,
    (count, what): (usize, &str),
) -> Option<Vec<usize>> {
    match f.take(key) {
        Some((p, v)) => client_list(r, &p, v, (count, what)),
        None => Some((0..count).collect()),
    }
}

/// A crash (5 s down unless given) or a failover (2 s).
fn down(r: &mut Reader<'_>, mut f: Fields<'_, '_>, crash: bool) -> Option<FaultKind> {
    let down = match f.take("down_s") {
        Some((p, v)) => seconds(r, &p, v),
        None => Some(Duration::from_secs(if crash { 5 } else { 2 })),
    };
    let down = down?;
    r.finish(f, "down_s");
    Some(if crash { FaultKind::Crash { down } } else { FaultKind::Failover { down } })
}

/// A `region_cut` or `region_failover` (named `name`) of a scenario with `regions` regions.
fn region_kind(
    r: &mut Reader<'_>,
    mut f: Fields<'_, '_>,
    (path, name, v): (&str, &str, &Value<'_>),
    regions: usize,
) -> Option<FaultKind> {
    if regions == 0 {
        r.error(v.span(), path, "the scenario has no regions: set controller.regions");
        return None;
    }
    // Regions are listed as clients are: indexes below the count.
    let c = listed(r, &mut f, "regions", (regions, "region"));
    if name == "region_failover" {
        let down = match f.take("down_s") {
            Some((p, v)) => seconds(r, &p, v),
            None => Some(ELECTION_LEASE),
        };
        r.finish(f, "regions, down_s");
        return Some(FaultKind::RegionFailover { regions: c?, down: down? });
    }
    let d = duration_of(r, &mut f, path, v);
    r.finish(f, "regions, duration_s");
    Some(FaultKind::RegionCut { regions: c?, duration: d? })
}

fn read_kind(
    r: &mut Reader<'_>,
    path: &str,
    name: &str,
    v: &Value<'_>,
    (clients, regions): (usize, usize),
) -> Option<FaultKind> {
    let mut f = r.fields(path, v)?;
    let kind = match name {
        "crash" | "failover" => return down(r, f, name == "crash"),
        "partition" => {
            let c = listed(r, &mut f, "clients", (clients, "client"));
            let d = duration_of(r, &mut f, path, v);
            r.finish(f, "clients, duration_s");
            FaultKind::Partition { clients: c?, duration: d? }
        }
        "loss" => {
            let p = probability(r, &mut f);
            let d = duration_of(r, &mut f, path, v);
            r.finish(f, "p, duration_s");
            FaultKind::Loss { p: p?, duration: d? }
        }
        "restart" => {
            let c = listed(r, &mut f, "clients", (clients, "client"));
            r.finish(f, "clients");
            FaultKind::Restart { clients: c? }
        }
        "churn" => {
            let names = churn_names(r, &mut f, path, v);
            let d = duration_of(r, &mut f, path, v);
            r.finish(f, "names, duration_s");
            FaultKind::Churn { names: names?, duration: d? }
        }
        "store_loss" => {
            let d = duration_of(r, &mut f, path, v);
            r.finish(f, "duration_s");
            FaultKind::StoreLoss { duration: d? }
        }
        "region_cut" | "region_failover" => return region_kind(r, f, (path, name, v), regions),
        "delay" => {
            let ms = delay_of(r, &mut f, path, v);
            let d = duration_of(r, &mut f, path, v);
            r.finish(f, "ms, duration_s");
            FaultKind::Delay { delay: ms?, duration: d? }
        }
        _ => {
            let c = listed(r, &mut f, "clients", (clients, "client"));
            let rate = drift_rate(r, &mut f, path, v);
            r.finish(f, "clients, rate");
            FaultKind::Drift { clients: c?, rate: rate? }
        }
    };
    Some(kind)
}

/// A loss's `p`: a probability, 0.5 unless given.
fn probability(r: &mut Reader<'_>, f: &mut Fields<'_, '_>) -> Option<f64> {
    match f.take("p") {
        Some((path2, pv)) => match r.number(&path2, pv) {
            Some(x) if (0.0..=1.0).contains(&x) => Some(x),
            Some(x) => {
                r.error(pv.span(), path2, format!("must be a probability from 0 to 1, got {x}"));
                None
            }
            None => None,
        },
        None => Some(0.5),
    }
}

/// A churn's `names`: required, 1 to [`CHURN_NAMES_MAX`].
fn churn_names(r: &mut Reader<'_>, f: &mut Fields<'_, '_>, path: &str, v: &Value<'_>) -> Option<u32> {
    match f.take("names") {
        Some((p, v)) => r.integer(&p, v, 1, u64::from(CHURN_NAMES_MAX)).map(|n| n as u32),
        None => {
            r.error(v.span(), format!("{path}.names"), format!("is required: 1 to {CHURN_NAMES_MAX}"));
            None
        }
    }
}

/// A delay's `ms`: required, 1 to 60,000.
fn delay_of(r: &mut Reader<'_>, f: &mut Fields<'_, '_>, path: &str, v: &Value<'_>) -> Option<Duration> {
    match f.take("ms") {
        Some((p, v)) => r.integer(&p, v, 1, 60_000).map(Duration::from_millis),
        None => {
            r.error(v.span(), format!("{path}.ms"), "is required: how late each answer is, 1 to 60000");
            None
        }
    }
}

/// A drift's `rate`: required, -0.1 to 0.1.
fn drift_rate(r: &mut Reader<'_>, f: &mut Fields<'_, '_>, path: &str, v: &Value<'_>) -> Option<f64> {
    match f.take("rate") {
        Some((p, v)) => match r.number(&p, v) {
            Some(x) if x.abs() <= 0.1 && x > -1.0 => Some(x),
            Some(x) => {
                r.error(v.span(), p, format!("must be from -0.1 to 0.1 (10 % slow to 10 % fast), got {x}"));
                None
            }
            None => None,
        },
        None => {
            r.error(v.span(), format!("{path}.rate"), "is required");
            None
        }
    }
}

/// Reads `[faults]`.
pub(crate) fn read_random(r: &mut Reader<'_>, v: &Value<'_>) -> Option<RandomFaults> {
    let mut f = r.fields("faults", v)?;
    let count = match f.take("random") {
        Some((p, v)) => r.integer(&p, v, 1, FAULTS_MAX as u64).map(|n| n as u32),
        None => {
            r.error(v.span(), "faults.random", "is required: how many faults to draw from the seed");
            None
        }
    };
    let from = match f.take("from_s") {
        Some((p, v)) => r.integer(&p, v, 0, FAULT_SECONDS_MAX).map(Duration::from_secs),
        None => Some(Duration::ZERO),
    };
    let to = match f.take("to_s") {
        Some((p, v)) => r.integer(&p, v, 1, FAULT_SECONDS_MAX).map(Duration::from_secs),
        None => {
            r.error(v.span(), "faults.to_s", "is required: the latest second a drawn fault starts");
            None
        }
    };
    r.finish(f, "random, from_s, to_s");
    let (count, from, to) = (count?, from?, to?);
    if from >= to {
        r.error(
            v.span(),
            "faults.from_s",
            format!("must be before to_s ({} ≥ {})", from.as_secs(), to.as_secs()),
        );
        return None;
    }
    Some(RandomFaults { count, from, to })
}

/// The faults a seed draws: kinds, times and sizes from the seed alone, so a breach replays.
/// With `regions`, a region cut off from the global tier and a region's leader killed are two
/// more kinds drawn.
pub fn draw(random: &RandomFaults, seed: u64, clients: usize, regions: usize) -> Vec<Fault> {
    let mut rng = SplitMix64::new(seed ^ 0xFA17_5EED);
    let span = (random.to - random.from).as_secs_f64();
    (0..random.count)
        .map(|_| {
            let at = random.from + Duration::from_secs_f64((rng.next_f64() * span).floor());
            let secs = |lo: f64, hi: f64, rng: &mut SplitMix64| {
                Duration::from_secs_f64((lo + rng.next_f64() * (hi - lo)).round())
            };
            let some_clients = |rng: &mut SplitMix64| {
                let n = clients.max(1);
                let k = 1 + (rng.next_u64() % n as u64) as usize;
                let start = (rng.next_u64() % n as u64) as usize;
                (0..k).map(|i| (start + i) % n).collect::<Vec<_>>()
            };
            let kinds = if regions > 0 { 8 } else { 6 };
            let kind = match rng.next_u64() % kinds {
                0 => FaultKind::Crash { down: secs(1.0, 15.0, &mut rng) },
                1 => FaultKind::Failover { down: secs(1.0, 3.0, &mut rng) },
                2 => FaultKind::Partition {
                    clients: some_clients(&mut rng),
                    duration: secs(1.0, 30.0, &mut rng),
                },
                3 => FaultKind::Loss {
                    p: (rng.next_f64() * 0.8 * 100.0).round() / 100.0,
                    duration: secs(1.0, 30.0, &mut rng),
                },
                4 => FaultKind::Delay {
                    delay: Duration::from_millis(10 * (1 + rng.next_u64() % 50)),
                    duration: secs(1.0, 30.0, &mut rng),
                },
                5 => FaultKind::Drift {
                    clients: some_clients(&mut rng),
                    rate: ((rng.next_f64() * 2.0 - 1.0) * 0.05 * 1000.0).round() / 1000.0,
                },
                6 => FaultKind::RegionCut {
                    regions: vec![(rng.next_u64() % regions.max(1) as u64) as usize],
                    duration: secs(1.0, 30.0, &mut rng),
                },
                _ => FaultKind::RegionFailover {
                    regions: vec![(rng.next_u64() % regions.max(1) as u64) as usize],
                    down: secs(1.0, 3.0, &mut rng),
                },
            };
            Fault { at, kind }
        })
        .collect()
}

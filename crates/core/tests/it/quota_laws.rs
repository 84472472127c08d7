//! Quotas per window are counts: whatever the clients ask, however their exchanges and
//! answers interleave, get lost or arrive late, and wherever the windows turn, what they admit
//! in any window never passes its quota.
//!
//! Each client here does what the Rust and Python clients do with an allotment (admit from it
//! while its window lasts, report what it was given and used, give back what it holds past its
//! needs, start afresh in a new window), against the real engine.

use std::time::Duration;

use proptest::prelude::*;
use tollgate_model::engine::{Allotment, ClientReport, Engine, EngineSettings, QuotaHeld};
use tollgate_model::settings::{BudgetPeriod, GroupName, GroupSettings};
use tollgate_model::time::Nanos;

const MINUTE_MS: u64 = 60_000;
const HOUR_MS: u64 = 3_600_000;
/// The wall clock at the engine's time 0: 45 s into a minute, so windows turn early on.
const WALL_AT_ZERO: u64 = 479_000 * MINUTE_MS + 45_000;

#[derive(Debug, Clone)]
enum Step {
    /// A client asks to admit this cost.
    Ask { client: usize, cost: f64 },
    /// A client sends its report (the engine answers at once; the answer is delivered later,
    /// or lost).
    Send { client: usize, demand: f64, lose: bool },
    /// A client's answer in flight arrives.
    Deliver { client: usize },
    /// Time passes.
    Wait { ms: u64 },
}

fn step(clients: usize) -> impl Strategy<Value = Step> {
    prop_oneof![
        5 => (0..clients, prop_oneof![Just(1.0), 0.1..5.0f64]).prop_map(|(client, cost)| Step::Ask { client, cost }),
        2 => (0..clients, prop_oneof![Just(0.0), 0.0..50.0f64], prop::bool::weighted(0.1))
            .prop_map(|(client, demand, lose)| Step::Send { client, demand, lose }),
        2 => (0..clients).prop_map(|client| Step::Deliver { client }),
        1 => prop_oneof![1u64..50, 500u64..5000, 20_000u64..70_000].prop_map(|ms| Step::Wait { ms }),
    ]
}

/// A client's allotment, as the clients keep it.
#[derive(Debug, Default, Clone)]
struct Client {
    window: u64,
    given: f64,
    used: f64,
    /// The engine's time (ms) after which the allotment may not be used.
    ends: Option<u64>,
    has: bool,
    /// Consumed since the last report sent.
    unreported: f64,
    /// The answer in flight: when its request was sent, and the allotment it carries.
    in_flight: Option<(u64, Option<Allotment>)>,
}

impl Client {
    fn take(&mut self, cost: f64, now_ms: u64) -> bool {
        let live = self.ends.is_none_or(|e| now_ms < e);
        if self.has && live && self.used + cost <= self.given + 1e-6 {
            self.used += cost;
            self.unreported += cost;
            return true;
        }
        false
    }

    /// What it reports: it takes allotments, so the default (nothing) while it holds none.
    fn held(&mut self, demand: f64) -> Option<QuotaHeld> {
        if !self.has {
            return Some(QuotaHeld::default());
        }
        let keep = (demand * 4.0).max(1.0);
        if self.given - self.used > keep {
            self.given = self.used + keep;
        }
        Some(QuotaHeld { window: self.window, given: self.given, used: self.used, lasts: None })
    }

    fn apply(&mut self, sent_ms: u64, a: Option<Allotment>) {
        let Some(a) = a else {
            self.has = false;
            return;
        };
        if !self.has || self.window != a.window {
            (self.window, self.given, self.used) = (a.window, 0.0, 0.0);
        }
        self.given += a.add;
        self.ends = a.ends_in.map(|d| sent_ms + u64::try_from(d.as_millis()).unwrap());
        self.has = true;
    }
}

/// Units admitted in each window: the window's number since the epoch, and the units.
type PerWindow = Vec<(u64, f64)>;

/// Runs `steps` for `clients` clients of one group with a minute's and an hour's quota;
/// returns the units admitted in each minute and each hour of the wall clock.
fn run(minute: f64, hour: f64, clients: usize, steps: &[Step]) -> (PerWindow, PerWindow) {
    let mut e = Engine::new(EngineSettings::default());
    let g = GroupName::new("api").unwrap();
    let s = GroupSettings::builder().quota(BudgetPeriod::Minute, minute).quota(BudgetPeriod::Hour, hour);
    e.set_group(g.clone(), s.build().unwrap());
    e.set_wall_clock(Nanos(0), WALL_AT_ZERO);
    e.roll_windows(WALL_AT_ZERO, BudgetPeriod::Total);
    let mut cs = vec![Client::default(); clients];
    let (mut per_minute, mut per_hour) = (PerWindow::new(), PerWindow::new());
    let mut now_ms = 0u64;
    for s in steps {
        match *s {
            Step::Ask { client, cost } => {
                if cs[client].take(cost, now_ms) {
                    let wall = WALL_AT_ZERO + now_ms;
                    for (list, span) in [(&mut per_minute, MINUTE_MS), (&mut per_hour, HOUR_MS)] {
                        match list.last_mut() {
                            Some((w, sum)) if *w == wall / span => *sum += cost,
                            _ => list.push((wall / span, cost)),
                        }
                    }
                }
            }
            Step::Send { client, demand, lose } => {
                let c = &mut cs[client];
                if c.in_flight.is_some() {
                    continue; // one exchange at a time
                }
                let report = ClientReport {
                    demand,
                    consumed: std::mem::take(&mut c.unreported),
                    quota: c.held(demand),
                    ..ClientReport::default()
                };
                let grant = e.report(Nanos(now_ms * 1_000_000), client as u64 + 1, &g, report);
                // A lost answer is never applied: the client's next report says what it holds.
                if !lose {
                    c.in_flight = Some((now_ms, grant.quota));
                }
            }
            Step::Deliver { client } => {
                if let Some((sent, a)) = cs[client].in_flight.take() {
                    cs[client].apply(sent, a);
                }
            }
            Step::Wait { ms } => {
                now_ms += ms;
                e.tick(Nanos(now_ms * 1_000_000));
                e.roll_windows(WALL_AT_ZERO + now_ms, BudgetPeriod::Total);
            }
        }
    }
    (per_minute, per_hour)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn what_clients_admit_in_a_window_never_passes_its_quota(
        minute in prop_oneof![Just(1.0), Just(5.0), 1.0..200.0f64],
        hour in prop_oneof![Just(1e9), 10.0..2000.0f64],
        clients in 1usize..6,
        steps in prop::collection::vec(step(5), 1..400),
    ) {
        let steps: Vec<Step> = steps
            .into_iter()
            .map(|s| match s {
                Step::Ask { client, cost } => Step::Ask { client: client % clients, cost },
                Step::Send { client, demand, lose } => Step::Send { client: client % clients, demand, lose },
                Step::Deliver { client } => Step::Deliver { client: client % clients },
                w => w,
            })
            .collect();
        let (per_minute, per_hour) = run(minute, hour, clients, &steps);
        for (w, admitted) in per_minute {
            prop_assert!(admitted <= minute + 1e-6, "minute {w}: {admitted} admitted of {minute}");
        }
        for (w, admitted) in per_hour {
            prop_assert!(admitted <= hour + 1e-6, "hour {w}: {admitted} admitted of {hour}");
        }
    }
}

/// The canary: a client that kept using its allotment past its window's end would pass the
/// next window's quota, and the law above would see it.
#[test]
fn the_law_sees_a_client_that_spends_past_its_windows_end() {
    let mut c = Client::default();
    c.apply(
        0,
        Some(Allotment {
            window: 1,
            add: 5.0,
            ends_in: Some(Duration::from_secs(15)),
            left: 0.0,
            reset_in: None,
        }),
    );
    assert!(c.take(5.0, 14_000));
    c.used = 0.0;
    assert!(!c.take(5.0, 15_000), "the allotment ends with its window");
}

/// Used in full: a single client asking flat out is allotted every unit of the window.
#[test]
fn one_client_asking_flat_out_is_allotted_the_whole_quota() {
    let mut steps = Vec::new();
    for _ in 0..40 {
        steps.push(Step::Send { client: 0, demand: 100.0, lose: false });
        steps.push(Step::Deliver { client: 0 });
        for _ in 0..10 {
            steps.push(Step::Ask { client: 0, cost: 1.0 });
        }
    }
    let (per_minute, _) = run(70.0, 1e9, 1, &steps);
    assert_eq!(per_minute.first().map(|&(_, a)| a), Some(70.0));
}

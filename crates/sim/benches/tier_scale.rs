//! Two tiers at scale: 100,000 clients each serving 10 of 1,000,000 groups, in 10 regions
//! (client `c` in region `c mod 10`, so each region's 10,000 clients use 100,000 groups). Each
//! second every client exchanges with its region's engine, which ticks within the shares the
//! global tier gave it, then adds up its groups' usage (`Engine::upstream_usage`, as the
//! regional leader does) and reports it to the global engine in pages of
//! `EXCHANGE_GROUPS_MAX` groups, as the client `region/N`; the global engine ticks over all
//! 1,000,000 groups. Prints each tier's median tick, the time to add up a region's usage, the
//! memory of the largest regional engine and of the global one, and the exchanges each tier
//! takes a second. Every group falls to the `default` group's settings.
//!
//! `cargo bench -p tollgate-sim --bench tier_scale -- --bench`
//!
//! A program rather than a criterion bench: it counts allocated bytes with a counting global
//! allocator.

use tollgate_model::engine::{ClientReport, Engine, EngineSettings, UpstreamGrant};
use tollgate_model::settings::{GroupName, GroupSettings};
use tollgate_model::time::Nanos;
use tollgate_proto::EXCHANGE_GROUPS_MAX;
use tollgate_testkit::alloc::{Counting, live_bytes};

#[global_allocator]
static GLOBAL: Counting = Counting;

const REGIONS: usize = 10;
const GROUPS: usize = 1_000_000;
const CLIENTS: usize = 100_000;
const PER_CLIENT: usize = 10;
/// Seconds measured, after one to warm up.
const SECONDS: u64 = 5;

fn engine(groups: usize, regional: bool) -> Engine {
    let settings =
        EngineSettings { max_tracked_groups: groups + 1, max_clients: CLIENTS + 1, ..Default::default() };
    let mut e = Engine::new(settings);
    let default = GroupSettings::builder().reserved(10.0).limit(1000.0).build().unwrap();
    e.set_group(GroupName::default_group(), default);
    e.set_upstream_mode(regional);
    e
}

/// Milliseconds since `start`.
#[allow(clippy::disallowed_methods)] // a benchmark measures wall time
fn ms_since(start: std::time::Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1e3
}

#[allow(clippy::disallowed_methods)] // a benchmark measures wall time
fn now() -> std::time::Instant {
    std::time::Instant::now()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The two tiers' engines, and the groups each region last reported.
struct Tiers {
    regions: Vec<Engine>,
    global: Engine,
    used: Vec<Vec<GroupName>>,
}

/// One second's timings: each region's tick and usage added up, the global tick, in ms.
#[derive(Default)]
struct Timings {
    region_ticks: Vec<f64>,
    usage: Vec<f64>,
    global_ticks: Vec<f64>,
    /// The regions' exchanges (pages) with the global tier in the last second.
    pages: usize,
}

impl Tiers {
    /// Second `second` (from 0) at `t`: the clients' exchanges, the regions' ticks and
    /// rounds, the global tick, the shares handed down.
    fn second(&mut self, t: Nanos, second: u64, names: &[GroupName], keys: &[String], out: &mut Timings) {
        let report = ClientReport { demand: 100.0, consumed: 50.0, requests: 5.0, ..Default::default() };
        for (c, key) in keys.iter().enumerate() {
            let region = &mut self.regions[c % REGIONS];
            let part: Vec<(GroupName, ClientReport)> = (0..PER_CLIENT)
                .map(|k| (names[(c * PER_CLIENT + k) % names.len()].clone(), report))
                .collect();
            let id = region.client(t, key, second + 1).expect("room for every client");
            region.report_all(t, id, &part, |_| {});
        }
        out.pages = 0;
        for (r, region) in self.regions.iter_mut().enumerate() {
            let start = now();
            region.tick(t);
            let ticked = ms_since(start);
            let start = now();
            let usage = region.upstream_usage(GROUPS);
            let summed = ms_since(start);
            self.used[r] = usage.iter().map(|u| u.group.clone()).collect();
            let id =
                self.global.client(t, &format!("region/r{r}"), second + 1).expect("room for every region");
            for page in usage.chunks(EXCHANGE_GROUPS_MAX) {
                let part: Vec<(GroupName, ClientReport)> = page
                    .iter()
                    .map(|u| (u.group.clone(), ClientReport { demand: u.demand, ..report }))
                    .collect();
                self.global.report_all(t, id, &part, |_| {});
                out.pages += 1;
            }
            if second > 0 {
                out.region_ticks.push(ticked);
                out.usage.push(summed);
            }
        }
        let start = now();
        self.global.tick(t);
        if second > 0 {
            out.global_ticks.push(ms_since(start));
        }
        // Each region takes the shares the global tier computed for it.
        for (region, used) in self.regions.iter_mut().zip(&self.used) {
            for name in used {
                let rate = self.global.outcome(name).and_then(|o| o.target()).unwrap_or(0.0);
                region.set_upstream(
                    name.clone(),
                    UpstreamGrant { rate, burst: rate, reserved: 1.0, quota: None },
                );
            }
        }
    }
}

fn main() {
    // Under `cargo test --all-targets` benches run once as tests: keep that quick.
    let quick = std::env::args().all(|a| a != "--bench");
    let (groups, clients) = if quick { (10_000, 1_000) } else { (GROUPS, CLIENTS) };
    let names: Vec<GroupName> =
        (0..groups).map(|i| GroupName::new(&format!("tenant-{i:07}")).unwrap()).collect();
    let keys: Vec<String> = (0..clients).map(|c| format!("client-{c:06}")).collect();
    let base = live_bytes();
    let mut tiers = Tiers {
        regions: (0..REGIONS).map(|_| engine(groups, true)).collect(),
        global: engine(groups, false),
        used: vec![Vec::new(); REGIONS],
    };
    let mut timings = Timings::default();
    for second in 0..=SECONDS {
        tiers.second(Nanos(1_000_000_000 * (second + 1)), second, &names, &keys, &mut timings);
    }
    let (regional_tracked, global_tracked) =
        (tiers.regions[0].tracked_groups(), tiers.global.tracked_groups());
    let all = live_bytes();
    drop(tiers.global);
    let global_bytes = all - live_bytes();
    let regional_bytes = (live_bytes() - base) / REGIONS as isize;
    println!("{groups} groups, {clients} clients serving {PER_CLIENT} each, {REGIONS} regions");
    println!(
        "regional tick (median) {:.1} ms over {regional_tracked} groups; its usage added up {:.1} ms",
        median(timings.region_ticks),
        median(timings.usage)
    );
    println!("global tick (median) {:.1} ms over {global_tracked} groups", median(timings.global_ticks));
    println!(
        "memory: a regional engine {:.1} MB, the global engine {:.1} MB (live, after the run)",
        regional_bytes as f64 / 1e6,
        global_bytes as f64 / 1e6
    );
    println!(
        "exchanges a second: {clients} from clients to regions, {} from regions to the global tier",
        timings.pages
    );
}

//! Scale: one engine tick with 100,000 groups and 10,000 clients, and the memory each
//! client-group pair costs; first with each client serving 10 groups (100,000 pairs: one
//! client a group, the most memory per pair), then 100 groups (1,000,000 pairs: ten clients a
//! group, the fleet of the controller's load figures). Ten saturated backends report every
//! group's load each second. Each run also walks ticks in slices as the controller does, and
//! prints the longest the engine was held at a time: what an exchange may wait for.
//!
//! `cargo bench -p tollgate-model --bench scale`
//!
//! A program rather than a criterion bench: it also counts allocated bytes, with a counting
//! global allocator, and prints the median of 11 ticks.

use tollgate_model::engine::{ClientReport, Engine, EngineSettings, Health, SliceSize};
use tollgate_model::settings::{GroupName, GroupSettings};
use tollgate_model::time::Nanos;
use tollgate_testkit::alloc::{Counting, live_bytes};

#[global_allocator]
static GLOBAL: Counting = Counting;

const GROUPS: usize = 100_000;
const CLIENTS: u64 = 10_000;

fn main() {
    // Under `cargo test --all-targets` benches run once as tests: keep that quick.
    let quick = std::env::args().all(|a| a != "--bench");
    let (groups, clients) = if quick { (1000, 100) } else { (GROUPS, CLIENTS) };
    // Each client serves 10 groups: every group has one client, the most state per pair.
    let (pairs_one, bytes_one) = scenario(groups, clients, 10);
    // The fleet of the controller's load figures: each client serves 100 groups, so every
    // group has ten clients (1,000,000 pairs).
    let (pairs_ten, bytes_ten) = scenario(groups, clients, 100);
    // The same groups and clients in both, ten times the pairs in the second: what a pair
    // adds is the difference over the pairs added, and the rest is the groups' own.
    let per_pair = (bytes_ten - bytes_one) as f64 / (pairs_ten - pairs_one) as f64;
    let per_group = (bytes_one as f64 - per_pair * pairs_one as f64) / groups as f64;
    println!(
        "memory, the two runs set side by side: each client-group pair adds {per_pair:.0} bytes (its client's entry, grant and place in the client's route); each group in use {per_group:.0} bytes of its own (its state and its row in the tick), whatever its clients"
    );
}

/// Ticks an engine tracking `groups` groups, `clients` clients each serving
/// `groups_per_client` of them; prints the median tick and the memory per pair, and returns
/// the pairs and the bytes they and their groups took.
fn scenario(groups: usize, clients: u64, groups_per_client: usize) -> (usize, isize) {
    let names: Vec<GroupName> =
        (0..groups).map(|i| GroupName::new(&format!("tenant-{i:06}")).unwrap()).collect();
    let mut p = Engine::new(EngineSettings {
        max_tracked_groups: groups + 1,
        capacity: Some(1e9),
        ..Default::default()
    });
    for (i, n) in names.iter().enumerate() {
        let s = GroupSettings::builder().reserved((i % 100) as f64).limit(1000.0 + i as f64).build().unwrap();
        p.set_group(n.clone(), s);
    }
    let now = Nanos(1_000_000_000);
    let report = ClientReport { demand: 100.0, consumed: 50.0, requests: 5.0, ..Default::default() };
    // Ten backends, each carrying a tenth of the groups, saturated, reporting every second.
    let loads: Vec<Vec<(GroupName, f64)>> =
        (0..10).map(|b| names.iter().skip(b).step_by(10).map(|n| (n.clone(), 500_000.0)).collect()).collect();
    let backends = |p: &mut Engine, at: Nanos| {
        for (b, loads) in loads.iter().enumerate() {
            p.backend_report(at, &format!("b{b}"), &format!("z{b}"), Health::Utilisation(1.1), loads)
                .unwrap();
        }
    };
    backends(&mut p, now);
    p.tick(now);
    // Client `c` serves the `groups_per_client` groups from `c * groups_per_client` on.
    let served = |c: u64| (0..groups_per_client).map(move |k| (c as usize * groups_per_client + k) % groups);
    // Each client exchanges as the controller takes an exchange: the client resolved by its
    // key, then all its groups' reports at once (which keeps its route for the next one).
    let keys: Vec<String> = (0..clients).map(|c| format!("client-{c:05}")).collect();
    let exchange = |p: &mut Engine, at: Nanos, sequence: u64, c: u64| {
        let id = p.client(at, &keys[c as usize], sequence).expect("room for every client");
        let reports: Vec<(GroupName, ClientReport)> = served(c).map(|g| (names[g].clone(), report)).collect();
        p.report_all(at, id, &reports, |_| {});
        reports.len()
    };
    let before = live_bytes();
    let mut pairs = 0usize;
    for c in 0..clients {
        pairs += exchange(&mut p, now, 1, c);
    }
    p.tick(now);
    let after = live_bytes();
    let per_pair = (after - before) as f64 / pairs as f64;

    // Second `i` from `now`: every client reports every group it serves, as it would every
    // second, and the backends report.
    let second = |p: &mut Engine, i: u64| {
        let t = Nanos(now.0 + i * 1_000_000_000);
        for c in 0..clients {
            exchange(p, t, i + 1, c);
        }
        backends(p, t);
        t
    };
    let mut ticks = Vec::new();
    for i in 1..=11u64 {
        let t = second(&mut p, i);
        #[allow(clippy::disallowed_methods)] // a benchmark measures wall time
        let start = std::time::Instant::now();
        p.tick(t);
        ticks.push(start.elapsed().as_secs_f64() * 1e3);
    }
    ticks.sort_by(f64::total_cmp);
    // Then ticks walked as the controller walks them, in slices sized by time
    // (`next_slice`), with the capacity shared apart: how long the engine is held at a time,
    // the longest step of each tick (the median of 11), and the slices' mean.
    let mut slices = (0usize, 0f64);
    let mut holds = Vec::new();
    for i in 12..=22u64 {
        let t = second(&mut p, i);
        let mut longest = 0f64;
        #[allow(clippy::disallowed_methods)] // a benchmark measures wall time
        let mut start = std::time::Instant::now();
        p.begin_tick(t);
        let mut size = SliceSize::start(&p);
        loop {
            longest = longest.max(start.elapsed().as_secs_f64() * 1e3);
            // Taking the sharing out and handing it back hold the engine; computing it does not.
            #[allow(clippy::disallowed_methods)]
            let take = std::time::Instant::now();
            if let Some(work) = p.shares_work() {
                longest = longest.max(take.elapsed().as_secs_f64() * 1e3);
                let shares = work.compute();
                #[allow(clippy::disallowed_methods)]
                let put = std::time::Instant::now();
                p.put_shares(shares);
                longest = longest.max(put.elapsed().as_secs_f64() * 1e3);
            }
            #[allow(clippy::disallowed_methods)]
            let next = std::time::Instant::now();
            start = next;
            let done = p.tick_slice(size.get());
            let took = start.elapsed();
            slices = (slices.0 + 1, slices.1 + took.as_secs_f64() * 1e3);
            if done {
                longest = longest.max(took.as_secs_f64() * 1e3);
                break;
            }
            size.after(&p, took);
        }
        holds.push(longest);
    }
    holds.sort_by(f64::total_cmp);
    println!(
        "groups {groups}, clients {clients} serving {groups_per_client} each, client-group pairs {pairs}"
    );
    println!("  tick: median {:.1} ms (min {:.1}, max {:.1}) over 11 ticks", ticks[5], ticks[0], ticks[10]);
    println!(
        "  walked in slices sized by time as the controller does: the engine held {:.2} ms at most at a time (median of 11 ticks; max {:.2}), {:.3} ms a slice on average",
        holds[5],
        holds[10],
        slices.1 / slices.0.max(1) as f64
    );
    println!(
        "  memory per client-group pair: {per_pair:.0} bytes (the groups' state, the clients' entries, grants and routes, all included)"
    );
    (pairs, after - before)
}

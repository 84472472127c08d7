//! Scale with groups sharded over controllers: 1,000,000 groups used by 100,000 clients (each
//! serving 10), sharded by the real shard map over 1, 2, 4 and 8 controllers; for each, every
//! controller's engine takes its part of each client's exchange every second and ticks.
//! Prints, per number of controllers, the groups the busiest controller computes, the median
//! tick of the slowest controller, and the most memory one controller's groups and clients
//! take. Every group falls to the `default` group's settings (a limit and a reservation), as
//! a million tenants would be configured, so the memory is what the engine tracks.
//!
//! `cargo bench -p tollgate-sim --bench shard_scale -- --bench`
//!
//! A program rather than a criterion bench: it counts allocated bytes with a counting global
//! allocator, and runs each controller in turn in one process.

use tollgate_model::engine::{ClientReport, Engine, EngineSettings};
use tollgate_model::settings::{GroupName, GroupSettings};
use tollgate_model::shard::{DEFAULT_SHARDS, Member, ShardMap, next_map, shard_of};
use tollgate_model::time::Nanos;
use tollgate_testkit::alloc::{Counting, live_bytes};

#[global_allocator]
static GLOBAL: Counting = Counting;

const GROUPS: usize = 1_000_000;
const CLIENTS: usize = 100_000;
const PER_CLIENT: usize = 10;
/// Seconds of exchanges and ticks measured, after one to warm up.
const SECONDS: u64 = 5;

/// The settled map of `members` controllers, each applying every map at once.
fn settled(members: &[String]) -> ShardMap {
    let mut map = ShardMap::unowned(DEFAULT_SHARDS);
    loop {
        let live: Vec<Member<'_>> =
            members.iter().map(|m| Member { name: m, applied: map.epoch() }).collect();
        match next_map(&map, &live) {
            Some(next) => map = next,
            None => return map,
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
    println!("{groups} groups, {clients} clients serving {PER_CLIENT} each, {DEFAULT_SHARDS} shards");
    println!(
        "controllers | groups on the busiest | tick, slowest controller (median of {SECONDS}) | memory, largest controller"
    );
    for n in [1usize, 2, 4, 8] {
        let members: Vec<String> = (0..n).map(|i| format!("http://controller-{i}:7460")).collect();
        let map = settled(&members);
        let (mut most_groups, mut slowest, mut largest) = (0usize, 0f64, 0isize);
        for m in &members {
            let mine: Vec<bool> =
                names.iter().map(|g| map.owns(m, shard_of(g.as_str(), map.shards()))).collect();
            let (owned, tick_ms, bytes) = controller(&names, &keys, &mine);
            most_groups = most_groups.max(owned);
            slowest = slowest.max(tick_ms);
            largest = largest.max(bytes);
        }
        println!("{n:>11} | {most_groups:>20} | {slowest:>10.1} ms | {:>8.1} MB", largest as f64 / 1e6);
    }
}

/// One controller owning the groups `mine` marks: every client's part for it each second, a
/// tick after; returns the groups it computed, its median tick in milliseconds and the bytes
/// its engine holds.
fn controller(names: &[GroupName], keys: &[String], mine: &[bool]) -> (usize, f64, isize) {
    let before = live_bytes();
    let mut e = Engine::new(EngineSettings { max_tracked_groups: names.len() + 1, ..Default::default() });
    let default = GroupSettings::builder().reserved(10.0).limit(1000.0).build().unwrap();
    e.set_group(GroupName::default_group(), default);
    let report = ClientReport { demand: 100.0, consumed: 50.0, requests: 5.0, ..Default::default() };
    let groups = names.len();
    let mut ticks = Vec::new();
    for second in 0..=SECONDS {
        let t = Nanos(1_000_000_000 * (second + 1));
        for (c, key) in keys.iter().enumerate() {
            let part: Vec<(GroupName, ClientReport)> = (0..PER_CLIENT)
                .map(|k| (c * PER_CLIENT + k) % groups)
                .filter(|&g| mine[g])
                .map(|g| (names[g].clone(), report))
                .collect();
            if part.is_empty() {
                continue;
            }
            let id = e.client(t, key, second + 1).expect("room for every client");
            e.report_all(t, id, &part, |_| {});
        }
        #[allow(clippy::disallowed_methods)] // a benchmark measures wall time
        let start = std::time::Instant::now();
        e.tick(t);
        if second > 0 {
            ticks.push(start.elapsed().as_secs_f64() * 1e3);
        }
    }
    ticks.sort_by(f64::total_cmp);
    let bytes = live_bytes() - before;
    let owned = e.tracked_groups();
    drop(e);
    (owned, ticks[ticks.len() / 2], bytes)
}

//! One behavioural suite, run against every mode: every setting does the same thing whether
//! the engine runs in process (embedded), in a real controller reached over a simulated
//! network in simulated time (remote), or whether processes share pools through a real
//! `redis-server` (store). A setting a mode cannot honour is refused when the handle is built,
//! with the field and the reason.
//!
//! Each behaviour is written once, as an `async fn` over an [`Env`]; the `suite!` macro runs it
//! in each mode it applies to.

use std::future::Future;
use std::io::Write as _;
use std::time::Duration;

use tollgate_controller::Controller;
use tollgate_controller::store::MemoryStore;
use tollgate_limiter::clock::TokioClock;
use tollgate_limiter::{AcquireError, BuildError, GroupHandle, RemoteOptions, StoreOptions, Tollgate};
use tollgate_model::config::Config;
use tollgate_model::cost::{Consumption, Usage};
use tollgate_model::engine::EngineSettings;
use tollgate_model::time::ManualClock;
use tollgate_testkit::net::{self, Net};
use tollgate_testkit::redis::Redis;

/// Where a behaviour runs.
enum Env {
    Embedded {
        clock: ManualClock,
    },
    Remote {
        net: Net,
    },
    Store {
        redis: Redis,
        clock: ManualClock,
        namespace: String,
    },
    /// No store: each pool divided by a replica count (one process here, counted as one).
    Replicas {
        clock: ManualClock,
    },
}

const STEP: Duration = Duration::from_millis(10);

impl Env {
    fn mode(&self) -> &'static str {
        match self {
            Env::Embedded { .. } => "embedded",
            Env::Remote { .. } => "remote",
            Env::Store { .. } => "store",
            Env::Replicas { .. } => "replicas",
        }
    }

    /// Whether processes share pools by epochs (store and replicas modes) rather than run an
    /// engine.
    fn pools(&self) -> bool {
        matches!(self, Env::Store { .. } | Env::Replicas { .. })
    }

    /// A handle (one client process) with these settings. In remote mode the settings go to
    /// the controller, as an operator would set them.
    async fn try_gate(&self, toml: &str) -> Result<Tollgate, BuildError> {
        let config = Config::parse(toml).expect("valid test settings");
        match self {
            Env::Embedded { clock } => Tollgate::builder().config(config).clock(clock.clone()).build(),
            Env::Remote { net } => {
                apply(&net.controller(), &config);
                let opts = RemoteOptions {
                    cost_model: config.cost_model,
                    max_wait: config.node.max_wait,
                    ..RemoteOptions::default()
                };
                Tollgate::remote_channel(net.channel(), opts.with_clock(TokioClock::new()))
            }
            Env::Store { redis, clock, namespace } => {
                let opts = StoreOptions {
                    namespace: namespace.clone(),
                    ttl: Duration::from_secs(1),
                    sync_interval: Duration::from_millis(50),
                    ..StoreOptions::default()
                };
                Tollgate::store_with_clock(&redis.url(), config, opts, clock.clone()).await
            }
            Env::Replicas { clock } => Tollgate::replicas_with_clock(config, Some(1), clock.clone()),
        }
    }

    async fn gate(&self, toml: &str) -> Tollgate {
        self.try_gate(toml).await.unwrap_or_else(|e| panic!("{}: {e}", self.mode()))
    }

    /// Lets `d` pass for every handle.
    async fn sleep(&self, d: Duration) {
        match self {
            Env::Embedded { clock } | Env::Store { clock, .. } | Env::Replicas { clock } => clock.advance(d),
            Env::Remote { .. } => tokio::time::sleep(d).await,
        }
    }

    /// Runs for `secs`: every 10 ms each of `load`'s handles offers `per_s / 100` requests of
    /// cost 1 (fractions carried over). Returns each handle's admitted units/s over the last
    /// `measured` seconds.
    async fn offer(&self, load: &[(&GroupHandle, f64)], secs: u64, measured: u64) -> Vec<f64> {
        let steps = secs * 100;
        let from = steps - measured * 100;
        let mut carried = vec![0.0; load.len()];
        let mut admitted = vec![0.0; load.len()];
        for step in 0..steps {
            for (i, (handle, per_s)) in load.iter().enumerate() {
                carried[i] += per_s / 100.0;
                while carried[i] >= 1.0 {
                    carried[i] -= 1.0;
                    if handle.try_acquire(1.0).is_ok() && step >= from {
                        admitted[i] += 1.0;
                    }
                }
            }
            self.sleep(STEP).await;
            self.settle_quotas(load).await;
        }
        admitted.iter().map(|a| a / measured as f64).collect()
    }
}

impl Env {
    /// Store mode: lets each handle whose quota's allotment ran out, while Redis has more,
    /// take more before the next step (a real round trip, while the clock stands still).
    async fn settle_quotas(&self, load: &[(&GroupHandle, f64)]) {
        if !matches!(self, Env::Store { .. }) {
            return;
        }
        for (handle, _) in load {
            if handle.quota().is_some_and(|q| q.asks_more(1.0)) {
                tokio::time::timeout(Duration::from_secs(10), handle.wait_for_answer())
                    .await
                    .expect("Redis answers within 10 s");
            }
        }
    }
}

/// Puts a settings file's node settings and groups on the controller.
fn apply(controller: &Controller, config: &Config) {
    controller.admin().set_capacity(config.node.capacity, "test").unwrap();
    controller.admin().set_mode(config.node.mode, "test").unwrap();
    controller.admin().set_slow_start(config.node.slow_start, "test").unwrap();
    controller.admin().set_shadow(config.node.shadow, "test").unwrap();
    controller.admin().set_throttling(config.node.throttling, "test").unwrap();
    for (name, settings) in &config.groups {
        controller
            .admin()
            .set_group(name.clone(), settings.clone(), "test", tollgate_controller::wall_ms())
            .unwrap();
    }
}

fn within(actual: f64, expected: f64, pct: f64) -> bool {
    (actual - expected).abs() <= expected * pct / 100.0
}

fn assert_near(env: &Env, what: &str, actual: &[f64], expected: &[f64], pct: f64) {
    let ok = actual.iter().zip(expected).all(|(a, e)| within(*a, *e, pct));
    assert!(ok, "{}: {what}: got {actual:?}, expected {expected:?} within {pct} %", env.mode());
}

/// A build the mode must refuse, naming the field.
async fn refused(env: &Env, toml: &str, field: &str) {
    match env.try_gate(toml).await {
        Err(BuildError::Unsupported { field: f, .. }) => assert_eq!(f, field, "{}", env.mode()),
        other => panic!("{}: expected {field} refused, got {other:?}", env.mode()),
    }
}

// ---- The runners ----

fn embedded<F, Fut>(body: F)
where
    F: FnOnce(Env) -> Fut,
    Fut: Future<Output = ()>,
{
    let env = Env::Embedded { clock: ManualClock::new() };
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(body(env));
}

fn remote_with<F, Fut>(settings: EngineSettings, body: F)
where
    F: FnOnce(Env) -> Fut,
    Fut: Future<Output = ()> + 'static,
{
    net::run(settings, MemoryStore::default(), |net| body(Env::Remote { net }));
}

fn remote<F, Fut>(body: F)
where
    F: FnOnce(Env) -> Fut,
    Fut: Future<Output = ()> + 'static,
{
    remote_with(EngineSettings::default(), body);
}

fn store<F, Fut>(name: &str, body: F)
where
    F: FnOnce(Env) -> Fut,
    Fut: Future<Output = ()>,
{
    let env =
        Env::Store { redis: Redis::start(name), clock: ManualClock::new(), namespace: name.to_string() };
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(body(env));
}

fn replicas<F, Fut>(body: F)
where
    F: FnOnce(Env) -> Fut,
    Fut: Future<Output = ()>,
{
    let env = Env::Replicas { clock: ManualClock::new() };
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(body(env));
}

/// `suite! { behaviour: [modes] }` makes one test per behaviour and mode.
macro_rules! suite {
    ($($behaviour:ident: [$($mode:ident),+];)+) => {
        $(
            mod $behaviour {
                $(
                    #[test]
                    fn $mode() {
                        suite!(@run $mode, $behaviour);
                    }
                )+
            }
        )+
    };
    (@run embedded, $b:ident) => { super::embedded(super::$b) };
    (@run remote, $b:ident) => { super::remote(super::$b) };
    (@run store, $b:ident) => { super::store(stringify!($b), super::$b) };
    (@run replicas, $b:ident) => { super::replicas(super::$b) };
}

suite! {
    limit: [embedded, remote, store, replicas];
    burst: [embedded, remote, store, replicas];
    reserved_then_free_pool: [embedded, remote, store, replicas];
    priority: [embedded, remote, store, replicas];
    weight: [embedded, remote, store, replicas];
    fcfs_first_come: [embedded, remote, store, replicas];
    unthrottled_counts: [embedded, remote, store, replicas];
    budget: [embedded, remote, store, replicas];
    budget_per_period: [embedded, remote, store, replicas];
    quota_is_a_count: [embedded, remote, store, replicas];
    ramp: [embedded, remote, store, replicas];
    resumed_ramp: [embedded, remote, store];
    cost_models: [embedded, remote, store, replicas];
    default_group: [embedded, remote, store, replicas];
    dropped_work: [embedded, remote, store, replicas];
    slow_start: [embedded, remote, store, replicas];
    detailed_consumption: [embedded, remote, store, replicas];
    reads_writes_apart: [embedded, remote, store, replicas];
    debt_paid_over_time: [embedded, remote, store, replicas];
    shadow_mode: [embedded, remote, store, replicas];
    node_wide_shadow_mode: [embedded, remote, store, replicas];
    throttling_off: [embedded, remote, store, replicas];
    request_classes: [embedded, remote, store, replicas];
    in_flight: [embedded, remote, store, replicas];
    nested_groups: [embedded, remote, store, replicas];
}

// ---- The behaviours ----

async fn limit(env: Env) {
    let gate = env.gate("[groups.g]\nlimit = 200\n").await;
    let g = gate.group("g").unwrap();
    let rates = env.offer(&[(&g, 400.0)], 6, 4).await;
    assert_near(&env, "a group offered twice its limit", &rates, &[200.0], 5.0);
}

async fn burst(env: Env) {
    let toml = "[groups.g]\nlimit = 100\nburst = 300\n";
    if env.pools() {
        return refused(&env, toml, "groups.g.burst").await;
    }
    let gate = env.gate(toml).await;
    let g = gate.group("g").unwrap();
    // Idle for 5 s: the bucket fills to its burst, then a tight burst of requests finds it.
    env.sleep(Duration::from_secs(5)).await;
    let at_once = (0..1000).filter(|_| g.try_acquire(1.0).is_ok()).count();
    assert!((299..=301).contains(&at_once), "{}: admitted {at_once} at once, burst 300", env.mode());
}

async fn reserved_then_free_pool(env: Env) {
    let toml = "[node]\ncapacity = 1000\n[groups.a]\nreserved = 600\n[groups.b]\nreserved = 200\n";
    if env.pools() {
        return refused(&env, toml, "node.capacity").await;
    }
    let gate = env.gate(toml).await;
    let (a, b) = (gate.group("a").unwrap(), gate.group("b").unwrap());
    let rates = env.offer(&[(&a, 3000.0), (&b, 3000.0)], 8, 4).await;
    assert_near(&env, "reserved first, the free 200 split evenly", &rates, &[700.0, 300.0], 5.0);
}

async fn priority(env: Env) {
    if env.pools() {
        // Nothing shares a capacity there: refused, not accepted and ignored.
        return refused(&env, "[groups.hi]\npriority = \"high\"\n", "groups.hi.priority").await;
    }
    let gate = env
        .gate("[node]\ncapacity = 1000\n[groups.hi]\npriority = \"high\"\n[groups.lo]\npriority = \"low\"\n")
        .await;
    let (hi, lo) = (gate.group("hi").unwrap(), gate.group("lo").unwrap());
    let rates = env.offer(&[(&hi, 800.0), (&lo, 800.0)], 8, 4).await;
    assert_near(&env, "high priority served first", &rates, &[800.0, 200.0], 5.0);
}

async fn weight(env: Env) {
    if env.pools() {
        return refused(&env, "[groups.two]\nweight = 2\n", "groups.two.weight").await;
    }
    let gate = env.gate("[node]\ncapacity = 900\n[groups.one]\nweight = 1\n[groups.two]\nweight = 2\n").await;
    let (one, two) = (gate.group("one").unwrap(), gate.group("two").unwrap());
    let rates = env.offer(&[(&one, 2000.0), (&two, 2000.0)], 8, 4).await;
    assert_near(&env, "the free pool split by weight", &rates, &[300.0, 600.0], 5.0);
}

async fn fcfs_first_come(env: Env) {
    let toml =
        "[node]\nmode = \"fcfs\"\ncapacity = 100\n[groups.a]\nreserved = 10\n[groups.b]\nreserved = 10\n";
    if env.pools() {
        return refused(&env, toml, "node.capacity").await;
    }
    let gate = env.gate(toml).await;
    // b asks first, alone; then a asks as hard: b keeps the free pool, a has its reservation.
    let b = gate.group("b").unwrap();
    env.offer(&[(&b, 500.0)], 3, 1).await;
    let a = gate.group("a").unwrap();
    let rates = env.offer(&[(&b, 500.0), (&a, 500.0)], 8, 4).await;
    assert_near(&env, "first come, first served", &rates, &[90.0, 10.0], 5.0);
}

async fn unthrottled_counts(env: Env) {
    if env.pools() {
        // No capacity without a controller: unthrottled work counts against its group's pool.
        let gate = env.gate("[groups.g]\nlimit = 100\n").await;
        let (ops, g) = (gate.unthrottled().group("g").unwrap(), gate.group("g").unwrap());
        let rates = env.offer(&[(&ops, 70.0), (&g, 100.0)], 10, 4).await;
        return assert_near(&env, "unthrottled 70 of a pool of 100", &rates, &[70.0, 30.0], 5.0);
    }
    // Couchbase's rule: unthrottled use still counts against the node's capacity.
    let gate = env.gate("[node]\ncapacity = 1000\n").await;
    let (ops, tenant) = (gate.unthrottled().group("ops").unwrap(), gate.group("tenant").unwrap());
    let rates = env.offer(&[(&ops, 700.0), (&tenant, 1000.0)], 8, 4).await;
    assert_near(&env, "unthrottled 700 of a capacity of 1000", &rates, &[700.0, 300.0], 5.0);
}

/// A budget per period (a quota per window) is counted against a controller's metering, in
/// memory by the embedded limiter, in Redis in store mode and in this process's share in
/// replicas mode. Within its period it is a budget like any other (nothing was consumed
/// before today here, so the whole budget is today's).
async fn budget_per_period(env: Env) {
    let toml = "[groups.trial]\nreserved = 10\nlimit = 100\nbudget = 500\nbudget_period = \"day\"\n";
    let gate = env.gate(toml).await;
    let g = gate.group("trial").unwrap();
    let rates = env.offer(&[(&g, 200.0)], 12, 4).await;
    // A quota is a count: spent, it admits nothing, its reservation included.
    assert_near(&env, "a day's spent budget admits nothing", &rates, &[0.0], 0.0);
    let consumed = g.stats().consumed_units;
    assert!(consumed <= 500.0 + 1e-6, "{}: consumed {consumed} of a budget of 500", env.mode());
}

async fn budget(env: Env) {
    let toml = "[groups.trial]\nreserved = 10\nlimit = 100\nbudget = 500\n";
    let gate = env.gate(toml).await;
    let g = gate.group("trial").unwrap();
    // 500 units at 100/s, then nothing: the reservation is a floor within the quotas, not a
    // way past them.
    let rates = env.offer(&[(&g, 200.0)], 12, 4).await;
    assert_near(&env, "a spent budget admits nothing", &rates, &[0.0], 0.0);
    let consumed = g.stats().consumed_units;
    assert!(consumed <= 500.0 + 1e-6, "{}: consumed {consumed} of a budget of 500", env.mode());
}

/// A quota is a count, not a rate: asked at many times its pace by three processes at once
/// (one in embedded and replicas modes, whose counts are their own), exactly the quota is
/// admitted, however the asks, the exchanges and the takes from Redis fall, and not one unit
/// more.
async fn quota_is_a_count(env: Env) {
    let toml = "[groups.api]\nlimit = 1000\nbudget = 300\n";
    let processes = if matches!(env, Env::Remote { .. } | Env::Store { .. }) { 3 } else { 1 };
    let mut gates = Vec::new();
    for _ in 0..processes {
        gates.push(env.gate(toml).await);
    }
    let handles: Vec<GroupHandle> = gates.iter().map(|g| g.group("api").unwrap()).collect();
    let load: Vec<(&GroupHandle, f64)> = handles.iter().map(|h| (h, 200.0)).collect();
    env.offer(&load, 6, 6).await;
    let admitted: f64 = handles.iter().map(|h| h.stats().consumed_units).sum();
    assert_eq!(admitted, 300.0, "{}: admitted of a budget of 300", env.mode());
    // Spent: each process says so, and when to look again.
    for h in &handles {
        let q = h.quota().expect("an allotment");
        assert_eq!(q.held, 0.0, "{}: {q:?}", env.mode());
        assert!(h.try_acquire(1.0).is_err());
    }
}

async fn ramp(env: Env) {
    let gate = env
        .gate(
            "[groups.r]\nlimit = 1000\n[groups.r.ramp]\nmin = 10\nmax = 110\nduration_s = 10\nmode = \"scheduled\"\n",
        )
        .await;
    let r = gate.group("r").unwrap();
    let early = env.offer(&[(&r, 200.0)], 4, 3).await;
    assert!(early[0] < 60.0, "{}: the ramp starts low, got {early:?}", env.mode());
    let late = env.offer(&[(&r, 200.0)], 14, 3).await;
    assert_near(&env, "the ramp reaches its max", &late, &[110.0], 7.0);
}

/// A ramp with `resume_ttl_s` continues where it was when its group comes back within the
/// TTL (after going idle, or after a restart); without it, it starts again at `min`.
async fn resumed_ramp(env: Env) {
    let ramp = "[groups.r]\nlimit = 1000\n[groups.r.ramp]\nmin = 10\nmax = 110\nduration_s = 10\nmode = \"scheduled\"\n";
    for (resume, expected) in [(true, 60.0), (false, 10.0)] {
        let toml = if resume { format!("{ramp}resume_ttl_s = 600\n") } else { ramp.to_string() };
        let gate = env.gate(&toml).await;
        let r = gate.group("r").unwrap();
        env.offer(&[(&r, 200.0)], 6, 1).await;
        // The way back: an idle spell past the engine's expiry (embedded), a controller killed
        // and started again (remote), a client that leaves and another that registers (store).
        let (gate, r) = match &env {
            Env::Embedded { .. } => {
                env.sleep(Duration::from_secs(250)).await;
                (gate.clone(), r)
            }
            Env::Remote { net } => {
                env.sleep(Duration::from_millis(1500)).await; // a flush
                net.restart().await;
                (gate.clone(), r)
            }
            Env::Store { .. } | Env::Replicas { .. } => {
                gate.shutdown().await;
                let again = env.gate(&toml).await;
                let r = again.group("r").unwrap();
                (again, r)
            }
        };
        let first = env.offer(&[(&r, 300.0)], 2, 1).await;
        let tolerance = if resume { 0.3 } else { 1.0 };
        assert!(
            first[0] >= expected * (1.0 - tolerance) && first[0] <= expected * 1.5 + 20.0,
            "{}: resume {resume}: the first second back admitted {first:?}, expected about {expected}",
            env.mode()
        );
        drop(gate);
        if let Env::Remote { net } = &env {
            net.controller()
                .admin()
                .drop_group(&tollgate_model::settings::GroupName::new("r").unwrap(), "test")
                .unwrap();
        }
    }
}

async fn cost_models(env: Env) {
    for model in [
        "model = \"count\"",
        "model = \"fdb\"",
        "model = \"ru\"",
        "model = \"couchbase\"",
        "model = \"linear\"\nwrite_base = 2\nwrite_per_byte = 0.001",
    ] {
        let gate = env.gate(&format!("[cost]\n{model}\n[groups.g]\nlimit = 1000000\n")).await;
        let usage = Usage::write(8192);
        let expected = gate.cost_model().upfront(&usage).unwrap();
        assert!(expected > 0.0);
        let mut admitted = None;
        for _ in 0..200 {
            match gate.try_acquire_usage("g", &usage) {
                Ok(p) => {
                    admitted = Some(p.cost());
                    break;
                }
                Err(AcquireError::Throttled { .. }) => env.sleep(STEP).await,
                Err(e) => panic!("{}: {e}", env.mode()),
            }
        }
        assert_eq!(admitted, Some(expected), "{}: model {model}", env.mode());
        assert_eq!(gate.stats("g").unwrap().admitted_units, expected, "{}", env.mode());
    }
}

async fn default_group(env: Env) {
    let gate = env.gate("[groups.default]\nlimit = 50\n").await;
    let stranger = gate.group("stranger").unwrap();
    let rates = env.offer(&[(&stranger, 100.0)], 5, 3).await;
    assert_near(&env, "an unknown name gets the default group's settings", &rates, &[50.0], 5.0);
}

async fn slow_start(env: Env) {
    let groups = "[groups.quiet]\nreserved = 50\n[groups.busy]\nreserved = 10\n";
    if env.pools() {
        return refused(&env, &format!("[node]\nslow_start = true\n{groups}"), "node.slow_start").await;
    }
    // Couchbase's free pool counts every reservation, a quiet group's too; slow start only a
    // tenth of it while the group has no client.
    for (slow_start, expected) in [(false, 50.0), (true, 95.0)] {
        let node = format!("[node]\ncapacity = 100\nmode = \"fcfs\"\nslow_start = {slow_start}\n");
        let gate = env.gate(&format!("{node}{groups}")).await;
        let busy = gate.group("busy").unwrap();
        let rates = env.offer(&[(&busy, 200.0)], 6, 3).await;
        assert_near(&env, &format!("slow start {slow_start}"), &rates, &[expected], 5.0);
        drop(gate);
        env.sleep(Duration::from_secs(20)).await;
    }
}

async fn detailed_consumption(env: Env) {
    let gate = env.gate("[cost]\nmodel = \"ru\"\n[groups.g]\nlimit = 100000\n").await;
    let reads = Usage::read(65_536).with_cpu_ms(3.0);
    let writes = Usage::write(2048);
    for usage in [reads, reads, writes] {
        let permit = loop {
            match gate.try_acquire_usage("g", &usage) {
                Ok(p) => break p,
                Err(_) => env.sleep(STEP).await,
            }
        };
        permit.settle_usage(gate.cost_model(), &usage).unwrap();
    }
    let model = gate.cost_model();
    let (rru, wru) = (model.cost(&reads).unwrap() * 2.0, model.cost(&writes).unwrap());
    let want = Consumption {
        rru,
        wru,
        read_bytes: 131_072.0,
        write_bytes: 2048.0,
        cpu_ms: 6.0,
        read_rpcs: 2.0,
        write_rpcs: 1.0,
    };
    assert_eq!(gate.stats("g").unwrap().detail, want, "{}", env.mode());
    if let Env::Remote { net } = &env {
        // The controller sums what its clients report, at their next exchange.
        let g = tollgate_model::settings::GroupName::new("g").unwrap();
        let mut summed = None;
        for _ in 0..300 {
            summed = net.controller().readings().view().iter().find(|v| v.name == g).and_then(|v| v.detail);
            if summed == Some(want) {
                break;
            }
            env.sleep(STEP).await;
        }
        assert_eq!(summed, Some(want));
    }
}

async fn reads_writes_apart(env: Env) {
    let cost = "[cost]\nmodel = \"linear\"\nread_base = 1\nwrite_base = 4\n";
    if env.pools() {
        let toml = format!("{cost}[groups.g]\nlimit = 100\nreads_writes_apart = true\n");
        return refused(&env, &toml, "groups.g.reads_writes_apart").await;
    }
    // Reads (1 unit) and writes (4 units) asked for at 100 units/s each, every 40 ms, the two
    // kinds first in turn (a bucket kept drained by the one first would leave the other none:
    // the mix is learnt from what is admitted). Together, reads and writes share the limit of
    // 100 units/s. Apart (FoundationDB), the limit holds for each kind by its own cost: up to
    // 100 units/s of reads and 100 of writes.
    for apart in [false, true] {
        let gate = env.gate(&format!("{cost}[groups.g]\nlimit = 100\nreads_writes_apart = {apart}\n")).await;
        let mut admitted = [0.0, 0.0];
        for step in 0..1600 {
            if step % 4 == 0 {
                let mut asks = [(0, Usage::read(0), 4), (1, Usage::write(0), 1)];
                if step % 8 == 0 {
                    asks.reverse();
                }
                for (kind, usage, n) in asks {
                    for _ in 0..n {
                        if let Ok(p) = gate.try_acquire_usage("g", &usage) {
                            admitted[kind] += if step >= 1200 { p.cost() / 4.0 } else { 0.0 };
                            p.settle_usage(gate.cost_model(), &usage).unwrap();
                        }
                    }
                }
            }
            env.sleep(STEP).await;
        }
        let [reads, writes] = admitted;
        if apart {
            // Neither kind above the limit, and both together well above it; the share moves
            // toward 100 and 100 as the average costs follow the admitted mix (faster in
            // process than through a controller's grants).
            assert!(
                reads <= 105.0 && writes <= 105.0 && reads + writes >= 150.0,
                "{}: {admitted:?}",
                env.mode()
            );
        } else {
            assert_near(&env, "reads and writes together", &[reads + writes], &[100.0], 5.0);
        }
        drop(gate);
        env.sleep(Duration::from_secs(20)).await;
    }
}

async fn dropped_work(env: Env) {
    let gate =
        env.gate("[groups.back]\nlimit = 100\n[groups.kept]\nlimit = 100\ndropped = \"count\"\n").await;
    let (back, kept) = (gate.group("back").unwrap(), gate.group("kept").unwrap());
    // Every 10 ms, three requests of each group are admitted if they can be, then dropped
    // before reaching the resource: 300/s offered to a limit of 100.
    let mut admitted = [0u32; 2];
    for step in 0..600 {
        for (i, g) in [&back, &kept].into_iter().enumerate() {
            for _ in 0..3 {
                if let Ok(p) = g.try_acquire(1.0) {
                    p.dropped();
                    admitted[i] += u32::from(step >= 300);
                }
            }
        }
        env.sleep(STEP).await;
    }
    let rates = [f64::from(admitted[0]) / 3.0, f64::from(admitted[1]) / 3.0];
    // Returned work costs nothing, so every request goes through; counted work holds the limit.
    assert_near(&env, "dropped work returned, then counted", &rates, &[300.0, 100.0], 5.0);
    let (b, k) = (back.stats(), kept.stats());
    assert_eq!(b.consumed_units, 0.0, "{}", env.mode());
    assert!(b.dropped > 1700 && b.dropped_units == b.dropped as f64, "{}: {b:?}", env.mode());
    assert!(k.consumed_units == k.dropped_units && k.dropped > 500, "{}: {k:?}", env.mode());
}

async fn debt_paid_over_time(env: Env) {
    let toml =
        "[groups.blocking]\nlimit = 100\ndebt_repay_s = 0\n[groups.paying]\nlimit = 100\ndebt_repay_s = 10\n";
    if env.pools() {
        return refused(&env, toml, "groups.blocking.debt_repay_s").await;
    }
    let gate = env.gate(toml).await;
    let (blocking, paying) = (gate.group("blocking").unwrap(), gate.group("paying").unwrap());
    let load = [(&blocking, 200.0), (&paying, 200.0)];
    env.offer(&load, 4, 1).await;
    // One request of each turns out 400 units dearer than admitted.
    for g in [&blocking, &paying] {
        let permit = loop {
            match g.try_acquire(1.0) {
                Ok(p) => break p,
                Err(_) => env.sleep(STEP).await,
            }
        };
        permit.settle(401.0).unwrap();
    }
    assert!(paying.stats().debt_units > 390.0, "{}: {:?}", env.mode(), paying.stats());
    // Blocking: nothing until the 400 units are refilled, 4 s at 100/s. Paid over 10 s: 40/s
    // of the refill goes to the debt, and admissions go on at 60/s.
    let rates = env.offer(&load, 4, 4).await;
    assert!(rates[0] < 5.0, "{}: blocked group admitted {rates:?}", env.mode());
    assert_near(&env, "a debt paid over 10 s", &rates[1..], &[60.0], 10.0);
    // Once paid, the group is back at its limit.
    let rates = env.offer(&load, 10, 3).await;
    assert_near(&env, "debts paid", &rates, &[100.0, 100.0], 5.0);
    assert_eq!(paying.stats().debt_units, 0.0, "{}", env.mode());
}

/// Offers 300 requests/s to each of `names` for 2 s, then for 4 s measured: each group's
/// admitted requests/s and would-be refusals/s over the 4 s, and its refusals in all.
async fn shadow_rates(env: &Env, gate: &Tollgate, names: &[&str]) -> Vec<(f64, f64, u64)> {
    let handles: Vec<GroupHandle> = names.iter().map(|n| gate.group(n).unwrap()).collect();
    let load: Vec<(&GroupHandle, f64)> = handles.iter().map(|h| (h, 300.0)).collect();
    env.offer(&load, 2, 1).await;
    let before: Vec<u64> = handles.iter().map(|h| h.stats().would_refuse).collect();
    let admitted = env.offer(&load, 4, 4).await;
    handles
        .iter()
        .zip(before)
        .zip(admitted)
        .map(|((h, b), a)| {
            let s = h.stats();
            (a, (s.would_refuse - b) as f64 / 4.0, s.throttled)
        })
        .collect()
}

async fn shadow_mode(env: Env) {
    let gate = env
        .gate(
            "[groups.dark]
limit = 100
shadow = true
[groups.live]
limit = 100
",
        )
        .await;
    let got = shadow_rates(&env, &gate, &["dark", "live"]).await;
    let (dark, live) = (got[0], got[1]);
    // In shadow mode everything goes through, and what the limit would refuse is counted;
    // the group beside it is held to its limit as usual.
    assert_near(&env, "a group in shadow mode", &[dark.0, dark.1], &[300.0, 200.0], 5.0);
    assert_near(&env, "the group beside it", &[live.0], &[100.0], 5.0);
    assert!(live.1 == 0.0 && live.2 > 0, "{}: {live:?}", env.mode());
    // A remote client learns of shadow mode with the group's first grant: before it arrives
    // the group waits like any new one, so a few early requests may be refused.
    assert!(dark.2 <= 10, "{}: the group in shadow mode refused {} requests", env.mode(), dark.2);
}

async fn node_wide_shadow_mode(env: Env) {
    let gate = env
        .gate(
            "[node]
shadow = true
[groups.a]
limit = 100
[groups.b]
limit = 200
",
        )
        .await;
    let got = shadow_rates(&env, &gate, &["a", "b"]).await;
    let flat: Vec<f64> = got.iter().flat_map(|g| [g.0, g.1]).collect();
    assert_near(&env, "every group in shadow mode", &flat, &[300.0, 200.0, 300.0, 100.0], 5.0);
}

async fn throttling_off(env: Env) {
    let toml = |on: bool| {
        format!(
            "[node]
throttling = {on}
[groups.g]
limit = 100
"
        )
    };
    let gate = env.gate(&toml(false)).await;
    let got = shadow_rates(&env, &gate, &["g"]).await;
    // Off: everything goes through and nothing counts as a would-be refusal.
    assert_near(&env, "throttling off", &[got[0].0], &[300.0], 5.0);
    assert_eq!(got[0].1, 0.0, "{}", env.mode());
    // A process leaving the store deregisters; a remote client's lease lapses.
    gate.shutdown().await;
    drop(gate);
    env.sleep(Duration::from_secs(20)).await;
    // Back on, with the settings kept: the limit holds again.
    let gate = env.gate(&toml(true)).await;
    let got = shadow_rates(&env, &gate, &["g"]).await;
    assert_near(&env, "throttling back on", &[got[0].0], &[100.0], 5.0);
}

async fn request_classes(env: Env) {
    use tollgate_limiter::RequestClass::{Critical, Normal, Sheddable};
    let gate = env.gate("[groups.g]\nlimit = 100\ncritical_reserve = 0.2\n").await;
    let g = gate.group("g").unwrap();
    // 280 requests a second offered to a limit of 100: 30 critical, 150 normal, 100
    // sheddable, every 10 ms; admissions counted over the last 4 of 6 seconds.
    let load = [(Critical, 30.0), (Normal, 150.0), (Sheddable, 100.0)];
    let mut carried = [0.0f64; 3];
    let mut admitted = [0.0f64; 3];
    for step in 0..600 {
        for (i, (class, per_s)) in load.iter().enumerate() {
            carried[i] += per_s / 100.0;
            while carried[i] >= 1.0 {
                carried[i] -= 1.0;
                if g.try_acquire_class(1.0, *class).is_ok() && step >= 200 {
                    admitted[i] += 1.0;
                }
            }
        }
        env.sleep(STEP).await;
    }
    let rates = admitted.map(|a| a / 4.0);
    let _ = writeln!(std::io::stderr(), "{}: admitted by class {rates:?}", env.mode());
    // Critical work is all served and the limit holds. A bucket sheds sheddable work
    // entirely while normal work asks for more than is left; a store's one-second share
    // lets every class take from its top at each second's start, so sheddable work gets a
    // little there.
    assert_near(&env, "critical work", &rates[..1], &[30.0], 5.0);
    assert!(rates.iter().sum::<f64>() <= 105.0, "{}: {rates:?}", env.mode());
    let shed = if env.pools() { 20.0 } else { 2.0 };
    assert!(rates[2] <= shed && rates[1] >= 50.0, "{}: {rates:?}", env.mode());
    // The counts by class add up to the group's.
    let s = g.stats();
    let classes = s.by_class;
    assert_eq!(classes.iter().map(|c| c.admitted).sum::<u64>(), s.admitted, "{}", env.mode());
    assert!(classes[2].throttled > classes[0].throttled, "{}: {classes:?}", env.mode());
    if let Env::Remote { net } = &env {
        // The controller counts each class as the client reports it.
        env.sleep(Duration::from_millis(1500)).await;
        let name = tollgate_model::settings::GroupName::new("g").unwrap();
        let view = net.controller().readings().view();
        let seen = view.iter().find(|v| v.name == name).and_then(|v| v.by_class).expect("counted by class");
        let s = g.stats();
        let client = s.by_class.map(|c| [c.admitted, c.throttled]);
        assert_eq!(seen.0, client, "the controller's counts by class");
    }
}

async fn in_flight(env: Env) {
    use std::collections::VecDeque;
    use tollgate_limiter::InFlightStats;
    let toml = "[groups.g]\nmax_in_flight = 10\n";
    if env.pools() {
        // A slot held by a process that dies could not come back: refused, named.
        let e = env.try_gate(toml).await.expect_err("an in-flight quota needs a controller");
        assert!(e.to_string().contains("groups.g.max_in_flight"), "{}: {e}", env.mode());
        return;
    }
    // Two processes share the quota through a controller; one holds it all in process.
    let processes = if matches!(env, Env::Remote { .. }) { 2 } else { 1 };
    let mut gates = Vec::new();
    for _ in 0..processes {
        gates.push(env.gate(toml).await);
    }
    let handles: Vec<GroupHandle> = gates.iter().map(|g| g.group("g").unwrap()).collect();
    // Every 10 ms each process's oldest request finishes and it fills its share again,
    // asking for more than the quota between them.
    let mut held: Vec<VecDeque<tollgate_limiter::Permit<'static>>> =
        (0..processes).map(|_| VecDeque::new()).collect();
    for step in 0..400 {
        for (h, q) in handles.iter().zip(&mut held) {
            if step % 2 == 0 {
                q.pop_front();
            }
            while q.len() < 12 {
                match h.try_acquire(1.0) {
                    Ok(p) => q.push_back(p.into_owned()),
                    Err(_) => break,
                }
            }
        }
        let total: usize = held.iter().map(VecDeque::len).sum();
        assert!(total <= 10, "{}: {total} in flight at step {step} against a quota of 10", env.mode());
        env.sleep(STEP).await;
    }
    let counts: Vec<usize> = held.iter().map(VecDeque::len).collect();
    let _ = writeln!(std::io::stderr(), "{}: in flight at the end {counts:?}", env.mode());
    // The quota is in use, shared evenly between processes asking alike.
    assert!(counts.iter().sum::<usize>() >= 9, "{}: {counts:?}", env.mode());
    assert!(counts.iter().all(|&c| c >= 10 / processes - 1), "{}: {counts:?}", env.mode());
    for (h, q) in handles.iter().zip(&held) {
        let s = h.stats().in_flight.expect("an in-flight quota shows in the stats");
        assert_eq!(s.held as usize, q.len(), "{}", env.mode());
        assert!(s.share as usize >= q.len(), "{}: {s:?}", env.mode());
    }
    if let Env::Remote { net } = &env {
        let name = tollgate_model::settings::GroupName::new("g").unwrap();
        env.sleep(Duration::from_millis(1500)).await; // an exchange: the controller hears
        let view = net.controller().readings().view();
        let seen =
            view.iter().find(|v| v.name == name).and_then(|v| v.in_flight).expect("the controller's view");
        assert_eq!(seen.held as usize, counts.iter().sum::<usize>(), "{seen:?}");
    }
    // Slots come back when a permit is dropped, settled, dropped as work, or unwound by a
    // panic, and a cancelled wait holds none.
    let (h, q) = (&handles[0], &mut held[0]);
    let share = h.stats().in_flight.unwrap().share;
    let held_now = |h: &GroupHandle| h.stats().in_flight.map(|f: InFlightStats| f.held).unwrap();
    q.pop_front().unwrap().settle(2.0).unwrap();
    q.pop_front().unwrap().dropped();
    drop(q.pop_front());
    assert_eq!(held_now(h) as usize, q.len(), "{}", env.mode());
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _permit = h.try_acquire(1.0).unwrap();
        panic!("the request failed");
    }));
    assert!(unwound.is_err());
    assert_eq!(held_now(h) as usize, q.len(), "{}", env.mode());
    while (q.len() as u32) < share {
        q.push_back(h.try_acquire(1.0).unwrap().into_owned());
    }
    assert!(h.try_acquire(1.0).is_err(), "{}: the share is full", env.mode());
    // A wait cancelled before a slot came holds none.
    let cancelled = tokio::time::timeout(Duration::from_millis(1), h.acquire(1.0)).await;
    assert!(cancelled.is_err(), "{}: no slot was free", env.mode());
    assert_eq!(held_now(h), share, "{}", env.mode());
    // A waiting acquire goes on as soon as a slot comes back.
    let waiting = h.acquire(1.0);
    tokio::pin!(waiting);
    let early = tokio::time::timeout(Duration::from_millis(1), &mut waiting).await;
    assert!(early.is_err(), "{}: waits while no slot is free", env.mode());
    q.pop_front();
    let permit = tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("on once a slot is back");
    drop(permit.expect("admitted"));
    held.clear();
    assert_eq!(handles[0].stats().in_flight.unwrap().held, 0, "{}", env.mode());
}

async fn nested_groups(env: Env) {
    let toml = "[groups.acme]\nlimit = 100\nreserved = 40\n[groups.\"acme/search\"]\nparent = \"acme\"\n\
                [groups.\"acme/batch\"]\nparent = \"acme\"\nreserved = 30\n";
    if env.pools() {
        let e = env.try_gate(toml).await.expect_err("a parent's limit needs a controller");
        assert!(e.to_string().contains(".parent"), "{}: {e}", env.mode());
        return;
    }
    let gate = env.gate(toml).await;
    let (search, batch) = (gate.group("acme/search").unwrap(), gate.group("acme/batch").unwrap());
    // Each asks 80 of acme's 100: batch has its 30 reserved, the two share the other 70.
    let rates = env.offer(&[(&search, 80.0), (&batch, 80.0)], 8, 4).await;
    assert_near(&env, "two children of one parent", &rates, &[35.0, 65.0], 8.0);
    // batch asks 10: search takes what it leaves.
    let rates = env.offer(&[(&search, 80.0), (&batch, 10.0)], 8, 4).await;
    assert_near(&env, "a quiet sibling", &rates, &[80.0, 10.0], 8.0);
}

// ---- Remote only: what only a controller and its clients do ----

#[test]
fn remote_fifty_clients_hold_a_group_within_5_percent_of_its_limit() {
    remote(|env| async move {
        let mut gates = Vec::new();
        for _ in 0..50 {
            gates.push(env.gate("[groups.shared]\nlimit = 1000\n").await);
        }
        let handles: Vec<GroupHandle> = gates.iter().map(|g| g.group("shared").unwrap()).collect();
        let load: Vec<(&GroupHandle, f64)> = handles.iter().map(|h| (h, 60.0)).collect();
        let rates = env.offer(&load, 12, 10).await;
        let total: f64 = rates.iter().sum();
        assert!(within(total, 1000.0, 5.0), "50 clients admitted {total}/s against a limit of 1000/s");
    });
}

/// A process joining a busy group starts with one request, not a full bucket: joining adds
/// nothing to the burst the group's processes bank, so a group joined by one process after
/// another still admits its limit and one burst over any window.
#[test]
fn remote_clients_joining_a_busy_group_add_nothing_to_its_burst() {
    remote(|env| async move {
        let first = env.gate("[groups.g]\nlimit = 100\n").await;
        let mut gates = vec![first];
        let mut handles = vec![gates[0].group("g").unwrap()];
        // One process asks twice the limit until its bucket is long drained.
        env.offer(&[(&handles[0], 200.0)], 3, 1).await;
        let admitted = |hs: &[GroupHandle]| hs.iter().map(|h| h.stats().admitted_units).sum::<f64>();
        let before = admitted(&handles);
        // Then another joins every second, each asking twice the limit: ten seconds in all.
        for _ in 0..4 {
            let gate = env.gate("[groups.g]\nlimit = 100\n").await;
            handles.push(gate.group("g").unwrap());
            gates.push(gate);
            let load: Vec<(&GroupHandle, f64)> = handles.iter().map(|h| (h, 200.0)).collect();
            env.offer(&load, 1, 1).await;
        }
        let load: Vec<(&GroupHandle, f64)> = handles.iter().map(|h| (h, 200.0)).collect();
        env.offer(&load, 6, 1).await;
        let over_ten_s = admitted(&handles) - before;
        // The limit over 10 s, and what the first process banked (its bucket of 100 drained)
        // and one request for each process that joined; a joiner starting full would bring
        // its grant's burst (50, 33, 25, 20 more).
        assert!(over_ten_s <= 1000.0 + 4.0 + 10.0, "{over_ten_s} units over 10 s with a limit of 100/s");
        assert!(over_ten_s >= 950.0, "{over_ten_s} units over 10 s with a limit of 100/s");
    });
}

#[test]
fn remote_twenty_clients_right_after_a_restart_never_hold_more_than_the_limit() {
    remote(|env| async move {
        let Env::Remote { net } = &env else { unreachable!() };
        let mut gates = Vec::new();
        for _ in 0..20 {
            gates.push(env.gate("[groups.g]\nlimit = 100\n").await);
        }
        let handles: Vec<GroupHandle> = gates.iter().map(|g| g.group("g").unwrap()).collect();
        let load: Vec<(&GroupHandle, f64)> = handles.iter().map(|h| (h, 20.0)).collect();
        env.offer(&load, 5, 1).await;
        net.restart().await;
        // Through the restart and the first ticks after it, the grants the clients hold add
        // up to no more than the limit.
        for _ in 0..300 {
            let held: f64 = handles.iter().map(|h| h.stats().allowance).sum();
            assert!(held <= 100.0 + 1e-6, "the clients hold {held} units/s against a limit of 100");
            env.offer(&load, 1, 1).await;
        }
    });
}

#[test]
fn remote_clients_enter_safe_mode_past_the_lease_and_leave_it_when_the_controller_returns() {
    let settings = EngineSettings { lease: Duration::from_secs(1), ..EngineSettings::default() };
    remote_with(settings, |env| async move {
        let Env::Remote { net } = &env else { unreachable!() };
        let gate = env.gate("[groups.g]\nreserved = 10\nlimit = 100\n").await;
        let g = gate.group("g").unwrap();
        let _ = g.acquire(1.0).await.unwrap();
        assert!(gate.remote_status().unwrap().connected);
        let text = gate.metrics();
        for line in [
            "tollgate_client_info{mode=\"remote\"} 1",
            "tollgate_client_connected 1",
            "tollgate_client_safe_mode 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} missing from\n{text}");
        }
        net.crash().await;
        let clock = TokioClock::new();
        let crashed = tollgate_model::time::Clock::now(&clock);
        while !gate.remote_status().unwrap().safe_mode {
            env.sleep(Duration::from_millis(10)).await;
        }
        let entered = tollgate_model::time::Clock::now(&clock).since(crashed);
        // The lease runs from the last exchange (at most a tick before the crash); failures
        // are retried within 2 s.
        assert!(entered <= Duration::from_secs(1) + Duration::from_secs(3), "entered after {entered:?}");
        assert!(gate.remote_status().unwrap().last_error.is_some());
        assert!(gate.metrics().lines().any(|l| l == "tollgate_client_safe_mode 1"));
        // Decay: still admitted, at a falling rate.
        let _ = g.acquire(1.0).await.unwrap();
        net.start().await;
        while gate.remote_status().unwrap().safe_mode {
            env.sleep(Duration::from_millis(10)).await;
        }
        assert!(gate.remote_status().unwrap().connected);
        // The controller kept the group's settings.
        assert!(
            net.controller().admin().group(&tollgate_model::settings::GroupName::new("g").unwrap()).is_some()
        );
    });
}

/// Regression: `FailOpen` admitted nothing at a cold start, or for a new group, while the
/// controller was unreachable.
#[test]
fn remote_fail_open_admits_a_new_group_while_the_controller_is_unreachable() {
    remote(|env| async move {
        let Env::Remote { net } = &env else { unreachable!() };
        net.crash().await;
        for (policy, open) in [
            (tollgate_limiter::SafeModePolicy::FailOpen, true),
            (tollgate_limiter::SafeModePolicy::FailClosed, false),
            (tollgate_limiter::SafeModePolicy::Decay, false),
        ] {
            let opts =
                RemoteOptions { safe_mode: policy, ..RemoteOptions::default() }.with_clock(TokioClock::new());
            let gate = Tollgate::remote_channel(net.channel(), opts).unwrap();
            let first = gate.group("cold").unwrap();
            env.sleep(Duration::from_secs(2)).await;
            assert_eq!(first.try_acquire(1.0).is_ok(), open, "{policy:?} at a cold start");
            // A group made while in safe mode gets the policy at once.
            let later = gate.group("later").unwrap();
            assert_eq!(later.try_acquire(1.0).is_ok(), open, "{policy:?} for a new group");
        }
    });
}

#[test]
fn remote_a_group_idle_at_a_live_client_expires_end_to_end() {
    let settings = EngineSettings { group_idle_expiry: Duration::from_secs(10), ..EngineSettings::default() };
    remote_with(settings, |env| async move {
        let Env::Remote { net } = &env else { unreachable!() };
        let opts = RemoteOptions { group_idle_expiry: Duration::from_secs(5), ..RemoteOptions::default() };
        let gate = Tollgate::remote_channel(net.channel(), opts.with_clock(TokioClock::new())).unwrap();
        let (busy, idle) = (gate.group("busy").unwrap(), gate.group("idle").unwrap());
        env.offer(&[(&busy, 10.0), (&idle, 10.0)], 3, 1).await;
        let tracked = |n: &str| {
            let name = tollgate_model::settings::GroupName::new(n).unwrap();
            net.controller().with_engine(|e| e.outcome(&name).is_some())
        };
        assert!(tracked("busy") && tracked("idle"));
        env.offer(&[(&busy, 10.0)], 20, 1).await;
        assert!(tracked("busy"), "a group in use stays");
        assert!(!tracked("idle"), "a group idle at a live client is forgotten by the controller");
        // Used again, it gets a fresh grant.
        let rates = env.offer(&[(&idle, 10.0)], 3, 1).await;
        assert!(rates[0] > 5.0, "revived: {rates:?}");
    });
}

#[test]
fn remote_budget_consumption_survives_a_controller_restart() {
    remote(|env| async move {
        let Env::Remote { net } = &env else { unreachable!() };
        let gate = env.gate("[groups.trial]\nreserved = 10\nlimit = 100\nbudget = 500\n").await;
        let g = gate.group("trial").unwrap();
        env.offer(&[(&g, 100.0)], 3, 1).await;
        env.sleep(Duration::from_millis(1500)).await; // a flush
        net.restart().await;
        // About 300 were consumed before the restart, and the controller that comes back
        // knows it: the budget runs out after about 200 more (3 s with the burst and a tick of
        // lag), where a controller that forgot would allow 500 (6 s).
        let name = tollgate_model::settings::GroupName::new("trial").unwrap();
        let mut exhausted_after = None;
        for second in 1..=8 {
            env.offer(&[(&g, 200.0)], 1, 1).await;
            let spent =
                net.controller().with_engine(|e| e.outcome(&name).is_some_and(|o| o.budget_exhausted));
            if spent && exhausted_after.is_none() {
                exhausted_after = Some(second);
            }
        }
        let after = exhausted_after.expect("the budget ran out");
        assert!(after <= 4, "the budget ran out {after} s after the restart");
        let rates = env.offer(&[(&g, 200.0)], 3, 2).await;
        assert_near(&env, "spent, nothing admitted", &rates, &[0.0], 0.0);
        let meter = net.controller().with_engine(|e| e.meter(&name)).unwrap();
        assert!(meter.consumed >= 500.0, "{meter:?}");
    });
}

#[test]
fn remote_waiting_work_and_restarted_clients_reach_the_controller() {
    remote(|env| async move {
        let Env::Remote { net } = &env else { unreachable!() };
        apply(&net.controller(), &Config::parse("[groups.g]\nlimit = 10\n").unwrap());
        let opts = || {
            RemoteOptions {
                client_id: Some("fixed".into()),
                max_wait: Duration::from_secs(600),
                ..RemoteOptions::default()
            }
            .with_clock(TokioClock::new())
        };
        let gate = Tollgate::remote_channel(net.channel(), opts()).unwrap();
        let g = gate.group("g").unwrap();
        g.set_queued(500.0);
        env.sleep(Duration::from_secs(3)).await;
        let name = tollgate_model::settings::GroupName::new("g").unwrap();
        let demand = net.controller().with_engine(|e| e.outcome(&name).unwrap().demand);
        assert!(demand >= 500.0, "500 units waiting count as demand: {demand}");
        drop((g, gate));
        // A new process under the same id numbers its exchanges from 1 again.
        let again = Tollgate::remote_channel(net.channel(), opts()).unwrap();
        let _ = again.group("g").unwrap();
        env.sleep(Duration::from_secs(2)).await;
        assert_eq!(net.controller().with_engine(|e| e.client_restarts()), 1);
    });
}

/// TiDB's client: it asks for its own exchange period, and between exchanges a group running
/// low on tokens exchanges early (after the controller's next tick), looked at off the hot
/// path.
#[test]
fn remote_a_client_keeps_its_own_period_and_exchanges_early_when_low_on_tokens() {
    use tollgate_model::settings::{GroupName, GroupSettings};
    use tollgate_model::time::Nanos;
    let clock = ManualClock::new();
    let controller =
        Controller::new(Box::new(MemoryStore::default()), EngineSettings::default(), Nanos::ZERO, 0).unwrap();
    controller
        .admin()
        .set_group(
            GroupName::new("g").unwrap(),
            GroupSettings::builder().limit(100.0).build().unwrap(),
            "test",
            tollgate_controller::wall_ms(),
        )
        .unwrap();
    let opts = RemoteOptions { exchange_period: Some(Duration::from_secs(5)), ..RemoteOptions::default() };
    let (gate, mut driver) = Tollgate::remote_driven(opts.with_clock(clock.clone())).unwrap();
    let g = gate.group("g").unwrap();
    let mut exchanges = Vec::new();
    // Runs the loop the exchange task runs, in 10 ms steps, the controller ticking each second.
    let run_until = |until_ms: u64, driver: &mut tollgate_limiter::Driver, exchanges: &mut Vec<u64>| loop {
        let now = tollgate_model::time::Clock::now(&clock);
        if now.0.is_multiple_of(1_000_000_000) {
            controller.pacer().tick(now);
        }
        if driver.is_due(now) {
            let request = driver.request(now).unwrap();
            assert_eq!(request.target_request_period_ms, 5000);
            let answer = controller.exchange(now, &request).unwrap();
            driver.answer(now, &answer);
            exchanges.push(now.0 / 1_000_000);
        }
        if now.0 / 1_000_000 >= until_ms {
            return;
        }
        clock.advance(STEP);
    };
    drop(g.try_acquire(1.0));
    run_until(12_000, &mut driver, &mut exchanges);
    // Every 5 s once the first grants are in, not every tick.
    let late: Vec<u64> = exchanges.iter().copied().filter(|&t| t >= 2000).collect();
    assert!(late.len() <= 3 && late.windows(2).all(|w| w[1] - w[0] >= 4990), "{exchanges:?}");
    let before = exchanges.len();
    let next_periodic = *exchanges.last().unwrap() + 5000;
    // 85 of the 100 tokens taken at once, none refused (a refusal would ask for an early
    // exchange by itself): the next exchange comes after the next tick.
    let throttled = g.stats().throttled;
    let taken = (0..85).filter(|_| g.try_acquire(1.0).is_ok()).count();
    assert_eq!((taken, g.stats().throttled), (85, throttled));
    run_until(next_periodic - 1000, &mut driver, &mut exchanges);
    assert!(exchanges.len() > before, "no early exchange: {exchanges:?}");
    assert!(exchanges[before] <= 13_000, "early exchange at {} ms", exchanges[before]);
}

/// TiDB's trickle: a grant that rises is taken up over the trickle, from the rate the group
/// had; one that falls applies at once.
#[test]
fn remote_a_rising_grant_is_taken_up_over_the_trickle() {
    use tollgate_model::settings::{GroupName, GroupSettings};
    use tollgate_model::time::{Clock as _, Nanos};
    let clock = ManualClock::new();
    let settings = EngineSettings { trickle: Duration::from_secs(2), ..EngineSettings::default() };
    let controller = Controller::new(Box::new(MemoryStore::default()), settings, Nanos::ZERO, 0).unwrap();
    let name = GroupName::new("g").unwrap();
    let limit = |l: f64| GroupSettings::builder().limit(l).build().unwrap();
    controller.admin().set_group(name.clone(), limit(100.0), "test", tollgate_controller::wall_ms()).unwrap();
    let (gate, mut driver) =
        Tollgate::remote_driven(RemoteOptions::default().with_clock(clock.clone())).unwrap();
    let g = gate.group("g").unwrap();
    drop(g.try_acquire(1.0));
    let allowance_at = |ms: u64, driver: &mut tollgate_limiter::Driver| loop {
        let now = clock.now();
        if now.0.is_multiple_of(1_000_000_000) {
            controller.pacer().tick(now);
        }
        driver.poll(now);
        if driver.is_due(now) {
            let request = driver.request(now).unwrap();
            driver.answer(now, &controller.exchange(now, &request).unwrap());
        }
        if now.0 / 1_000_000 >= ms {
            return g.stats().allowance;
        }
        clock.advance(STEP);
    };
    // The first grant climbs from nothing to 100 over 2 s.
    let (early, half, full) =
        (allowance_at(10, &mut driver), allowance_at(1010, &mut driver), allowance_at(2500, &mut driver));
    assert!(early < 10.0 && (40.0..=60.0).contains(&half) && full == 100.0, "{early}, {half}, {full}");
    // A lower limit applies at the next exchange, at once.
    controller.admin().set_group(name, limit(20.0), "test", tollgate_controller::wall_ms()).unwrap();
    assert_eq!(allowance_at(4500, &mut driver), 20.0);
}

/// A client with more groups than one exchange carries reports them over a round of pages,
/// each within the controller's bound, the active groups first; each page goes as soon as the
/// last is answered, and a failed page puts back what it and the pages after it reported.
#[test]
fn remote_a_client_past_one_exchanges_bound_pages_its_groups_busiest_first() {
    use tollgate_model::settings::{GroupName, GroupSettings};
    use tollgate_model::time::{Clock as _, Nanos};
    use tollgate_proto::EXCHANGE_GROUPS_MAX;
    let clock = ManualClock::new();
    let controller =
        Controller::new(Box::new(MemoryStore::default()), EngineSettings::default(), Nanos::ZERO, 0).unwrap();
    let limit = GroupSettings::builder().limit(100.0).build().unwrap();
    controller
        .admin()
        .set_group(GroupName::new("steady").unwrap(), limit, "test", tollgate_controller::wall_ms())
        .unwrap();
    let (gate, mut driver) =
        Tollgate::remote_driven(RemoteOptions::default().with_clock(clock.clone())).unwrap();
    let steady = gate.group("steady").unwrap();
    let names = 2 * EXCHANGE_GROUPS_MAX + 500;
    let handles: Vec<GroupHandle> =
        (0..names).map(|i| gate.group(&format!("tenant-{i:05}")).unwrap()).collect();
    // The first round: every group is new, so every group has a first grant after it.
    for h in &handles {
        drop(h.try_acquire(1.0));
    }
    drop(steady.try_acquire(1.0));
    let mut pages = Vec::new();
    let now = clock.now();
    while driver.is_due(now) {
        let request = driver.request(now).unwrap();
        assert!(request.groups.len() <= EXCHANGE_GROUPS_MAX);
        pages.push(request.groups.len());
        driver.answer(now, &controller.exchange(now, &request).unwrap());
    }
    assert_eq!(pages, [EXCHANGE_GROUPS_MAX, EXCHANGE_GROUPS_MAX, names + 1 - 2 * EXCHANGE_GROUPS_MAX]);
    assert!(handles.iter().all(GroupHandle::has_grant) && steady.has_grant(), "every page answered");
    assert!(gate.remote_status().is_some_and(|s| !s.safe_mode));
    // A round later only the steady group was called: it leads the first page.
    controller.pacer().tick(now);
    clock.advance(Duration::from_secs(1));
    for _ in 0..20 {
        steady.try_acquire(1.0).unwrap();
    }
    let now = clock.now();
    assert!(driver.is_due(now));
    let first = driver.request(now).unwrap();
    assert_eq!(first.groups[0].group, "steady");
    assert_eq!(first.groups[0].admitted, 20);
    // The first page fails: the round ends, and the next reports the same calls again.
    driver.failed(now, &tollgate_limiter::ExchangeError::Transport("lost".into()));
    let again = driver.request(now).unwrap();
    assert_eq!((again.groups[0].group.as_str(), again.groups[0].admitted), ("steady", 20));
    driver.answer(now, &controller.exchange(now, &again).unwrap());
    // The next page is due at once; the one after the last waits for the period.
    assert!(driver.is_due(now));
    while driver.is_due(now) {
        let request = driver.request(now).unwrap();
        driver.answer(now, &controller.exchange(now, &request).unwrap());
    }
    assert!(driver.due_at() > now);
}

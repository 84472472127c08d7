//! The demand definition, the cost models and the ramps, as a table of cases other clients check
//! themselves against: the Python client's tests replay `clients/python/tests/shared_cases.json`
//! through its own meter and models, and the Go client's its demand cases through its meter
//! (`clients/go/demand_test.go`), and must get the same numbers.
//!
//! This test computes the table with the model's code and compares it with the committed file;
//! `TOLLGATE_BLESS=1 cargo test -p tollgate-model --test it shared_cases` writes it afresh.

use std::path::PathBuf;

use serde_json::{Value, json};
use tollgate_model::cost::{Consumption, CostModel, LinearCoefficients, Usage};
use tollgate_model::demand::{Counts, DemandMeter};
use tollgate_model::time::Nanos;

/// A small deterministic generator (xorshift), so the table never changes by itself.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn detail_json(d: &Consumption) -> Value {
    Value::Object(
        Consumption::NAMES.iter().zip(d.values()).map(|(n, v)| ((*n).to_owned(), json!(v))).collect(),
    )
}

fn demand_cases() -> Value {
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let mut sequences = Vec::new();
    for _ in 0..8 {
        let mut meter = DemandMeter::new(Nanos(0));
        let mut counts = Counts::default();
        let mut now_ms = 0u64;
        let mut steps = Vec::new();
        for _ in 0..20 {
            // Reports from 20 ms to 3 s apart, with quiet spells, refusals, waits and
            // unthrottled work.
            now_ms += 20 + rng.below(2980);
            let quiet = rng.below(5) == 0;
            let asked = if quiet { 0.0 } else { rng.below(5000) as f64 / 4.0 };
            let refused = if quiet { 0 } else { rng.below(20) };
            counts.asked += asked;
            counts.consumed += asked * 0.75;
            counts.admitted_units += asked * 0.5;
            counts.unthrottled += if rng.below(3) == 0 { asked / 8.0 } else { 0.0 };
            counts.admitted += if quiet { 0 } else { rng.below(100) };
            counts.throttled += refused;
            counts.waited += rng.below(3) * u64::from(!quiet);
            counts.detail.rru += asked / 2.0;
            counts.detail.read_rpcs += if quiet { 0.0 } else { 1.0 };
            let waiting = rng.below(4) as f64 * 2.5;
            let granted = match rng.below(4) {
                0 => None,
                _ => Some(rng.below(4000) as f64 / 2.0),
            };
            let r = meter.report(Nanos(now_ms * 1_000_000), counts, waiting, granted);
            steps.push(json!({
                "at_s": now_ms as f64 / 1000.0,
                "counts": {
                    "asked": counts.asked, "consumed": counts.consumed,
                    "admitted_units": counts.admitted_units,
                    "unthrottled": counts.unthrottled, "admitted": counts.admitted,
                    "throttled": counts.throttled, "waited": counts.waited,
                    "detail": detail_json(&counts.detail),
                },
                "waiting": waiting,
                "granted": granted,
                "report": {
                    "demand": r.demand, "unthrottled": r.unthrottled, "waiting": r.waiting,
                    "consumed": r.consumed, "requests": r.requests, "throttled": r.throttled,
                    "held": r.held, "waited": r.waited, "detail": detail_json(&r.detail),
                },
            }));
        }
        sequences.push(Value::Array(steps));
    }
    Value::Array(sequences)
}

fn cost_cases() -> Value {
    let linear = LinearCoefficients {
        read_base: 1.0,
        read_per_byte: 0.001,
        write_base: 5.0,
        write_per_byte: 0.01,
        per_cpu_ms: 0.5,
    };
    let models: [(&str, Value, CostModel); 6] = [
        ("count", json!({}), CostModel::Count),
        ("fdb", json!({"fungibility": 4.0}), CostModel::fdb()),
        ("fdb", json!({"fungibility": 1.3}), CostModel::Fdb { fungibility: 1.3 }),
        ("ru", json!({}), CostModel::ru()),
        ("couchbase", json!({}), CostModel::couchbase()),
        (
            "linear",
            json!({"read_base": 1.0, "read_per_byte": 0.001, "write_base": 5.0, "write_per_byte": 0.01, "per_cpu_ms": 0.5}),
            CostModel::Linear(linear),
        ),
    ];
    let mut usages = Vec::new();
    for bytes in [0u64, 1, 1023, 1024, 1025, 4095, 4096, 4097, 65_536, 200_000] {
        usages.push(Usage::read(bytes).with_cpu_ms((bytes % 7) as f64 * 1.5));
        usages.push(Usage::write(bytes).with_replicas(1 + (bytes % 3) as u32));
        usages.push(Usage::write(bytes).durable());
    }
    usages.push(Usage::units(12.5));
    let mut cases = Vec::new();
    for (name, coefficients, model) in &models {
        for u in &usages {
            cases.push(json!({
                "model": name,
                "coefficients": coefficients,
                "usage": {
                    "kind": if u.kind == tollgate_model::cost::OpKind::Read { "read" } else { "write" },
                    "bytes": u.bytes, "cpu_ms": u.cpu_ms, "replicas": u.replicas,
                    "durable": u.durable, "units": u.units,
                },
                "cost": model.cost(u).unwrap(),
                "upfront": model.upfront(u).unwrap(),
            }));
        }
    }
    Value::Array(cases)
}

fn ramp_cases() -> Value {
    use std::time::Duration;
    use tollgate_model::ramp::Ramp;
    use tollgate_model::settings::{RampMode, RampSettings};
    let mut rng = Rng(0x5eed_1234_abcd_0002);
    let mut cases = Vec::new();
    for mode in [RampMode::Scheduled, RampMode::Relaxed, RampMode::OnlyIfUsed, RampMode::GoBackN] {
        for (threshold_pct, ramp_down_pct, cool_down_s, resume) in
            [(100.0, 50.0, 5u64, None), (50.0, 25.0, 2, Some(47.5)), (75.0, 100.0, 1, Some(500.0))]
        {
            let settings = RampSettings {
                mode,
                threshold_pct,
                ramp_down_pct,
                cool_down: Duration::from_secs(cool_down_s),
                ..RampSettings::new(10.0, 110.0, Duration::from_secs(7))
            };
            let mut ramp = Ramp::new(settings, resume);
            let mut epoch = 0u64;
            let mut steps = Vec::new();
            for _ in 0..30 {
                // Calls in the same epoch, the next, or after a gap of up to 6 epochs.
                epoch += [0, 1, 1, 1, 2, 4, 7][rng.below(7) as usize];
                let pool = ramp.at_epoch(epoch);
                let used = (rng.below(130) as f64 * 0.5).min(pool as f64 + 3.0);
                ramp.use_units(used);
                steps.push(json!({ "epoch": epoch, "pool": pool, "used": used, "value": ramp.value() }));
            }
            cases.push(json!({
                "settings": {
                    "mode": mode.name(), "min": 10.0, "max": 110.0, "duration_s": 7.0,
                    "threshold_pct": threshold_pct, "ramp_down_pct": ramp_down_pct, "cool_down_s": cool_down_s,
                },
                "resume": resume,
                "steps": steps,
            }));
        }
    }
    Value::Array(cases)
}

#[test]
fn the_shared_table_is_what_the_model_computes() {
    let table = json!({ "demand": demand_cases(), "cost": cost_cases(), "ramp": ramp_cases() });
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../clients/python/tests/shared_cases.json");
    let text = serde_json::to_string_pretty(&table).unwrap() + "\n";
    if std::env::var_os("TOLLGATE_BLESS").is_some() {
        std::fs::write(&path, &text).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == text,
        "{} is not what the model computes: run TOLLGATE_BLESS=1 cargo test -p tollgate-model --test it shared_cases",
        path.display()
    );
}

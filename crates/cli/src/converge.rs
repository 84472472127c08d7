//! `tollgate bench converge`: how long saturation limiting takes to settle after a shift, in
//! simulated seconds, under Tollgate's law and beside a plain multiplicative one.
//!
//! Three scenarios (the files in `scenarios/` named `converge-*`, built in): a demand step, a
//! quota lifted, a backend's capacity cut. Each runs the real controller and clients in
//! virtual time (`tollgate sim`); the second phase makes the shift and expects the group's
//! target within 5 % of where it must end, held for 20 s. The settling time is how long after
//! the shift that hold began.

use clap::Args;
use tollgate_core::engine::LimitingLaw;
use tollgate_sim::Scenario;

/// `tollgate bench converge` arguments.
#[derive(Args, Debug)]
pub struct ConvergeArgs {
    /// Replaces the scenarios' seed.
    #[arg(long)]
    seed: Option<u64>,
}

/// The built-in scenarios: (what shifts, the scenario file).
const SCENARIOS: [(&str, &str); 3] = [
    ("demand step", include_str!("../../../scenarios/converge-demand-step.toml")),
    ("quota lifted", include_str!("../../../scenarios/converge-quota-change.toml")),
    ("capacity cut", include_str!("../../../scenarios/converge-capacity-change.toml")),
];

/// The laws compared.
const LAWS: [LimitingLaw; 2] = [LimitingLaw::Rate, LimitingLaw::Multiplicative];

/// One run's figures after the shift.
struct Settled {
    /// Simulated seconds from the shift to the start of the hold within 5 %.
    after_s: Option<f64>,
    /// The largest utilisation of the backend after the shift.
    peak_utilisation: f64,
    /// How long the run looked, in simulated seconds after the shift.
    watched_s: f64,
}

fn settle(scenario: &Scenario, law: LimitingLaw, seed: u64) -> anyhow::Result<Settled> {
    let mut scenario = scenario.clone();
    scenario.controller.limiting_law = law;
    let hold = scenario.phases.get(1).map_or(0.0, |p| f64::from(p.hold_checks));
    let out = tollgate_sim::run(&scenario, seed);
    let before = out.phases.first().and_then(|p| p.converged_s).ok_or_else(|| {
        anyhow::anyhow!("{} under the {} law never reached its starting point", scenario.name, law.name())
    })?;
    let after: Vec<_> = out.timeline.iter().filter(|s| s.t > before).collect();
    Ok(Settled {
        after_s: out.phases.get(1).and_then(|p| p.converged_s).map(|c| c - hold),
        peak_utilisation: after.iter().flat_map(|s| s.utilisation.iter().copied()).fold(0.0, f64::max),
        watched_s: after.last().map_or(0.0, |s| s.t - before),
    })
}

/// Runs every scenario under both laws and prints the table.
pub fn converge(a: ConvergeArgs) -> anyhow::Result<()> {
    crate::say(format!(
        "{:<14} {:<15} {:>22} {:>17}",
        "shift", "law", "settled within 5 % in", "peak utilisation"
    ));
    for (shift, text) in SCENARIOS {
        let scenario =
            Scenario::parse(text).map_err(|e| anyhow::anyhow!("built-in scenario {shift}: {e}"))?;
        let seed = a.seed.unwrap_or(scenario.seed);
        for law in LAWS {
            let s = settle(&scenario, law, seed)?;
            let after = match s.after_s {
                Some(t) => format!("{t:.0} s"),
                None => format!("not in {:.0} s", s.watched_s),
            };
            crate::say(format!("{shift:<14} {:<15} {after:>22} {:>17.3}", law.name(), s.peak_utilisation));
        }
    }
    Ok(())
}

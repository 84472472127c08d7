//! `tollgate bench converge`: how long saturation limiting takes to settle after a shift, in
//! simulated seconds, under Tollgate's law and beside a plain multiplicative one.
//!
//! Three scenarios (the files in `scenarios/` named `converge-*`, built in): a demand step, a
//! quota lifted, a backend's capacity cut. Each runs the real controller and clients in
//! virtual time (`tollgate sim`); the second phase makes the shift and expects the group's
//! target within 5 % of where it must end, held for 20 s. The settling time is how long after
//! the shift that hold began. A third run of each uses Tollgate's law with the backend
//! reporting as the server's backend reporter does by default (every 250 ms, its load folded
//! over 1 s, where the scenarios' backends report at the ticks and fold over 10 s): what a
//! fresher report and a tick at once for a backend newly saturated buy.

use clap::Args;
use tollgate_model::engine::LimitingLaw;
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
    ("demand step", include_str!("../../scenarios/converge-demand-step.toml")),
    ("quota lifted", include_str!("../../scenarios/converge-quota-change.toml")),
    ("capacity cut", include_str!("../../scenarios/converge-capacity-change.toml")),
];

/// The runs compared: (label, law, whether the backends report as the server's reporter does).
const RUNS: [(&str, LimitingLaw, bool); 3] = [
    ("rate", LimitingLaw::Rate, false),
    ("multiplicative", LimitingLaw::Multiplicative, false),
    ("rate, reporter", LimitingLaw::Rate, true),
];

/// The server's backend reporter's defaults: how often it reports, and its folding time.
const REPORTER: (std::time::Duration, f64) = (std::time::Duration::from_millis(250), 1.0);

/// One run's figures after the shift.
struct Settled {
    /// Simulated seconds from the shift to the start of the hold within 5 %.
    after_s: Option<f64>,
    /// The largest utilisation of the backend after the shift.
    peak_utilisation: f64,
    /// How long the run looked, in simulated seconds after the shift.
    watched_s: f64,
}

fn settle(scenario: &Scenario, law: LimitingLaw, reporter: bool, seed: u64) -> anyhow::Result<Settled> {
    let mut scenario = scenario.clone();
    scenario.controller.limiting_law = law;
    if reporter {
        scenario.controller.report_every = Some(REPORTER.0);
        for b in &mut scenario.backends {
            b.folding_s = REPORTER.1;
        }
    }
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

/// Runs every scenario under both laws (and the rate law with the reporter's defaults) and
/// prints the table.
pub fn converge(a: ConvergeArgs) -> anyhow::Result<()> {
    crate::say(format!(
        "{:<14} {:<15} {:>22} {:>17}",
        "shift", "law", "settled within 5 % in", "peak utilisation"
    ));
    for (shift, text) in SCENARIOS {
        let scenario =
            Scenario::parse(text).map_err(|e| anyhow::anyhow!("built-in scenario {shift}: {e}"))?;
        let seed = a.seed.unwrap_or(scenario.seed);
        for (label, law, reporter) in RUNS {
            let s = settle(&scenario, law, reporter, seed)?;
            let after = match s.after_s {
                Some(t) => format!("{t:.0} s"),
                None => format!("not in {:.0} s", s.watched_s),
            };
            crate::say(format!("{shift:<14} {label:<15} {after:>22} {:>17.3}", s.peak_utilisation));
        }
    }
    Ok(())
}

//! Every scenario in `scenarios/` passes, as `tollgate sim` would run it.

use std::path::PathBuf;

use tollgate_sim::{Scenario, output, run};

fn scenarios_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scenarios")
}

fn load(name: &str) -> Scenario {
    let path = scenarios_dir().join(format!("{name}.toml"));
    let src = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Scenario::parse(&src).unwrap_or_else(|e| panic!("{}:\n{e}", path.display()))
}

#[test]
fn every_scenario_passes() {
    let mut names: Vec<String> = std::fs::read_dir(scenarios_dir())
        .unwrap()
        .filter_map(|e| e.ok()?.path().file_stem()?.to_str().map(str::to_string))
        .collect();
    names.sort();
    assert!(names.len() >= 5, "scenarios/ holds {names:?}");
    for name in names {
        let s = load(&name);
        let outcome = run(&s, s.seed);
        let lines = output::phase_lines(&outcome);
        println!("{name}: {lines:?}");
        assert!(outcome.passed(), "{name}: {lines:?}");
    }
}

#[test]
fn fdb_simple_converges_within_15_simulated_seconds() {
    let s = load("fdb-simple");
    let outcome = run(&s, s.seed);
    let t = outcome.phases[0].converged_s.expect("converged");
    assert!(t <= 15.0, "took {t} s");
}

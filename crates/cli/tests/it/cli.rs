//! The `tollgate` binary, run as a user would.

use std::path::PathBuf;
use std::process::Command;

fn tollgate(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate")).args(args).output().expect("runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn file(name: &str, contents: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::write(&path, contents).unwrap();
    path
}

#[test]
fn help_lists_the_commands() {
    let (code, out, _) = tollgate(&["--help"]);
    assert_eq!(code, 0);
    assert!(out.contains("check-config"), "{out}");
}

/// Regression: the connection flags were mixed into every subcommand's options.
#[test]
fn the_connection_flags_sit_under_their_own_heading_and_are_optional() {
    let (code, out, _) = tollgate(&["group", "create", "--help"]);
    assert_eq!(code, 0);
    let usage = out.lines().find(|l| l.starts_with("Usage:")).unwrap();
    assert_eq!(usage, "Usage: tollgate group create [OPTIONS] <NAME>");
    let (options, connection) = out.split_once("\nConnection:\n").expect("a Connection heading");
    for flag in ["--server", "--token", "--ca", "--cert", "--key", "--timeout-ms"] {
        assert!(connection.contains(&format!("  {flag} ")), "{flag} under Connection:\n{out}");
        assert!(!options.contains(&format!("  {flag} ")), "{flag} not among the options:\n{out}");
    }
}

/// Regression: `tollgate ramp` took only `go-back-n`, files only `go_back_n`; a cool-down of 0
/// was blamed on `--min`.
#[test]
fn ramp_modes_take_either_spelling_and_the_cool_down_is_named() {
    let ramp = |mode: &str, more: &[&str]| {
        let mut args = vec!["ramp", "--mode", mode, "--min", "10", "--max", "20", "--duration", "2"];
        args.extend_from_slice(more);
        tollgate(&args)
    };
    let (a, b) = (ramp("go-back-n", &["--usage", "10,10"]), ramp("go_back_n", &["--usage", "10,10"]));
    assert_eq!(a.0, 0, "{}", a.2);
    assert_eq!(a, b);
    let (code, _, err) = ramp("go-back-n", &["--cool-down", "0", "--usage", "1"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("--cool-down: must be at least 1"), "{err}");
}

#[test]
fn a_valid_file_is_summarised() {
    let path =
        file("valid.toml", "[node]\ncapacity = 1000\n[groups.a]\nreserved = 600\n[groups.b]\nlimit = 300\n");
    let (code, out, _) = tollgate(&["check-config", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("ok: 2 groups, capacity 1000 units/s"), "{out}");
    assert!(out.contains("a: reserved 600 limit unlimited"), "{out}");
}

#[test]
fn every_problem_is_printed_with_its_line_and_the_exit_code_is_1() {
    let path = file(
        "broken.toml",
        "[node]\ncapacity = \"lots\"\n\n[groups.a]\nreserved = 10\nlimit = 5\n\n[groups.b]\nweight = -1\ncolour = \"red\"\n",
    );
    let p = path.to_str().unwrap();
    let (code, out, _) = tollgate(&["check-config", p]);
    assert_eq!(code, 1, "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines,
        [
            format!("{p}:2: node.capacity: must be a number, got string").as_str(),
            format!("{p}:5: groups.a.reserved: must not exceed limit (10 > 5)").as_str(),
            format!("{p}:9: groups.b.weight: must be above 0, got -1").as_str(),
            format!(
                "{p}:10: groups.b.colour: unknown field; expected one of reserved, limit, burst, priority, weight, budget, budget_period, quotas, ramp, dropped, debt_repay_s, reads_writes_apart, backend_limit, background, shadow, critical_reserve, max_in_flight, parent"
            )
            .as_str(),
            "4 problems found; nothing applied",
        ]
    );
}

/// Regression: check-config said nothing of settings that cannot act. A budget per period and
/// quotas per window pass for both the embedded limiter (which counts its windows in memory)
/// and the server; a window that does not exist is named.
#[test]
fn check_config_takes_windows_everywhere_and_warns_of_settings_that_cannot_act() {
    let path = file(
        "period.toml",
        "[groups.trial]\nlimit = 100\nbudget = 500\nbudget_period = \"day\"\nquotas = { minute = 20 }\n",
    );
    let p = path.to_str().unwrap();
    for mode in [&["check-config", p][..], &["check-config", "--for-server", p]] {
        let (code, out, _) = tollgate(mode);
        assert_eq!(code, 0, "{mode:?}: {out}");
    }
    let path = file("fortnight.toml", "[groups.trial]\nquotas = { fortnight = 20, minute = -1 }\n");
    let (code, out, _) = tollgate(&["check-config", path.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("groups.trial.quotas.minute: must be above 0"), "{out}");
    assert!(
        out.contains("groups.trial.quotas.fortnight: must be minute, hour, day, week, month, total, a number of seconds such as 90s"),
        "{out}"
    );
    let path = file(
        "inert.toml",
        "[node]\ncapacity = 100\nmode = \"fcfs\"\n[groups.a]\npriority = \"high\"\nlimit = 500\n",
    );
    let (code, out, _) = tollgate(&["check-config", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("warning: groups.a: priority and weight do nothing in fcfs mode"), "{out}");
    assert!(out.contains("warning: groups.a.limit 500 is above the node capacity 100"), "{out}");
}

/// Regression: bench accuracy changed the settings of whatever server it was pointed at.
#[test]
fn bench_accuracy_changes_nothing_without_setup() {
    let (code, _, err) =
        tollgate(&["bench", "accuracy", "--server", "http://127.0.0.1:1", "--duration", "1"]);
    assert_ne!(code, 0);
    assert!(err.contains("--setup: bench accuracy creates seven groups"), "{err}");
}

#[test]
fn a_missing_file_is_a_clear_error() {
    let (code, _, err) = tollgate(&["check-config", "/nonexistent/tollgate.toml"]);
    assert_ne!(code, 0);
    assert!(err.contains("cannot read settings file /nonexistent/tollgate.toml"), "{err}");
}

fn scenario(name: &str) -> String {
    format!("{}/../../scenarios/{name}.toml", env!("CARGO_MANIFEST_DIR"))
}

fn out_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn sim_passes_a_scenario_and_writes_timeline_summary_and_chart() {
    let dir = out_dir("sim-simple");
    let (code, out, err) = tollgate(&["sim", &scenario("fdb-simple"), "--out", dir.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("scenario fdb-simple (seed 1)"), "{out}");
    assert!(out.contains("phase 1: passed at 11 s"), "{out}");
    let summary = std::fs::read_to_string(dir.join("summary.json")).unwrap();
    assert!(summary.contains(r#""phases":[{"passed":true,"converged_s":11.0}]"#), "{summary}");
    let csv = std::fs::read_to_string(dir.join("timeline.csv")).unwrap();
    assert!(csv.starts_with("t,tag1.target_rps,"), "{csv}");
    assert_eq!(csv.lines().count(), 1 + 11, "a header and one row per simulated second");
    let png = std::fs::read(dir.join("timeline.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
}

#[test]
fn sim_writes_the_trace_of_every_rate_computation() {
    let dir = out_dir("sim-trace");
    let trace = dir.with_extension("jsonl");
    let (code, out, err) = tollgate(&[
        "sim",
        &scenario("fdb-active-throttling"),
        "--out",
        dir.to_str().unwrap(),
        "--trace",
        trace.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains(&format!("wrote the trace to {}", trace.display())), "{out}");
    let text = std::fs::read_to_string(&trace).unwrap();
    let events: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let rates: Vec<&serde_json::Value> = events.iter().filter(|e| e["event"] == "rate").collect();
    let busy = events.iter().filter(|e| e["event"] == "busy_group").count();
    assert!(rates.len() > 15 && busy > 30, "{} rates, {busy} busy-group events", rates.len());
    // Once saturated, each computation names the backends that limited it and their ratios.
    let limited = rates.iter().find(|r| r["busy"] == true).unwrap();
    let ratio = limited["ratio"].as_f64().unwrap();
    assert!(
        limited["limited_by"].as_array().unwrap().iter().any(|l| l["ratio"].as_f64() == Some(ratio)),
        "{limited}"
    );
    assert!(limited["limiting"].as_f64().unwrap() < limited["desired"].as_f64().unwrap(), "{limited}");
}

#[test]
fn sim_runs_replay_exactly_from_their_seed() {
    let (a, b) = (out_dir("sim-seed-a"), out_dir("sim-seed-b"));
    for dir in [&a, &b] {
        let (code, out, _) = tollgate(&[
            "sim",
            &scenario("couchbase-fairness"),
            "--seed",
            "42",
            "--out",
            dir.to_str().unwrap(),
        ]);
        assert_eq!(code, 0, "{out}");
        assert!(out.contains("(seed 42)"), "{out}");
    }
    let read = |d: &PathBuf| std::fs::read_to_string(d.join("timeline.csv")).unwrap();
    assert_eq!(read(&a), read(&b));
}

/// A storage scenario runs as `tollgate sim` runs any: its verdict per group and its marks,
/// 0 when it holds; the same without idle backends lending fails with 1.
#[test]
fn sim_runs_storage_scenarios_and_exits_1_when_one_is_not_met() {
    let burst = format!("{}/../../scenarios/storage/node-burst.toml", env!("CARGO_MANIFEST_DIR"));
    let (code, out, err) = tollgate(&["sim", &burst]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("skewed: 150.0 units/s (backends: 120.0, 20.0, 10.0); expected 150 within 2 %: ok"),
        "{out}"
    );
    let slow = burst.replace("node-burst", "slow-requests");
    let (code, out, err) = tollgate(&["sim", &slow]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("  marks: largest request 25.0 (last minute), 25.0 (last hour); units/s"), "{out}");
    assert!(out.contains("refused 37\npoint:"), "{out}");
    let src = std::fs::read_to_string(&burst).unwrap().replace("lend_idle = true", "lend_idle = false");
    let path = file("no-burst.toml", &src);
    let (code, out, _) = tollgate(&["sim", path.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("skewed: 80.0 units/s") && out.contains("FAILED"), "{out}");
    let (code, out, err) = tollgate(&["sim", path.to_str().unwrap(), "--seed", "2"]);
    assert_eq!(code, 2, "{out}{err}");
}

#[test]
fn sim_exits_1_when_a_phase_fails() {
    let path = file(
        "impossible.toml",
        "name = \"impossible\"\n[[group]]\nname = \"g\"\nlimit = 10\n[[client]]\ngroup = \"g\"\nrate = 5.0\n\
         [[phase]]\ntimeout_s = 5\nhold_s = 2\n[[phase.expect]]\ngroup = \"g\"\nmetric = \"target_units\"\nvalue = 99\n",
    );
    let dir = out_dir("sim-impossible");
    let (code, out, _) = tollgate(&["sim", path.to_str().unwrap(), "--out", dir.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("phase 1: failed"), "{out}");
    let summary = std::fs::read_to_string(dir.join("summary.json")).unwrap();
    assert!(summary.contains(r#"{"passed":false,"converged_s":null}"#), "{summary}");
}

/// Regressions: `tollgate sim` used the scenario's name as an output path unchecked, exited 1 for an
/// unreadable file, and accepted scenarios whose parts, each within its bound, multiplied to
/// more memory than the machine has.
#[test]
fn sim_refuses_unreadable_files_unsafe_names_and_runs_too_large_to_hold() {
    let (code, out, _) = tollgate(&["sim", "/nonexistent/scenario.toml"]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("/nonexistent/scenario.toml: cannot read the scenario"), "{out}");
    let base = "[[phase]]\n[[phase.expect]]\nmetric = \"busy_groups\"\nvalue = 0\n";
    let path = file("escape.toml", &format!("name = \"../../etc\"\n{base}"));
    let (code, out, _) = tollgate(&["sim", path.to_str().unwrap()]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains(":1: name: must be 1 to 100 letters"), "{out}");
    let huge = format!(
        "name = \"huge\"\n[[backend]]\nname = \"b\"\ncount = 10000\ncapacity = 1\n\
         [[client]]\ngroup = \"g\"\nrate = 1\ncount = 100000\n{base}"
    );
    let path = file("huge.toml", &huge);
    let (code, out, _) = tollgate(&["sim", path.to_str().unwrap()]);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains(
            "client[0].count: at most 2000000 links from clients to their backends in all, got 1000000000"
        ),
        "{out}"
    );
}

#[test]
fn a_malformed_scenario_exits_2_naming_key_and_line() {
    let path = file(
        "malformed.toml",
        "name = \"bad\"\ncost_model = \"magic\"\n[[backend]]\nname = \"b\"\n[[client]]\ngroup = \"g\"\nrate = -1\n\
         backends = [\"nowhere\"]\n[[phase]]\n[[phase.expect]]\nmetric = \"speed\"\nvalue = 1\n",
    );
    let p = path.to_str().unwrap();
    let (code, out, _) = tollgate(&["sim", p]);
    assert_eq!(code, 2, "{out}");
    for expected in [
        format!("{p}:2: cost_model: must be count, fdb, ru or couchbase, got \"magic\""),
        format!("{p}:3: backend[0].capacity: is required (units/s at utilisation 1)"),
        format!("{p}:7: client[0].rate: must be above 0, got -1"),
        format!("{p}:8: client[0].backends[0]: no backend is named \"nowhere\""),
        format!(
            "{p}:11: phase[0].expect[0].metric: must be one of total_target_rps, busy_groups, tracked_groups, got \"speed\""
        ),
    ] {
        assert!(out.contains(&expected), "missing {expected:?} in\n{out}");
    }
    assert!(!PathBuf::from("sim-out/bad").exists(), "nothing written for a malformed scenario");
}

/// `tollgate bench converge` runs the three shifts under both laws, and under the rate law with
/// the backend reporting as the server's reporter does, in virtual time, and prints one row
/// each; the rate law settles in every shift, and sooner with the reporter's fresher reports.
#[test]
fn bench_converge_prints_each_shift_under_both_laws() {
    let (code, out, err) = tollgate(&["bench", "converge"]);
    assert_eq!(code, 0, "{err}");
    let rows: Vec<&str> = out.lines().skip(1).collect();
    assert_eq!(rows.len(), 9, "{out}");
    let settled = |row: &str| -> f64 {
        let after = row[30..].trim_start();
        after.split(" s").next().unwrap().parse().unwrap_or_else(|_| panic!("not settled: {row}"))
    };
    for shift in ["demand step", "quota lifted", "capacity cut"] {
        let rate = rows.iter().find(|r| r.starts_with(shift) && r.contains(" rate  ")).expect(shift);
        let reporter =
            rows.iter().find(|r| r.starts_with(shift) && r.contains(" rate, reporter ")).expect(shift);
        assert!(settled(reporter) <= settled(rate), "{out}");
        assert!(rows.iter().any(|r| r.starts_with(shift) && r.contains(" multiplicative ")), "{out}");
    }
    // The same seed, the same figures: the runs are in virtual time.
    assert_eq!(tollgate(&["bench", "converge"]).1, out);
    let (code, _, err) = tollgate(&["bench", "converge", "--seed", "x"]);
    assert_eq!(code, 2);
    assert!(err.contains("--seed"), "{err}");
}

#[test]
fn ramp_prints_each_epoch_as_the_design_tables_do() {
    // Numaflow's go_back_n table with gaps (cool-down 1 s, ramp-down 50 %).
    let usage = "10,20,20,20,20,20,30,30,30,30,20,20,30,40,50,60,70,-,-,60,70,80,90,100,110,110";
    let (code, out, err) = tollgate(&[
        "ramp",
        "--mode",
        "go-back-n",
        "--min",
        "10",
        "--max",
        "110",
        "--duration",
        "10",
        "--threshold",
        "100",
        "--cool-down",
        "1",
        "--ramp-down",
        "50",
        "--usage",
        usage,
    ]);
    assert_eq!(code, 0, "{err}");
    let pools: Vec<&str> = out.lines().map(|l| l.split(' ').nth(1).unwrap()).collect();
    assert_eq!(
        pools,
        [
            "10", "20", "30", "20", "30", "20", "30", "40", "30", "40", "30", "20", "30", "40", "50", "60",
            "70", "-", "-", "60", "70", "80", "90", "100", "110", "110"
        ]
    );
    assert_eq!(out.lines().nth(17), Some("18 - -"));
    // Use is capped at the pool.
    let (_, out, _) = tollgate(&[
        "ramp",
        "--mode",
        "scheduled",
        "--min",
        "10",
        "--max",
        "20",
        "--duration",
        "1",
        "--usage",
        "50,50",
    ]);
    assert_eq!(out, "1 10 10\n2 20 20\n");
}

/// The words of `line`, as a shell would split them.
fn words(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

#[test]
fn ramp_draws_a_chart_and_names_bad_arguments() {
    let chart = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ramp.png");
    let (code, _, err) = tollgate(&[
        "ramp",
        "--mode",
        "relaxed",
        "--min",
        "1",
        "--max",
        "5",
        "--duration",
        "4",
        "--usage",
        "1,2,-,3",
        "--chart",
        chart.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(&std::fs::read(&chart).unwrap()[..4], b"\x89PNG");
    let (code, _, err) = tollgate(&words("ramp --mode relaxed --min 20 --max 10 --duration 0 --usage 1"));
    assert_ne!(code, 0);
    assert!(err.contains("--min: must not exceed") && err.contains("--duration: must be above 0"), "{err}");
    let (code, _, err) =
        tollgate(&words("ramp --mode only-if-used --min 1 --max 2 --duration 1 --threshold 0 --usage 1"));
    assert_ne!(code, 0);
    assert!(err.contains("--threshold: must be above 0 and at most 100, got 0"), "{err}");
    let (code, _, err) = tollgate(&words("ramp --mode relaxed --min 1 --max 2 --duration 1 --usage 1,lots"));
    assert_ne!(code, 0);
    assert!(err.contains("--usage: entry 2 must be a number of tokens or `-`, got \"lots\""), "{err}");
    let (code, _, err) = tollgate(&words("ramp --mode sideways --min 1 --max 2 --duration 1 --usage 1"));
    assert_ne!(code, 0);
    assert!(err.contains("invalid value 'sideways'"), "{err}");
}

/// Regressions: `check-config` panicked on a huge duration; accepted a go_back_n ramp with a
/// cool-down of 0, which then held the pool at its minimum for ever; and accepted an fcfs
/// file with a budget that the client then refused. What it accepts, the limiter builds.
#[test]
fn check_config_reports_what_the_limiter_would_refuse_and_accepts_what_it_builds() {
    let path = file(
        "durations.toml",
        "[groups.a]\nlimit = 10\n[groups.a.ramp]\nmin = 1\nmax = 5\nduration_s = 1e20\n\
         [groups.b]\nlimit = 10\n[groups.b.ramp]\nmin = 1\nmax = 5\nduration_s = 10\nmode = \"go_back_n\"\ncool_down_s = 0\n",
    );
    let (code, out, err) = tollgate(&["check-config", path.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.is_empty(), "no panic: {err}");
    assert!(
        out.contains(
            ":6: groups.a.ramp.duration_s: must be at most 31536000 seconds, got 100000000000000000000"
        ),
        "{out}"
    );
    assert!(out.contains("groups.b.ramp.cool_down_s: must be at least 1 in go_back_n mode"), "{out}");

    let fcfs = "[node]\nmode = \"fcfs\"\ncapacity = 100\n[groups.a]\nreserved = 10\nbudget = 500\nburst = 20\n\
                [groups.a.ramp]\nmin = 1\nmax = 50\nduration_s = 10\n";
    let path = file("fcfs.toml", fcfs);
    let (code, out, _) = tollgate(&["check-config", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    tollgate_limiter::Tollgate::from_toml(fcfs).expect("what check-config accepts, the limiter builds");
}

#[test]
fn calibrate_recovers_the_examples_coefficients_and_its_snippet_checks() {
    let csv = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/calibration.csv");
    let (code, out, err) = tollgate(&["calibrate", csv, "--observed", "busy_us"]);
    assert_eq!(code, 0, "{err}");
    // The file was made from read_base 30, write_base 90, read_per_byte 0.004,
    // write_per_byte 0.02 and per_cpu_ms 55, with 5 % noise.
    let value = |key: &str| -> f64 {
        let line =
            out.lines().find(|l| l.starts_with(&format!("{key} = "))).unwrap_or_else(|| panic!("{out}"));
        line[key.len() + 3..].parse().unwrap()
    };
    for (key, want) in [
        ("read_base", 30.0),
        ("write_base", 90.0),
        ("read_per_byte", 0.004),
        ("write_per_byte", 0.02),
        ("per_cpu_ms", 55.0),
    ] {
        let got = value(key);
        assert!((got - want).abs() / want < 0.05, "{key}: {got} for {want}\n{out}");
    }
    assert!(out.contains("R² 0.99"), "{out}");
    let snippet = file("calibrated.toml", &out[out.find("[cost]").unwrap()..]);
    let (code, out, _) = tollgate(&["check-config", snippet.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");

    // Data that cannot be fitted: the reason, exit 1.
    let mut rows = String::from("reads,read_bytes,observed\n");
    for i in 1..30 {
        rows.push_str(&format!("{i},{},{}\n", i * 4096, i * 7));
    }
    let bad = file("collinear.csv", &rows);
    let (code, _, err) = tollgate(&["calibrate", bad.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(err.contains("cannot fit: read_bytes is (almost) a combination of reads"), "{err}");
    let (code, _, err) = tollgate(&["calibrate", csv]);
    assert_eq!(code, 1);
    assert!(err.contains("column \"busy_us\" is not one the model knows"), "{err}");
}

#[test]
fn the_most_groups_a_server_tracks_is_range_checked() {
    let data = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("max-groups-never-made");
    for n in ["0", "1000001"] {
        let dir = data.to_str().unwrap();
        let (code, _, err) = tollgate(&["server", "--data", dir, "--max-groups", n]);
        assert_eq!(code, 2, "{err}");
        assert!(err.contains("--max-groups") && err.contains("not in 1..=1000000"), "{err}");
        assert!(!data.exists());
    }
}

#[test]
fn server_knobs_out_of_range_are_named_before_anything_starts() {
    for (args, message) in [
        (
            vec!["--queue-spring-bytes", "9e8"],
            "--queue-spring-bytes: must be above 0 and at most --queue-target-bytes (800000000), got 900000000",
        ),
        (vec!["--queue-target-bytes", "0"], "--queue-target-bytes: must be above 0 and at most 1e18, got 0"),
        (vec!["--cost-folding-s", "0"], "--cost-folding-s: must be from 0.1 to 600 seconds, got 0"),
        (
            vec!["--limiting-threshold", "1e16"],
            "--limiting-threshold: must be from 0 to 1e15 units/s, got 10000000000000000",
        ),
    ] {
        let data = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("knobs-never-made");
        let mut all = vec![
            "server",
            "--data",
            data.to_str().unwrap(),
            "--grpc",
            "127.0.0.1:0",
            "--http",
            "127.0.0.1:0",
        ];
        all.extend(args);
        let (code, _, err) = tollgate(&all);
        assert_eq!(code, 1, "{all:?}");
        assert!(err.contains(message), "{all:?}: {err}");
        assert!(!data.exists());
    }
}

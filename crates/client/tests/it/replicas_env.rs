//! Replicas mode reads its count from `TOLLGATE_REPLICAS` when none is given. The test runs
//! this binary again with the variable set, so no test changes its own environment.

use std::process::Command;

use tollgate_limiter::Tollgate;
use tollgate_model::config::Config;

fn config() -> Config {
    Config::parse("[groups.g]\nlimit = 900\n").unwrap()
}

/// Run by the test below in a child process, with `TOLLGATE_REPLICAS` set: prints what the
/// handle says.
#[test]
fn child_reads_the_count() {
    let Ok(value) = std::env::var("TOLLGATE_REPLICAS") else { return };
    match Tollgate::replicas(config(), None) {
        Ok(gate) => println!("RESULT size {}", gate.store_status().unwrap().groups[0].size),
        Err(e) => println!("RESULT error {e} ({value})"),
    }
}

fn child(value: &str) -> String {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "replicas_env::child_reads_the_count", "--nocapture", "--test-threads", "1"])
        .env("TOLLGATE_REPLICAS", value)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.split_once("RESULT ").map(|(_, r)| r))
        .unwrap_or_else(|| panic!("{text}"))
        .to_string()
}

#[test]
fn the_replica_count_comes_from_the_environment() {
    if std::env::var("TOLLGATE_REPLICAS").is_ok() {
        return;
    }
    let missing = Tollgate::replicas(config(), None).unwrap_err();
    assert!(
        missing.to_string().contains("replicas: give the replica count, or set TOLLGATE_REPLICAS"),
        "{missing}"
    );
    assert_eq!(child("3"), "size 3");
    assert!(
        child("three").contains("TOLLGATE_REPLICAS: must be a whole number from 1 to 100000, got \"three\"")
    );
    assert!(child("0").contains("replicas: must be from 1 to 100000, got 0"));
}

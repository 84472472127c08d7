//! What ships beside the binary for running it: the systemd unit under `deploy/systemd/`,
//! checked by systemd's own analyzer and its command line run for real.

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use common::{BIN, data_dir, http};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The unit as shipped, its `ExecStart` pointed at the binary under test.
fn unit_here(dir: &std::path::Path) -> PathBuf {
    let text = std::fs::read_to_string(repo().join("deploy/systemd/tollgate.service")).unwrap();
    let path = dir.join("tollgate.service");
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(&path, text.replace("/usr/local/bin/tollgate", BIN)).unwrap();
    path
}

/// The value of `key` in the unit's `[Service]` section (the last, as systemd takes it).
fn service_value(text: &str, key: &str) -> Option<String> {
    let service = text.split("\n[Service]\n").nth(1)?.split("\n[").next()?;
    service.lines().rev().find_map(|l| l.strip_prefix(&format!("{key}="))).map(str::to_string)
}

#[test]
fn the_systemd_unit_verifies_and_is_sandboxed() {
    let dir = data_dir("systemd-unit");
    let unit = unit_here(&dir);
    let out =
        Command::new("systemd-analyze").arg("verify").arg(&unit).output().expect("systemd-analyze runs");
    let said = String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    // Verify only warns of an unknown key: every word it says counts.
    assert!(out.status.success() && said.trim().is_empty(), "systemd-analyze verify:\n{said}");
    let text = std::fs::read_to_string(&unit).unwrap();
    for (key, want) in [
        ("DynamicUser", "yes"),
        ("StateDirectory", "tollgate"),
        ("ProtectSystem", "strict"),
        ("NoNewPrivileges", "yes"),
        ("CapabilityBoundingSet", ""),
        ("PrivateTmp", "yes"),
    ] {
        assert_eq!(service_value(&text, key).as_deref(), Some(want), "{key}");
    }
    // systemd's own measure of what the service is exposed to, from 0 (nothing) to 10.
    let out = Command::new("systemd-analyze")
        .args(["security", "--offline=yes", "--threshold=20"])
        .arg(&unit)
        .output()
        .expect("systemd-analyze runs");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "exposure above 2.0:\n{report}");
    let level = report.lines().find(|l| l.contains("Overall exposure level")).expect("a level");
    println!("{level}");
}

/// A unit with an unknown key or a missing binary is caught: the check above can fail.
#[test]
fn a_unit_with_a_typo_or_no_binary_is_caught() {
    let dir = data_dir("systemd-typo");
    let unit = unit_here(&dir);
    let text = std::fs::read_to_string(&unit).unwrap();
    for broken in [
        text.replace("ProtectSystem=strict", "ProtectSytem=strict"),
        text.replace(BIN, "/nonexistent/tollgate"),
    ] {
        std::fs::write(&unit, broken).unwrap();
        let out = Command::new("systemd-analyze").arg("verify").arg(&unit).output().unwrap();
        assert!(!out.status.success() || !out.stderr.is_empty(), "a broken unit passed");
    }
}

/// The unit's `ExecStart`, run as written (the state directory and ports made this test's
/// own), serves: the command line the unit gives is one the server takes.
#[test]
fn the_units_command_line_serves() {
    let text = std::fs::read_to_string(repo().join("deploy/systemd/tollgate.service")).unwrap();
    let exec = service_value(&text, "ExecStart").expect("ExecStart");
    let mut words = exec.split_whitespace();
    assert_eq!(words.next(), Some("/usr/local/bin/tollgate"));
    let data = data_dir("systemd-run");
    let args: Vec<String> = words
        .map(|w| match w {
            "/var/lib/tollgate" => data.to_str().unwrap().to_string(),
            w if w.starts_with("127.0.0.1:") => "127.0.0.1:0".to_string(),
            w => w.to_string(),
        })
        .collect();
    assert!(args.iter().any(|a| a == "--data"), "{exec}");
    let mut child =
        Command::new(BIN).args(&args).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let words: Vec<&str> = line.split_whitespace().collect();
    let (code, _, body) = http(words[6], "GET", "/healthz", &[], "");
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!((code, body.trim()), (200, "ok"), "{line}");
    assert!(data.join(tollgate_server::store::FILE_NAME).exists(), "the store is in the state directory");
}

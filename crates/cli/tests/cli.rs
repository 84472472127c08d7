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
                "{p}:10: groups.b.colour: unknown field; expected one of reserved, limit, burst, priority, weight, budget, ramp"
            )
            .as_str(),
            "4 problems found; nothing applied",
        ]
    );
}

#[test]
fn a_missing_file_is_a_clear_error() {
    let (code, _, err) = tollgate(&["check-config", "/nonexistent/tollgate.toml"]);
    assert_ne!(code, 0);
    assert!(err.contains("cannot read settings file /nonexistent/tollgate.toml"), "{err}");
}

//! Every shell command README.md and docs/*.md show, run as written, in order, against the
//! real server: a command the docs show cannot rot.
//!
//! Each file's `sh` blocks run in a sandbox of their own (a copy of `examples/`,
//! `scenarios/` and `deploy/`), one logical command at a time (lines ending in `\` joined), through bash,
//! with `tollgate` on the `PATH`. The environment a command exports carries to the next. A
//! server is running on free loopback ports before the first command; the docs' default ports
//! (7460 for gRPC, 7461 for HTTP) are read as those. `tollgate server …` in the docs replaces
//! it: the same command, on those ports and in the sandbox, left running for the commands
//! after it (its data in the sandbox's `tollgate-data`, as by default). Each command must exit 0;
//! one still running after five minutes is stopped and fails (a bound for a stuck command, not
//! a timing: the slowest, 200 simulated seeds, takes about half a minute in a debug build).
//!
//! `cargo run -p tollgate-cli -- ARGS` runs as `tollgate ARGS`. Commands of a few kinds are
//! not run here, each because another test runs it: see [`not_here`].

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::common;
use common::{BIN, free_port};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Why a command is not run here, if it is one of those kinds.
fn not_here(cmd: &str) -> Option<&'static str> {
    let first = cmd.split_whitespace().next().unwrap_or_default();
    match first {
        "cargo" => Some("builds and runs through cargo: the test command itself does"),
        "./scripts/test.sh" => Some("the test command: this test is part of it"),
        "sudo" => {
            Some("installs or starts system services: crates/cli/tests/it/deploy.rs checks what they install")
        }
        "etcd" | "for" | "done" => Some("controllers on etcd: crates/cli/tests/it/etcd.rs runs them"),
        "envoy" => Some("Envoy with examples/envoy/envoy.yaml: crates/cli/tests/it/envoy.rs runs that file"),
        "scripts/release.sh" => {
            Some("builds a release: crates/cli/tests/it/deploy.rs runs the script and the archive")
        }
        "scripts/image.sh" | "podman" => Some(
            "builds or runs the image: crates/cli/tests/it/deploy.rs builds it and runs its root file system",
        ),
        "python3" if cmd.contains("pip install") => Some(
            "installs the Python client: scripts/test.sh builds its wheel and installs it in a fresh environment",
        ),
        "kubectl" => Some(
            "needs a cluster: crates/cli/tests/it/deploy.rs validates the manifests and runs their pods' arguments",
        ),
        _ if cmd.contains("-x86_64-linux") => {
            Some("the release archive: crates/cli/tests/it/deploy.rs checks, unpacks and runs it")
        }
        _ if cmd.contains("--etcd") || cmd.contains(":7470") || cmd.contains(":7560") => {
            Some("controllers on etcd: crates/cli/tests/it/etcd.rs runs them")
        }
        _ if cmd.contains(":7480") => Some("examples/kv-service: crates/cli/tests/e2e.rs runs it"),
        _ => None,
    }
}

/// The logical commands of a file's `sh` blocks, block by block: (line, command), comments
/// and blank lines left out, continuation lines joined.
fn commands(text: &str) -> Vec<Vec<(usize, String)>> {
    let mut blocks = Vec::new();
    let mut out = Vec::new();
    let mut in_sh = false;
    let mut pending: Option<(usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if let Some(fence) = trimmed.strip_prefix("```") {
            if in_sh && !out.is_empty() {
                blocks.push(std::mem::take(&mut out));
            }
            in_sh = !in_sh && fence.trim() == "sh";
            continue;
        }
        if !in_sh {
            continue;
        }
        // Inside a quoted argument a `#` is text; bash drops a comment after it.
        let inside = pending.as_ref().is_some_and(|(_, c)| quote_open(c));
        let code = if inside { line } else { strip_comment(line) };
        let code = code.trim_end();
        if code.trim().is_empty() && pending.is_none() {
            continue;
        }
        let (start, mut cmd) = pending.take().unwrap_or((i + 1, String::new()));
        match code.strip_suffix('\\') {
            Some(part) => {
                cmd.push_str(part.trim());
                cmd.push(' ');
                pending = Some((start, cmd));
            }
            None if quote_open(&format!("{cmd}{code}")) => {
                // A quoted argument over several lines goes on.
                cmd.push_str(code.trim());
                cmd.push('\n');
                pending = Some((start, cmd));
            }
            None => {
                cmd.push_str(code.trim());
                if !cmd.trim().is_empty() {
                    out.push((start, cmd.trim().to_string()));
                }
            }
        }
    }
    blocks
}

/// Whether `text` ends inside a quoted string.
fn quote_open(text: &str) -> bool {
    let (mut single, mut double) = (false, false);
    for c in text.chars() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            _ => {}
        }
    }
    single || double
}

/// `line` without a trailing `# comment` (a `#` after a space, outside quotes).
fn strip_comment(line: &str) -> &str {
    let (mut single, mut double) = (false, false);
    let mut prev = ' ';
    for (i, c) in line.char_indices() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '#' if !single && !double && prev.is_whitespace() => return &line[..i],
            _ => {}
        }
        prev = c;
    }
    line
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}

/// The `tollgate` the docs' commands find on their `PATH`: the binary under test, except that
/// `tollgate server` stops the sandbox's running server and starts the one the command asks
/// for on the sandbox's ports (unless it names its own), leaving it running.
fn wrapper(sandbox: &Path, grpc: u16, http: u16) -> String {
    let s = sandbox.display();
    format!(
        r#"#!/usr/bin/env bash
set -euo pipefail
if [ "${{1:-}}" != server ]; then exec "{BIN}" "$@"; fi
shift
args=("$@")
has() {{ local a; for a in "${{args[@]}}"; do [ "$a" = "$1" ] && return 0; done; return 1; }}
has --grpc || args+=(--grpc 127.0.0.1:{grpc})
has --http || args+=(--http 127.0.0.1:{http})
if [ -f "{s}/server.pid" ]; then
  kill "$(cat "{s}/server.pid")" 2>/dev/null || true
  while kill -0 "$(cat "{s}/server.pid")" 2>/dev/null; do sleep 0.05; done
  rm -f "{s}/server.pid"
fi
: > "{s}/server.out"
"{BIN}" server "${{args[@]}}" > "{s}/server.out" 2> "{s}/server.err" < /dev/null &
pid=$!
for _ in $(seq 600); do
  if grep -q "listening" "{s}/server.out"; then echo $pid > "{s}/server.pid"; cat "{s}/server.out"; exit 0; fi
  if ! kill -0 $pid 2>/dev/null; then cat "{s}/server.err" >&2; exit 1; fi
  sleep 0.05
done
echo "the server did not start within 30 s" >&2
kill $pid
exit 1
"#
    )
}

/// Runs every command of `file` (relative to the repository); the commands not run here, with
/// why.
fn run_file(file: &str) -> Vec<String> {
    let text = std::fs::read_to_string(repo().join(file)).unwrap();
    let sandbox = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("docs-{}", file.replace('/', "-")));
    let _ = std::fs::remove_dir_all(&sandbox);
    copy_dir(&repo().join("examples"), &sandbox.join("examples"));
    copy_dir(&repo().join("scenarios"), &sandbox.join("scenarios"));
    copy_dir(&repo().join("deploy"), &sandbox.join("deploy"));
    std::fs::create_dir_all(sandbox.join("docs/assets")).unwrap();
    std::fs::create_dir_all(sandbox.join("bin")).unwrap();
    let (grpc, http) = (free_port(), free_port());
    let tollgate = sandbox.join("bin/tollgate");
    std::fs::write(&tollgate, wrapper(&sandbox, grpc, http)).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&tollgate, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!("{}:{}", sandbox.join("bin").display(), std::env::var("PATH").unwrap_or_default());
    let state = sandbox.join("env.sh");
    std::fs::write(&state, format!("export TOLLGATE_SERVER=http://127.0.0.1:{grpc}\n")).unwrap();
    let run = |cmd: &str| {
        let script = format!(
            "set -eo pipefail\nsource {state}\n{cmd}\nexport -p | grep -E '^declare -x (TOLLGATE_[A-Z_]+)=' > {state}.new; mv {state}.new {state}\n",
            state = state.display()
        );
        Command::new("timeout")
            .args(["300", "bash", "-c", &script])
            .current_dir(&sandbox)
            .env("PATH", &path)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    // A server for the commands that assume one runs.
    let started = run("tollgate server");
    assert!(started.status.success(), "{}", String::from_utf8_lossy(&started.stderr));
    let mut skipped = Vec::new();
    for block in commands(&text) {
        // A block that starts etcd and controllers on it is a whole that another test runs.
        let etcd = block.iter().find(|(_, c)| c.starts_with("etcd ")).and_then(|(_, c)| not_here(c));
        for (line, cmd) in block {
            if let Some(why) = etcd {
                skipped.push(format!("{file}:{line}: {cmd} ({why})"));
                continue;
            }
            run_command(file, line, &cmd, &sandbox, (grpc, http), &run, &mut skipped);
        }
    }
    if let Ok(pid) = std::fs::read_to_string(sandbox.join("server.pid")) {
        let _ = Command::new("kill").arg(pid.trim()).status();
    }
    skipped
}

/// Runs one command of `file` with `run`, its ports and paths made the sandbox's; or notes why
/// it is not run here.
fn run_command(
    file: &str,
    line: usize,
    cmd: &str,
    sandbox: &Path,
    (grpc, http): (u16, u16),
    run: &dyn Fn(&str) -> std::process::Output,
    skipped: &mut Vec<String>,
) {
    {
        // `cargo run -p tollgate-cli -- ARGS` is `tollgate ARGS`, built.
        let cmd = ["cargo run --release -p tollgate-cli -- ", "cargo run -p tollgate-cli -- "]
            .iter()
            .find_map(|p| cmd.strip_prefix(p).map(|rest| format!("tollgate {rest}")))
            .unwrap_or_else(|| cmd.to_string());
        let cmd = cmd
            .replace("target/release/tollgate", "tollgate")
            .replace("127.0.0.1:7460", &format!("127.0.0.1:{grpc}"))
            .replace("127.0.0.1:7461", &format!("127.0.0.1:{http}"))
            .replace("localhost:7461", &format!("127.0.0.1:{http}"))
            .replace("/var/lib/tollgate", &sandbox.join("var-lib-tollgate").display().to_string());
        let cmd = cmd.strip_suffix('&').map_or(cmd.as_str(), str::trim_end).to_string();
        if let Some(why) = not_here(&cmd) {
            skipped.push(format!("{file}:{line}: {cmd} ({why})"));
            return;
        }
        let out = run(&cmd);
        let _ = writeln!(std::io::stderr(), "{file}:{line}: {cmd}\n{}", String::from_utf8_lossy(&out.stdout));
        assert!(
            out.status.success(),
            "{file}:{line}: `{cmd}` failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn commands_are_read_as_a_reader_would_type_them() {
    let text = "text\n```sh\ntollgate a   # a comment\n# a line of comment\n\ntollgate b \\\n  --c 'x # y'\n\
                tollgate c \"one;\n  two\"\n```\n```text\nnot run\n```\n";
    assert_eq!(
        commands(text),
        vec![vec![
            (3, "tollgate a".to_string()),
            (6, "tollgate b --c 'x # y'".to_string()),
            (8, "tollgate c \"one;\ntwo\"".to_string()),
        ]]
    );
}

#[test]
fn every_command_in_the_readme_and_the_docs_runs() {
    let mut files = vec!["README.md".to_string()];
    let mut docs: Vec<String> = std::fs::read_dir(repo().join("docs"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    docs.sort();
    files.extend(docs);
    let mut skipped = Vec::new();
    for file in &files {
        skipped.extend(run_file(file));
    }
    let _ = writeln!(std::io::stderr(), "not run here ({}):\n{}", skipped.len(), skipped.join("\n"));
}

//! What the integration tests share: the binary, starting a server, admin commands.

// Each test crate uses its own part of this module.
#![allow(dead_code)]

pub mod envoy;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The `tollgate` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_tollgate");

/// `tollgate server` on `data`, gRPC on `grpc`, HTTP on any free loopback port.
pub fn server_command(data: &Path, grpc: &str) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(["server", "--data", data.to_str().unwrap(), "--grpc", grpc, "--http", "127.0.0.1:0"]);
    cmd
}

/// Runs an admin command against the server at `url`, which must succeed.
pub fn admin(url: &str, args: &[&str]) {
    let out = Command::new(BIN).args(args).env("TOLLGATE_SERVER", url).output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A running `tollgate server`, killed when dropped.
pub struct ServerProc {
    pub child: Child,
    pub grpc: String,
    pub http: String,
}

impl ServerProc {
    pub fn start(data: &Path) -> ServerProc {
        Self::start_with(data, &[], Stdio::null())
    }

    /// With extra flags, its log going to `stderr`.
    pub fn start_with(data: &Path, flags: &[&str], stderr: Stdio) -> ServerProc {
        Self::start_at(data, "127.0.0.1:0", flags, stderr)
    }

    /// With gRPC on `grpc` (an address such as `127.0.0.1:7460`, so that a restarted server
    /// is found where the last one was).
    pub fn start_at(data: &Path, grpc: &str, flags: &[&str], stderr: Stdio) -> ServerProc {
        let mut child = server_command(data, grpc)
            .args(flags)
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        // "tollgate server listening: grpc ADDR http ADDR data DIR"
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(&words[..3], ["tollgate", "server", "listening:"], "{line}");
        ServerProc { child, grpc: words[4].to_string(), http: words[6].to_string() }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.grpc)
    }

    /// SIGTERM, and the exit status.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().unwrap();
        let status = self.child.wait().unwrap();
        std::mem::forget(self);
        status
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A fresh directory for a test's data.
pub fn data_dir(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("server-{name}"));
    let _ = std::fs::remove_dir_all(&d);
    d
}

pub use tollgate_testkit::port::free_port;

/// Polls `done` every 100 ms for up to a minute; panics naming `what` if it never holds.
pub fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..600 {
        if done() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("never happened: {what}");
}

/// The value of the metric `name` (a single sample, no labels) on the server at HTTP `addr`.
pub fn metric(addr: &str, name: &str) -> f64 {
    try_metric(addr, name).unwrap_or_else(|| panic!("no metric {name}"))
}

/// [`metric`], or `None` while the server has no sample of it.
pub fn try_metric(addr: &str, name: &str) -> Option<f64> {
    let (_, _, body) = http(addr, "GET", "/metrics", &[], "");
    body.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
}

/// The value of the metric `name` with the labels `labels` (`file="…"`, as the page writes
/// them) on the server at HTTP `addr`, if it has that sample.
pub fn metric_of(addr: &str, name: &str, labels: &str) -> Option<f64> {
    let (_, _, body) = http(addr, "GET", "/metrics", &[], "");
    let prefix = format!("{name}{{{labels}}} ");
    body.lines().find_map(|l| l.strip_prefix(&prefix)).and_then(|v| v.trim().parse().ok())
}

/// One HTTP/1.1 request over plain TCP with `headers` and `body`: the status, the head (lower
/// case) and the body.
pub fn http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let extra: String = headers.iter().map(|(k, v)| format!("{k}: {v}\r\n")).collect();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\n{extra}content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let head = head.to_lowercase();
    let body = if head.contains("transfer-encoding: chunked") { dechunk(rest) } else { rest.to_string() };
    (code, head, body)
}

/// A body sent in chunks (a long answer is written a chunk at a time), put back together.
pub fn dechunk(mut rest: &str) -> String {
    let mut body = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        body.push_str(&after[..n]);
        rest = &after[n + 2..];
    }
    body
}

/// Waits, when the wall clock is in the last 15 s of a minute, for the next minute: the
/// quota windows are calendar minutes, and what follows must fall within one.
pub fn within_one_minute() {
    #[allow(clippy::disallowed_methods)]
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    let into = now.as_millis() % 60_000;
    if into > 45_000 {
        std::thread::sleep(std::time::Duration::from_millis(u64::try_from(60_000 - into).unwrap() + 200));
    }
}

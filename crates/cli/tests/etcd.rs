//! Settings in a real etcd, shared by real `tollgate server` processes (built with the `etcd`
//! feature, as the test command builds them).
#![cfg(feature = "etcd")]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tollgate_testkit::etcd::Etcd;

mod common;
use common::{BIN, admin};

struct Killed(Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn server(etcd: &str, prefix: &str) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args([
        "server",
        "--etcd",
        etcd,
        "--etcd-prefix",
        prefix,
        "--grpc",
        "127.0.0.1:0",
        "--http",
        "127.0.0.1:0",
    ]);
    cmd
}

/// Starts a controller; it and its gRPC URL.
fn start(etcd: &str, prefix: &str) -> (Killed, String) {
    let mut child = server(etcd, prefix).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let addr =
        line.split_whitespace().nth(4).unwrap_or_else(|| panic!("listening line: {line:?}")).to_string();
    (Killed(child), format!("http://{addr}"))
}

fn output(url: &str, args: &[&str]) -> String {
    let out = Command::new(BIN).args(args).env("TOLLGATE_SERVER", url).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// Waits (up to a minute: a bound for a stuck test, not a timing assertion) until `done`.
fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..600 {
        if done() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("never happened: {what}");
}

#[test]
fn controllers_on_one_etcd_share_every_setting_and_keep_it_across_a_kill() {
    let etcd = Etcd::start("shared");
    let (a, a_url) = start(&etcd.url(), "/tollgate");
    let (_b, b_url) = start(&etcd.url(), "/tollgate");
    // A change through either controller is acknowledged once etcd has it, and the other one
    // sees it through its watch.
    admin(&a_url, &["group", "create", "shared", "--limit", "500", "--backend-limit", "50"]);
    eventually("b sees the group", || output(&b_url, &["group", "show", "shared"]).contains("limit:    500"));
    admin(&b_url, &["node", "capacity", "900"]);
    eventually("a sees the capacity", || {
        output(&a_url, &["status", "--json"]).contains("\"capacity\":900.0")
    });
    admin(&b_url, &["group", "alter", "shared", "--limit", "700"]);
    eventually("a sees the change", || {
        output(&a_url, &["group", "show", "shared"]).contains("limit:    700")
    });

    // kill -9 one controller and start it again: everything is still there.
    drop(a);
    let (_a, a_url) = start(&etcd.url(), "/tollgate");
    let shown = output(&a_url, &["group", "show", "shared"]);
    assert!(shown.contains("limit:    700") && shown.contains("at most 50 units/s"), "{shown}");
    assert!(output(&a_url, &["status", "--json"]).contains("\"capacity\":900.0"));

    // A drop through one is seen by the other.
    admin(&b_url, &["group", "drop", "shared"]);
    eventually("a sees the drop", || output(&a_url, &["group", "show", "shared"]).contains("does not exist"));

    // Another prefix is another set of settings.
    let (_c, c_url) = start(&etcd.url(), "/elsewhere");
    assert!(output(&c_url, &["status", "--json"]).contains("\"capacity\":null"));
}

#[test]
fn a_bad_or_unreachable_etcd_and_a_foreign_prefix_are_refused_clearly() {
    let etcd = Etcd::start("refusals");
    let run = |args: &[&str]| {
        let out = Command::new(BIN).args(args).output().unwrap();
        assert!(!out.status.success(), "{args:?} started");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    // A prefix holding keys that are not Tollgate's.
    let put = Command::new("etcdctl")
        .args(["--endpoints", &etcd.url(), "put", "/theirs/config", "x"])
        .env("ETCDCTL_API", "3")
        .output()
        .unwrap();
    assert!(put.status.success(), "{}", String::from_utf8_lossy(&put.stderr));
    let base = ["server", "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0", "--etcd"];
    let err = run(&[&base[..], &[etcd.url().as_str(), "--etcd-prefix", "/theirs"]].concat());
    assert!(err.contains("prefix /theirs: the prefix holds keys that are not Tollgate's"), "{err}");
    // Nothing of theirs was touched.
    let got = Command::new("etcdctl")
        .args(["--endpoints", &etcd.url(), "get", "--prefix", "/theirs", "--keys-only"])
        .env("ETCDCTL_API", "3")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&got.stdout).split_whitespace().collect::<Vec<_>>(),
        ["/theirs/config"]
    );
    // Nobody listening: a clear error within the bounded wait, not a hang.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let err = run(&[&base[..], &[format!("http://127.0.0.1:{port}").as_str()]].concat());
    assert!(err.contains(&format!("etcd http://127.0.0.1:{port} prefix /tollgate: cannot connect")), "{err}");
    // Malformed flags name the flag and the rule.
    let err = run(&[&base[..], &["127.0.0.1:2379"]].concat());
    assert!(err.contains("--etcd: \"127.0.0.1:2379\" must be an http:// URL"), "{err}");
    let err = run(&[&base[..], &[etcd.url().as_str(), "--etcd-prefix", "nope/"]].concat());
    assert!(err.contains("--etcd-prefix: \"nope/\" must start with /"), "{err}");
}

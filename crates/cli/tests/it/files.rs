//! Settings files a server follows (`--config`, `--import`): changes applied as they come and
//! on SIGHUP, through the audited path, a bad file refused whole while the running settings
//! stay, and each file's revision and state in status, `/readyz` and the metrics.

use std::process::{Command, Stdio};

use crate::common::{BIN, ServerProc, data_dir, eventually, http, metric_of};

fn tollgate(s: &ServerProc, args: &[&str]) -> String {
    let out = Command::new(BIN).args(args).env("TOLLGATE_SERVER", s.url()).output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn status(s: &ServerProc) -> serde_json::Value {
    serde_json::from_str(&tollgate(s, &["status", "--json"])).unwrap()
}

fn file_status(s: &ServerProc, kind: &str) -> serde_json::Value {
    status(s)["settings_files"].as_array().unwrap().iter().find(|f| f["kind"] == kind).cloned().unwrap()
}

#[test]
fn followed_files_apply_their_changes_refuse_a_bad_one_whole_and_say_so() {
    let dir = data_dir("followed");
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("tollgate.toml");
    let limits = dir.join("ratelimit.yaml");
    std::fs::write(&config, "[groups.a]\nlimit = 10\n\n[groups.gone]\nlimit = 5\n").unwrap();
    std::fs::write(&limits, "domain: shop\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: minute, requests_per_unit: 20}\n").unwrap();
    let import = format!("envoy-ratelimit={}", limits.display());
    let s = ServerProc::start_with(
        &dir.join("data"),
        &["--config", config.to_str().unwrap(), "--import", &import],
        Stdio::null(),
    );
    // At start: the settings file fills the store, the import file answers its domain.
    assert!(tollgate(&s, &["group", "show", "a"]).contains("limit:    10\n"));
    let text = tollgate(&s, &["status"]);
    assert!(text.contains("rls domain shop: envoy/ratelimit descriptor tree (1)"), "{text}");
    let first = file_status(&s, "config")["revision"].as_str().unwrap().to_string();
    // A change: what changed applies, what left goes, in the audit under the file's name.
    std::fs::write(&config, "[groups.a]\nlimit = 20\n\n[groups.b]\nlimit = 7\n").unwrap();
    eventually("the settings file's change applied", || {
        tollgate(&s, &["group", "show", "a"]).contains("limit:    20\n")
    });
    assert!(tollgate(&s, &["group", "show", "b"]).contains("limit:    7\n"));
    assert!(
        !tollgate(&s, &["group", "list"]).lines().any(|l| l.starts_with("gone ")),
        "dropped with the file's line"
    );
    let audit = tollgate(&s, &["audit"]);
    assert!(audit.contains(&format!("file {}", config.display())), "{audit}");
    let second = file_status(&s, "config")["revision"].as_str().unwrap().to_string();
    assert_ne!(first, second);
    // A bad file: refused whole, its line named, the running settings kept.
    std::fs::write(&config, "[groups.a]\nlimit = 30\n\n[groups.b]\nlimit = -1\n").unwrap();
    eventually("the bad file refused", || file_status(&s, "config")["rejected"].is_string());
    let rejected = file_status(&s, "config")["rejected"].as_str().unwrap().to_string();
    assert!(rejected.contains("tollgate.toml:5: groups.b.limit"), "{rejected}");
    assert_eq!(file_status(&s, "config")["revision"], second, "the revision in force stays");
    assert!(tollgate(&s, &["group", "show", "a"]).contains("limit:    20\n"), "nothing of it applied");
    // Ready (once the first lease's learning is over): the settings in force serve.
    eventually("ready", || http(&s.http, "GET", "/readyz", &[], "").0 == 200);
    let (_, _, body) = http(&s.http, "GET", "/readyz", &[], "");
    assert!(body.starts_with("ready\n") && body.contains("tollgate.toml rejected"), "{body}");
    let rejected_metric =
        metric_of(&s.http, "tollgate_settings_file_rejected", &format!("file=\"{}\"", config.display()));
    assert_eq!(rejected_metric, Some(1.0));
    // Fixed, and applied at once on SIGHUP.
    std::fs::write(&config, "[groups.a]\nlimit = 30\n\n[groups.b]\nlimit = 7\n").unwrap();
    Command::new("kill").args(["-HUP", &s.child.id().to_string()]).status().unwrap();
    eventually("the fixed file applied", || tollgate(&s, &["group", "show", "a"]).contains("limit:    30\n"));
    assert!(file_status(&s, "config")["rejected"].is_null());
    // SIGHUP reads the files again even unchanged (nothing changes then).
    let applied = file_status(&s, "config")["applied"].as_u64().unwrap();
    Command::new("kill").args(["-HUP", &s.child.id().to_string()]).status().unwrap();
    eventually("read again on SIGHUP", || file_status(&s, "config")["applied"].as_u64().unwrap() > applied);
    // The import file followed: its limit changed, its domain answered by the new one.
    std::fs::write(&limits, "domain: shop\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: minute, requests_per_unit: 30}\n").unwrap();
    eventually("the import file's change applied", || {
        tollgate(&s, &["group", "show", "shop/api_key=*"]).contains("30 per minute")
    });
    let broken = "domain: shop\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: fortnight, requests_per_unit: 30}\n";
    std::fs::write(&limits, broken).unwrap();
    eventually("the bad import file refused", || file_status(&s, "envoy-ratelimit")["rejected"].is_string());
    let why = file_status(&s, "envoy-ratelimit")["rejected"].as_str().unwrap().to_string();
    assert!(why.contains("ratelimit.yaml:4: rate_limit.unit: \"fortnight\""), "{why}");
    let text = tollgate(&s, &["status"]);
    assert!(text.contains("rejected, the revision in force stays"), "{text}");
}

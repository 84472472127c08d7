//! `tollgate import` against a real server: the shipped example files in envoy/ratelimit's and
//! Limitador's formats become groups, patterns and rules that Envoy's rate-limit calls then
//! meet; a dry run changes nothing; a file with anything Tollgate cannot express is refused
//! line by line and changes nothing.

use std::path::PathBuf;
use std::process::{Command, Output};

use crate::common;
use common::{BIN, ServerProc, data_dir, within_one_minute};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tollgate(server: &ServerProc, args: &[&str]) -> Output {
    Command::new(BIN).args(args).env("TOLLGATE_SERVER", server.url()).current_dir(repo()).output().unwrap()
}

fn ok(server: &ServerProc, args: &[&str]) -> String {
    let out = tollgate(server, args);
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// `tollgate rls check` with one descriptor per item: the overall code, then each status line.
fn check(server: &ServerProc, domain: &str, descriptors: &[&str]) -> Vec<String> {
    let mut args = vec!["rls", "check", "--domain", domain];
    for d in descriptors {
        args.extend(["--descriptor", d]);
    }
    // Each line without the time to its limit's reset, which moves with the clock.
    let line = |l: &str| {
        let l = l.split("  resets in ").next().unwrap_or(l);
        l.split_whitespace().collect::<Vec<_>>().join(" ")
    };
    ok(server, &args).lines().map(line).collect()
}

/// The seconds each line of `tollgate rls check` says its limit resets in.
fn resets(server: &ServerProc, domain: &str, descriptors: &[&str]) -> Vec<Option<f64>> {
    let mut args = vec!["rls", "check", "--domain", domain];
    for d in descriptors {
        args.extend(["--descriptor", d]);
    }
    ok(server, &args)
        .lines()
        .skip(1)
        .map(|l| l.split("resets in ").nth(1).and_then(|r| r.trim_end_matches(" s").trim().parse().ok()))
        .collect()
}

#[test]
fn envoy_ratelimit_files_become_groups_patterns_and_rules_that_hold() {
    let server = ServerProc::start(&data_dir("import-envoy"));
    let file = "examples/import/ratelimit.yaml";
    let before = ok(&server, &["rls", "rules"]);
    // A dry run says what it would do and does nothing.
    let dry = ok(&server, &["import", "envoy-ratelimit", file, "--dry-run"]);
    assert!(dry.contains("create pattern shop/api_key=*: unlimited, quota 20/1s"), "{dry}");
    assert!(dry.contains("create pattern shop/api_key=*/path=/checkout: unlimited, quota 5/minute"), "{dry}");
    assert!(dry.contains("create group shop/report=export: unlimited, quota 50/day"), "{dry}");
    assert!(dry.contains("create pattern shop/user_agent=*: unlimited, quota 2/1s, shadow mode"), "{dry}");
    assert!(
        dry.contains("domain shop: answered by its envoy/ratelimit descriptor tree (8 limits), in place of nothing of its own: the implicit tenant rule"),
        "{dry}"
    );
    assert!(
        dry.contains("the implicit tenant rule still applies in every domain no rule or tree names"),
        "{dry}"
    );
    assert!(dry.ends_with("dry run: nothing changed\n"), "{dry}");
    assert_eq!(ok(&server, &["rls", "rules"]), before);
    assert!(!tollgate(&server, &["group", "show", "shop/api_key=*"]).status.success());
    // Rules of other domains stay, after the imported ones.
    let other = r#"[{"domain":"other","key":"tenant","group":"{value}"}]"#;
    ok(&server, &["rls", "set-rules", other]);
    let done = ok(&server, &["import", "envoy-ratelimit", file]);
    assert!(
        done.contains(
            "imported: 7 groups and patterns written, 0 rules, 1 descriptor trees, 0 namespaces of limits"
        ),
        "{done}"
    );
    assert!(done.contains("other domains keep what answers them (other)"), "{done}");
    let rules: serde_json::Value = serde_json::from_str(&ok(&server, &["rls", "rules"])).unwrap();
    assert_eq!(rules["rules"][0]["domain"], "other");
    assert_eq!(rules["trees"][0]["domain"], "shop");
    assert_eq!(rules["trees"][0]["descriptors"].as_array().unwrap().len(), 7);
    // Each key has its own 20/s, and each key's checkout its own 5 a minute: counted from
    // the start of a minute of the server's wall clock, so that no new minute starts mid-way.
    within_one_minute();
    assert_eq!(
        check(&server, "shop", &["api_key=k1", "api_key=k1,path=/checkout"]),
        [
            "OK",
            "[0] OK limit 20/second (shop/api_key=k1) remaining 19",
            "[1] OK limit 5/minute (shop/api_key=k1/path=/checkout) remaining 4"
        ]
    );
    // Every answer with a limit says when it starts afresh (Envoy's x-ratelimit-reset): a
    // rate within a second, a minute's quota at the minute's end.
    let reset = resets(&server, "shop", &["api_key=k1", "api_key=k1,path=/checkout"]);
    assert!(reset[0].is_some_and(|s| (0.0..=1.0).contains(&s)), "{reset:?}");
    assert!(reset[1].is_some_and(|s| s > 0.0 && s <= 60.0), "{reset:?}");
    for _ in 0..3 {
        assert_eq!(check(&server, "shop", &["api_key=k1,path=/checkout"])[0], "OK");
    }
    assert_eq!(
        check(&server, "shop", &["api_key=k1,path=/checkout"])[0],
        "OVER_LIMIT",
        "the minute's 5 are spent"
    );
    assert_eq!(check(&server, "shop", &["api_key=k2,path=/checkout"])[0], "OK", "another key's are its own");
    // Any other path under a key: the any-path limit.
    assert_eq!(
        check(&server, "shop", &["api_key=k1,path=/home"])[1],
        "[0] OK limit 300/minute (shop/api_key=k1/path=/home) remaining 299"
    );
    // The banned key is closed; the listed key with no limit is not limited at all.
    assert_eq!(check(&server, "shop", &["api_key=leaked-key"])[0], "OVER_LIMIT");
    assert_eq!(check(&server, "shop", &["api_key=monitoring"])[1], "[0] OK limit none remaining 0");
    // The enterprise plan lifts the per-address hourly limit in the same request.
    let lifted = check(&server, "shop", &["client_ip=10.0.0.1", "plan=enterprise"]);
    assert_eq!(lifted[1], "[0] OK limit none remaining 0", "{lifted:?}");
    let alone = check(&server, "shop", &["client_ip=10.0.0.1"]);
    assert_eq!(alone[1], "[0] OK limit 1000/hour (shop/client_ip=10.0.0.1) remaining 999", "{alone:?}");
    // The limit in shadow mode refuses nothing (the status counts what it would have refused).
    for _ in 0..5 {
        assert_eq!(check(&server, "shop", &["user_agent=crawler"])[0], "OK");
    }
    assert!(ok(&server, &["group", "show", "shop/user_agent=*"]).contains("shadow:   never refused"));
    // A descriptor the file has no limit for falls to `default`.
    assert_eq!(check(&server, "shop", &["api_key=k1,zone=eu"])[1], "[0] OK limit none remaining 0");
    // Importing the same file again changes no group.
    let again = ok(&server, &["import", "envoy-ratelimit", file, "--dry-run"]);
    assert!(again.lines().filter(|l| l.starts_with("keep ")).count() == 7, "{again}");
    assert!(again.contains("in place of a descriptor tree of 8 limits"), "{again}");
    // A different file for the domain would drop its limits: only with --replace.
    let dir = data_dir("import-envoy-other");
    std::fs::create_dir_all(&dir).unwrap();
    let smaller = dir.join("smaller.yaml");
    std::fs::write(&smaller, "domain: shop\ndescriptors:\n  - key: api_key\n    rate_limit:\n      unit: second\n      requests_per_unit: 20\n").unwrap();
    let out = tollgate(&server, &["import", "envoy-ratelimit", smaller.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("give --replace to replace it; nothing changed"), "{err}");
    let out = tollgate(&server, &["import", "envoy-ratelimit", smaller.to_str().unwrap(), "--replace"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(check(&server, "shop", &["report=export"])[1], "[0] OK limit none remaining 0");
}

#[test]
fn limitador_files_merge_windows_on_the_same_entries() {
    let server = ServerProc::start(&data_dir("import-limitador"));
    let done = ok(&server, &["import", "limitador", "examples/import/limitador.yaml"]);
    assert!(
        done.contains(
            "create pattern media/req.method=POST/user_id=*: unlimited, quota 30/60s-from-first, quota 500/86400s-from-first"
        ),
        "{done}"
    );
    assert!(
        done.contains("create pattern media/req.method=GET/user_id=*: unlimited, quota 100/1s-from-first"),
        "{done}"
    );
    assert!(done.contains("domain media: answered by its Limitador limits (2)"), "{done}");
    let shown = ok(&server, &["group", "show", "media/req.method=POST/user_id=*"]);
    assert!(shown.contains("quotas:   30 per 60s-from-first, 500 per 86400s-from-first"), "{shown}");
    // Limitador answers with the verdict alone; the limits that apply count the request: 30
    // posts by ann in the minute from her first, then no more (whatever the entries' order).
    for _ in 0..30 {
        assert_eq!(check(&server, "media", &["user_id=ann,req.method=POST"]), ["OK"]);
    }
    assert_eq!(check(&server, "media", &["req.method=POST,user_id=ann"]), ["OVER_LIMIT"]);
    assert_eq!(check(&server, "media", &["req.method=POST,user_id=bob"]), ["OK"], "each user apart");
}

#[test]
fn what_cannot_be_expressed_is_refused_by_line_and_nothing_changes() {
    let server = ServerProc::start(&data_dir("import-refused"));
    let before = ok(&server, &["rls", "rules"]);
    let out = tollgate(&server, &["import", "envoy-ratelimit", "examples/import/refused.yaml"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    for line in [
        "examples/import/refused.yaml:5: share_threshold: applies to a wildcard value",
        "examples/import/refused.yaml:11: rate_limit.unit: \"fortnight\" is none of second, minute, hour, day, week, month, year",
        "examples/import/refused.yaml:17: rate_limit.burst: unknown key",
        "3 refused; nothing changed",
    ] {
        assert!(err.contains(line), "{line}\n{err}");
    }
    assert_eq!(ok(&server, &["rls", "rules"]), before);
    assert!(ok(&server, &["group", "list"]).lines().count() <= 1, "no group was written");
    // A pattern may not reserve, whoever sets it.
    let out = tollgate(&server, &["group", "create", "user-*", "--reserved", "5"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("reserved: a pattern (user-*) may not reserve"), "{err}");
    // Limitador's forms Tollgate cannot express, each named by its line.
    let dir = data_dir("import-refused-files");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("limits.yaml");
    std::fs::write(
        &file,
        "- namespace: n\n  max_value: 5\n  seconds: 60\n  conditions:\n    - \"descriptors[0]['path'].startsWith('/health')\"\n  variables: []\n\
         - namespace: n\n  max_value: 5\n  seconds: 60\n  conditions: []\n  variables: [\"descriptors[0]['u']\", u]\n\
         - namespace: n\n  max_value: -1\n  seconds: 60\n  colour: red\n  variables: [u]\n",
    )
    .unwrap();
    let out = tollgate(&server, &["import", "limitador", file.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    for line in [
        "limits.yaml:5: conditions: \"descriptors[0]['path'].startsWith('/health')\": only one comparison",
        "limits.yaml:7: variable \"u\" is named twice in one limit",
        "limits.yaml:13: max_value: a whole number from 0",
        "limits.yaml:15: colour: unknown key",
    ] {
        assert!(err.contains(line), "{line}\n{err}");
    }
    // Not YAML at all: the line, and nothing changes.
    std::fs::write(&file, "domain: x\ndescriptors: [\n").unwrap();
    let out = tollgate(&server, &["import", "envoy-ratelimit", file.to_str().unwrap()]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not YAML"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(ok(&server, &["rls", "rules"]), before);
}

/// The admin API's `ImportLimits`, as a client in any language calls it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_imports_a_file_sent_as_text_as_the_command_does() {
    use tollgate_proto::v1;
    let server = ServerProc::start(&data_dir("import-api"));
    let mut admin = v1::admin_client::AdminClient::connect(server.url()).await.unwrap();
    let text = std::fs::read_to_string(repo().join("examples/import/ratelimit.yaml")).unwrap();
    let request = |text: &str, dry_run, replace| v1::ImportLimitsRequest {
        format: v1::ImportFormat::EnvoyRatelimit as i32,
        text: text.to_string(),
        dry_run,
        replace,
    };
    let dry = admin.import_limits(request(&text, true, false)).await.unwrap().into_inner();
    assert!(!dry.applied && dry.summary.is_empty(), "{dry:?}");
    assert!(
        dry.changes.contains(&"create group shop/report=export: unlimited, quota 50/day".to_string()),
        "{dry:?}"
    );
    assert!(!tollgate(&server, &["group", "show", "shop/report=export"]).status.success(), "a dry run wrote");
    // The command's dry run says the same, line for line.
    let command = ok(&server, &["import", "envoy-ratelimit", "examples/import/ratelimit.yaml", "--dry-run"]);
    let said: Vec<&str> = command.lines().filter(|l| !l.contains(": note: ")).collect();
    assert_eq!(said[..said.len() - 1], dry.changes.iter().map(String::as_str).collect::<Vec<_>>()[..]);
    let done = admin.import_limits(request(&text, false, false)).await.unwrap().into_inner();
    assert!(done.applied, "{done:?}");
    assert_eq!(
        done.summary,
        "imported: 7 groups and patterns written, 0 rules, 1 descriptor trees, 0 namespaces of limits"
    );
    assert!(ok(&server, &["group", "show", "shop/report=export"]).contains("50"), "the group was written");
    // What cannot be expressed is refused line by line, and nothing changes.
    let refused = std::fs::read_to_string(repo().join("examples/import/refused.yaml")).unwrap();
    let status = admin.import_limits(request(&refused, false, false)).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("line 17: rate_limit.burst: unknown key"), "{}", status.message());
    assert!(status.message().ends_with("3 refused; nothing changed"), "{}", status.message());
    // A smaller file for the domain would drop its limits: only with replace.
    let smaller = "domain: shop\ndescriptors:\n  - key: api_key\n    rate_limit:\n      unit: second\n      requests_per_unit: 20\n";
    let status = admin.import_limits(request(smaller, false, false)).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert!(status.message().contains("give replace to replace it; nothing changed"), "{}", status.message());
    assert!(admin.import_limits(request(smaller, false, true)).await.unwrap().into_inner().applied);
    // Bad arguments are named.
    let mut bad = request(smaller, true, false);
    bad.format = 0;
    let status = admin.import_limits(bad).await.unwrap_err();
    assert!(
        status.code() == tonic::Code::InvalidArgument && status.message().starts_with("format:"),
        "{status:?}"
    );
}

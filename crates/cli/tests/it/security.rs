//! Security, as an operator and an attacker would meet it: the real server binary with
//! `--auth` and TLS, real gRPC and HTTP over loopback, certificates made inside the test.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use tollgate_limiter::access::{Access, Rpc};
use tollgate_proto::v1;
use tollgate_testkit::pki::Pki;
use tonic::Code;

use crate::common;
use common::{BIN, ServerProc, data_dir, eventually};

/// Runs the CLI with `env`: (exit code, stdout, stderr).
fn cli(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = Command::new(BIN);
    cmd.args(args).env_remove("TOLLGATE_TOKEN");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

fn first_token(data: &Path) -> String {
    let file = data.join("admin.token");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "the first admin token is readable by its owner only");
    }
    std::fs::read_to_string(file).unwrap().trim().to_string()
}

/// `tollgate token create` as admin: the token.
fn create(s: &ServerProc, admin: &str, args: &[&str]) -> String {
    create_over(&s.url(), &[("TOLLGATE_TOKEN", admin.to_string())], args)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn rpc(url: &str, access: &Access) -> Rpc {
    access.channel(url, Duration::from_secs(5)).unwrap()
}

fn with_token(token: Option<&str>) -> Access {
    Access { token: token.map(str::to_string), ..Access::default() }
}

/// Every gRPC method of the contract.
const METHODS: [&str; 26] = [
    "Exchange",
    "Report",
    "WatchSettings",
    "GetSettings",
    "PutGroup",
    "DropGroup",
    "GetGroup",
    "ListGroups",
    "SetCapacity",
    "SetMode",
    "SetSlowStart",
    "SetShadow",
    "SetThrottling",
    "GetNode",
    "Status",
    "Trace",
    "Audit",
    "CreateToken",
    "ListTokens",
    "RevokeToken",
    "SetTokenGroup",
    "SetRlsRules",
    "GetRlsRules",
    "ImportLimits",
    "ShouldRateLimit",
    "StreamRateLimitQuotas",
];

/// Calls `method` with a request that passes the contract's checks; the status code.
async fn call(channel: Rpc, method: &str, client_id: &str) -> Code {
    use v1::admin_client::AdminClient;
    use v1::admission_client::AdmissionClient;
    use v1::backend_client::BackendClient;
    let mut admin = AdminClient::new(channel.clone());
    let mut backend = BackendClient::new(channel.clone());
    let code = |r: Result<(), tonic::Status>| r.map_or_else(|s| s.code(), |()| Code::Ok);
    code(match method {
        "Exchange" => {
            let load = v1::GroupUsage { group: "t-matrix".into(), demand: 1.0, ..v1::GroupUsage::default() };
            let req =
                v1::ExchangeRequest { client_id: client_id.into(), groups: vec![load], ..Default::default() };
            AdmissionClient::new(channel).exchange(req).await.map(drop)
        }
        "Report" => {
            let req = v1::BackendReport {
                backend_id: "b1".into(),
                zone: "z".into(),
                health: Some(v1::backend_report::Health::Utilisation(0.5)),
                loads: vec![],
                capacity: None,
            };
            backend.report(req).await.map(drop)
        }
        "WatchSettings" => backend.watch_settings(v1::WatchSettingsRequest {}).await.map(drop),
        "GetSettings" => backend.get_settings(v1::GetSettingsRequest::default()).await.map(drop),
        "PutGroup" => {
            let patch = v1::GroupPatch { limit: Some(1000.0), ..Default::default() };
            let req = v1::PutGroupRequest { name: "t-matrix".into(), patch: Some(patch), mode: 0 };
            admin.put_group(req).await.map(drop)
        }
        "DropGroup" => {
            admin.drop_group(v1::DropGroupRequest { name: "t-gone".into(), if_exists: true }).await.map(drop)
        }
        "GetGroup" => admin.get_group(v1::GetGroupRequest { name: "t-none".into() }).await.map(drop),
        "ListGroups" => admin.list_groups(v1::ListGroupsRequest::default()).await.map(drop),
        "SetCapacity" => admin.set_capacity(v1::SetCapacityRequest { capacity: None }).await.map(drop),
        "SetMode" => admin.set_mode(v1::SetModeRequest { mode: 0 }).await.map(drop),
        "SetSlowStart" => admin.set_slow_start(v1::SetSlowStartRequest { on: false }).await.map(drop),
        "SetShadow" => admin.set_shadow(v1::SetShadowRequest { on: false }).await.map(drop),
        "SetThrottling" => admin.set_throttling(v1::SetThrottlingRequest { on: true }).await.map(drop),
        "GetNode" => admin.get_node(v1::GetNodeRequest {}).await.map(drop),
        "Status" => admin.status(v1::StatusRequest::default()).await.map(drop),
        "Trace" => admin.trace(v1::TraceRequest::default()).await.map(drop),
        "Audit" => admin.audit(v1::AuditRequest::default()).await.map(drop),
        "CreateToken" => {
            let req = v1::CreateTokenRequest { role: "reader".into(), ..Default::default() };
            admin.create_token(req).await.map(drop)
        }
        "ListTokens" => admin.list_tokens(v1::ListTokensRequest {}).await.map(drop),
        "RevokeToken" => {
            admin.revoke_token(v1::RevokeTokenRequest { id: "0123456789abcdef".into() }).await.map(drop)
        }
        "SetTokenGroup" => {
            let req =
                v1::SetTokenGroupRequest { id: "0123456789abcdef".into(), default_group: String::new() };
            admin.set_token_group(req).await.map(drop)
        }
        "SetRlsRules" => admin.set_rls_rules(v1::RlsRules { rules_json: "[]".into() }).await.map(drop),
        "GetRlsRules" => admin.get_rls_rules(v1::GetRlsRulesRequest {}).await.map(drop),
        "ImportLimits" => {
            let text = "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 5\n";
            let req = v1::ImportLimitsRequest {
                format: v1::ImportFormat::EnvoyRatelimit as i32,
                text: text.into(),
                dry_run: true,
                replace: false,
            };
            admin.import_limits(req).await.map(drop)
        }
        "ShouldRateLimit" => {
            use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
                RateLimitDescriptor, rate_limit_descriptor::Entry,
            };
            use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
            use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
            let entries = vec![Entry { key: "tenant".into(), value: "t-matrix".into() }];
            let descriptors = vec![RateLimitDescriptor { entries, ..Default::default() }];
            let req = RateLimitRequest { domain: "edge".into(), descriptors, hits_addend: 1 };
            RateLimitServiceClient::new(channel).should_rate_limit(req).await.map(drop)
        }
        "StreamRateLimitQuotas" => {
            use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
            use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
                BucketId, RateLimitQuotaUsageReports, rate_limit_quota_usage_reports::BucketQuotaUsage,
            };
            let bucket = BucketId { bucket: [("tenant".to_string(), "t-matrix".to_string())].into() };
            let usage =
                BucketQuotaUsage { bucket_id: Some(bucket), num_requests_allowed: 1, ..Default::default() };
            let report =
                RateLimitQuotaUsageReports { domain: "edge".into(), bucket_quota_usages: vec![usage] };
            RateLimitQuotaServiceClient::new(channel)
                .stream_rate_limit_quotas(tokio_stream::iter(vec![report]))
                .await
                .map(drop)
        }
        other => panic!("no such method {other}"),
    })
}

/// One HTTP/1.1 request with the token: the status code and the whole answer's head.
fn http(addr: &str, method: &str, path: &str, token: Option<&str>, body: &str) -> (u16, String) {
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("authorization", a.as_str())).collect();
    let (code, head, body) = common::http(addr, method, path, &headers, body);
    (code, format!("{head}\r\n\r\n{body}"))
}

/// Every HTTP endpoint: method, path, body.
const ENDPOINTS: [(&str, &str, &str); 16] = [
    ("GET", "/healthz", ""),
    ("GET", "/readyz", ""),
    ("GET", "/metrics", ""),
    ("GET", "/status", ""),
    ("GET", "/v1/node/properties", ""),
    ("PUT", "/v1/node/properties", "{}"),
    ("GET", "/v1/groups/t-matrix/properties", ""),
    ("PUT", "/v1/groups/t-matrix/properties", "{}"),
    ("GET", "/v1/groups", ""),
    ("PATCH", "/v1/groups/t-matrix", "{}"),
    ("POST", "/v1/check", r#"{"group":"t-matrix"}"#),
    ("POST", "/v1/charge", r#"{"group":"t-matrix","units":1}"#),
    ("POST", "/v1/acquire", r#"{"group":"t-matrix"}"#),
    ("POST", "/v1/release", r#"{"permit":"p00000000000000000000000000000000"}"#),
    ("POST", "/v1/renew", r#"{"permit":"p00000000000000000000000000000000"}"#),
    ("GET", "/v1/openapi.json", ""),
];

fn refused(code: Code) -> bool {
    matches!(code, Code::Unauthenticated | Code::PermissionDenied)
}

#[test]
fn every_role_against_every_method_and_endpoint() {
    let data = data_dir("security-matrix");
    let s = ServerProc::start_with(&data, &["--auth"], Stdio::null());
    let admin = first_token(&data);
    let client = create(&s, &admin, &["--role", "client", "--groups", "t-*"]);
    let backend = create(&s, &admin, &["--role", "backend"]);
    let reader = create(&s, &admin, &["--role", "reader"]);
    let rt = runtime();
    let _entered = rt.enter();
    let roles: [(&str, Option<&str>); 5] = [
        ("admin", Some(&admin)),
        ("client", Some(&client)),
        ("backend", Some(&backend)),
        ("reader", Some(&reader)),
        ("none", None),
    ];
    let allowed = |role: &str, method: &str| match role {
        "admin" => true,
        "client" => ["Exchange", "ShouldRateLimit", "StreamRateLimitQuotas"].contains(&method),
        "backend" => ["Report", "WatchSettings", "GetSettings"].contains(&method),
        "reader" => ["GetGroup", "ListGroups", "GetNode", "Status", "Trace", "GetRlsRules"].contains(&method),
        _ => false,
    };
    let mut wrong = Vec::new();
    for (role, token) in roles {
        let channel = rpc(&s.url(), &with_token(token));
        for method in METHODS {
            let code = rt.block_on(call(channel.clone(), method, &format!("m-{role}")));
            if refused(code) == allowed(role, method) {
                wrong.push(format!("{role} {method}: {code:?}"));
            }
        }
        for (verb, path, body) in ENDPOINTS {
            let (code, text) = http(&s.http, verb, path, token, body);
            let open = path == "/healthz" || path == "/readyz";
            let expect_ok = open
                || role == "admin"
                || (role == "reader" && verb == "GET")
                || (role == "client"
                    && ["/v1/check", "/v1/charge", "/v1/acquire", "/v1/release", "/v1/renew"]
                        .contains(&path));
            // `/readyz` says 503 while the first lease is learnt: answered, not refused.
            let was_refused = code == 401 || code == 403;
            if was_refused == expect_ok {
                wrong.push(format!("{role} {verb} {path}: {code} {text}"));
            }
            if code == 401 {
                assert!(text.contains("www-authenticate: bearer"), "{text}");
            }
        }
    }
    assert!(wrong.is_empty(), "calls allowed or refused against their role:\n{}", wrong.join("\n"));
    // Refusals say why, naming the credential, the call and the role it needs.
    let channel = rpc(&s.url(), &with_token(Some(&reader)));
    let mut a = v1::admin_client::AdminClient::new(channel);
    let e = rt.block_on(a.set_capacity(v1::SetCapacityRequest { capacity: Some(5.0) })).unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    assert!(
        e.message().contains("(reader) may not call /tollgate.v1.Admin/SetCapacity: it needs the admin role"),
        "{e}"
    );
    // The audit log names the credential that made each change.
    let (_, out, _) = cli(&["--server", &s.url(), "audit"], &[("TOLLGATE_TOKEN", &admin)]);
    let admin_id = &admin[3..19];
    assert!(out.contains(&format!("token {admin_id} (admin, first-admin) grpc 127.0.0.1:")), "{out}");
    assert!(out.contains("token.create") && out.contains("group.put t-matrix"), "{out}");
}

#[test]
fn missing_wrong_expired_revoked_and_malformed_tokens_are_refused_and_the_server_keeps_serving() {
    let data = data_dir("security-tokens");
    let s = ServerProc::start_with(&data, &["--auth"], Stdio::null());
    let admin = first_token(&data);
    let url = s.url();
    let admin_env = [("TOLLGATE_TOKEN", admin.as_str())];
    // Missing.
    let (code, _, err) = cli(&["--server", &url, "group", "list"], &[]);
    assert_ne!(code, 0);
    assert!(err.contains("this server requires a token") && err.contains("TOLLGATE_TOKEN"), "{err}");
    // Wrong: a well-formed token with a wrong secret, and one never issued.
    let mut wrong = admin.clone();
    let last = wrong.pop().unwrap();
    wrong.push(if last == '0' { '1' } else { '0' });
    for t in [
        wrong.as_str(),
        "tg_0000000000000000_0000000000000000000000000000000000000000000000000000000000000000",
    ] {
        let (code, _, err) = cli(&["--server", &url, "group", "list"], &[("TOLLGATE_TOKEN", t)]);
        assert_ne!(code, 0);
        assert!(err.contains("unknown token"), "{err}");
    }
    // Malformed, and oversized, sent as they are.
    let rt = runtime();
    let _entered = rt.enter();
    let with_header = |value: &str| {
        rt.block_on(async {
            let channel = Access::default().endpoint(&url).unwrap().connect().await.unwrap();
            let mut c = v1::admin_client::AdminClient::new(channel);
            let mut req = tonic::Request::new(v1::ListGroupsRequest::default());
            req.metadata_mut().insert("authorization", value.parse().unwrap());
            c.list_groups(req)
                .await
                .map_or_else(|e| (e.code(), e.message().to_string()), |_| (Code::Ok, String::new()))
        })
    };
    for bad in ["xyz", "Bearer tg_abc", "Basic dXNlcjpwYXNz", &format!("Bearer tg_{}", "a".repeat(300))] {
        let (code, message) = with_header(bad);
        assert_eq!(code, Code::Unauthenticated, "{bad}");
        assert!(message.starts_with("malformed token"), "{bad}: {message}");
    }
    let big = "a".repeat(64 * 1024);
    let (code, _) = http(&s.http, "GET", "/status", Some(&big), "");
    assert!(code == 401 || code == 431 || code == 400, "an oversized header is refused: {code}");
    let (code, _) = with_header(&format!("Bearer {big}"));
    assert_ne!(code, Code::Ok, "a 64 KiB header is refused");
    // Expired: a token made to last one second stops working on its own.
    let short = create(&s, &admin, &["--role", "reader", "--expires", "1s"]);
    eventually("the one-second token expires", || {
        let (code, _, err) = cli(&["--server", &url, "status"], &[("TOLLGATE_TOKEN", &short)]);
        code != 0 && err.contains("expired")
    });
    // Revoked: refused at once.
    let reader = create(&s, &admin, &["--role", "reader"]);
    let (code, _, _) = cli(&["--server", &url, "group", "list"], &[("TOLLGATE_TOKEN", &reader)]);
    assert_eq!(code, 0);
    let (code, out, err) = cli(&["--server", &url, "token", "revoke", &reader[3..19]], &admin_env);
    assert_eq!(code, 0, "{out}{err}");
    let (code, _, err) = cli(&["--server", &url, "group", "list"], &[("TOLLGATE_TOKEN", &reader)]);
    assert_ne!(code, 0);
    assert!(err.contains("unknown token"), "{err}");
    // The last admin token cannot be revoked; nothing changes.
    let (code, _, err) = cli(&["--server", &url, "token", "revoke", &admin[3..19]], &admin_env);
    assert_ne!(code, 0);
    assert!(err.contains("is the last admin token"), "{err}");
    let (_, out, _) = cli(&["--server", &url, "token", "list"], &admin_env);
    assert!(out.contains(&admin[3..19]), "{out}");
    // Bad arguments name the field.
    for (args, message) in [
        (vec!["token", "create", "--role", "client", "--groups", "a b"], "groups: pattern \"a b\""),
        (vec!["token", "create", "--role", "reader", "--groups", "a"], "only for a client token"),
        (vec!["token", "create", "--role", "reader", "--name", "no spaces"], "name: 1 to 64 characters"),
        (vec!["token", "revoke", "xyz"], "id: 16 hex digits"),
        (vec!["token", "revoke", "0123456789abcdef"], "token 0123456789abcdef does not exist"),
    ] {
        let mut all = vec!["--server", url.as_str()];
        all.extend(args.iter());
        let (code, _, err) = cli(&all, &admin_env);
        assert_ne!(code, 0, "{args:?}");
        assert!(err.contains(message), "{args:?}: {err}");
    }
    // A second admin token, then the first may go; the server kept serving throughout.
    let second = create(&s, &admin, &["--role", "admin", "--name", "ops"]);
    let (code, _, err) =
        cli(&["--server", &url, "token", "revoke", &admin[3..19]], &[("TOLLGATE_TOKEN", &second)]);
    assert_eq!(code, 0, "{err}");
    let (code, out, _) = cli(&["--server", &url, "token", "list"], &[("TOLLGATE_TOKEN", &second)]);
    assert_eq!(code, 0);
    assert!(!out.contains(&admin[3..19]) && out.contains("ops"), "{out}");
    // Credentials survive a restart; the first-token file is not written again.
    let status = s.terminate();
    assert!(status.success());
    std::fs::remove_file(data.join("admin.token")).unwrap();
    let s = ServerProc::start_with(&data, &["--auth"], Stdio::null());
    assert!(!data.join("admin.token").exists(), "an admin token exists, so no new one is made");
    let (code, out, err) = cli(&["--server", &s.url(), "token", "list"], &[("TOLLGATE_TOKEN", &second)]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("ops"), "{out}");
}

/// `--admin-token-file`: the operator's own token (a mounted secret) is the first admin token,
/// and no file is written; a file that holds no token stops the start, naming the flag; once an
/// admin token is live, the file is not taken again.
#[test]
fn the_first_admin_token_can_be_the_operators_own() {
    let data = data_dir("security-given-token");
    std::fs::create_dir_all(&data).unwrap();
    let given = format!("tg_{}_{}", "0123456789abcdef", "ab".repeat(32));
    let file = data.join("given.token");
    std::fs::write(&file, "not a token\n").unwrap();
    let (code, _, err) = cli(
        &["server", "--data", data.to_str().unwrap(), "--auth", "--admin-token-file", file.to_str().unwrap()],
        &[],
    );
    assert_ne!(code, 0);
    assert!(err.contains("--admin-token-file") && err.contains("tg_ID_SECRET"), "{err}");
    std::fs::write(&file, format!("{given}\n")).unwrap();
    let s = ServerProc::start_with(
        &data,
        &["--auth", "--admin-token-file", file.to_str().unwrap()],
        Stdio::null(),
    );
    assert!(!data.join("admin.token").exists(), "no token of its own made");
    let (code, out, err) = cli(&["--server", &s.url(), "token", "list"], &[("TOLLGATE_TOKEN", &given)]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("0123456789abcdef") && out.contains("first-admin"), "{out}");
    let second = create(&s, &given, &["--role", "admin", "--name", "ops"]);
    let (code, _, err) =
        cli(&["--server", &s.url(), "token", "revoke", "0123456789abcdef"], &[("TOLLGATE_TOKEN", &second)]);
    assert_eq!(code, 0, "{err}");
    assert!(s.terminate().success());
    // Another admin token is live: the given one, revoked, is not brought back.
    let s = ServerProc::start_with(
        &data,
        &["--auth", "--admin-token-file", file.to_str().unwrap()],
        Stdio::null(),
    );
    let (code, _, _) = cli(&["--server", &s.url(), "token", "list"], &[("TOLLGATE_TOKEN", &given)]);
    assert_ne!(code, 0, "the revoked token stays revoked");
}

#[test]
fn a_client_token_is_limited_to_its_groups_and_keeps_its_client_ids() {
    let data = data_dir("security-groups");
    let s = ServerProc::start_with(&data, &["--auth"], Stdio::null());
    let admin = first_token(&data);
    let a = create(&s, &admin, &["--role", "client", "--groups", "tenant-a*,shared", "--name", "app-a"]);
    let b = create(&s, &admin, &["--role", "client", "--groups", "tenant-b*"]);
    let rt = runtime();
    let _entered = rt.enter();
    let exchange = |token: &str, client: &str, group: &str| {
        let channel = rpc(&s.url(), &with_token(Some(token)));
        rt.block_on(async {
            let load = v1::GroupUsage { group: group.into(), demand: 1.0, ..v1::GroupUsage::default() };
            let req =
                v1::ExchangeRequest { client_id: client.into(), groups: vec![load], ..Default::default() };
            v1::admission_client::AdmissionClient::new(channel).exchange(req).await
        })
    };
    assert!(exchange(&a, "a-1", "tenant-a1").is_ok());
    assert!(exchange(&a, "a-1", "shared").is_ok());
    let e = exchange(&a, "a-1", "tenant-b1").unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    assert!(e.message().contains("(client, app-a) may not exchange for group \"tenant-b1\""), "{e}");
    // Another credential cannot take a client id in use.
    let e = exchange(&b, "a-1", "tenant-b1").unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    assert!(e.message().contains("client id \"a-1\" belongs to another credential"), "{e}");
    assert!(exchange(&b, "b-1", "tenant-b1").is_ok());
}

#[test]
fn unthrottled_is_a_privilege_of_the_credential() {
    let data = data_dir("security-unthrottled");
    let s = ServerProc::start_with(&data, &["--auth", "--tick-ms", "100"], Stdio::null());
    let admin = first_token(&data);
    let admin_env = [("TOLLGATE_TOKEN", admin.as_str())];
    for g in ["u-priv", "u-plain"] {
        let (code, _, err) = cli(&["--server", &s.url(), "group", "create", g, "--limit", "50"], &admin_env);
        assert_eq!(code, 0, "{err}");
    }
    let privileged = create(&s, &admin, &["--role", "client", "--unthrottled"]);
    let plain = create(&s, &admin, &["--role", "client"]);
    let rt = runtime();
    let _entered = rt.enter();
    let remote = |token: &str, id: &str| {
        let opts = tollgate_limiter::RemoteOptions {
            client_id: Some(id.into()),
            access: with_token(Some(token)),
            ..Default::default()
        };
        tollgate_limiter::Tollgate::remote(&s.url(), opts).unwrap()
    };
    let p = remote(&privileged, "priv");
    let q = remote(&plain, "plain");
    rt.block_on(async {
        // Until the first answer, neither admits unthrottled work as such.
        for (gate, group) in [(&p, "u-priv"), (&q, "u-plain")] {
            let gate = gate.clone();
            tokio::time::timeout(Duration::from_secs(30), async {
                while gate.remote_status().unwrap().exchanges == 0 {
                    let _ = gate.try_acquire(group, 1.0);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
            .await
            .expect("first exchange");
        }
    });
    let allowed =
        (p.remote_status().unwrap().unthrottled_allowed, q.remote_status().unwrap().unthrottled_allowed);
    assert_eq!(allowed, (true, false), "the controller grants the privilege to the credential that has it");
    let (pu, qu) = (p.unthrottled(), q.unthrottled());
    let mut refused = (0, 0);
    for _ in 0..2000 {
        refused.0 += usize::from(pu.try_acquire("u-priv", 1.0).is_err());
        refused.1 += usize::from(qu.try_acquire("u-plain", 1.0).is_err());
    }
    assert_eq!(refused.0, 0, "privileged unthrottled work is never refused");
    assert!(refused.1 > 1000, "unprivileged unthrottled work is throttled: {} of 2000 refused", refused.1);
    // The controller counts the unprivileged client's work as ordinary, throttled work: keep
    // both working while the status is read.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let stop = stop.clone();
        rt.spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = pu.try_acquire("u-priv", 1.0);
                let _ = qu.try_acquire("u-plain", 1.0);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    let reader = create(&s, &admin, &["--role", "reader"]);
    eventually("the controller sees both groups' reports", || {
        let (_, body) = http(&s.http, "GET", "/status", Some(&reader), "");
        let v: serde_json::Value =
            serde_json::from_str(body.split("\r\n\r\n").nth(1).unwrap_or("{}")).unwrap_or_default();
        let group = |n: &str| {
            v["groups"]
                .as_array()
                .and_then(|gs| gs.iter().find(|g| g["name"] == n).cloned())
                .unwrap_or_default()
        };
        let (p, q) = (group("u-priv"), group("u-plain"));
        p["unthrottled"].as_f64().unwrap_or(0.0) > 0.0
            && q["unthrottled"].as_f64() == Some(0.0)
            && q["throttled_total"].as_u64().unwrap_or(0) > 0
    });
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    rt.block_on(load).unwrap();
    // The same privilege through the front ends: an unthrottled check, and an Envoy descriptor
    // carrying `tollgate_unthrottled`, are taken from the privileged token only.
    let check = |token: &str| {
        let body = r#"{"group":"u-plain","unthrottled":true}"#;
        http(&s.http, "POST", "/v1/check", Some(token), body)
    };
    let (code, text) = check(&plain);
    assert_eq!(code, 403, "{text}");
    assert!(text.contains("lacks the unthrottled privilege"), "{text}");
    let passed = (0..200).filter(|_| check(&privileged).0 == 200).count();
    assert_eq!(passed, 200, "the privileged token's unthrottled checks are never refused");
    let rls = |token: &str| {
        use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
            RateLimitDescriptor, rate_limit_descriptor::Entry,
        };
        use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
        use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
        let entries = vec![
            Entry { key: "tenant".into(), value: "u-plain".into() },
            Entry { key: "tollgate_unthrottled".into(), value: "yes".into() },
        ];
        let descriptors = vec![RateLimitDescriptor { entries, ..Default::default() }];
        let req = RateLimitRequest { domain: "edge".into(), descriptors, hits_addend: 100 };
        let channel = rpc(&s.url(), &with_token(Some(token)));
        rt.block_on(async { RateLimitServiceClient::new(channel).should_rate_limit(req).await })
    };
    let e = rls(&plain).unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e}");
    assert!(e.message().contains("tollgate_unthrottled"), "{e}");
    for _ in 0..20 {
        let answer = rls(&privileged).expect("answered").into_inner();
        assert_eq!(answer.overall_code, 1, "OK, past a limit of 50 at 100 a call: {answer:?}");
    }
}

/// The DER of the first certificate in a PEM file.
fn der_of(path: &Path) -> Vec<u8> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    CertificateDer::pem_file_iter(path).unwrap().next().unwrap().unwrap().to_vec()
}

/// Opens a TLS connection to the HTTP port at `addr` trusting `ca`, showing `identity`, and
/// asks for `/healthz`: the certificate the server showed (DER), or what failed.
fn handshake(addr: &str, ca: &Path, identity: Option<(&Path, &Path)>) -> Result<Vec<u8>, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = match identity {
        None => builder.with_no_client_auth(),
        Some((c, k)) => builder
            .with_client_auth_cert(
                CertificateDer::pem_file_iter(c).unwrap().map(Result::unwrap).collect(),
                PrivateKeyDer::from_pem_file(k).unwrap(),
            )
            .unwrap(),
    };
    let mut conn =
        rustls::ClientConnection::new(Arc::new(config), ServerName::try_from("127.0.0.1").unwrap()).unwrap();
    let mut tcp = TcpStream::connect(addr).unwrap();
    let mut tls = rustls::Stream::new(&mut conn, &mut tcp);
    // A request proves the server accepted us (client certificates are checked after the
    // client's part of the handshake).
    let sent = write!(tls, "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let mut text = String::new();
    let read = sent.and_then(|()| tls.read_to_string(&mut text));
    if let Err(e) = read {
        return Err(e.to_string());
    }
    if !text.starts_with("HTTP/1.1 200") {
        return Err(format!("not served: {text}"));
    }
    Ok(conn.peer_certificates().unwrap()[0].to_vec())
}

#[test]
fn mutual_tls_with_an_allow_list_refuses_strangers_and_reloads_its_certificate() {
    let dir = data_dir("security-tls");
    let pki = Pki::new(&dir.join("pki"), "test-ca");
    let stranger = Pki::new(&dir.join("other"), "other-ca");
    let (cert, key) = pki.issue("server-a", "server", false);
    let (app, app_key) = pki.issue("app-1", "app-1", false);
    let (intruder, intruder_key) = pki.issue("intruder", "intruder", false);
    let (old, old_key) = pki.issue("app-1", "expired", true);
    let (foreign, foreign_key) = stranger.issue("app-1", "foreign", false);
    let data = dir.join("data");
    let ca = pki.ca_file();
    let flags = [
        "--auth",
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
        "--tls-client-ca",
        ca.to_str().unwrap(),
        "--tls-allow-name",
        "app-1,ops",
    ];
    let s = ServerProc::start_with(&data, &flags, Stdio::null());
    let admin = first_token(&data);
    let url = format!("https://{}", s.grpc);
    let env = |c: &Path, k: &Path| {
        vec![
            ("TOLLGATE_TOKEN", admin.clone()),
            ("TOLLGATE_CA", ca.to_str().unwrap().to_string()),
            ("TOLLGATE_CERT", c.to_str().unwrap().to_string()),
            ("TOLLGATE_KEY", k.to_str().unwrap().to_string()),
        ]
    };
    let run = |args: &[&str], env: &[(&str, String)]| {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let mut all = vec!["--server", url.as_str()];
        all.extend_from_slice(args);
        cli(&all, &env)
    };
    // The allowed name, with the token: served.
    let (code, out, err) = run(&["group", "create", "tls-g", "--limit", "10"], &env(&app, &app_key));
    assert_eq!(code, 0, "{out}{err}");
    // A name outside the allow-list: refused, by name.
    let (code, _, err) = run(&["group", "list"], &env(&intruder, &intruder_key));
    assert_ne!(code, 0);
    assert!(err.contains("client certificate \"intruder\" is not on the server's allow-list"), "{err}");
    // An expired certificate, and one from an authority the server does not trust: no
    // connection at all.
    for (c, k, what) in [(&old, &old_key, "expired"), (&foreign, &foreign_key, "unknown authority")] {
        let (code, _, err) = run(&["group", "list"], &env(c, k));
        assert_ne!(code, 0, "{what}");
        assert!(err.contains("closed the connection") && err.contains("certificate"), "{what}: {err}");
        assert!(handshake(&s.http, &ca, Some((c, k))).is_err(), "{what}");
    }
    // No client certificate: no connection.
    assert!(handshake(&s.http, &ca, None).is_err());
    // A client that does not trust the server's authority: refuses the server.
    let mut untrusting = env(&app, &app_key);
    untrusting[1].1 = stranger.ca_file().to_str().unwrap().to_string();
    let (code, _, err) = run(&["group", "list"], &untrusting);
    assert_ne!(code, 0);
    assert!(err.to_lowercase().contains("certificate"), "{err}");
    // Plain HTTP to a TLS port: refused.
    let plain = format!("http://{}", s.grpc);
    let (code, _, _) = cli(&["--server", &plain, "group", "list"], &[("TOLLGATE_TOKEN", &admin)]);
    assert_ne!(code, 0);
    // The HTTP port speaks TLS too; a new certificate is taken without a restart.
    assert_eq!(handshake(&s.http, &ca, Some((&app, &app_key))).unwrap(), der_of(&cert));
    let (new_cert, new_key) = pki.issue("server-b", "server-b", false);
    std::fs::copy(&new_key, &key).unwrap();
    std::fs::copy(&new_cert, &cert).unwrap();
    let new = der_of(&new_cert);
    eventually("the server takes its new certificate", || {
        handshake(&s.http, &ca, Some((&app, &app_key))).is_ok_and(|der| der == new)
    });
    // A remote client over TLS with a client token.
    let client = create_over(&url, &env(&app, &app_key), &["--role", "client"]);
    let rt = runtime();
    let _entered = rt.enter();
    rt.block_on(async {
        let access = Access {
            token: Some(client),
            ca_file: Some(ca.clone()),
            identity: Some((app.clone(), app_key.clone())),
        };
        let opts = tollgate_limiter::RemoteOptions { access, ..Default::default() };
        let gate = tollgate_limiter::Tollgate::remote(&url, opts).unwrap();
        tokio::time::timeout(Duration::from_secs(30), async {
            while gate.remote_status().unwrap().exchanges == 0 {
                let _ = gate.try_acquire("tls-g", 1.0);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the remote client exchanges over mutual TLS");
    });
}

fn create_over(url: &str, env: &[(&str, String)], args: &[&str]) -> String {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut all = vec!["--server", url, "token", "create"];
    all.extend_from_slice(args);
    let (code, out, err) = cli(&all, &env);
    assert_eq!(code, 0, "{out}{err}");
    out.trim().to_string()
}

#[test]
fn a_server_with_auth_and_tls_may_listen_beyond_loopback_and_a_bad_tls_file_is_named() {
    let dir = data_dir("security-start");
    let pki = Pki::new(&dir.join("pki"), "start-ca");
    let (cert, key) = pki.issue("server", "server", false);
    // A key that does not match the certificate, and a file that is not PEM.
    let (_, other_key) = pki.issue("other", "other", false);
    std::fs::write(dir.join("junk.pem"), "not a certificate").unwrap();
    for (c, k, message) in [
        (cert.clone(), other_key.clone(), "--tls-cert and --tls-key do not make a usable pair"),
        (dir.join("junk.pem"), key.clone(), "--tls-cert"),
        (dir.join("missing.pem"), key.clone(), "missing.pem"),
    ] {
        let out = common::server_command(&dir.join("d"), "127.0.0.1:0")
            .args(["--tls-cert", c.to_str().unwrap(), "--tls-key", k.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(message), "{message}: {err}");
    }
    // Without both, other addresses are refused, naming what is missing.
    let out = common::server_command(&dir.join("d"), "0.0.0.0:0").args(["--auth"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("without TLS"), "{:?}", out);
    let out = common::server_command(&dir.join("d"), "0.0.0.0:0")
        .args(["--tls-cert", cert.to_str().unwrap(), "--tls-key", key.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("without --auth"), "{:?}", out);
    // With both, the check passes and the server goes on to bind: shown here with an
    // address this machine does not have (a documentation address), so that nothing listens
    // beyond loopback during the test.
    let out = common::server_command(&dir.join("d"), "192.0.2.1:7460")
        .args(["--auth", "--tls-cert", cert.to_str().unwrap(), "--tls-key", key.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot listen on 192.0.2.1:7460") && !err.contains("loopback"), "{err}");
}

#[test]
fn a_connection_over_its_request_rate_is_refused_and_others_are_served() {
    let data = data_dir("security-rate");
    let s = ServerProc::start_with(&data, &["--max-requests-per-conn-s", "5"], Stdio::null());
    let rt = runtime();
    let _entered = rt.enter();
    let busy = rpc(&s.url(), &Access::default());
    let mut refused = Vec::new();
    for _ in 0..100 {
        let code = rt.block_on(call(busy.clone(), "GetNode", "c"));
        if code != Code::Ok {
            refused.push(code);
        }
    }
    // At most 5 a second (and 5 banked) are served: on any machine, most of 100 are refused.
    assert!(refused.len() >= 50, "{} of 100 refused", refused.len());
    assert!(refused.iter().all(|c| *c == Code::ResourceExhausted), "{refused:?}");
    let mut admin = v1::admin_client::AdminClient::new(busy);
    let e = rt.block_on(admin.get_node(v1::GetNodeRequest {})).unwrap_err();
    assert!(e.message().contains("more than 5 requests a second on this connection"), "{e}");
    // Another connection is served.
    let fresh = rpc(&s.url(), &Access::default());
    assert_eq!(rt.block_on(call(fresh, "GetNode", "c")), Code::Ok);
    // The HTTP port applies the same limit per connection; a new connection per request is served.
    assert_eq!(http(&s.http, "GET", "/healthz", None, "").0, 200);
}

/// Regression: the usual one-line `openssl req -x509` certificate, given to the server, was refused
/// by the CLI with `CaUsedAsEndEntity` alone (curl takes it): it is a certificate authority's.
/// The CLI now says so and what to make instead.
#[test]
fn a_one_line_self_signed_certificate_is_refused_with_what_to_make_instead() {
    let dir = data_dir("security-one-line");
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = (dir.join("self.pem"), dir.join("self.key"));
    let made = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost"])
        .args(["-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"])
        .args(["-keyout", key.to_str().unwrap(), "-out", cert.to_str().unwrap()])
        .output()
        .expect("openssl runs (the test command installs it)");
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let s = ServerProc::start_with(
        &dir.join("data"),
        &["--tls-cert", cert.to_str().unwrap(), "--tls-key", key.to_str().unwrap()],
        Stdio::null(),
    );
    let url = format!("https://{}", s.grpc);
    let (code, out, err) = cli(&["--server", &url, "--ca", cert.to_str().unwrap(), "status"], &[]);
    assert_ne!(code, 0, "{out}");
    assert!(err.contains("CaUsedAsEndEntity"), "{err}");
    assert!(err.contains("a certificate authority's") && err.contains("docs/operations.md"), "{err}");
}

/// A revoked token is no outage: the client closes its groups at once and every refused request
/// says the controller rejects it (not transient), instead of serving on in safe mode; the
/// metrics count the rejections apart from transport failures.
#[test]
fn a_revoked_token_is_a_rejection_the_application_sees_not_an_outage() {
    let data = data_dir("security-rejected");
    let s = ServerProc::start_with(&data, &["--auth", "--tick-ms", "100"], Stdio::null());
    let admin = first_token(&data);
    let admin_env = [("TOLLGATE_TOKEN", admin.as_str())];
    let (code, _, err) = cli(&["--server", &s.url(), "group", "create", "rj", "--limit", "1000"], &admin_env);
    assert_eq!(code, 0, "{err}");
    let token = create(&s, &admin, &["--role", "client"]);
    let rt = runtime();
    let _entered = rt.enter();
    let opts = tollgate_limiter::RemoteOptions {
        client_id: Some("rejected".into()),
        access: with_token(Some(&token)),
        ..Default::default()
    };
    let gate = tollgate_limiter::Tollgate::remote(&s.url(), opts).unwrap();
    let admitted = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                if gate.try_acquire("rj", 1.0).is_ok() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
    });
    assert!(admitted.is_ok(), "served while the token is good");
    let (code, _, err) = cli(&["--server", &s.url(), "token", "revoke", &token[3..19]], &admin_env);
    assert_eq!(code, 0, "{err}");
    let refused = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                match gate.try_acquire("rj", 1.0) {
                    Err(e @ tollgate_limiter::AcquireError::Rejected { .. }) => return e,
                    _ => tokio::time::sleep(Duration::from_millis(20)).await,
                }
            }
        })
        .await
    });
    let e = refused.expect("a request refused as rejected once the token is revoked");
    assert!(!e.is_transient(), "{e}");
    let tollgate_limiter::AcquireError::Rejected { group } = &e else { unreachable!() };
    assert_eq!(group.as_str(), "rj", "{e}");
    let status = gate.remote_status().unwrap();
    let reason = status.rejected.clone().expect("the controller's answer is kept");
    assert!(!reason.is_transient(), "{reason:?}");
    assert!(
        matches!(reason, tollgate_limiter::ExchangeError::Rejected { code: Code::Unauthenticated, .. }),
        "{reason:?}"
    );
    assert!(!status.safe_mode, "{status:?}");
    assert!(status.failures.rejected > 0 && status.failures.transport == 0, "{status:?}");
    let text = gate.metrics();
    assert!(text.contains("tollgate_client_rejected 1"), "{text}");
    assert!(text.contains("tollgate_client_exchange_failures_total{kind=\"rejected\"}"), "{text}");
}

/// The body of an HTTP answer as JSON.
fn json_of(answer: &str) -> serde_json::Value {
    serde_json::from_str(answer.split("\r\n\r\n").nth(1).unwrap_or("{}")).unwrap_or_default()
}

#[test]
fn a_user_identified_by_a_token_handed_out_beforehand_is_held_to_its_group() {
    let data = data_dir("security-identified");
    let s = ServerProc::start_with(&data, &["--auth", "--tick-ms", "100"], Stdio::null());
    let admin = first_token(&data);
    let env = [("TOLLGATE_SERVER", s.url()), ("TOLLGATE_TOKEN", admin)];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let sql = |text: &str| cli(&["sql", text], &env);
    // IDENTIFIED BY gives the user's token, handed out beforehand: it is not printed again.
    let given = format!("tg_{}_{}", "00112233aabbccdd", "0123456789abcdef".repeat(4));
    let (code, out, err) =
        sql(&format!("CREATE USER 'ci'@'%' IDENTIFIED BY '{given}' RESOURCE GROUP checkout"));
    assert_eq!(
        (code, out.as_str()),
        (0, "created user ci, resource group checkout, identified by the token given\n"),
        "{err}"
    );
    let (code, answer) = http(&s.http, "POST", "/v1/check", Some(&given), "{}");
    assert_eq!((code, json_of(&answer)["group"].as_str()), (200, Some("checkout")), "{answer}");
    // A password is no credential here: refused, saying what is.
    let (code, _, err) = sql("CREATE USER weak IDENTIFIED BY 'hunter2'");
    assert!(code != 0 && err.contains("a user's credential is a token, not a password"), "{err}");
    // The same token twice is refused: it names one credential.
    let (code, _, err) = sql(&format!("CREATE USER again IDENTIFIED BY '{given}'"));
    assert!(code != 0 && err.contains("exists already"), "{err}");
    // The command takes one from a file, and does not print it.
    let file = data.join("reader.token");
    let reader = format!("tg_{}_{}", "aabbccdd00112233", "fedcba9876543210".repeat(4));
    std::fs::write(&file, format!("{reader}\n")).unwrap();
    let (code, out, err) =
        cli(&["token", "create", "--role", "reader", "--token-file", file.to_str().unwrap()], &env);
    assert!(
        code == 0 && out.starts_with("made aabbccdd00112233  reader") && !out.contains(&reader),
        "{out}{err}"
    );
    let (code, answer) = http(&s.http, "GET", "/v1/status", Some(&reader), "");
    assert_eq!(code, 200, "{answer}");
}

#[test]
fn users_are_tokens_bound_to_a_resource_group_by_sql_and_the_cli() {
    let data = data_dir("security-users");
    let s = ServerProc::start_with(&data, &["--auth", "--tick-ms", "100"], Stdio::null());
    let admin = first_token(&data);
    let env = [("TOLLGATE_SERVER", s.url()), ("TOLLGATE_TOKEN", admin.clone())];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let sql = |text: &str| cli(&["sql", text], &env);
    // TiDB's statements: a user is a client token named after it; its resource group is the
    // group its work goes to when a request names none.
    let (code, out, err) = sql("CREATE USER 'app'@'%' RESOURCE GROUP checkout");
    assert_eq!(code, 0, "{err}");
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some("created user app, resource group checkout; its token, shown this once:"));
    let app = lines.next().unwrap().to_string();
    let check = |token: &str, body: &str| {
        let (code, answer) = http(&s.http, "POST", "/v1/check", Some(token), body);
        (code, json_of(&answer))
    };
    let (code, v) = check(&app, "{}");
    assert_eq!((code, v["group"].as_str()), (200, Some("checkout")), "{v}");
    // A token with no group patterns may name any group instead.
    assert_eq!(check(&app, r#"{"group":"search"}"#).1["group"], "search");
    assert_eq!(sql("ALTER USER app RESOURCE GROUP search").0, 0);
    assert_eq!(check(&app, "{}").1["group"], "search");
    // Envoy's rate-limit calls with the token: a descriptor no rule names a group for goes to
    // the same group.
    assert_eq!(cli(&["group", "create", "search", "--limit", "100"], &env).0, 0);
    let url = s.url();
    let as_app = [("TOLLGATE_SERVER", url.as_str()), ("TOLLGATE_TOKEN", app.as_str())];
    let (code, out, err) = cli(&["rls", "check", "--domain", "edge", "--descriptor", "user=ann"], &as_app);
    assert!(code == 0 && out.contains("(search)"), "{out}{err}");
    let (_, listed, _) = cli(&["token", "list"], &env);
    assert!(listed.lines().any(|l| l.contains("app") && l.ends_with("default group search")), "{listed}");
    // A token held to its groups may not leave them, by default or by name.
    let held = create(&s, &admin, &["--role", "client", "--groups", "shop-*", "--default-group", "shop-eu"]);
    assert_eq!(check(&held, r#"{"cost":2}"#).1["group"], "shop-eu");
    assert_eq!(check(&held, r#"{"group":"shop-us"}"#).0, 200);
    assert_eq!(check(&held, r#"{"group":"search"}"#).0, 403);
    // Bad input names the field and the rule, and changes nothing.
    let (code, _, err) = cli(
        &["token", "create", "--role", "client", "--groups", "shop-*", "--default-group", "search"],
        &env,
    );
    assert!(
        code != 0 && err.contains("default_group: \"search\" is not among the token's groups (shop-*)"),
        "{err}"
    );
    let (code, _, err) = cli(&["token", "create", "--role", "reader", "--default-group", "x"], &env);
    assert!(code != 0 && err.contains("default_group: only for a client token"), "{err}");
    let plain = create(&s, &admin, &["--role", "client"]);
    let (code, v) = check(&plain, "{}");
    assert_eq!((code, v["field"].as_str()), (400, Some("group")), "{v}");
    assert!(v["detail"].as_str().unwrap().contains("has no default group"), "{v}");
    let (code, _, err) = sql("ALTER USER ghost RESOURCE GROUP x");
    assert!(code != 0 && err.contains("user \"ghost\" does not exist"), "{err}");
    let (code, _, err) = sql("CREATE USER 'app'@'10.0.0.1'");
    assert!(code != 0 && err.contains("a user's host must be '%'"), "{err}");
    // Every change is audited; a dropped user's token is refused at once.
    let (_, audit, _) = cli(&["audit", "--json"], &env);
    assert!(
        audit.lines().any(|l| l.contains("token.alter") && l.contains("\"default_group\":\"search\"")),
        "{audit}"
    );
    assert_eq!(sql("DROP USER app").0, 0);
    assert_eq!(check(&app, "{}").0, 401);
    assert_eq!(sql("DROP USER IF EXISTS app").1, "user app does not exist: nothing dropped\n");
}

/// The load programs carry `--token` to a server with `--auth`: `bench accuracy` without one
/// is refused for want of it; with the admin token its calls are answered, and it stops at its
/// own check (a group it makes is there already) before changing anything.
#[test]
fn the_load_programs_carry_the_token() {
    let data = data_dir("bench-token");
    let s = ServerProc::start_with(&data, &["--auth"], Stdio::null());
    let admin = first_token(&data);
    let url = s.url();
    let as_admin = [("TOLLGATE_TOKEN", admin.as_str())];
    let (code, _, err) = cli(&["--server", &url, "group", "create", "accuracy", "--limit", "5"], &as_admin);
    assert_eq!(code, 0, "{err}");
    let bench = ["bench", "accuracy", "--server", &url, "--setup", "--duration", "1"];
    let (code, _, err) = cli(&bench, &[]);
    assert_ne!(code, 0);
    assert!(err.contains("token"), "{err}");
    for env in [&as_admin[..], &[]] {
        let mut args = bench.to_vec();
        if env.is_empty() {
            args.splice(0..0, ["--token", admin.as_str()]);
        }
        let (code, _, err) = cli(&args, env);
        assert_ne!(code, 0);
        assert!(err.contains("group accuracy exists"), "{err}");
    }
    let (code, out, err) = cli(&["--server", &url, "group", "show", "accuracy"], &as_admin);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains('5'), "{out}");
}

//! Envoy's rate-limit service (RLS v3) on the real server, called over real gRPC as Envoy
//! calls it: mapping rules from the admin API and the settings file, the answer's fields, bad
//! requests, and a client token's groups.

use std::process::{Command, Stdio};
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor, rate_limit_descriptor::Entry, rate_limit_descriptor::RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tollgate_limiter::access::Access;

use crate::common;
use common::{BIN, ServerProc, data_dir};

fn cli(url: &str, token: Option<&str>, args: &[&str]) -> (bool, String) {
    let mut cmd = Command::new(BIN);
    cmd.args(args).env("TOLLGATE_SERVER", url).env_remove("TOLLGATE_TOKEN");
    if let Some(t) = token {
        cmd.env("TOLLGATE_TOKEN", t);
    }
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

fn request(domain: &str, descriptors: &[&[(&str, &str)]]) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors: descriptors
            .iter()
            .map(|entries| RateLimitDescriptor {
                entries: entries
                    .iter()
                    .map(|(k, v)| Entry { key: (*k).into(), value: (*v).into() })
                    .collect(),
                ..RateLimitDescriptor::default()
            })
            .collect(),
        hits_addend: 0,
    }
}

async fn ask(
    url: &str,
    token: Option<&str>,
    r: RateLimitRequest,
) -> Result<(Code, Vec<(Code, u32, u32)>), tonic::Status> {
    let access = Access { token: token.map(str::to_string), ..Access::default() };
    let mut client = RateLimitServiceClient::new(access.channel(url, Duration::from_secs(5)).unwrap());
    let answer = client.should_rate_limit(r).await?.into_inner();
    let code = |c: i32| Code::try_from(c).unwrap();
    Ok((
        code(answer.overall_code),
        answer
            .statuses
            .iter()
            .map(|s| {
                (code(s.code), s.current_limit.as_ref().map_or(0, |l| l.requests_per_unit), s.limit_remaining)
            })
            .collect(),
    ))
}

/// Bad requests: INVALID_ARGUMENT naming the field; the server keeps serving.
async fn bad_requests_are_named_and_the_server_keeps_serving(url: &str) {
    let huge: Vec<(&str, &str)> = vec![("k", "v"); 65];
    let long = "v".repeat(2000);
    for (r, field) in [
        (request("edge", &[]), "descriptors: give 1 to 64, got 0"),
        (request("", &[&[("tenant", "a")]]), "domain"),
        (request("edge", &[&[("", "a")]]), "descriptors[0].entries[0].key"),
        (request("edge", &[&huge]), "descriptors[0].entries: give 1 to 64, got 65"),
        (request("edge", &[&[("user", long.as_str())]]), "descriptors[0].entries[0].value"),
    ] {
        let e = ask(url, None, r).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{field}");
        assert!(e.message().contains(field), "{field}: {}", e.message());
    }
    let many: Vec<&[(&str, &str)]> = vec![&[("user", "a")]; 65];
    let e = ask(url, None, request("edge", &many)).await.unwrap_err();
    assert!(e.message().contains("descriptors: give 1 to 64, got 65"), "{}", e.message());
    assert!(ask(url, None, request("edge", &[&[("user", "a")]])).await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_name_groups_answers_carry_the_limit_and_bad_requests_are_named() {
    let dir = data_dir("rls");
    // Rules from the settings file, applied where the store holds none.
    let config = dir.join("tollgate.toml");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        &config,
        "[groups.api]\nlimit = 2\n[groups.t-acme]\nlimit = 100\n\n[[rls.rules]]\ndomain = \"edge\"\nkey = \"path\"\nvalue = \"/api\"\ngroup = \"api\"\n\n[[rls.rules]]\nkey = \"tenant\"\ngroup = \"t-{value}\"\n",
    )
    .unwrap();
    let s = ServerProc::start_with(&dir.join("data"), &["--config", config.to_str().unwrap()], Stdio::null());
    let url = s.url();
    let (ok, out) = cli(&url, None, &["rls", "rules"]);
    assert!(ok && out.contains("\"group\": \"t-{value}\""), "{out}");
    // The path rule (in its domain) comes first; in another domain the tenant rule applies.
    let (overall, statuses) =
        ask(&url, None, request("edge", &[&[("tenant", "acme"), ("path", "/api")]])).await.unwrap();
    assert_eq!((overall, statuses[0].0, statuses[0].1), (Code::Ok, Code::Ok, 2));
    let (_, statuses) =
        ask(&url, None, request("other", &[&[("tenant", "acme"), ("path", "/api")]])).await.unwrap();
    assert_eq!(statuses[0].1, 100, "t-acme's limit");
    // api holds 2 a second: the third at once is over its limit, and the answer says so for
    // that descriptor while the other passes; nothing is taken from the passing one.
    let _ = ask(&url, None, request("edge", &[&[("path", "/api")]])).await.unwrap();
    let (overall, statuses) =
        ask(&url, None, request("edge", &[&[("tenant", "acme")], &[("path", "/api")]])).await.unwrap();
    assert_eq!(overall, Code::OverLimit);
    assert_eq!((statuses[0].0, statuses[1].0), (Code::Ok, Code::OverLimit));
    // A negative hit is a deposit: the units go back to the group (never past its burst of 2)
    // and the descriptor is answered OK.
    let mut refund = request("edge", &[&[("path", "/api")]]);
    refund.descriptors[0].is_negative_hits = true;
    refund.hits_addend = 5;
    let (overall, statuses) = ask(&url, None, refund).await.unwrap();
    assert_eq!((overall, statuses[0].0, statuses[0].2), (Code::Ok, Code::Ok, 2), "{statuses:?}");
    // A charge for work done (Envoy's call after the response) is answered OK however much it
    // is, and the group is in debt after it: the next request is over the limit.
    let mut charge = request("edge", &[&[("path", "/api"), ("tollgate_charge", "after")]]);
    charge.hits_addend = 10;
    let (overall, statuses) = ask(&url, None, charge).await.unwrap();
    assert_eq!((overall, statuses[0].0), (Code::Ok, Code::Ok), "{statuses:?}");
    let (overall, _) = ask(&url, None, request("edge", &[&[("path", "/api")]])).await.unwrap();
    assert_eq!(overall, Code::OverLimit, "in debt after the charge");
    // One charge takes at most what the group repays in a minute (2 a second: 120).
    let mut dear = request("edge", &[&[("path", "/api"), ("tollgate_charge", "after")]]);
    dear.hits_addend = 1_000;
    let e = ask(&url, None, dear).await.unwrap_err();
    assert!(e.message().contains("at most 120 for group \"api\""), "{e}");
    // Rules through the admin API, durable; bad rules named.
    let (ok, out) = cli(&url, None, &["rls", "set-rules", r#"[{"key":"user","group":"u-{value}"}]"#]);
    assert!(ok, "{out}");
    let bad = format!(r#"[{{"key":"user","group":"{}"}}]"#, "g".repeat(300));
    let (ok, out) = cli(&url, None, &["rls", "set-rules", &bad]);
    assert!(!ok && out.contains("rules[0].group: at most 255 bytes"), "{out}");
    let (ok, out) = cli(&url, None, &["rls", "set-rules", "not json"]);
    assert!(!ok && out.contains("rules: expected a JSON array"), "{out}");
    let (ok, out) = cli(&url, None, &["rls", "check", "--domain", "d", "--descriptor", "user=zed"]);
    assert!(ok && out.starts_with("OK") && out.contains("[0] OK  limit none"), "{out}");
    bad_requests_are_named_and_the_server_keeps_serving(&url).await;
    // The rules survive a restart.
    let status = s.terminate();
    assert!(status.success());
    let s = ServerProc::start_with(&dir.join("data"), &[], Stdio::null());
    let (ok, out) = cli(&s.url(), None, &["rls", "rules"]);
    assert!(ok && out.contains("u-{value}"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_token_asks_only_for_its_groups() {
    let dir = data_dir("rls-auth");
    let s = ServerProc::start_with(&dir, &["--auth"], Stdio::null());
    let admin = std::fs::read_to_string(dir.join("admin.token")).unwrap().trim().to_string();
    let (ok, token) =
        cli(&s.url(), Some(&admin), &["token", "create", "--role", "client", "--groups", "edge-*"]);
    assert!(ok, "{token}");
    let token = token.split_whitespace().next().unwrap().to_string();
    let url = s.url();
    assert!(ask(&url, Some(&token), request("d", &[&[("tenant", "edge-a")]])).await.is_ok());
    let e = ask(&url, Some(&token), request("d", &[&[("tenant", "core")]])).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied);
    assert!(e.message().contains("may not exchange for group \"core\""), "{}", e.message());
    let e = ask(&url, None, request("d", &[&[("tenant", "edge-a")]])).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
}

/// Quotas per window from the CLI: shown by `group show`, told to Envoy in the window's unit,
/// and holding the group once spent; a descriptor's own limit is refused by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quotas_per_window_are_set_shown_and_held() {
    let dir = data_dir("rls-quotas");
    let s = ServerProc::start_with(&dir.join("data"), &[], Stdio::null());
    let url = s.url();
    let (ok, out) = cli(
        &url,
        None,
        &["group", "create", "api", "--limit", "1000", "--quota", "5/minute", "--quota", "900/day"],
    );
    assert!(ok, "{out}");
    assert!(out.contains("quotas:   5 per minute, 900 per day"), "{out}");
    let (ok, out) = cli(&url, None, &["group", "create", "bad", "--quota", "5/fortnight"]);
    assert!(
        !ok && out.contains("window \"fortnight\": must be minute, hour, day, week, month, total, a number of seconds such as 90s"),
        "{out}"
    );
    // Envoy is told the tightest window it can name: 5 a minute.
    let access = Access::default();
    let mut client = RateLimitServiceClient::new(access.channel(&url, Duration::from_secs(5)).unwrap());
    let answer =
        client.should_rate_limit(request("edge", &[&[("tenant", "api")]])).await.unwrap().into_inner();
    let limit = answer.statuses[0].current_limit.clone().unwrap();
    assert_eq!((limit.requests_per_unit, limit.unit), (5, Unit::Minute as i32), "{limit:?}");
    // Five in the minute, and what the grants let through before the engine sees them spent:
    // capped at what is left (5 a second) and reported at each exchange, so over these two
    // seconds at most 15.
    let mut admitted = 1;
    for _ in 0..40 {
        let (overall, _) = ask(&url, None, request("edge", &[&[("tenant", "api")]])).await.unwrap();
        admitted += u32::from(overall == Code::Ok);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!((5..=15).contains(&admitted), "{admitted} admitted against 5 a minute");
    let (ok, out) = cli(&url, None, &["group", "alter", "api", "--no-quota", "minute"]);
    assert!(ok && !out.contains("per minute") && out.contains("900 per day"), "{out}");
    // A descriptor that carries its own limit (Envoy's per-route override) is counted against
    // it, as envoy/ratelimit counts: one counter per descriptor and limit.
    common::within_one_minute();
    let own = |tenant: &'static str, unit: Unit| {
        let mut r = request("edge", &[&[("tenant", tenant)]]);
        r.descriptors[0].limit = Some(RateLimitOverride { requests_per_unit: 3, unit: unit as i32 });
        r
    };
    for expect in [(Code::Ok, 3, 2), (Code::Ok, 3, 1), (Code::Ok, 3, 0), (Code::OverLimit, 3, 0)] {
        let (_, statuses) = ask(&url, None, own("api", Unit::Minute)).await.unwrap();
        assert_eq!(statuses[0], expect);
    }
    assert_eq!(
        ask(&url, None, own("web", Unit::Minute)).await.unwrap().1[0],
        (Code::Ok, 3, 2),
        "its own counter"
    );
    let (ok, out) = cli(&url, None, &["group", "show", "rls-override/edge/tenant=*/3-per-minute"]);
    assert!(ok && out.contains("3 per minute"), "{out}");
    let mut bad = own("api", Unit::Minute);
    bad.descriptors[0].limit.as_mut().unwrap().unit = Unit::Unknown as i32;
    let e = ask(&url, None, bad).await.unwrap_err();
    assert!(e.message().starts_with("descriptors[0].limit.unit: must be SECOND"), "{}", e.message());
}

/// A quota per window is a count, as envoy/ratelimit counts one: calls back to back admit
/// exactly the quota (not one more, not one less), each answer's remaining counts down to 0,
/// every answer says when its window resets, and a refused call has nothing remaining and is
/// told to come back when the minute ends, not in a few milliseconds. The same group through
/// `POST /v1/check` shares the count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_per_minute_is_a_count_back_to_back_with_envoys_fields() {
    let s = ServerProc::start(&data_dir("rls-quota"));
    let url = s.url();
    let (ok, out) = cli(&url, None, &["group", "create", "q", "--quota", "70/minute"]);
    assert!(ok, "{out}");
    common::within_one_minute();
    let mut client =
        RateLimitServiceClient::new(Access::default().channel(&url, Duration::from_secs(5)).unwrap());
    let mut remaining = Vec::new();
    let mut refused = 0;
    for _ in 0..90 {
        let answer =
            client.should_rate_limit(request("edge", &[&[("tenant", "q")]])).await.unwrap().into_inner();
        let status = &answer.statuses[0];
        let limit = status.current_limit.as_ref().expect("the limit");
        assert_eq!((limit.requests_per_unit, limit.unit), (70, Unit::Minute as i32));
        let reset = status.duration_until_reset.as_ref().expect("when the window resets");
        assert!(reset.seconds <= 60 && (reset.seconds > 0 || reset.nanos > 0), "{reset:?}");
        match Code::try_from(answer.overall_code).unwrap() {
            Code::Ok => remaining.push(status.limit_remaining),
            Code::OverLimit => {
                refused += 1;
                assert_eq!(status.limit_remaining, 0, "nothing remains once refused");
            }
            c => panic!("{c:?}"),
        }
    }
    assert_eq!(remaining.len(), 70, "exactly the quota admitted: {remaining:?}");
    assert_eq!(remaining, (0..70).rev().collect::<Vec<u32>>(), "remaining counts down");
    assert_eq!(refused, 20);
    // Through HTTP: refused too, with a Retry-After until the minute's end (whole seconds).
    let (status, headers, body) = common::http(&s.http, "POST", "/v1/check", &[], r#"{"group":"q"}"#);
    assert_eq!(status, 429, "{body}");
    let after: u64 = headers
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("retry-after:").map(|v| v.trim().parse().unwrap()))
        .expect("Retry-After");
    assert!((1..=60).contains(&after), "retry after {after} s");
}

/// The answers envoy/ratelimit's users expect from their own files, case by case, written from
/// its documentation and behaviour: wildcards each value apart or sharing one count, a listed
/// value never falling back to the any-value descriptor beside it, limits only where a
/// descriptor ends, quota mode, unlimited descriptors, a check that adds nothing, and each
/// descriptor counted even when another refuses the request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_imported_envoy_ratelimit_file_is_answered_as_envoy_ratelimit_answers() {
    let dir = data_dir("rls-peer");
    let s = ServerProc::start(&dir.join("data"));
    let url = s.url();
    let file = dir.join("peer.yaml");
    std::fs::write(
        &file,
        "domain: peer
descriptors:
  - key: files
    value: /docs/*
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: files
    value: /shared/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: files
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: team
    value: ops
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 1}
  - key: team
    rate_limit: {unit: minute, requests_per_unit: 50}
  - key: cheap
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: dear
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: free
    rate_limit: {unlimited: true}
",
    )
    .unwrap();
    let (done, out) = cli(&url, None, &["import", "envoy-ratelimit", file.to_str().unwrap()]);
    assert!(done, "{out}");
    common::within_one_minute();
    let one = |entries: &'static [(&'static str, &'static str)]| request("peer", &[entries]);
    let go = |r: RateLimitRequest| {
        let url = url.clone();
        async move { ask(&url, None, r).await.unwrap() }
    };
    // A wildcard without share_threshold: each value its own 2 a minute.
    for expect in [Code::Ok, Code::Ok, Code::OverLimit] {
        assert_eq!(go(one(&[("files", "/docs/a")])).await.0, expect);
    }
    assert_eq!(go(one(&[("files", "/docs/b")])).await.1[0], (Code::Ok, 2, 1));
    // With share_threshold: every matching value shares 3.
    for (v, expect) in [
        ("/shared/a", Code::Ok),
        ("/shared/b", Code::Ok),
        ("/shared/c", Code::Ok),
        ("/shared/d", Code::OverLimit),
    ] {
        let r = request("peer", &[&[("files", v)]]);
        assert_eq!(go(r).await.0, expect, "{v}");
    }
    // Values no wildcard matches: the any-value limit.
    assert_eq!(go(one(&[("files", "/home")])).await.1[0], (Code::Ok, 100, 99));
    // A listed value with only nested limits: alone it is not limited, and never by the
    // any-value descriptor beside it; under it, its own limits.
    assert_eq!(go(one(&[("team", "ops")])).await.1[0], (Code::Ok, 0, 0));
    assert_eq!(go(one(&[("team", "ops"), ("user", "ann")])).await.1[0], (Code::Ok, 1, 0));
    assert_eq!(go(one(&[("team", "ops"), ("user", "ann")])).await.0, Code::OverLimit);
    assert_eq!(go(one(&[("team", "dev")])).await.1[0], (Code::Ok, 50, 49));
    // A limit counts only where a descriptor ends: a longer one is not limited by it.
    assert_eq!(go(one(&[("team", "dev"), ("user", "ann")])).await.1[0], (Code::Ok, 0, 0));
    // Quota mode: over its limit, a descriptor refuses the request only when every one in
    // quota mode is over its own.
    let both = || request("peer", &[&[("cheap", "x")], &[("dear", "y")]]);
    let (overall, statuses) = go(both()).await;
    assert_eq!((overall, statuses[0].0, statuses[1].0), (Code::Ok, Code::Ok, Code::Ok));
    let (overall, statuses) = go(both()).await;
    assert_eq!((overall, statuses[0].0, statuses[1].0), (Code::Ok, Code::OverLimit, Code::Ok));
    let (overall, statuses) = go(both()).await;
    assert_eq!((overall, statuses[0].0, statuses[1].0), (Code::OverLimit, Code::OverLimit, Code::OverLimit));
    // Unlimited: OK, no limit, everything remaining.
    assert_eq!(go(one(&[("free", "x")])).await.1[0], (Code::Ok, 0, u32::MAX));
    // A descriptor's hits_addend of 0 checks without counting.
    let mut check_only = one(&[("files", "/docs/c")]);
    check_only.descriptors[0].hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value: 0 });
    for _ in 0..3 {
        assert_eq!(go(check_only.clone()).await.0, Code::Ok);
    }
    assert_eq!(go(one(&[("files", "/docs/c")])).await.1[0], (Code::Ok, 2, 1), "nothing was counted");
    // Each descriptor counts on its own: /docs/e is counted although team=ops/user=bob refuses
    // the request the second time, so a third /docs/e alone finds its 2 spent.
    let mixed = || request("peer", &[&[("files", "/docs/e")], &[("team", "ops"), ("user", "bob")]]);
    assert_eq!(go(mixed()).await.0, Code::Ok);
    assert_eq!(go(mixed()).await.0, Code::OverLimit);
    assert_eq!(go(one(&[("files", "/docs/e")])).await.0, Code::OverLimit);
}

/// The answers Limitador's users expect from their own limits file, case by case, written from
/// its documentation: every limit whose conditions hold applies (in any order of entries, on
/// any descriptor, `!=` included), each user counted apart, a limit on the whole namespace,
/// and a window that starts at a counter's first request rather than on the clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_imported_limitador_file_is_answered_as_limitador_answers() {
    let dir = data_dir("rls-limitador");
    let s = ServerProc::start(&dir.join("data"));
    let url = s.url();
    let file = dir.join("limits.yaml");
    std::fs::write(
        &file,
        "- namespace: api
  max_value: 2
  seconds: 2
  conditions: [\"descriptors[0]['method'] == 'POST'\", \"descriptors[1].plan != 'gold'\"]
  variables: [\"descriptors[0]['user']\"]
- namespace: all
  max_value: 3
  seconds: 3600
  conditions: []
  variables: []
",
    )
    .unwrap();
    let (done, out) = cli(&url, None, &["import", "limitador", file.to_str().unwrap()]);
    assert!(done, "{out}");
    let post = |user: &'static str, plan: &'static str| {
        request("api", &[&[("user", user), ("method", "POST")], &[("plan", plan)]])
    };
    let go = |r: RateLimitRequest| {
        let url = url.clone();
        async move { ask(&url, None, r).await.unwrap().0 }
    };
    // Ann on the free plan (the entries in any order): two posts in her window, then refused.
    assert_eq!(go(post("ann", "free")).await, Code::Ok);
    assert_eq!(
        go(request("api", &[&[("method", "POST"), ("user", "ann")], &[("plan", "free")]])).await,
        Code::Ok
    );
    assert_eq!(go(post("ann", "free")).await, Code::OverLimit);
    // Gold is not != 'gold', and a get is no post: no limit applies to them.
    for _ in 0..3 {
        assert_eq!(go(post("ann", "gold")).await, Code::Ok);
        assert_eq!(
            go(request("api", &[&[("user", "ann"), ("method", "GET")], &[("plan", "free")]])).await,
            Code::Ok
        );
    }
    // Bob has his own counter.
    assert_eq!(go(post("bob", "free")).await, Code::Ok);
    // A limit on the whole namespace: every request counts, whatever it carries.
    for (i, expect) in [Code::Ok, Code::Ok, Code::Ok, Code::OverLimit].into_iter().enumerate() {
        let entries: &[(&str, &str)] = if i % 2 == 0 { &[("a", "1")] } else { &[("b", "2")] };
        assert_eq!(go(request("all", &[entries])).await, expect, "request {i}");
    }
    // Ann's window began at her first post: once it ends, a new one starts at her next post,
    // with its own two (waited for as a condition, never for a set time).
    common::eventually("ann's window to end", || {
        tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(go(post("ann", "free"))) == Code::Ok
        })
    });
    assert_eq!(go(post("ann", "free")).await, Code::Ok);
    assert_eq!(go(post("ann", "free")).await, Code::OverLimit);
}

/// Decisions are read off the wire by hand: a message spread over many HTTP/2 frames is read
/// whole; a body that is no `RateLimitRequest`, a compressed call and a message over 4 MiB
/// are refused with the codes the generated services give (INTERNAL, UNIMPLEMENTED,
/// OUT_OF_RANGE), each naming what is wrong; the server keeps answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_read_by_hand_answer_and_refuse_as_grpc_does() {
    use prost::Message;
    use prost::bytes::Bytes;
    use tonic::codegen::http::uri::PathAndQuery;
    let s = ServerProc::start(&data_dir("rls-wire"));
    let channel = tonic::transport::Endpoint::from_shared(s.url()).unwrap().connect().await.unwrap();
    let call = |body: Bytes, encoding: Option<&'static str>| {
        let mut grpc = tonic::client::Grpc::new(channel.clone());
        async move {
            grpc.ready().await.unwrap();
            let mut req = tonic::Request::new(body);
            if let Some(e) = encoding {
                req.metadata_mut().insert("grpc-encoding", e.parse().unwrap());
            }
            let path =
                PathAndQuery::from_static("/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit");
            grpc.unary(req, path, tollgate_proto::wire::BytesCodec).await.map(|r| r.into_inner())
        }
    };
    // 40 descriptors of a kilobyte each: about 40 KB, more than two frames of 16 KB.
    let long: Vec<String> = (0..40).map(|i| format!("{i}-{}", "v".repeat(1000))).collect();
    let entries: Vec<[(&str, &str); 1]> = long.iter().map(|v| [("user", v.as_str())]).collect();
    let descriptors: Vec<&[(&str, &str)]> = entries.iter().map(|e| e.as_slice()).collect();
    let asked = Bytes::from(request("edge", &descriptors).encode_to_vec());
    assert!(asked.len() > 40_000);
    let answer = call(asked.clone(), None).await.unwrap();
    let answer = envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse::decode(answer).unwrap();
    assert_eq!((answer.overall_code, answer.statuses.len()), (Code::Ok as i32, 40));
    let refused = |r: Result<Bytes, tonic::Status>| r.unwrap_err();
    let e = refused(call(Bytes::from_static(b"\xff\xff\xff"), None).await);
    assert_eq!(e.code(), tonic::Code::Internal, "{e}");
    assert!(e.message().contains("RateLimitRequest does not decode"), "{e}");
    let e = refused(call(asked.clone(), Some("gzip")).await);
    assert_eq!(e.code(), tonic::Code::Unimplemented, "{e}");
    assert!(e.message().contains("compressed (gzip)"), "{e}");
    let e = refused(call(Bytes::from(vec![0u8; 4 * 1024 * 1024 + 1]), None).await);
    assert_eq!(e.code(), tonic::Code::OutOfRange, "{e}");
    assert!(e.message().contains("above the limit of 4194304"), "{e}");
    let again = envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse::decode(
        call(asked, Some("identity")).await.unwrap(),
    )
    .unwrap();
    assert_eq!(again.overall_code, Code::Ok as i32);
}

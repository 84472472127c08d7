//! Regions that stand alone: a region's controllers keep a store of their own (their own
//! etcd, or a lone controller's embedded store) and lease from the global tier over gRPC
//! (`--upstream`), copying its groups; cut off, they serve their last shares and decay them,
//! and the global tier gives a silent region's share back to the others.

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tollgate_testkit::cut::Cuttable;
use tollgate_testkit::etcd::Etcd;

use crate::common::{self, BIN, ServerProc, admin, eventually};
use crate::etcd::{check, output, paced, remote_as, status, stop_all};

/// A controller on `etcd` (grant leases of 2 s, so that a cut-off region decays within the
/// test), with `more` flags.
fn on_etcd(name: &str, etcd: &Etcd, more: &[&str]) -> ServerProc {
    let url = etcd.url();
    let flags = [&["--etcd", url.as_str(), "--lease-ms", "2000"][..], more].concat();
    ServerProc::start_with(&common::data_dir(name), &flags, Stdio::null())
}

/// What each of the two regions admitted in each of the next `seconds` seconds.
async fn per_second(admitted: &[Arc<AtomicU64>; 2], seconds: usize) -> Vec<[u64; 2]> {
    let count = || [admitted[0].load(Ordering::Relaxed), admitted[1].load(Ordering::Relaxed)];
    let mut last = count();
    let mut out = Vec::new();
    for _ in 0..seconds {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = count();
        out.push([now[0] - last[0], now[1] - last[1]]);
        last = now;
    }
    out
}

/// Three etcd clusters: the global tier's, and one for each of two regions. East (two
/// controllers electing on east's etcd) reaches the global tier through a relay the test cuts;
/// west (one controller) directly. Each region copies the global tier's groups, and together
/// they hold its limit. Cut off, east serves its last share for a grant's lease and decays it,
/// while the global tier, hearing nothing from east, gives its share to west; healed, east
/// leases again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regions_on_their_own_etcd_lease_over_grpc_and_ride_out_a_cut() {
    let (g_etcd, e_etcd, w_etcd) = (Etcd::start("up-global"), Etcd::start("up-east"), Etcd::start("up-west"));
    let global = on_etcd("up-global", &g_etcd, &[]);
    let relay = Cuttable::start(&global.grpc);
    let east_flags = ["--region", "east", "--upstream", &relay.url()];
    let east = [on_etcd("up-east-a", &e_etcd, &east_flags), on_etcd("up-east-b", &e_etcd, &east_flags)];
    let west = on_etcd("up-west", &w_etcd, &["--region", "west", "--upstream", &global.url()]);
    admin(&global.url(), &["group", "create", "shared", "--limit", "200"]);
    let all = [&east[0], &east[1], &west];
    for s in all {
        eventually("each region has the global tier's group", || {
            output(&s.url(), &["group", "show", "shared"]).contains("200")
        });
    }
    let leaders = || all.iter().filter(|s| status(&s.http).is_some_and(|v| v["role"] == "leader")).count();
    eventually("east and west each elect a leader of their own", || leaders() == 2);

    // Two clients in each region (east's on each of its controllers), each asking 100/s: 400
    // asked of a global 200.
    let admitted = [Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0))];
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for (i, (r, s)) in [(0, &east[0]), (0, &east[1]), (1, &west), (1, &west)].into_iter().enumerate() {
        tasks.push(paced(remote_as(&format!("c{i}"), &s.url()), "shared", admitted[r].clone(), stop.clone()));
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    let steady = per_second(&admitted, 5).await;
    println!("both regions leasing, admitted per second [east, west]: {steady:?}");
    let total: u64 = steady.iter().map(|s| s[0] + s[1]).sum();
    assert!((950..=1050).contains(&total), "{steady:?}: {total} in 5 s, not within 5 % of 200/s");
    for r in 0..2 {
        assert!(steady.iter().map(|s| s[r]).sum::<u64>() > 300, "each region has its part: {steady:?}");
    }

    // East cut off from the global tier.
    relay.cut();
    let cut = per_second(&admitted, 14).await;
    println!("east cut off, admitted per second [east, west]: {cut:?}");
    // Never above the limit and one burst of east's share (its decay overlaps the global
    // tier's hold on its share by the report expiry).
    assert!(cut.iter().all(|s| s[0] + s[1] <= 300), "{cut:?}");
    assert!(cut[0][0] > 60, "east serves its last share at first: {cut:?}");
    assert!(cut[13][0] < 60, "east's share decays: {cut:?}");
    assert!(cut[13][1] > 170, "the global tier gives east's share to west: {cut:?}");
    let east_status = status(&east[0].http).zip(status(&east[1].http)).unwrap();
    let safe = [&east_status.0, &east_status.1].iter().any(|s| s["upstream_safe_mode"] == true);
    assert!(safe, "east says its shares decay: {east_status:?}");

    // Healed: east leases again, and both together hold the limit.
    relay.heal();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let healed = per_second(&admitted, 3).await;
    println!("healed, admitted per second [east, west]: {healed:?}");
    assert!(healed.iter().all(|s| s[0] + s[1] <= 215), "{healed:?}");
    assert!(healed.iter().all(|s| s[0] > 40), "east leases again: {healed:?}");
    stop_all(&stop, tasks).await;
}

/// A lone regional controller on its embedded store reaches a global tier that asks for TLS
/// and a token: it copies the groups under a `region` token (and follows a change, refusing
/// one of its own), serves a tenant at once, and a reader's token cannot lease.
#[test]
fn an_embedded_region_leases_over_tls_with_a_region_token() {
    let dir = common::data_dir("upstream-tls");
    let pki = tollgate_testkit::pki::Pki::new(&dir, "global-ca");
    let (cert, key) = pki.issue("127.0.0.1", "global", false);
    let tls = ["--auth", "--tls-cert", cert.to_str().unwrap(), "--tls-key", key.to_str().unwrap()];
    let global = ServerProc::start_with(&dir.join("global"), &tls, Stdio::null());
    let global_url = format!("https://{}", global.grpc);
    let ca = pki.ca_file();
    let admin_token = std::fs::read_to_string(dir.join("global/admin.token")).unwrap();
    let run = |args: &[&str]| {
        let out = std::process::Command::new(BIN)
            .args(args)
            .env("TOLLGATE_SERVER", &global_url)
            .env("TOLLGATE_TOKEN", admin_token.trim())
            .env("TOLLGATE_CA", &ca)
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    run(&["group", "create", "paid", "--limit", "100"]);
    let token_of = |role: &str| {
        let made = run(&["token", "create", "--role", role, "--name", &format!("east-{role}")]);
        let file = dir.join(format!("{role}.token"));
        std::fs::write(&file, made.split_whitespace().next().unwrap()).unwrap();
        file
    };
    let start = |token: &std::path::Path, name: &str| {
        let flags = [
            "--region",
            "east",
            "--upstream",
            &global_url,
            "--upstream-ca",
            ca.to_str().unwrap(),
            "--upstream-token-file",
            token.to_str().unwrap(),
        ];
        ServerProc::start_with(&dir.join(name), &flags, Stdio::null())
    };
    let east = start(&token_of("region"), "east");
    eventually("the region copied the group", || output(&east.url(), &["group", "list"]).contains("paid"));
    let codes: Vec<u16> = (0..5).map(|_| check(&east.http, "paid")).collect();
    assert_eq!(codes, [200; 5], "a tenant new to the region is served at once");
    run(&["group", "alter", "paid", "--limit", "150"]);
    eventually("the region follows a change", || {
        output(&east.url(), &["group", "show", "paid"]).contains("150")
    });
    let said = output(&east.url(), &["group", "alter", "paid", "--limit", "500"]);
    assert!(said.contains("copied from the global tier"), "a change made in the region alone: {said}");
    let answered = |s: &ServerProc| {
        common::try_metric(&s.http, "tollgate_region_upstream_exchanges_total{outcome=\"answered\"}")
    };
    assert!(answered(&east).is_some_and(|n| n >= 1.0));
    drop(east);

    // A reader's token may read the groups but not exchange: the region cannot lease.
    let reader = start(&token_of("reader"), "east-reader");
    eventually("a reader's region fails to lease", || {
        // A tenant's check makes the region ask for a share.
        check(&reader.http, "paid");
        common::try_metric(&reader.http, "tollgate_region_upstream_exchanges_total{outcome=\"failed\"}")
            .is_some_and(|n| n >= 1.0)
    });
    assert_eq!(answered(&reader), Some(0.0));
}

/// `--upstream` is refused without `--region`, with a URL that is not one, and with a token
/// file that holds no token; a region with neither `--etcd` nor `--upstream` is refused.
#[test]
fn upstream_flags_are_checked_at_the_start() {
    let dir = common::data_dir("upstream-flags");
    let bad_token = dir.join("bad.token");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(&bad_token, "not a token").unwrap();
    let base = ["server", "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0", "--data", dir.to_str().unwrap()];
    let refused = |more: &[&str]| {
        let out = std::process::Command::new(BIN).args([&base[..], more].concat()).output().unwrap();
        assert!(!out.status.success(), "{more:?} started");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let said = refused(&["--upstream", "http://127.0.0.1:7460"]);
    assert!(said.contains("--region"), "{said}");
    let said = refused(&["--region", "east", "--upstream", "127.0.0.1:7460"]);
    assert!(said.contains("--upstream") && said.contains("http://HOST:PORT"), "{said}");
    let said = refused(&[
        "--region",
        "east",
        "--upstream",
        "http://127.0.0.1:7460",
        "--upstream-token-file",
        bad_token.to_str().unwrap(),
    ]);
    assert!(said.contains("--upstream-token-file") && said.contains("tg_ID_SECRET"), "{said}");
    let said = refused(&["--region", "east"]);
    assert!(said.contains("--etcd") && said.contains("--upstream"), "{said}");
}

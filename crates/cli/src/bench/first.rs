//! `tollgate bench first-answer`: how long a new group's first request takes to be answered
//! through the server's HTTP check (`POST /v1/check`) and Envoy's rate-limit service (RLS),
//! one new group after another, as new tenants arriving back to back would.

use std::time::Duration;

use anyhow::Context;
use clap::Args;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tollgate_model::time::Clock;

use crate::say;

/// The most new groups one run asks for, per path.
pub const GROUPS_MAX: usize = 100_000;

/// `tollgate bench first-answer` arguments.
#[derive(Args, Debug)]
pub struct FirstAnswerArgs {
    /// The server's HTTP address (host:port), for `POST /v1/check`.
    #[arg(long, default_value = "127.0.0.1:7461")]
    server_http: String,
    /// New groups asked for on each path, one after another.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=GROUPS_MAX as u64))]
    groups: u64,
    /// The new groups' names begin with this (each run should use a prefix no earlier run
    /// used, so that its groups are new to the server).
    #[arg(long, default_value = "first")]
    prefix: String,
}

/// Latencies' summary: p50, p99 and the largest, in milliseconds.
fn summary(mut ms: Vec<f64>) -> String {
    ms.sort_by(f64::total_cmp);
    let at = |q: f64| ms[((ms.len() as f64 * q).ceil() as usize).clamp(1, ms.len()) - 1];
    format!("p50 {:.3} ms  p99 {:.3} ms  max {:.3} ms", at(0.5), at(0.99), ms[ms.len() - 1])
}

/// One `POST /v1/check` on a fresh connection, with the token if there is one: the status
/// code.
async fn check(addr: &str, group: &str, token: Option<&str>) -> anyhow::Result<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.with_context(|| format!("cannot reach {addr}"))?;
    s.set_nodelay(true)?;
    let body = format!(r#"{{"group":"{group}"}}"#);
    let auth = token.map_or(String::new(), |t| format!("authorization: Bearer {t}\r\n"));
    let request = format!(
        "POST /v1/check HTTP/1.1\r\nHost: {addr}\r\n{auth}content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(request.as_bytes()).await?;
    let mut answer = Vec::new();
    (&mut s).take(1 << 20).read_to_end(&mut answer).await?;
    let text = String::from_utf8_lossy(&answer);
    text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).context("not an HTTP answer")
}

/// Runs the benchmark.
/// The rate-limit service is reached at `--server` (its gRPC address), with its access flags.
pub async fn first_answer(a: FirstAnswerArgs, target: &crate::admin::Target) -> anyhow::Result<()> {
    if a.prefix.is_empty()
        || a.prefix.len() > 200
        || !a.prefix.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    {
        anyhow::bail!("--prefix: 1 to 200 letters, digits or dashes, got {:?}", a.prefix);
    }
    let clock = tollgate_limiter::clock::TokioClock::new();
    let n = a.groups as usize;
    // HTTP: a connection per check, as a program without keep-alive would (the connection's
    // setup is in the figure).
    let (mut http, mut http_refused) = (Vec::with_capacity(n), 0usize);
    for i in 0..n {
        let group = format!("{}-http-{i}", a.prefix);
        let started = clock.now();
        let code = check(&a.server_http, &group, target.access.token.as_deref()).await?;
        http.push(clock.now().since(started).as_secs_f64() * 1e3);
        http_refused += usize::from(code != 200);
    }
    // RLS: one gRPC channel, as Envoy keeps one to its rate-limit cluster.
    let channel = crate::admin::channel(target).await?;
    let mut rls = RateLimitServiceClient::new(channel);
    let (mut grpc, mut grpc_refused) = (Vec::with_capacity(n), 0usize);
    for i in 0..n {
        let value = format!("{}-rls-{i}", a.prefix);
        let request = RateLimitRequest {
            domain: "bench".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry { key: "tenant".into(), value }],
                ..RateLimitDescriptor::default()
            }],
            hits_addend: 1,
        };
        let started = clock.now();
        let answer = tokio::time::timeout(Duration::from_secs(10), rls.should_rate_limit(request))
            .await
            .context("no answer within 10 s")?
            .map_err(|s| anyhow::anyhow!("the rate-limit service: {}", s.message()))?
            .into_inner();
        grpc.push(clock.now().since(started).as_secs_f64() * 1e3);
        grpc_refused += usize::from(answer.overall_code != Code::Ok as i32);
    }
    say(format!("new groups' first answer, {n} groups one after another on each path:"));
    say(format!("  POST /v1/check  {}  refused {http_refused}", summary(http)));
    say(format!("  RLS             {}  refused {grpc_refused}", summary(grpc)));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_reads_its_percentiles_from_the_sorted_times() {
        let ms: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(summary(ms), "p50 50.000 ms  p99 99.000 ms  max 100.000 ms");
        assert_eq!(summary(vec![2.0]), "p50 2.000 ms  p99 2.000 ms  max 2.000 ms");
    }
}

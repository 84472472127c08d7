//! `tollgate bench`: the load programs that measure Tollgate as its users run it, each in a
//! module of its own (`surge`, `overload`, `capacity`, `converge`, `first`, the quota counts of
//! `accuracy` in `counts`, and the open-loop load they share in `load`); this module holds
//! `bench exchange`, which loads a controller with admission exchanges over real gRPC, and
//! `bench accuracy`.

pub(crate) mod capacity;
pub(crate) mod converge;
pub(crate) mod counts;
pub(crate) mod first;
pub(crate) mod load;
pub(crate) mod overload;
pub(crate) mod surge;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use prost::bytes;
use tollgate_proto::v1;
use tonic::transport::Channel;

use crate::bench::load::{offer, open_loop, own_cpu, process_usage};
use crate::say;

/// `tollgate bench exchange` arguments.
#[derive(Args, Debug)]
pub struct ExchangeArgs {
    /// The controller, or several, comma-separated: the connections are spread over them in
    /// turn (connection `i` to address `i mod N`), and the clients over the connections, so
    /// that every controller answers its share (followers pass theirs on to the leader).
    #[arg(long, env = "TOLLGATE_SERVER", default_value = "http://127.0.0.1:7460")]
    server: String,
    /// Simulated clients, each exchanging for all its groups at once.
    #[arg(long, default_value_t = 1000)]
    clients: usize,
    /// Groups per client.
    #[arg(long, default_value_t = 10)]
    groups: usize,
    /// Seconds to run.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Exchanges per second per client; 0: as fast as the server answers.
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
    /// gRPC connections the clients share.
    #[arg(long, default_value_t = 8)]
    connections: usize,
    /// Worker threads of the load program (1 to 64). By default one when paced (`--rate`
    /// above 0: on a machine shared with the server, one thread switches least and leaves
    /// the most of the cores to it), one a core as fast as it answers.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=64))]
    threads: Option<u16>,
    /// The server's process id, to report its CPU time and peak memory (Linux /proc).
    #[arg(long)]
    server_pid: Option<u32>,
    /// An HTTP address (host:port) whose `/metrics` (or `--scrape-path`s) is scraped every
    /// second during the run: the exchange latency with a scraper at work, and how long each
    /// scrape took.
    #[arg(long)]
    scrape: Option<String>,
    /// The paths `--scrape` fetches each second, one after the other (repeat the flag; default
    /// `/metrics`), such as `/status`, `/v1/groups` or `/v1/status`.
    #[arg(long = "scrape-path", requires = "scrape")]
    scrape_paths: Vec<String>,
    /// The server's HTTP address (host:port): its own histogram of the time it took to answer
    /// each exchange is read before and after the run, and how many it answered within each
    /// bound printed beside the latency the clients saw (which adds their gRPC stack's and
    /// the machine's scheduling).
    #[arg(long)]
    server_http: Option<String>,
    /// After the run, wait this many seconds and report the server's memory again (with
    /// `--server-pid`): whether what the load left behind is given back.
    #[arg(long, default_value_t = 0)]
    settle: u64,
    /// Backends reporting to the controller meanwhile, each once a second at a phase of its
    /// own: saturated (utilisation 1.1), with a load on its share of the clients' groups
    /// (group `i` on backend `i mod N`, up to the 10,000 groups a report may carry), so that
    /// every tick gathers their loads and limits those groups.
    #[arg(long, default_value_t = 0)]
    backends: usize,
    /// With the groups sharded over the controllers (`tollgate server --shards`): each client
    /// sends each group's part to its owner itself, as the Rust and Python clients do once
    /// they hold the shard map. Before the run, each client exchanges once through a
    /// controller, whose answer names its groups' shards and the map; `--server` must name
    /// every controller the map does.
    #[arg(long)]
    route: bool,
}

/// One simulated client's exchange, encoded once: the load program spends its CPU on
/// sending and receiving, not on building and parsing messages, so that on a machine it shares
/// with the server it takes as little of the server's cores as it can.
struct Encoded {
    /// Every field of the request but its sequence number.
    fields: bytes::Bytes,
    /// How many groups it carries (and grants an answer must hold).
    groups: usize,
}

impl Encoded {
    /// Client `c`'s request for its `groups` groups.
    fn exchange(c: usize, groups: usize) -> Self {
        Self::of(&Self::request(c, groups))
    }

    /// `request`, encoded but for its number.
    fn of(request: &v1::ExchangeRequest) -> Self {
        use prost::Message;
        Self { fields: request.encode_to_vec().into(), groups: request.groups.len() }
    }

    /// Client `c`'s request for its `groups` groups, not encoded.
    fn request(c: usize, groups: usize) -> v1::ExchangeRequest {
        v1::ExchangeRequest {
            client_id: format!("bench-client-{c}"),
            sequence: 0,
            target_request_period_ms: 0,
            shard_map_epoch: None,
            // As the clients send it (the bench's groups have no quota).
            takes_allotments: true,
            groups: (0..groups)
                .map(|g| v1::GroupUsage {
                    group: format!("bench-{}", (c * groups + g) % 100_000),
                    demand: 100.0,
                    consumed: 50.0,
                    admitted: 5,
                    ..Default::default()
                })
                .collect(),
        }
    }

    /// The request numbered `sequence`: protocol buffers read fields in any order, so the
    /// number is appended to the encoded rest.
    fn numbered(&self, sequence: u64) -> bytes::Bytes {
        use prost::Message;
        let number = v1::ExchangeRequest { sequence, ..Default::default() };
        let mut out = bytes::BytesMut::with_capacity(self.fields.len() + 11);
        out.extend_from_slice(&self.fields);
        number.encode(&mut out).expect("room reserved");
        out.freeze()
    }

    /// How many grants an encoded answer holds (field 1, length-delimited, at the top
    /// level), without decoding them; 0 for an answer that does not parse.
    fn grants(answer: &bytes::Bytes) -> usize {
        use prost::encoding::{WireType, decode_key, decode_varint, skip_field};
        let mut buf = answer.clone();
        let mut n = 0;
        while !buf.is_empty() {
            let Ok((tag, wire)) = decode_key(&mut buf) else { return 0 };
            if tag == 1 && wire == WireType::LengthDelimited {
                let Ok(len) = decode_varint(&mut buf) else { return 0 };
                let Ok(len) = usize::try_from(len) else { return 0 };
                if len > buf.len() {
                    return 0;
                }
                bytes::Buf::advance(&mut buf, len);
                n += 1;
            } else if skip_field(wire, tag, &mut buf, Default::default()).is_err() {
                return 0;
            }
        }
        n
    }
}

/// Resident memory (kB) of `pid` now.
fn resident_kb(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find(|l| l.starts_with("VmRSS:"))?.split_whitespace().nth(1)?.parse().ok()
}

/// Fetches `http://addr{path}` once, reading it through without keeping it: how long it took,
/// in seconds, and its size in bytes.
async fn scrape_once(addr: &str, path: &str) -> std::io::Result<(f64, usize)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tollgate_model::time::Clock;
    let clock = tollgate_limiter::clock::TokioClock::new();
    let started = clock.now();
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes())
        .await?;
    let mut buf = vec![0u8; 1 << 16];
    let mut size = 0;
    loop {
        match s.read(&mut buf).await? {
            0 => break,
            n => size += n,
        }
    }
    Ok((clock.now().since(started).as_secs_f64(), size))
}

/// `http://addr/metrics`, its head included.
async fn metrics_text(addr: &str) -> std::io::Result<Vec<u8>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes())
        .await?;
    let mut body = Vec::new();
    // At most 64 MiB: a metrics page, not a stream.
    (&mut s).take(64 << 20).read_to_end(&mut body).await?;
    Ok(body)
}

/// The server's exchange-latency histogram in a `/metrics` text: (upper bound in seconds,
/// exchanges answered within it), in the text's (ascending) order.
fn latency_buckets(text: &str) -> Vec<(f64, f64)> {
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("tollgate_exchange_latency_seconds_bucket{le=\"")?;
            let (le, count) = rest.split_once("\"}")?;
            let le = if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? };
            Some((le, count.trim().parse().ok()?))
        })
        .collect()
}

/// What the server's histogram says of the exchanges between two readings of it: the share
/// answered within each bound, and the smallest bound holding 99 % of them.
fn server_latency(before: &[(f64, f64)], after: &[(f64, f64)]) -> Option<String> {
    let counts: Vec<(f64, f64)> = after
        .iter()
        .map(|&(le, n)| (le, n - before.iter().find(|b| b.0 == le).map_or(0.0, |b| b.1)))
        .collect();
    let total = counts.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let p99 = counts.iter().find(|(_, n)| *n >= 0.99 * total)?.0;
    let shares: Vec<String> = counts
        .iter()
        .filter(|(le, _)| *le <= 0.01)
        .map(|(le, n)| format!("{:.2} % within {} ms", n / total * 100.0, le * 1e3))
        .collect();
    Some(format!(
        "server's own answer time ({total:.0} exchanges): p99 at most {} ms; {}",
        p99 * 1e3,
        shares.join(", ")
    ))
}

impl ExchangeArgs {
    /// The load program's worker threads: `--threads`, or its default for the pace.
    pub fn worker_threads(&self) -> usize {
        match self.threads {
            Some(n) => usize::from(n),
            None if self.rate > 0.0 => 1,
            None => std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }
}

/// The most connections the load program opens for its clients, and the most backends.
const CONNECTIONS_MAX: usize = 1000;

pub async fn exchange(a: ExchangeArgs, access: tollgate_limiter::access::Access) -> anyhow::Result<()> {
    anyhow::ensure!(
        a.clients > 0 && a.groups > 0 && a.connections > 0,
        "--clients, --groups and --connections must be above 0"
    );
    anyhow::ensure!(a.duration > 0.0 && a.duration.is_finite(), "--duration must be above 0 seconds");
    anyhow::ensure!(a.rate >= 0.0 && a.rate.is_finite(), "--rate must be 0 or more");
    let bearer = access.bearer().map_err(|e| anyhow::anyhow!("--token: {e}"))?;
    anyhow::ensure!(
        a.connections <= CONNECTIONS_MAX && a.backends <= CONNECTIONS_MAX,
        "--connections and --backends must be at most {CONNECTIONS_MAX} (each backend has a connection of its own)"
    );
    let (channels, backend_channels) = connect_all(&a, &access).await?;
    let baseline = a.server_pid.and_then(resident_kb);
    let histogram = |text: std::io::Result<Vec<u8>>| {
        text.map(|t| latency_buckets(&String::from_utf8_lossy(&t)))
            .with_context(|| "cannot read the server's /metrics (--server-http)")
    };
    let latency_before = match &a.server_http {
        Some(addr) => Some(histogram(metrics_text(addr).await)?),
        None => None,
    };
    let before = a.server_pid.and_then(process_usage);
    let clock = tollgate_limiter::clock::TokioClock::new();
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = tokio::task::JoinSet::new();
    // Everything each client needs is made first, so that their schedules start together.
    let prepared = prepare_clients(&a, &channels, &bearer).await?;
    let period = (a.rate > 0.0).then(|| Duration::from_secs_f64(1.0 / a.rate));
    // With a rate, each client waits for its turn from the pacer.
    let turns: Option<Vec<Arc<tokio::sync::Notify>>> =
        period.map(|_| (0..a.clients).map(|_| Arc::new(tokio::sync::Notify::new())).collect());
    for (c, parts) in prepared.into_iter().enumerate() {
        let (stop, clock) = (stop.clone(), clock.clone());
        let turn = turns.as_ref().map(|t| t[c].clone());
        tasks.spawn(client_loop(parts, stop, clock, turn));
    }
    let held_up = match (period, &turns) {
        (Some(period), Some(turns)) => Some(pace(turns.clone(), period, stop.clone())?),
        _ => None,
    };
    let (stop_reporting, _) = tokio::sync::watch::channel(false);
    let mut reporters = backends(&a, &backend_channels, &bearer, &stop_reporting);
    let scraper =
        a.scrape.clone().map(|addr| tokio::spawn(scrape(addr, a.scrape_paths.clone(), stop.clone())));
    tokio::time::sleep(Duration::from_secs_f64(a.duration)).await;
    stop.store(true, Ordering::Relaxed);
    // Clients waiting for their next turn see the stop now, not at that turn.
    turns.iter().flatten().for_each(|t| t.notify_one());
    let (mut all, failed, first_error) = join_clients(tasks).await?;
    let after = a.server_pid.and_then(process_usage);
    stop_reporting.send_replace(true);
    let reports = join_reporters(&mut reporters).await?;
    if let (true, 0, Some(period)) = (all.is_empty(), failed, period) {
        anyhow::bail!(
            "no exchange was due in --duration {} s: at --rate {} each client exchanges once every {:.3} s, at a phase of its own; run for a period at least",
            a.duration,
            a.rate,
            period.as_secs_f64()
        );
    }
    anyhow::ensure!(
        !all.is_empty(),
        "no exchange succeeded ({failed} failed; the first: {})",
        first_error.unwrap_or_default()
    );
    say_throughput(&a, &mut all);
    if let (Some(addr), Some(before)) = (&a.server_http, latency_before) {
        let after = histogram(metrics_text(addr).await)?;
        say(server_latency(&before, &after)
            .unwrap_or_else(|| "the server's histogram counted no exchange".into()));
    }
    if let (Some((cpu0, _)), Some((cpu1, hwm))) = (before, after) {
        say(format!(
            "server CPU {:.0} % of one core   server peak memory {:.1} MB",
            (cpu1 - cpu0) / a.duration * 100.0,
            hwm as f64 / 1024.0
        ));
    }
    if a.backends > 0 {
        say(format!(
            "backends {} (saturated), each reporting the loads of up to {} groups once a second: {} reports taken, {} refused{}",
            a.backends,
            backend_groups(&a, 0).len(),
            reports.0,
            reports.1,
            reports.2.map(|e| format!(" (the first: {e})")).unwrap_or_default()
        ));
    }
    if let Some(held_up) = held_up.filter(|h| h.times.load(Ordering::Relaxed) > 0) {
        say(format!(
            "the pacing thread was held up {} times (the longest {:.1} ms): the turns due meanwhile came at twice the rate after, not at once",
            held_up.times.load(Ordering::Relaxed),
            held_up.longest_ns.load(Ordering::Relaxed) as f64 / 1e6
        ));
    }
    if let Some(scraper) = scraper {
        say_scrapes(scraper.await?);
    }
    if let (Some(pid), true) = (a.server_pid, a.settle > 0) {
        say_settled(pid, baseline, a.settle).await;
    }
    if failed > 0 {
        say(format!("failed exchanges {failed} (the first: {})", first_error.unwrap_or_default()));
        anyhow::bail!("{failed} exchanges failed");
    }
    Ok(())
}

/// What a client's loop ends with: its exchanges' latencies, and how many failed with the
/// first failure.
type ClientRun = (Vec<f64>, (u64, Option<String>));

/// The latencies of every client's exchanges, how many failed, and the first failure.
async fn join_clients(
    mut tasks: tokio::task::JoinSet<ClientRun>,
) -> anyhow::Result<(Vec<f64>, u64, Option<String>)> {
    let mut all: Vec<f64> = Vec::new();
    let (mut failed, mut first_error) = (0u64, None);
    while let Some(r) = tasks.join_next().await {
        let (latencies, (n, error)) = r?;
        all.extend(latencies);
        failed += n;
        first_error = first_error.or(error);
    }
    Ok((all, failed, first_error))
}

/// The backends' reports: taken, refused, and the first refusal.
async fn join_reporters(
    reporters: &mut tokio::task::JoinSet<(u64, u64, Option<String>)>,
) -> anyhow::Result<(u64, u64, Option<String>)> {
    let mut reports = (0u64, 0u64, None::<String>);
    while let Some(r) = reporters.join_next().await {
        let (sent, failed, error) = r?;
        reports.0 += sent;
        reports.1 += failed;
        reports.2 = reports.2.or(error);
    }
    Ok(reports)
}

/// The exchanges' rate and latency percentiles.
fn say_throughput(a: &ExchangeArgs, all: &mut [f64]) {
    all.sort_by(f64::total_cmp);
    let pct = |p: f64| all[((all.len() as f64 * p) as usize).min(all.len() - 1)] * 1e3;
    let exchanges = all.len() as f64 / a.duration;
    say(format!(
        "clients {} × groups {} for {} s over {} connections, the load program's worker threads {}",
        a.clients,
        a.groups,
        a.duration,
        a.connections,
        a.worker_threads()
    ));
    say(format!("exchanges/s {exchanges:.0}   group grants/s {:.0}", exchanges * a.groups as f64));
    say(format!(
        "latency p50 {:.2} ms   p90 {:.2} ms   p99 {:.2} ms   p99.9 {:.2} ms",
        pct(0.5),
        pct(0.9),
        pct(0.99),
        pct(0.999)
    ));
}

/// The load program's connections: `a.connections` for its clients, and one for each of its
/// backends (a process of its own: a report of 10,000 loads sent on a client's connection
/// would hold up that client's exchanges behind it).
async fn connect_all(
    a: &ExchangeArgs,
    access: &tollgate_limiter::access::Access,
) -> anyhow::Result<(
    Vec<tollgate_proto::frames::EndKnownCalls<Channel>>,
    Vec<tollgate_proto::frames::EndKnownCalls<Channel>>,
)> {
    let urls: Vec<&str> = a.server.split(',').map(str::trim).collect();
    anyhow::ensure!(
        urls.len() <= tollgate_limiter::remote::CONTROLLERS_MAX && urls.iter().all(|u| !u.is_empty()),
        "--server: 1 to {} addresses, comma-separated, none empty",
        tollgate_limiter::remote::CONTROLLERS_MAX
    );
    let connect = |i: usize| {
        let url = urls[i % urls.len()];
        async move {
            access
                .endpoint(url)
                .map_err(|e| anyhow::anyhow!("--server {url}: {e}"))?
                .connect_timeout(Duration::from_secs(5))
                .timeout(Duration::from_secs(5))
                .connect()
                .await
                .map(tollgate_proto::frames::EndKnownCalls)
                .with_context(|| format!("cannot reach the tollgate server at {url}"))
        }
    };
    let mut channels = Vec::new();
    for i in 0..a.connections {
        channels.push(connect(i).await?);
    }
    let mut backend_channels = Vec::new();
    for i in 0..a.backends {
        backend_channels.push(connect(i).await?);
    }
    Ok((channels, backend_channels))
}

/// How long the scrapes of each path took.
fn say_scrapes(scraped: Vec<(String, Vec<f64>, usize)>) {
    for (path, mut took, size) in scraped {
        took.sort_by(f64::total_cmp);
        if let Some(worst) = took.last() {
            say(format!(
                "scrapes of {path} {}: median {:.1} ms, worst {:.1} ms, {:.1} MB each",
                took.len(),
                took[took.len() / 2] * 1e3,
                worst * 1e3,
                size as f64 / 1e6
            ));
        }
    }
}

/// The server's memory before the load (`baseline`), at its end, and after `settle` seconds
/// idle.
async fn say_settled(pid: u32, baseline: Option<u64>, settle: u64) {
    let peak = resident_kb(pid);
    tokio::time::sleep(Duration::from_secs(settle)).await;
    let settled = resident_kb(pid);
    let mb = |kb: Option<u64>| kb.map_or("?".to_string(), |k| format!("{:.1}", k as f64 / 1024.0));
    say(format!(
        "server memory: {} MB before the load, {} MB at its end, {} MB after {} s idle",
        mb(baseline),
        mb(peak),
        mb(settled),
        settle
    ));
}

/// A connection of the load program's, carrying the token.
type Exchanger = tonic::client::Grpc<
    tonic::service::interceptor::InterceptedService<
        tollgate_proto::frames::EndKnownCalls<Channel>,
        tollgate_limiter::access::Bearer,
    >,
>;

/// Sends `request` numbered `sequence` over `grpc`: the grants its answer holds.
async fn exchange_once(
    grpc: &mut Exchanger,
    request: &Encoded,
    sequence: u64,
) -> Result<usize, tonic::Status> {
    grpc.ready().await.map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/tollgate.v1.Admission/Exchange");
    let answer = grpc
        .unary(tonic::Request::new(request.numbered(sequence)), path, tollgate_proto::wire::BytesCodec)
        .await?;
    Ok(Encoded::grants(answer.get_ref()))
}

/// One client of the load program: exchanges until `stop` (on its `turn` when paced), timing
/// each; returns the latencies of those answered in full, and how many failed with the first
/// reason. An exchange of several `parts` (one per owner, with `--route`) sends them all at
/// once and is answered when the last is.
async fn client_loop(
    mut parts: Vec<(Exchanger, Encoded)>,
    stop: Arc<AtomicBool>,
    clock: tollgate_limiter::clock::TokioClock,
    turn: Option<Arc<tokio::sync::Notify>>,
) -> (Vec<f64>, (u64, Option<String>)) {
    use tollgate_model::time::Clock;
    let mut latencies = Vec::new();
    let mut failures: (u64, Option<String>) = (0, None);
    let mut sequence = 0u64;
    while !stop.load(Ordering::Relaxed) {
        if let Some(turn) = &turn {
            turn.notified().await;
            if stop.load(Ordering::Relaxed) {
                break;
            }
        }
        sequence += 1;
        let started = clock.now();
        let calls = parts.iter_mut().map(|(grpc, request)| async {
            match exchange_once(grpc, request, sequence).await {
                Ok(n) if n == request.groups => Ok(()),
                Ok(n) => Err(format!("{n} grants for {} groups", request.groups)),
                Err(status) => Err(status.message().to_string()),
            }
        });
        let failed = futures_util::future::join_all(calls).await.into_iter().find_map(Result::err);
        match failed {
            None => latencies.push(clock.now().since(started).as_secs_f64()),
            Some(why) => {
                failures.0 += 1;
                failures.1.get_or_insert(why);
                // The server is struggling or gone: do not hammer it.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    (latencies, failures)
}

/// Each client's exchange, as the parts it sends and the connection each goes over: whole
/// over connection `c mod N`, or with `--route` one part per owner.
async fn prepare_clients(
    a: &ExchangeArgs,
    channels: &[tollgate_proto::frames::EndKnownCalls<Channel>],
    bearer: &tollgate_limiter::access::Bearer,
) -> anyhow::Result<Vec<Vec<(Exchanger, Encoded)>>> {
    if a.route {
        return routed_parts(a, channels, bearer).await;
    }
    Ok((0..a.clients)
        .map(|c| {
            let service = tonic::service::interceptor::InterceptedService::new(
                channels[c % channels.len()].clone(),
                bearer.clone(),
            );
            vec![(tonic::client::Grpc::new(service), Encoded::exchange(c, a.groups))]
        })
        .collect())
}

/// With `--route`: each client's exchange as parts by owner, each over a connection to its
/// owner. Each client first exchanges once (unnumbered) through the controller of its
/// connection, whose answer names its groups' shards and carries the shard map.
async fn routed_parts(
    a: &ExchangeArgs,
    channels: &[tollgate_proto::frames::EndKnownCalls<Channel>],
    bearer: &tollgate_limiter::access::Bearer,
) -> anyhow::Result<Vec<Vec<(Exchanger, Encoded)>>> {
    use tollgate_limiter::shards::map_of;
    let urls: Vec<&str> = a.server.split(',').map(|u| u.trim().trim_end_matches('/')).collect();
    anyhow::ensure!(
        a.connections >= urls.len(),
        "--route needs at least one connection per --server address"
    );
    let service =
        |i: usize| tonic::service::interceptor::InterceptedService::new(channels[i].clone(), bearer.clone());
    let mut map: Option<tollgate_model::shard::ShardMap> = None;
    let mut asked = Vec::with_capacity(a.clients);
    for c in 0..a.clients {
        let request = v1::ExchangeRequest { shard_map_epoch: Some(0), ..Encoded::request(c, a.groups) };
        let mut client = v1::admission_client::AdmissionClient::new(service(c % channels.len()));
        let answer = client
            .exchange(request.clone())
            .await
            .map_err(|s| anyhow::anyhow!("client {c}'s first exchange: {}", s.message()))?
            .into_inner();
        if let Some(m) = &answer.shard_map {
            let m = map_of(m).map_err(|e| anyhow::anyhow!("a controller sent a malformed shard map: {e}"))?;
            if map.as_ref().is_none_or(|held| held.epoch() < m.epoch()) {
                map = Some(m);
            }
        }
        let shards: std::collections::HashMap<String, u32> =
            answer.grants.iter().filter_map(|g| Some((g.group.clone(), g.shard?))).collect();
        asked.push((request, shards));
    }
    let map = map.context(
        "--route: no controller sent a shard map (are the groups sharded: tollgate server --shards?)",
    )?;
    let per_owner = a.connections / urls.len();
    let mut out = Vec::with_capacity(a.clients);
    for (c, (request, shards)) in asked.into_iter().enumerate() {
        let mut parts: Vec<(usize, v1::ExchangeRequest)> = Vec::new();
        for g in &request.groups {
            let shard = shards.get(&g.group).and_then(|&s| u16::try_from(s).ok());
            let owner = shard.and_then(|s| map.owner(s)).with_context(|| {
                format!("--route: group {} has no owner yet (wait for the map to settle)", g.group)
            })?;
            let at = urls
                .iter()
                .position(|u| *u == owner.trim_end_matches('/'))
                .with_context(|| format!("--route: the map names {owner}, which --server does not"))?;
            match parts.iter_mut().find(|(o, _)| *o == at) {
                Some((_, part)) => part.groups.push(g.clone()),
                None => parts.push((
                    at,
                    v1::ExchangeRequest { groups: vec![g.clone()], shard_map_epoch: None, ..request.clone() },
                )),
            }
        }
        let conn = |at: usize| at + urls.len() * (c % per_owner);
        out.push(
            parts
                .into_iter()
                .map(|(at, part)| (tonic::client::Grpc::new(service(conn(at))), Encoded::of(&part)))
                .collect(),
        );
    }
    Ok(out)
}

/// Scrapes each of `paths` (`/metrics` when none) at `addr` once a second until `stop`;
/// returns each path with how long each scrape took and the size of the last.
async fn scrape(addr: String, paths: Vec<String>, stop: Arc<AtomicBool>) -> Vec<(String, Vec<f64>, usize)> {
    let paths = if paths.is_empty() { vec!["/metrics".to_string()] } else { paths };
    let mut scraped: Vec<(String, Vec<f64>, usize)> = paths.into_iter().map(|p| (p, Vec::new(), 0)).collect();
    while !stop.load(Ordering::Relaxed) {
        for (path, took, size) in &mut scraped {
            if let Ok((t, bytes)) = scrape_once(&addr, path).await {
                took.push(t);
                *size = bytes;
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    scraped
}

/// The groups backend `b` of `a.backends` carries: of the clients' groups, every
/// `a.backends`-th from `b`, up to what a report may carry.
fn backend_groups(a: &ExchangeArgs, b: usize) -> Vec<String> {
    let distinct = (a.clients * a.groups).min(100_000);
    (b..distinct)
        .step_by(a.backends.max(1))
        .take(tollgate_proto::REPORT_GROUPS_MAX)
        .map(|g| format!("bench-{g}"))
        .collect()
}

/// Backend `b`'s report, encoded: every group it serves at 100 units a second, overloaded.
fn backend_report(a: &ExchangeArgs, b: usize) -> bytes::Bytes {
    use prost::Message;
    v1::BackendReport {
        backend_id: format!("bench-backend-{b}"),
        zone: format!("bench-zone-{}", b % 3),
        health: Some(v1::backend_report::Health::Utilisation(1.1)),
        loads: backend_groups(a, b)
            .into_iter()
            .map(|group| v1::GroupLoad { group, units_per_s: 100.0 })
            .collect(),
        capacity: None,
    }
    .encode_to_vec()
    .into()
}

/// Starts `a.backends` reporters, each on a connection of its own (`channels`, one a
/// backend) and reporting once a second at a phase of its own until `stop` is sent; each
/// returns the reports taken, those refused and the first refusal.
fn backends(
    a: &ExchangeArgs,
    channels: &[tollgate_proto::frames::EndKnownCalls<Channel>],
    bearer: &tollgate_limiter::access::Bearer,
    stop: &tokio::sync::watch::Sender<bool>,
) -> tokio::task::JoinSet<(u64, u64, Option<String>)> {
    let mut set = tokio::task::JoinSet::new();
    for b in 0..a.backends {
        // Encoded once, as the clients' exchanges are: the load program's own work stays small.
        let report = backend_report(a, b);
        let service = tonic::service::interceptor::InterceptedService::new(
            channels[b % channels.len()].clone(),
            bearer.clone(),
        );
        let mut grpc = tonic::client::Grpc::new(service);
        let phase = Duration::from_secs_f64(b as f64 / a.backends as f64);
        let mut stopped = stop.subscribe();
        set.spawn(async move {
            let (mut sent, mut failed, mut first) = (0, 0, None);
            tokio::select! {
                _ = tokio::time::sleep(phase) => {}
                _ = stopped.changed() => return (sent, failed, first),
            }
            let mut every = tokio::time::interval(Duration::from_secs(1));
            // Its first tick is at once: the first report, made now.
            every.tick().await;
            loop {
                let path =
                    tonic::codegen::http::uri::PathAndQuery::from_static("/tollgate.v1.Backend/Report");
                let answer = match grpc.ready().await {
                    Ok(()) => {
                        grpc.unary(
                            tonic::Request::new(report.clone()),
                            path,
                            tollgate_proto::wire::BytesCodec,
                        )
                        .await
                    }
                    Err(e) => Err(tonic::Status::unavailable(e.to_string())),
                };
                match answer {
                    Ok(_) => sent += 1,
                    Err(status) => {
                        failed += 1;
                        first.get_or_insert(status.message().to_string());
                    }
                }
                tokio::select! {
                    _ = every.tick() => {}
                    _ = stopped.changed() => break,
                }
            }
            (sent, failed, first)
        });
    }
    set
}

/// How often the pacing thread found itself late by more than [`PACER_SLACK`], and by how much
/// at most.
#[derive(Default)]
struct HeldUp {
    times: std::sync::atomic::AtomicU64,
    longest_ns: std::sync::atomic::AtomicU64,
}

/// How late the pacing thread may find a turn and still give it (with the ones due since) at
/// once: later, it was held up itself, and the schedule moves on by as much, then catches up.
const PACER_SLACK: Duration = Duration::from_millis(1);

/// Gives the clients their turns on one thread of its own: each client exchanges once a
/// `period`, at a phase of its own drawn at random (a fixed seed, so every run offers the
/// same load), as independent processes would, whose exchanges fall where they may and now
/// and then together. Tokio's timers fire on whole milliseconds, so a timer per client
/// started the clients in bunches at every millisecond (five at once for 1,000 clients
/// exchanging five times a second), a load no fleet of separate processes makes.
///
/// A turn found late by up to [`PACER_SLACK`] is given at once. Later than that, the pacing
/// thread itself was held up (the machine is shared with the server), which would not hold
/// up a fleet's separate processes: rather than give every missed turn in one burst, the
/// schedule moves on by as much and then catches up at twice the rate (so a run still offers
/// every turn of its duration), and the returned [`HeldUp`] counts it. A client still busy with
/// its last exchange takes its next turn when done. The thread ends at the first turn after
/// `stop` is set.
fn pace(
    turns: Vec<Arc<tokio::sync::Notify>>,
    period: Duration,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<Arc<HeldUp>> {
    use tollgate_model::time::Clock;
    let mut schedule = Schedule::new(phases(turns.len(), period), period);
    let held_up = Arc::new(HeldUp::default());
    let counted = held_up.clone();
    std::thread::Builder::new()
        .name("pacer".into())
        .spawn(move || {
            let clock = tollgate_limiter::clock::MonotonicClock::new();
            let begin = clock.now();
            while !stop.load(Ordering::Relaxed) {
                let (c, due) = schedule.next();
                let since = clock.now().since(begin);
                if due > since {
                    std::thread::sleep(due - since);
                } else if let Some(late) = schedule.found_at(due, since) {
                    counted.times.fetch_add(1, Ordering::Relaxed);
                    let ns = u64::try_from(late.as_nanos()).unwrap_or(u64::MAX);
                    counted.longest_ns.fetch_max(ns, Ordering::Relaxed);
                }
                turns[c].notify_one();
            }
        })
        .context("cannot start the load program's pacing thread")?;
    Ok(held_up)
}

/// The pacer's turns in order, each with when it is due (since the start); see [`pace`].
struct Schedule {
    phases: Vec<(Duration, usize)>,
    period: Duration,
    /// The next turn: its round and its place in the phases.
    round: u32,
    at: usize,
    /// How far behind the phases the turns are due, after the pacer was held up.
    shift: Duration,
    /// The phase-given time of the turn before.
    last: Duration,
}

impl Schedule {
    fn new(phases: Vec<(Duration, usize)>, period: Duration) -> Self {
        Self { phases, period, round: 0, at: 0, shift: Duration::ZERO, last: Duration::ZERO }
    }

    /// The next turn: its client, and when it is due.
    fn next(&mut self) -> (usize, Duration) {
        let (phase, c) = self.phases[self.at];
        let nominal = self.period * self.round + phase;
        // Catching up at twice the rate: half of each gap comes off the shift.
        self.shift = self.shift.saturating_sub((nominal - self.last) / 2);
        self.last = nominal;
        self.at += 1;
        if self.at == self.phases.len() {
            (self.at, self.round) = (0, self.round + 1);
        }
        (c, nominal + self.shift)
    }

    /// A turn due at `due` was found at `now`, no earlier: how late it is, when the pacer was
    /// held up (beyond [`PACER_SLACK`]), the turns after it then moving on by as much.
    fn found_at(&mut self, due: Duration, now: Duration) -> Option<Duration> {
        let late = now.saturating_sub(due);
        (late > PACER_SLACK).then(|| {
            self.shift += late;
            late
        })
    }
}

/// Each of `clients` clients' phase within `period`, drawn at random from a fixed seed, in
/// the order they come: `(phase, client)`.
fn phases(clients: usize, period: Duration) -> Vec<(Duration, usize)> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut phases: Vec<(Duration, usize)> = (0..clients)
        .map(|c| {
            // xorshift64: the phase is the top 53 bits as a fraction of the period.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (period.mul_f64((x >> 11) as f64 / (1u64 << 53) as f64), c)
        })
        .collect();
    phases.sort_unstable();
    phases
}

/// `tollgate bench accuracy` arguments.
#[derive(Args, Debug)]
pub struct AccuracyArgs {
    /// The controller, or several on one etcd, comma-separated: the clients share connections
    /// to the first that accepts one (a test controller: with --setup this creates groups and
    /// sets the node capacity).
    #[arg(long, env = "TOLLGATE_SERVER", default_value = "http://127.0.0.1:7460")]
    server: String,
    /// Let the benchmark change the server's settings: it creates the groups `accuracy`,
    /// `reserved-a`, `reserved-b`, `hungry`, `quota-1x`, `quota-2x` and `quota-10x` (refusing
    /// to run if any exists), and sets the
    /// node capacity for a while. At the end, on an error or on Ctrl-C, it drops those groups
    /// and sets the capacity back. Without it, nothing runs.
    #[arg(long)]
    setup: bool,
    /// A local redis-server for the per-request counter comparison; omitted: no comparison.
    #[arg(long)]
    redis: Option<String>,
    /// Remote clients.
    #[arg(long, default_value_t = 100)]
    clients: usize,
    /// Seconds measured (after 3 s of warm-up).
    #[arg(long, default_value_t = 60.0)]
    duration: f64,
    /// The group's limit, requests (units) per second.
    #[arg(long, default_value_t = 5000.0)]
    limit: f64,
    /// The server's HTTP address (host:port): its count of exchanges answered is read as the
    /// limit's measured part starts and ends, and the exchanges each client made a second
    /// printed (a throttled client exchanges about once per tick, not once per refusal)
    #[arg(long)]
    server_http: Option<String>,
}

/// The server's count of exchanges answered, from its `/metrics`.
async fn exchanges_answered(addr: &str) -> anyhow::Result<f64> {
    let text =
        metrics_text(addr).await.with_context(|| "cannot read the server's /metrics (--server-http)")?;
    String::from_utf8_lossy(&text)
        .lines()
        .find_map(|l| l.strip_prefix("tollgate_exchanges_total ").and_then(|v| v.trim().parse().ok()))
        .context("the server's /metrics has no tollgate_exchanges_total")
}

/// Exchanges the server answered a second from `after` seconds on, over `seconds`: its count
/// read at both ends, each read timed at its middle (a read of a large `/metrics` takes a
/// while).
async fn exchanges_per_second(addr: String, after: f64, seconds: f64) -> anyhow::Result<f64> {
    use tollgate_model::time::Clock;
    let clock = tollgate_limiter::clock::TokioClock::new();
    let read = || async {
        let before = clock.now();
        let count = exchanges_answered(&addr).await?;
        let after = clock.now();
        anyhow::Ok((count, before.0 as f64 / 2e9 + after.0 as f64 / 2e9))
    };
    tokio::time::sleep(Duration::from_secs_f64(after)).await;
    let (first, at) = read().await?;
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    let (last, until) = read().await?;
    Ok((last - first) / (until - at).max(1e-3))
}

/// An admin client on the first of `server`'s controllers (a comma-separated list) that
/// answers, with `target`'s token and TLS files (`--token`, `--ca`, `--cert`, `--key`): any of
/// them takes admin commands.
pub(crate) async fn admin_client(
    server: &str,
    target: &crate::admin::Target,
) -> anyhow::Result<crate::admin::Admin> {
    crate::admin::connect(&on(server, target)).await
}

/// `target`'s access and timeout, for the controllers at `server`.
fn on(server: &str, target: &crate::admin::Target) -> crate::admin::Target {
    crate::admin::Target { url: server.to_string(), timeout: target.timeout, access: target.access.clone() }
}

/// The groups `bench accuracy` makes, and drops when it is done.
const ACCURACY_GROUPS: [&str; 7] = [
    "accuracy",
    "reserved-a",
    "reserved-b",
    "hungry",
    crate::bench::counts::GROUPS[0],
    crate::bench::counts::GROUPS[1],
    crate::bench::counts::GROUPS[2],
];

pub(crate) async fn put(
    admin: &mut crate::admin::Admin,
    name: &str,
    patch: v1::GroupPatch,
) -> anyhow::Result<()> {
    admin
        .put_group(v1::PutGroupRequest {
            name: name.into(),
            patch: Some(patch),
            mode: v1::PutMode::Upsert as i32,
        })
        .await
        .map_err(|s| anyhow::anyhow!("{}", s.message()))?;
    Ok(())
}

/// The connections `bench accuracy`'s clients share.
const ACCURACY_CONNECTIONS: usize = 64;

pub async fn accuracy(a: AccuracyArgs, target: &crate::admin::Target) -> anyhow::Result<()> {
    anyhow::ensure!(a.clients > 0, "--clients must be above 0");
    anyhow::ensure!(a.duration > 0.0 && a.duration.is_finite(), "--duration must be above 0 seconds");
    anyhow::ensure!(a.limit > 0.0 && a.limit.is_finite(), "--limit must be above 0");
    anyhow::ensure!(
        a.setup,
        "--setup: bench accuracy creates seven groups and changes the node capacity of the server \
         it runs against (it drops them and sets the capacity back at the end, even on Ctrl-C); \
         give --setup to let it, against a test controller"
    );
    let mut admin = admin_client(&a.server, target).await?;
    let capacity_before = admin
        .get_node(v1::GetNodeRequest::default())
        .await
        .map_err(|s| anyhow::anyhow!("{}", s.message()))?
        .into_inner()
        .capacity;
    for name in ACCURACY_GROUPS {
        let found = admin.get_group(v1::GetGroupRequest { name: name.into() }).await;
        anyhow::ensure!(
            found.is_err_and(|s| s.code() == tonic::Code::NotFound),
            "group {name} exists: bench accuracy makes its own groups ({}) and drops them at the end; drop them first, or run it against a test controller",
            ACCURACY_GROUPS.join(", ")
        );
    }
    // Whatever happens (an error, or Ctrl-C), the settings are put back as they were.
    let measured = tokio::select! {
        r = measure_accuracy(&a, &mut admin, target) => r,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
    };
    let mut restore = admin_client(&a.server, target).await?;
    let mut put_back =
        restore.set_capacity(v1::SetCapacityRequest { capacity: capacity_before }).await.map(drop).map_err(
            |s| anyhow::anyhow!("cannot set the node capacity back to {capacity_before:?}: {}", s.message()),
        );
    for name in ACCURACY_GROUPS {
        if let Err(s) = restore.drop_group(v1::DropGroupRequest { name: name.into(), if_exists: true }).await
        {
            put_back = put_back.and(Err(anyhow::anyhow!("cannot drop group {name}: {}", s.message())));
        }
    }
    match (measured, put_back) {
        (Ok(()), r) => r,
        (Err(e), Ok(())) => Err(e.context("the settings were put back as they were")),
        (Err(e), Err(p)) => Err(e.context(format!("and the settings could not all be put back: {p}"))),
    }
}

/// Two reservations under saturation: the node holds a little more than they reserve, and a
/// hungry neighbour asks for everything.
async fn reservations(
    a: &AccuracyArgs,
    admin: &mut crate::admin::Admin,
    gates: &[tollgate_limiter::Tollgate],
    warmup: f64,
) -> anyhow::Result<()> {
    let (ra, rb) = (0.3 * a.limit, 0.5 * a.limit);
    admin
        .set_capacity(v1::SetCapacityRequest { capacity: Some(ra + rb + 0.1 * a.limit) })
        .await
        .map_err(|s| anyhow::anyhow!("{}", s.message()))?;
    put(admin, "reserved-a", v1::GroupPatch { reserved: Some(ra), unlimited: true, ..Default::default() })
        .await?;
    put(admin, "reserved-b", v1::GroupPatch { reserved: Some(rb), unlimited: true, ..Default::default() })
        .await?;
    put(admin, "hungry", v1::GroupPatch { unlimited: true, ..Default::default() }).await?;
    let half = a.clients / 3;
    let per = |share: f64, n: usize| 2.0 * share / n.max(1) as f64;
    let (got_a, got_b, got_h) = tokio::join!(
        offer(&gates[..half], "reserved-a", per(ra, half), warmup, a.duration.min(20.0)),
        offer(&gates[half..2 * half], "reserved-b", per(rb, half), warmup, a.duration.min(20.0)),
        offer(&gates[2 * half..], "hungry", per(a.limit, a.clients - 2 * half), warmup, a.duration.min(20.0)),
    );
    say(format!(
        "tollgate: under saturation, reserved-a got {:.1} % of its {ra}/s, reserved-b {:.1} % of its {rb}/s (hungry neighbour: {:.0}/s)",
        got_a.0 / ra * 100.0,
        got_b.0 / rb * 100.0,
        got_h.0
    ));
    Ok(())
}

/// The common alternative: a Redis counter per request, fixed one-second windows.
async fn redis_counter(a: &AccuracyArgs, url: &str, warmup: f64) -> anyhow::Result<()> {
    let client = redis::Client::open(url).with_context(|| format!("--redis: invalid URL {url:?}"))?;
    let clock = tollgate_limiter::clock::TokioClock::new();
    use tollgate_model::time::Clock;
    let limit = a.limit as i64;
    let mut clients = Vec::with_capacity(a.clients);
    for _ in 0..a.clients {
        let con = client
            .get_multiplexed_async_connection()
            .await
            .with_context(|| format!("--redis: cannot reach {url}"))?;
        let clock = clock.clone();
        clients.push(move || {
            // A multiplexed connection is a handle on one shared pipe: cloning is cheap.
            let mut con = con.clone();
            let key = format!("tollgate-bench:{}", clock.now().0 / 1_000_000_000);
            async move {
                let n: redis::RedisResult<(i64, i64)> =
                    redis::pipe().atomic().incr(&key, 1).expire(&key, 2).query_async(&mut con).await;
                matches!(n, Ok((n, _)) if n <= limit)
            }
        });
    }
    let cpu0 = own_cpu();
    let (rate, attempts) = open_loop(clients, 2.0 * a.limit / a.clients as f64, warmup, a.duration).await;
    let cpu = (own_cpu() - cpu0).max(1e-3);
    say(format!(
        "redis INCR+EXPIRE per request: admitted {rate:.1}/s = {:+.2} % of the limit",
        (rate / a.limit - 1.0) * 100.0
    ));
    say(format!(
        "redis INCR+EXPIRE per request: {:.0} decisions per CPU-second of the load process (plus redis-server's own CPU)",
        attempts as f64 / cpu
    ));
    Ok(())
}

/// `a.clients` remote clients of `target`'s controllers, each with its own id, sharing a few
/// connections that carry the token, as a load generator must: one each would need more open
/// files than a controller is given (its connections are capped to fit them).
async fn remote_clients(
    a: &AccuracyArgs,
    target: &crate::admin::Target,
) -> anyhow::Result<Vec<tollgate_limiter::Tollgate>> {
    let mut channels = Vec::new();
    for _ in 0..a.clients.min(ACCURACY_CONNECTIONS) {
        channels.push(crate::admin::channel(&on(&a.server, target)).await?);
    }
    let mut gates = Vec::new();
    for i in 0..a.clients {
        let opts = tollgate_limiter::RemoteOptions {
            client_id: Some(format!("accuracy-{i}")),
            ..Default::default()
        };
        let timeout = opts.exchange_timeout;
        let (gate, driver) = tollgate_limiter::Tollgate::remote_driven(opts)?;
        let client = v1::admission_client::AdmissionClient::new(channels[i % channels.len()].clone());
        tokio::spawn(driver.run_with(move |request| {
            let mut client = client.clone();
            async move {
                match tokio::time::timeout(timeout, client.exchange(request)).await {
                    Ok(answer) => answer.map(tonic::Response::into_inner),
                    Err(_) => Err(tonic::Status::deadline_exceeded(format!("no answer within {timeout:?}"))),
                }
            }
        }));
        gates.push(gate);
    }
    Ok(gates)
}

async fn measure_accuracy(
    a: &AccuracyArgs,
    admin: &mut crate::admin::Admin,
    target: &crate::admin::Target,
) -> anyhow::Result<()> {
    let mut admin = admin.clone();
    let warmup = 3.0;

    // 1. One group at twice its limit.
    put(&mut admin, "accuracy", v1::GroupPatch { limit: Some(a.limit), ..Default::default() }).await?;
    let gates = remote_clients(a, target).await?;
    let cpu0 = own_cpu();
    let exchanges =
        a.server_http.clone().map(|addr| tokio::spawn(exchanges_per_second(addr, warmup, a.duration)));
    let (rate, attempts) =
        offer(&gates, "accuracy", 2.0 * a.limit / a.clients as f64, warmup, a.duration).await;
    let cpu = (own_cpu() - cpu0).max(1e-3);
    say(format!(
        "tollgate: {} clients, one group limited to {} units/s, asked 2×: admitted {rate:.1}/s = {:+.2} % of the limit",
        a.clients,
        a.limit,
        (rate / a.limit - 1.0) * 100.0
    ));
    say(format!("tollgate: {:.0} decisions per CPU-second of the load process", attempts as f64 / cpu));
    if let Some(exchanges) = exchanges {
        let per_s = exchanges.await.context("the exchange counter")??;
        say(format!(
            "tollgate: the server answered {per_s:.0} exchanges/s while measured, {:.3} a client a second",
            per_s / a.clients as f64
        ));
    }

    // 2. Two reservations under saturation.
    reservations(a, &mut admin, &gates, warmup).await?;

    // 3. Quotas are counts: a budget asked once, twice and ten times over (and the same count
    // in Redis, as envoy/ratelimit keeps it).
    admin
        .set_capacity(v1::SetCapacityRequest { capacity: None })
        .await
        .map_err(|s| anyhow::anyhow!("{}", s.message()))?;
    crate::bench::counts::measure(&mut admin, &gates, (a.limit * 2.0).round(), a.redis.as_deref()).await?;

    // 4. The common alternative: a Redis counter per request.
    if let Some(url) = &a.redis {
        redis_counter(a, url, warmup).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `tollgate bench exchange ARGS`, parsed as the command line is.
    fn exchange_args(args: &[&str]) -> Result<ExchangeArgs, clap::Error> {
        use clap::Parser;
        let cli = crate::args::Cli::try_parse_from(["tollgate", "bench", "exchange"].iter().chain(args))?;
        match cli.command {
            crate::args::Command::Bench(crate::args::BenchCommand::Exchange(a)) => Ok(a),
            _ => unreachable!("bench exchange parses as itself"),
        }
    }

    #[test]
    fn a_paced_load_runs_on_one_thread_unless_told_and_the_count_is_range_checked() {
        let parse = |args: &[&str]| exchange_args(args).map(|a| a.worker_threads());
        assert_eq!(parse(&["--rate", "5"]).unwrap(), 1);
        assert_eq!(parse(&["--rate", "5", "--threads", "3"]).unwrap(), 3);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(parse(&[]).unwrap(), cores);
        assert_eq!(parse(&["--threads", "2"]).unwrap(), 2);
        for bad in ["0", "65", "-1", "two"] {
            let e = parse(&[&format!("--threads={bad}")]).unwrap_err().to_string();
            assert!(e.contains("--threads"), "{bad}: {e}");
        }
    }

    #[tokio::test]
    async fn connections_and_backends_are_bounded_before_any_is_opened() {
        for (flag, n) in [("--backends", "1001"), ("--connections", "1001")] {
            // Port 9 on loopback: nothing is reached, as the count is refused first.
            let a = exchange_args(&["--server", "http://127.0.0.1:9", flag, n]).expect("parses");
            let e = exchange(a, Default::default()).await.unwrap_err().to_string();
            assert!(e.contains(flag) && e.contains("at most 1000"), "{flag} {n}: {e}");
        }
    }

    #[test]
    fn the_servers_histogram_is_read_as_the_difference_of_two_readings() {
        let page = |a: u32, b: u32, inf: u32| {
            format!(
                "# TYPE tollgate_exchange_latency_seconds histogram\n\
                 tollgate_exchange_latency_seconds_count {inf}\n\
                 tollgate_exchange_latency_seconds_bucket{{le=\"0.0005\"}} {a}\n\
                 tollgate_exchange_latency_seconds_bucket{{le=\"0.001\"}} {b}\n\
                 tollgate_exchange_latency_seconds_bucket{{le=\"+Inf\"}} {inf}\n"
            )
        };
        let before = latency_buckets(&page(10, 10, 10));
        assert_eq!(before, [(0.0005, 10.0), (0.001, 10.0), (f64::INFINITY, 10.0)]);
        // 1,000 exchanges since: 980 within 0.5 ms, 995 within 1 ms.
        let after = latency_buckets(&page(990, 1005, 1010));
        let said = server_latency(&before, &after).unwrap();
        assert_eq!(
            said,
            "server's own answer time (1000 exchanges): p99 at most 1 ms; 98.00 % within 0.5 ms, 99.50 % within 1 ms"
        );
        assert_eq!(server_latency(&before, &before), None);
    }

    #[test]
    fn each_client_has_one_phase_of_its_own_within_the_period_the_same_every_run() {
        let period = Duration::from_millis(200);
        let p = phases(1000, period);
        assert_eq!(p, phases(1000, period));
        let mut clients: Vec<usize> = p.iter().map(|&(_, c)| c).collect();
        clients.sort_unstable();
        assert_eq!(clients, (0..1000).collect::<Vec<_>>());
        assert!(p.windows(2).all(|w| w[0].0 <= w[1].0) && p.iter().all(|&(ph, _)| ph < period));
        // Spread over the period, not in whole milliseconds: a tenth of a millisecond apart
        // on average, and at most 20 clients in any one millisecond (five on average).
        let distinct: std::collections::HashSet<u128> = p.iter().map(|(ph, _)| ph.as_micros()).collect();
        assert!(distinct.len() > 990, "{}", distinct.len());
        let mut per_ms = [0u32; 200];
        p.iter().for_each(|(ph, _)| per_ms[ph.as_millis() as usize] += 1);
        assert!(per_ms.iter().all(|&n| n <= 20) && per_ms[..100].iter().sum::<u32>().abs_diff(500) < 60);
    }

    /// The pacer's turns when it finds itself at `found` (a function of the turn's due time):
    /// `(client, when given)` for the first `n`.
    fn turns(
        n: usize,
        period: Duration,
        clients: usize,
        found: impl Fn(Duration) -> Duration,
    ) -> Vec<(usize, Duration)> {
        let mut s = Schedule::new(phases(clients, period), period);
        (0..n)
            .map(|_| {
                let (c, due) = s.next();
                let now = found(due).max(due);
                s.found_at(due, now);
                (c, now)
            })
            .collect()
    }

    #[test]
    fn on_time_each_client_has_its_turn_once_a_period_at_its_phase() {
        let period = Duration::from_millis(200);
        let t = turns(3000, period, 1000, |due| due);
        let p = phases(1000, period);
        for (k, &(c, due)) in t.iter().enumerate() {
            let (phase, client) = p[k % 1000];
            assert_eq!((c, due), (client, period * (k / 1000) as u32 + phase));
        }
    }

    #[test]
    fn a_pacer_held_up_catches_up_at_twice_the_rate_not_in_one_burst() {
        let period = Duration::from_millis(200);
        let (stall_from, stall) = (Duration::from_millis(300), Duration::from_millis(10));
        // The pacer, from 300 ms on, finds itself 10 ms late once: the turns due meanwhile.
        let t = turns(5000, period, 1000, |due| {
            if due >= stall_from && due < stall_from + stall { stall_from + stall } else { due }
        });
        let on_time = turns(5000, period, 1000, |due| due);
        // Every turn is given, in the same order, and no turn earlier than its phase.
        assert!(t.iter().zip(&on_time).all(|(a, b)| a.0 == b.0 && a.1 >= b.1));
        // The missed ones are not given all at once: in any tenth of a millisecond after the
        // stall, at most as many turns as in the busiest tenth on time, twice over (the 50 or
        // so due during the stall would come in one instant otherwise).
        let tenth = Duration::from_micros(100);
        let busiest = |v: &[(usize, Duration)]| {
            let mut per_tenth = std::collections::HashMap::new();
            v.iter().for_each(|(_, d)| *per_tenth.entry(d.as_nanos() / tenth.as_nanos()).or_insert(0) += 1);
            per_tenth.into_values().max().unwrap()
        };
        let on_time_busiest = busiest(&on_time);
        assert!(on_time_busiest < 10, "{on_time_busiest}");
        assert!(busiest(&t) <= 2 * on_time_busiest, "{} against {on_time_busiest}", busiest(&t));
        // Caught up within twice the stall, and on schedule after.
        let after =
            |v: &[(usize, Duration)]| v.iter().position(|(_, d)| *d >= Duration::from_millis(340)).unwrap();
        assert_eq!(after(&t), after(&on_time));
        assert_eq!(t[after(&t)..], on_time[after(&on_time)..]);
    }

    #[test]
    fn an_encoded_exchange_is_the_message_with_its_number_and_an_answer_is_counted_unparsed() {
        use prost::Message;
        let e = Encoded::exchange(7, 3);
        let sent = v1::ExchangeRequest::decode(e.numbered(300)).unwrap();
        assert_eq!((sent.client_id.as_str(), sent.sequence), ("bench-client-7", 300));
        let names: Vec<&str> = sent.groups.iter().map(|g| g.group.as_str()).collect();
        assert_eq!(names, ["bench-21", "bench-22", "bench-23"]);
        assert_eq!((sent.groups[0].demand, sent.groups[0].admitted), (100.0, 5));
        let answer = v1::ExchangeResponse {
            grants: (0..3)
                .map(|i| v1::Grant { group: format!("g{i}"), rate: 1.5, ..Default::default() })
                .collect(),
            next_exchange_ms: 1000,
            next_tick_ms: 250,
            unthrottled_allowed: true,
            shard_map: None,
        }
        .encode_to_vec();
        assert_eq!(Encoded::grants(&answer.clone().into()), 3);
        assert_eq!(Encoded::grants(&bytes::Bytes::new()), 0);
        // Cut short: not an answer.
        assert_eq!(Encoded::grants(&bytes::Bytes::copy_from_slice(&answer[..answer.len() / 2])), 0);
    }
}

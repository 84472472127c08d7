//! The admin commands, in the words operators of the source systems already know:
//! FoundationDB's `quota`, TiDB's `group`, Couchbase's `node capacity`, and `status`; and, in
//! modules of their own, `sql` (TiDB's statements), `token`, `usage`, `import` (envoy/ratelimit
//! and Limitador files) and `rls` (Envoy's rate-limit rules).

pub(crate) mod import;
pub(crate) mod rls;
pub(crate) mod sql;
pub(crate) mod token;
pub(crate) mod usage;

use std::fmt::Write as _;

use anyhow::bail;
use clap::{Args, Subcommand, ValueEnum};
use tollgate_controller::convert;
use tollgate_controller::front::properties;
use tollgate_controller::store::StoredNode;
use tollgate_proto::v1::{self, admin_client::AdminClient};

use crate::say;

/// FoundationDB's page: quotas are rounded up to whole pages.
const PAGE: u64 = 4096;

/// Which quota component.
#[derive(Clone, Copy, Debug, ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum QuotaKind {
    /// The reserved rate, bytes/s.
    ReservedThroughput,
    /// The total (limit), bytes/s.
    TotalThroughput,
}

/// `tollgate quota …`
#[derive(Subcommand, Debug)]
pub enum Quota {
    /// Print a tag's quota in bytes/s, or <empty>.
    Get { tag: String, kind: QuotaKind },
    /// Set a tag's quota in bytes/s, rounded up to whole 4096-byte pages.
    Set {
        tag: String,
        kind: QuotaKind,
        #[arg(allow_negative_numbers = true, value_parser = parse_bytes)]
        bytes_per_second: u64,
    },
    /// Remove a tag's quota (succeeds when it has none).
    Clear { tag: String },
}

/// A priority: 1 to 16, or TiDB's names, `low` (1), `medium` (8) and `high` (16).
fn parse_priority(s: &str) -> Result<u32, String> {
    let p = match s.parse::<u8>() {
        Ok(level) => tollgate_model::settings::Priority::new(level),
        Err(_) => tollgate_model::settings::Priority::from_name(s),
    };
    p.map(|p| u32::from(p.level())).map_err(|e| e.rule)
}

/// A limit: a number or `unlimited`.
#[derive(Clone, Copy, Debug)]
pub enum LimitArg {
    Units(f64),
    Unlimited,
}

fn parse_limit(s: &str) -> Result<LimitArg, String> {
    if s == "unlimited" {
        return Ok(LimitArg::Unlimited);
    }
    s.parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v >= 0.0)
        .map(LimitArg::Units)
        .ok_or_else(|| format!("expected a number of units/s or `unlimited`, got {s:?}"))
}

/// A whole number of bytes a second: a negative one is a range error, not an option.
fn parse_bytes(s: &str) -> Result<u64, String> {
    match s.parse::<i128>() {
        Ok(n) if n < 0 => Err(format!("must be at least 0, got {n}")),
        Ok(n) => u64::try_from(n).map_err(|_| format!("must be at most {}, got {n}", u64::MAX)),
        Err(_) => Err(format!("expected a whole number of bytes/s, got {s:?}")),
    }
}

fn parse_units(s: &str) -> Result<f64, String> {
    s.parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v >= 0.0)
        .ok_or_else(|| format!("expected a number, at least 0, got {s:?}"))
}

/// The window a group's budget counts over, by name (`total` when none is named).
fn budget_window(period: &str) -> &str {
    if period.is_empty() { "total" } else { period }
}

/// `UNITS/WINDOW`: a quota of more than 0 units per window.
fn parse_quota(s: &str) -> Result<(String, f64), String> {
    let (units, window) =
        s.split_once('/').ok_or_else(|| format!("expected UNITS/WINDOW such as 100/minute, got {s:?}"))?;
    let units = parse_units(units)
        .and_then(|u| if u > 0.0 { Ok(u) } else { Err(format!("a quota must be above 0, got {units:?}")) })?;
    tollgate_model::settings::BudgetPeriod::parse(window)
        .map(|w| (w.name().to_string(), units))
        .map_err(|rule| format!("window {window:?}: {rule}"))
}

/// Group options, TiDB style.
#[derive(Args, Debug, Default)]
pub struct GroupOptions {
    /// Reserved = limit = N units/s (TiDB's RU_PER_SEC).
    #[arg(allow_negative_numbers = true, long, value_parser = parse_units, conflicts_with_all = ["reserved", "limit"])]
    ru_per_sec: Option<f64>,
    /// Priority for free capacity: 1 to 16 (higher first), or low (1), medium (8), high (16).
    #[arg(allow_negative_numbers = true, long, value_parser = parse_priority)]
    priority: Option<u32>,
    /// No limit: may use free capacity (TiDB's BURSTABLE).
    #[arg(long, conflicts_with = "limit")]
    burstable: bool,
    /// Units/s never throttled below while asked for.
    #[arg(allow_negative_numbers = true, long, value_parser = parse_units)]
    reserved: Option<f64>,
    /// Units/s never admitted above, or `unlimited`.
    #[arg(allow_negative_numbers = true, long, value_parser = parse_limit)]
    limit: Option<LimitArg>,
    /// Units a client may bank.
    #[arg(allow_negative_numbers = true, long, value_parser = parse_units)]
    burst: Option<f64>,
    /// Share of free capacity among groups of one priority.
    #[arg(allow_negative_numbers = true, long, value_parser = parse_units)]
    weight: Option<f64>,
    /// A total in units; once consumed, the group admits nothing (its reservation included).
    #[arg(allow_negative_numbers = true, long, value_parser = parse_units, conflicts_with = "no_budget")]
    budget: Option<f64>,
    /// Count the budget per UTC minute, hour, day, week (from Monday) or month, against the
    /// controller's metering, rather than over the group's life (`total`).
    #[arg(long, value_parser = ["total", "minute", "hour", "day", "week", "month"], conflicts_with = "no_budget")]
    budget_period: Option<String>,
    /// Removes the budget.
    #[arg(long)]
    no_budget: bool,
    /// A quota per window, beside any other window's: `UNITS/WINDOW`, the window one of
    /// minute, hour, day, week, month, total (`--quota 100/minute --quota 5000/day`): a count,
    /// never overrun; while any is spent the group admits nothing. Repeat for several windows.
    #[arg(long, value_parser = parse_quota)]
    quota: Vec<(String, f64)>,
    /// Removes the quota of a window (`--no-quota minute`). Repeatable.
    #[arg(long, value_parser = ["total", "minute", "hour", "day", "week", "month"])]
    no_quota: Vec<String>,
    /// Back to the default burst (one second of the grant).
    #[arg(long, conflicts_with = "burst")]
    no_burst: bool,
    /// A ramp-up, in the settings file's keys: `min=10,max=500,duration_s=60[,mode=relaxed]
    /// [,threshold_pct=50][,ramp_down_pct=50][,cool_down_s=5][,resume_ttl_s=300]`.
    #[arg(long, value_parser = parse_ramp, conflicts_with = "no_ramp")]
    ramp: Option<v1::RampSettings>,
    /// Removes the ramp-up.
    #[arg(long)]
    no_ramp: bool,
    /// What work admitted and then dropped does: `return` its cost to the group (the
    /// default), or `count` it as consumed.
    #[arg(long)]
    dropped: Option<DroppedArg>,
    /// Over how long a debt (a cost settled above what was admitted) is paid back from the
    /// refill while admissions go on at the reduced rate, in seconds; 0 blocks until it is
    /// paid. Default 5.
    #[arg(allow_negative_numbers = true, long, value_parser = parse_units)]
    debt_repay_s: Option<f64>,
    /// FoundationDB's accounting: the limit and reservation apply to reads and to writes
    /// each (`true`), or to their sum (`false`, the default).
    #[arg(long)]
    reads_writes_apart: Option<bool>,
    /// TiKV's soft quota: units/s the group may use on each backend, whatever the backend's
    /// load (above 0).
    #[arg(allow_negative_numbers = true, long, value_parser = parse_units, conflicts_with = "no_backend_limit")]
    backend_limit: Option<f64>,
    /// Removes the soft quota on backends.
    #[arg(long)]
    no_backend_limit: bool,
    /// The group is a backend's own background work (compaction, replication): `true` or
    /// `false`.
    #[arg(long)]
    background: Option<bool>,
    /// Shadow mode, `true` or `false`: the group's requests are decided and counted but never
    /// refused; what would have been refused is counted (`would_refuse_total` in the status).
    #[arg(long)]
    shadow: Option<bool>,
    /// The share of the burst (0 to 0.9) normal and sheddable requests leave for critical
    /// ones (request classes: critical work is served first, sheddable work refused first).
    #[arg(allow_negative_numbers = true, long)]
    critical_reserve: Option<f64>,
    /// The most requests in flight at once across all clients (1 to 1,000,000): a permit
    /// holds a slot until it is dropped or settled.
    #[arg(allow_negative_numbers = true, long, conflicts_with = "no_max_in_flight")]
    max_in_flight: Option<u32>,
    /// Removes the in-flight limit.
    #[arg(long)]
    no_max_in_flight: bool,
    /// Nests the group under this one: the parent's limit caps the group and its siblings
    /// together, and the group's reservation comes out of the parent's.
    #[arg(long, conflicts_with = "no_parent")]
    parent: Option<String>,
    /// Makes the group one of its own again.
    #[arg(long)]
    no_parent: bool,
}

/// What dropped work does.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum DroppedArg {
    /// Given back to the group, not counted as consumed.
    Return,
    /// Counted as consumed.
    Count,
}

/// A ramp from `key=value` pairs named as in the settings file.
fn parse_ramp(s: &str) -> Result<v1::RampSettings, String> {
    let mut r = v1::RampSettings::default();
    let (mut min, mut max, mut duration) = (None, None, None);
    for pair in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, value) =
            pair.split_once('=').ok_or_else(|| format!("{pair:?}: expected key=value, such as min=10"))?;
        let key = key.trim();
        let value = value.trim();
        let number = || {
            value
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v >= 0.0)
                .ok_or_else(|| format!("{key}: expected a number, at least 0, got {value:?}"))
        };
        match key {
            "min" => min = Some(number()?),
            "max" => max = Some(number()?),
            "duration_s" => duration = Some(number()?),
            "threshold_pct" => r.threshold_pct = Some(number()?),
            "ramp_down_pct" => r.ramp_down_pct = Some(number()?),
            "cool_down_s" => r.cool_down_s = Some(number()?),
            "resume_ttl_s" => r.resume_ttl_s = Some(number()?),
            "mode" => {
                // One spelling of each mode everywhere: `go-back-n` reads as `go_back_n`.
                r.mode = match value.replace('-', "_").as_str() {
                    "scheduled" => v1::RampMode::Scheduled,
                    "relaxed" => v1::RampMode::Relaxed,
                    "only_if_used" => v1::RampMode::OnlyIfUsed,
                    "go_back_n" => v1::RampMode::GoBackN,
                    other => {
                        return Err(format!(
                            "mode: must be scheduled, relaxed, only_if_used or go_back_n, got {other:?}"
                        ));
                    }
                } as i32
            }
            other => {
                return Err(format!(
                    "{other:?}: unknown key; expected min, max, duration_s, mode, threshold_pct, ramp_down_pct, cool_down_s or resume_ttl_s"
                ));
            }
        }
    }
    r.min = min.ok_or("min: is required")?;
    r.max = max.ok_or("max: is required")?;
    r.duration_s = duration.ok_or("duration_s: is required")?;
    Ok(r)
}

impl GroupOptions {
    fn patch(&self) -> v1::GroupPatch {
        let mut p = v1::GroupPatch::default();
        if let Some(n) = self.ru_per_sec {
            p.reserved = Some(n);
            // TiDB's RU_PER_SEC with BURSTABLE: reserved N, no limit.
            if !self.burstable {
                p.limit = Some(n);
            }
        }
        if let Some(r) = self.reserved {
            p.reserved = Some(r);
        }
        match self.limit {
            Some(LimitArg::Units(l)) => p.limit = Some(l),
            Some(LimitArg::Unlimited) => p.unlimited = true,
            None => {}
        }
        if self.burstable {
            p.unlimited = true;
        }
        p.burst = self.burst;
        p.weight = self.weight;
        p.budget = self.budget;
        p.budget_period = self.budget_period.clone();
        p.clear_budget = self.no_budget;
        for (window, units) in &self.quota {
            p.quotas.insert(window.clone(), *units);
        }
        for window in &self.no_quota {
            p.quotas.insert(window.clone(), 0.0);
        }
        p.clear_burst = self.no_burst;
        p.ramp = self.ramp;
        p.clear_ramp = self.no_ramp;
        p.count_dropped = self.dropped.map(|d| matches!(d, DroppedArg::Count));
        p.debt_repay_s = self.debt_repay_s;
        p.reads_writes_apart = self.reads_writes_apart;
        p.backend_limit = self.backend_limit;
        p.clear_backend_limit = self.no_backend_limit;
        p.background = self.background;
        p.shadow = self.shadow;
        p.critical_reserve = self.critical_reserve;
        p.max_in_flight = self.max_in_flight;
        p.clear_max_in_flight = self.no_max_in_flight;
        p.parent = self.parent.clone();
        p.clear_parent = self.no_parent;
        p.priority = self.priority;
        p
    }
}

/// `tollgate group …`
#[derive(Subcommand, Debug)]
pub enum Group {
    /// Create a group.
    Create {
        name: String,
        #[command(flatten)]
        options: GroupOptions,
    },
    /// Change a group's settings: only the options given change.
    Alter {
        name: String,
        #[command(flatten)]
        options: GroupOptions,
    },
    /// Remove a group.
    Drop { name: String },
    /// List the groups.
    List,
    /// Show one group.
    Show { name: String },
    /// Couchbase's group document: `'{"reserved": 100, "hard_limit": "unlimited"}'`. Only the
    /// keys given change; the group is created if it does not exist. Prints the document.
    SetProperties { name: String, json: String },
    /// Print a group's document, as set-properties takes it.
    GetProperties { name: String },
}

/// How the node's free capacity is shared.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum ModeArg {
    /// By priority, then by weight (TiDB).
    Share,
    /// First come, first served (Couchbase's free pool).
    Fcfs,
}

/// On or off.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum OnOff {
    /// On.
    On,
    /// Off.
    Off,
}

/// `tollgate node …`
#[derive(Subcommand, Debug)]
pub enum Node {
    /// Print the node capacity, or set it: N units/s or `unlimited`.
    Capacity {
        #[arg(allow_negative_numbers = true, value_parser = parse_limit)]
        capacity: Option<LimitArg>,
    },
    /// Print how free capacity is shared, or set it: `share` or `fcfs`.
    Mode { mode: Option<ModeArg> },
    /// Print whether slow start is on, or turn it `on` or `off` (Couchbase: a group with no
    /// client reserves a tenth of its reservation until a tick has seen one).
    SlowStart { state: Option<OnOff> },
    /// Print whether every group is in shadow mode, or turn it `on` or `off`: requests are
    /// decided and counted but never refused, and what would have been refused is counted.
    /// Groups whose own settings ask for shadow mode stay in it when it is off.
    Shadow { state: Option<OnOff> },
    /// Print whether the node throttles, or turn throttling `on` or `off` for the whole node
    /// (the one switch): off admits everything and keeps every setting; on restores them at
    /// the clients' next exchange. Audited.
    Throttling { state: Option<OnOff> },
    /// Couchbase's node document: `'{"capacity": 25000}'` (and `"mode": "share"|"fcfs"`).
    /// Only the keys given change. Prints the document.
    SetProperties { json: String },
    /// Print the node's document, as set-properties takes it.
    GetProperties,
}

/// The controller an admin command talks to, and how long a call may take.
#[derive(Debug, Clone)]
pub struct Target {
    /// Its gRPC URL.
    pub url: String,
    /// How long a call may take before it counts as unanswered.
    pub timeout: std::time::Duration,
    /// The token and TLS files (`--token`, `--ca`, `--cert`, `--key`).
    pub access: tollgate_limiter::access::Access,
}

/// An admin client carrying the token on every call.
pub(crate) type Admin = AdminClient<tollgate_limiter::access::Rpc>;

/// Connects to the first controller of `--server` (comma-separated URLs) that answers: with
/// settings in etcd, any controller takes every admin command.
pub(crate) async fn connect(target: &Target) -> anyhow::Result<Admin> {
    Ok(AdminClient::new(channel(target).await?))
}

/// A connected channel to the first controller of `--server` that answers, carrying the token.
pub(crate) async fn channel(target: &Target) -> anyhow::Result<tollgate_limiter::access::Rpc> {
    let servers: Vec<&str> = target.url.split(',').map(str::trim).collect();
    if servers.len() > 16 || servers.iter().any(|s| s.is_empty()) {
        anyhow::bail!(
            "--server: give 1 to 16 controller URLs, comma-separated, none empty; got {:?}",
            target.url
        );
    }
    let bearer = target.access.bearer().map_err(|e| anyhow::anyhow!("--token: {e}"))?;
    let mut failures = Vec::new();
    for server in &servers {
        let endpoint =
            target.access.endpoint(server).map_err(|e| anyhow::anyhow!("--server {server:?}: {e}"))?;
        match endpoint
            .connect_timeout(target.timeout.min(std::time::Duration::from_secs(5)))
            .timeout(target.timeout)
            .connect()
            .await
        {
            Ok(channel) => {
                let channel = tollgate_proto::frames::EndKnownCalls(channel);
                return Ok(tonic::service::interceptor::InterceptedService::new(channel, bearer));
            }
            Err(e) => failures.push(format!("{server}: {}", transport_error(&e))),
        }
    }
    if servers.len() == 1 {
        anyhow::bail!(
            "cannot reach the tollgate server at {}: {}",
            servers[0],
            failures.join("; ").split_once(": ").map_or("", |x| x.1)
        );
    }
    anyhow::bail!("cannot reach any tollgate server: {}", failures.join("; "))
}

/// A connection failure with its causes (a TLS failure says why only in its source), and what
/// to do about the one a hand-made certificate meets most.
fn transport_error(e: &dyn std::error::Error) -> String {
    let text = with_causes(e.to_string(), e.source());
    if text.contains("CaUsedAsEndEntity") {
        // `openssl req -x509` makes a certificate authority's certificate by default (CA:TRUE);
        // a server showing one is refused, as TLS clients that check the chain do.
        return format!(
            "{text}: the server's certificate is a certificate authority's (basicConstraints \
             CA:TRUE, as a one-line `openssl req -x509` makes it); make a CA with it and a server \
             certificate that CA signs, and give the server that one and the CLI --ca the CA's \
             (docs/operations.md, \"TLS\", has the openssl commands)"
        );
    }
    text
}

/// `first`, then each cause in turn.
fn with_causes(first: String, mut source: Option<&dyn std::error::Error>) -> String {
    let mut text = first;
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// A gRPC error as the user should read it.
pub(crate) fn rpc(e: tonic::Status) -> anyhow::Error {
    let causes = with_causes(e.message().to_string(), std::error::Error::source(&e));
    let timed_out = causes.contains("Timeout expired");
    match e.code() {
        // A connection the server closed after its handshake (over TLS, a client certificate
        // it does not take) says why only in the error's causes.
        _ if !timed_out
            && (e.message() == "transport error"
                || (e.code() == tonic::Code::Cancelled && std::error::Error::source(&e).is_some())) =>
        {
            anyhow::anyhow!(
                "the tollgate server closed the connection (over TLS: does it accept this client's \
                 certificate, --cert?): {causes}"
            )
        }
        tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => {
            anyhow::anyhow!(
                "the tollgate server did not answer in time (--timeout-ms): is it running? {}",
                e.message()
            )
        }
        tonic::Code::Unavailable if e.message().contains("transport") || e.message().contains("connect") => {
            anyhow::anyhow!("the tollgate server is unreachable: {causes}")
        }
        _ => anyhow::anyhow!("{}", e.message()),
    }
}

fn name_of(s: &v1::GroupSettings) -> String {
    s.limit.map_or("unlimited".to_string(), fmt_units)
}

pub(crate) fn fmt_units(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 { format!("{v:.0}") } else { format!("{v}") }
}

pub(crate) fn priority_name(level: u32) -> String {
    tollgate_controller::convert::priority_name(level)
}

pub(crate) async fn get(client: &mut Admin, name: &str) -> anyhow::Result<Option<v1::GroupSettings>> {
    match client.get_group(v1::GetGroupRequest { name: name.to_string() }).await {
        Ok(r) => Ok(r.into_inner().settings),
        Err(s) if s.code() == tonic::Code::NotFound => Ok(None),
        Err(s) => Err(rpc(s)),
    }
}

/// Rounds up to whole pages, as FoundationDB stores quotas; refuses what cannot be a rate.
fn pages(bytes: u64) -> anyhow::Result<u64> {
    let max = tollgate_model::settings::RATE_MAX as u64;
    match bytes.div_ceil(PAGE).checked_mul(PAGE) {
        Some(rounded) if rounded <= max => Ok(rounded),
        _ => bail!("bytes_per_second: must be at most {max} (whole {PAGE}-byte pages), got {bytes}"),
    }
}

pub async fn quota(server: &Target, cmd: Quota) -> anyhow::Result<()> {
    let mut client = connect(server).await?;
    match cmd {
        Quota::Get { tag, kind } => {
            let settings = get(&mut client, &tag).await?;
            let value = match (kind, settings) {
                (QuotaKind::TotalThroughput, Some(s)) => s.limit.map(fmt_units),
                (QuotaKind::ReservedThroughput, Some(s)) if s.limit.is_some() || s.reserved > 0.0 => {
                    Some(fmt_units(s.reserved))
                }
                _ => None,
            };
            say(value.unwrap_or_else(|| "<empty>".into()));
        }
        Quota::Set { tag, kind, bytes_per_second } => {
            let value = pages(bytes_per_second)? as f64;
            let current = get(&mut client, &tag).await?;
            let total = current.as_ref().and_then(|s| s.limit);
            let reserved = current.as_ref().map_or(0.0, |s| s.reserved);
            let patch = match kind {
                QuotaKind::TotalThroughput => {
                    if value < reserved {
                        bail!(
                            "total_throughput {} would be below reserved_throughput {}: lower the reserved throughput first",
                            fmt_units(value),
                            fmt_units(reserved)
                        );
                    }
                    v1::GroupPatch { limit: Some(value), ..Default::default() }
                }
                QuotaKind::ReservedThroughput => match total {
                    None => bail!("tag {tag:?} has no total_throughput: set the total first"),
                    Some(t) if value > t => bail!(
                        "reserved_throughput {} would exceed total_throughput {}: set the total first",
                        fmt_units(value),
                        fmt_units(t)
                    ),
                    Some(_) => v1::GroupPatch { reserved: Some(value), ..Default::default() },
                },
            };
            let req = v1::PutGroupRequest { name: tag, patch: Some(patch), mode: v1::PutMode::Upsert as i32 };
            client.put_group(req).await.map_err(rpc)?;
            say("Successfully updated quota.");
        }
        Quota::Clear { tag } => {
            // The quota only (total and reserved throughput): the tag's other settings, its
            // priority, weight, ramp or budget, stay as they are.
            let exists = client.get_group(v1::GetGroupRequest { name: tag.clone() }).await;
            match exists {
                Err(s) if s.code() == tonic::Code::NotFound => {
                    say(format!("Tag {tag:?} has no quota: nothing to clear."));
                }
                Err(s) => return Err(rpc(s)),
                Ok(_) => {
                    let patch = v1::GroupPatch { reserved: Some(0.0), unlimited: true, ..Default::default() };
                    let req = v1::PutGroupRequest {
                        name: tag,
                        patch: Some(patch),
                        mode: v1::PutMode::Alter as i32,
                    };
                    client.put_group(req).await.map_err(rpc)?;
                    say("Successfully cleared quota.");
                }
            }
        }
    }
    Ok(())
}

/// How a debt is repaid, in the units the group is limited in: half the refill pays it over
/// `repay` seconds up to half the limit times that, and what is owed beyond blocks admissions
/// until the refill has paid it, at the limit's pace.
fn debt_line(repay: f64, limit: Option<f64>) -> String {
    match limit {
        Some(l) if l > 0.0 && repay > 0.0 => format!(
            "up to {} units paid from at most half the refill over {} s; beyond that, admissions wait {} s for each {} units owed",
            fmt_units(l / 2.0 * repay),
            fmt_units(repay),
            fmt_units(1.0),
            fmt_units(l)
        ),
        Some(l) if l > 0.0 => {
            format!(
                "blocks admissions until the refill has paid it: {} s for each {} units owed",
                fmt_units(1.0),
                fmt_units(l)
            )
        }
        _ if repay > 0.0 => format!(
            "paid from at most half the refill over {} s; beyond that, blocks until paid",
            fmt_units(repay)
        ),
        _ => "blocks admissions until the refill has paid it".to_string(),
    }
}

fn show(info: &v1::GroupInfo) -> String {
    let s = info.settings.clone().unwrap_or_default();
    let mut out = String::new();
    let _ = writeln!(out, "name:     {}", info.name);
    let _ = writeln!(out, "reserved: {}", fmt_units(s.reserved));
    let _ = writeln!(out, "limit:    {}", name_of(&s));
    let _ = writeln!(out, "burst:    {}", s.burst.map_or("one second of its grant".into(), fmt_units));
    let _ = writeln!(out, "priority: {}", priority_name(s.priority));
    let _ = writeln!(out, "weight:   {}", fmt_units(s.weight));
    if let Some(b) = s.budget {
        let per =
            if s.budget_period.is_empty() { String::new() } else { format!(" per {}", s.budget_period) };
        let _ = writeln!(out, "budget:   {}{per}", fmt_units(b));
    }
    if let Some(line) = quotas_line(&s) {
        let _ = writeln!(out, "quotas:   {line}");
    }
    let _ = writeln!(out, "dropped:  {}", if s.count_dropped { "count" } else { "return" });
    if s.reads_writes_apart {
        let _ = writeln!(out, "reads and writes: accounted apart");
    }
    if let Some(l) = s.backend_limit {
        let _ = writeln!(out, "on each backend: at most {} units/s", fmt_units(l));
    }
    if s.background {
        let _ = writeln!(out, "background work: given what front-end groups leave");
    }
    if s.shadow {
        let _ = writeln!(out, "shadow:   never refused; would-be refusals counted");
    }
    if s.critical_reserve > 0.0 {
        let _ = writeln!(out, "classes:  {} of the burst kept for critical requests", s.critical_reserve);
    }
    if let Some(n) = s.max_in_flight {
        let _ = writeln!(out, "in flight: at most {n} requests at once");
    }
    if let Some(parent) = &s.parent {
        let _ = writeln!(out, "parent:   {parent} (its limit caps this group and its siblings together)");
    }
    let _ = writeln!(out, "debt:     {}", debt_line(s.debt_repay_s.unwrap_or(5.0), s.limit));
    if let Some(r) = &s.ramp {
        let _ = writeln!(out, "ramp:     {}", ramp_line(r));
    }
    out
}

/// Every window with a quota, shortest first, the budget's apart; `None` when there is none.
fn quotas_line(s: &v1::GroupSettings) -> Option<String> {
    let mut windows: Vec<(tollgate_model::settings::BudgetPeriod, f64)> = s
        .quotas
        .iter()
        .filter_map(|(name, u)| Some((tollgate_model::settings::BudgetPeriod::parse(name).ok()?, *u)))
        .collect();
    windows.sort_by_key(|(w, _)| (w.span_ms(), *w));
    let others: Vec<String> = windows
        .into_iter()
        .filter(|(w, _)| s.budget.is_none() || w.name() != budget_window(&s.budget_period))
        .map(|(w, u)| format!("{} per {}", fmt_units(u), w.name()))
        .collect();
    (!others.is_empty()).then(|| others.join(", "))
}

/// A ramp as `--ramp` takes it.
fn ramp_line(r: &v1::RampSettings) -> String {
    let mode = match v1::RampMode::try_from(r.mode) {
        Ok(v1::RampMode::Scheduled) => "scheduled",
        Ok(v1::RampMode::OnlyIfUsed) => "only_if_used",
        Ok(v1::RampMode::GoBackN) => "go_back_n",
        _ => "relaxed",
    };
    let mut line = format!(
        "min={},max={},duration_s={},mode={mode}",
        fmt_units(r.min),
        fmt_units(r.max),
        fmt_units(r.duration_s)
    );
    if let Some(t) = r.resume_ttl_s {
        let _ = write!(line, ",resume_ttl_s={}", fmt_units(t));
    }
    line
}

/// Creates or alters a group and shows the result.
async fn put(
    client: &mut Admin,
    name: String,
    options: &GroupOptions,
    mode: v1::PutMode,
    verb: &str,
) -> anyhow::Result<()> {
    let req = v1::PutGroupRequest { name, patch: Some(options.patch()), mode: mode as i32 };
    let info = client.put_group(req).await.map_err(rpc)?.into_inner();
    say(format!("{verb} group {}", info.name));
    for line in show(&info).lines() {
        say(line);
    }
    Ok(())
}

/// Every group, page after page.
pub(crate) async fn list_all(client: &mut Admin) -> anyhow::Result<Vec<v1::GroupInfo>> {
    let mut groups = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = client
            .list_groups(v1::ListGroupsRequest { page_size: 0, page_token })
            .await
            .map_err(rpc)?
            .into_inner();
        groups.extend(page.groups);
        if page.next_page_token.is_empty() {
            return Ok(groups);
        }
        page_token = page.next_page_token;
    }
}

pub async fn group(server: &Target, cmd: Group) -> anyhow::Result<()> {
    let mut client = connect(server).await?;
    match cmd {
        Group::Create { name, options } => {
            put(&mut client, name, &options, v1::PutMode::Create, "created").await?
        }
        Group::Alter { name, options } => {
            put(&mut client, name, &options, v1::PutMode::Alter, "altered").await?
        }
        Group::Drop { name } => {
            client
                .drop_group(v1::DropGroupRequest { name: name.clone(), if_exists: false })
                .await
                .map_err(rpc)?;
            say(format!("dropped group {name}"));
        }
        Group::List => {
            let groups = list_all(&mut client).await?;
            say(format!(
                "{:<24} {:>12} {:>12} {:>12} {:>8} {:>6}",
                "NAME", "RESERVED", "LIMIT", "BURST", "PRIORITY", "WEIGHT"
            ));
            for g in groups {
                let s = g.settings.unwrap_or_default();
                say(format!(
                    "{:<24} {:>12} {:>12} {:>12} {:>8} {:>6}",
                    g.name,
                    fmt_units(s.reserved),
                    name_of(&s),
                    s.burst.map_or("-".into(), fmt_units),
                    priority_name(s.priority),
                    fmt_units(s.weight)
                ));
            }
        }
        Group::Show { name } => {
            let info = client.get_group(v1::GetGroupRequest { name }).await.map_err(rpc)?.into_inner();
            for line in show(&info).lines() {
                say(line);
            }
        }
        Group::SetProperties { name, json } => {
            let current = get(&mut client, &name).await?;
            let patch = properties::group_patch(&json, current.as_ref()).map_err(anyhow::Error::msg)?;
            let req = v1::PutGroupRequest { name, patch: Some(patch), mode: v1::PutMode::Upsert as i32 };
            let info = client.put_group(req).await.map_err(rpc)?.into_inner();
            say(properties::group_json(&info.settings.unwrap_or_default()));
        }
        Group::GetProperties { name } => {
            let info = client.get_group(v1::GetGroupRequest { name }).await.map_err(rpc)?.into_inner();
            say(properties::group_json(&info.settings.unwrap_or_default()));
        }
    }
    Ok(())
}

pub async fn node(server: &Target, cmd: Node) -> anyhow::Result<()> {
    let mut client = connect(server).await?;
    match cmd {
        Node::Capacity { capacity } => {
            let info = match capacity {
                None => client.get_node(v1::GetNodeRequest {}).await.map_err(rpc)?.into_inner(),
                Some(c) => {
                    let capacity = match c {
                        LimitArg::Units(u) => Some(u),
                        LimitArg::Unlimited => None,
                    };
                    client.set_capacity(v1::SetCapacityRequest { capacity }).await.map_err(rpc)?.into_inner()
                }
            };
            say(info.capacity.map_or("unlimited".to_string(), fmt_units));
        }
        Node::Mode { mode } => {
            let info = match mode {
                None => client.get_node(v1::GetNodeRequest {}).await.map_err(rpc)?.into_inner(),
                Some(m) => {
                    let mode = match m {
                        ModeArg::Share => v1::AllocationMode::Share,
                        ModeArg::Fcfs => v1::AllocationMode::Fcfs,
                    };
                    client.set_mode(v1::SetModeRequest { mode: mode as i32 }).await.map_err(rpc)?.into_inner()
                }
            };
            say(if info.mode() == v1::AllocationMode::Fcfs { "fcfs" } else { "share" });
        }
        Node::SlowStart { state } => {
            let info = switch(&mut client, state, async |c, on| {
                c.set_slow_start(v1::SetSlowStartRequest { on }).await
            })
            .await?;
            say(if info.slow_start { "on" } else { "off" });
        }
        Node::Shadow { state } => {
            let info =
                switch(&mut client, state, async |c, on| c.set_shadow(v1::SetShadowRequest { on }).await)
                    .await?;
            say(if info.shadow { "on" } else { "off" });
        }
        Node::Throttling { state } => {
            let info = switch(&mut client, state, async |c, on| {
                c.set_throttling(v1::SetThrottlingRequest { on }).await
            })
            .await?;
            say(if info.throttling_off { "off" } else { "on" });
        }
        Node::SetProperties { json } => set_node_properties(&mut client, &json).await?,
        Node::GetProperties => {
            let info = client.get_node(v1::GetNodeRequest {}).await.map_err(rpc)?.into_inner();
            say(properties::node_json(&stored(&info)));
        }
    }
    Ok(())
}

/// `node set-properties`: the document checked whole before anything is sent, so a bad one
/// changes nothing; then each switch it names set.
async fn set_node_properties(client: &mut Admin, json: &str) -> anyhow::Result<()> {
    let change = properties::node_change(json).map_err(anyhow::Error::msg)?;
    if let Some(capacity) = change.capacity {
        client.set_capacity(v1::SetCapacityRequest { capacity }).await.map_err(rpc)?;
    }
    if let Some(m) = change.mode {
        let mode = convert::mode_to_proto(m) as i32;
        client.set_mode(v1::SetModeRequest { mode }).await.map_err(rpc)?;
    }
    if let Some(on) = change.slow_start {
        client.set_slow_start(v1::SetSlowStartRequest { on }).await.map_err(rpc)?;
    }
    if let Some(on) = change.shadow {
        client.set_shadow(v1::SetShadowRequest { on }).await.map_err(rpc)?;
    }
    if let Some(on) = change.throttling {
        client.set_throttling(v1::SetThrottlingRequest { on }).await.map_err(rpc)?;
    }
    let info = client.get_node(v1::GetNodeRequest {}).await.map_err(rpc)?.into_inner();
    say(properties::node_json(&stored(&info)));
    Ok(())
}

/// The node as it is when `state` is not given, else as `set` left it after turning one of its
/// switches on or off.
async fn switch(
    client: &mut Admin,
    state: Option<OnOff>,
    set: impl AsyncFnOnce(&mut Admin, bool) -> Result<tonic::Response<v1::NodeInfo>, tonic::Status>,
) -> anyhow::Result<v1::NodeInfo> {
    let answer = match state {
        None => client.get_node(v1::GetNodeRequest {}).await,
        Some(s) => set(client, matches!(s, OnOff::On)).await,
    };
    Ok(answer.map_err(rpc)?.into_inner())
}

/// The node as the store keeps it, from its answer.
fn stored(info: &v1::NodeInfo) -> StoredNode {
    StoredNode::from_proto(info)
}

/// Follows the server's trace, printing each line, until `count` lines or the server ends it.
pub async fn trace(
    server: &Target,
    group: Option<String>,
    count: Option<u64>,
    timeout: Option<u64>,
) -> anyhow::Result<()> {
    // No per-call deadline: the answer is a stream that runs as long as it is followed.
    let target = Target { timeout: std::time::Duration::from_secs(24 * 3600), ..server.clone() };
    let mut client = connect(&target).await?;
    if let Some(g) = &group {
        // A group neither configured nor in traffic has no rate computation to wait for.
        let configured = match client.get_group(v1::GetGroupRequest { name: g.clone() }).await {
            Err(s) if s.code() == tonic::Code::NotFound => false,
            // Configured; or a name the trace itself refuses, and says why.
            _ => true,
        };
        let tracked = configured || {
            let s = client.status(v1::StatusRequest::default()).await.map_err(rpc)?.into_inner();
            s.groups.iter().any(|t| &t.name == g)
        };
        if !tracked {
            bail!("group {g:?} does not exist: it is not configured and nothing asks for it");
        }
        eprintln_note(&format!("waiting for group {g:?}'s next rate computation (one every tick)"));
    }
    let request = v1::TraceRequest { group: group.clone().unwrap_or_default() };
    let mut stream = client.trace(request).await.map_err(rpc)?.into_inner();
    let mut printed = 0u64;
    let follow = async {
        while count.is_none_or(|c| printed < c) {
            match stream.message().await.map_err(rpc)? {
                Some(line) => {
                    say(line.json);
                    printed += 1;
                }
                None => bail!("the tollgate server ended the trace"),
            }
        }
        anyhow::Ok(())
    };
    let Some(s) = timeout else { return follow.await };
    let outcome = tokio::time::timeout(std::time::Duration::from_secs(s), follow).await;
    match outcome {
        Ok(done) => done,
        Err(_) if printed > 0 => Ok(()),
        Err(_) => match &group {
            Some(g) => bail!("--timeout: no rate computation of group {g:?} within {s} s"),
            None => bail!("--timeout: no rate computation within {s} s"),
        },
    }
}

/// A note on standard error that does not stop the command.
fn eprintln_note(note: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "note: {note}");
}

/// The leader's client and status, when the leader answers; else a note that the follower's
/// status is shown.
async fn leader_status(server: &Target, leader: &str) -> Option<(Admin, v1::StatusResponse)> {
    let at_leader = Target { url: leader.to_string(), ..server.clone() };
    match connect(&at_leader).await {
        Ok(mut c) => match c.status(v1::StatusRequest::default()).await {
            Ok(answer) => return Some((c, answer.into_inner())),
            Err(e) => eprintln_note(&format!(
                "the leader {leader} did not answer ({}); showing a follower's status",
                e.message()
            )),
        },
        Err(e) => eprintln_note(&format!(
            "the leader {leader} cannot be reached ({e}); showing a follower's status"
        )),
    }
    None
}

/// Every page of the status as one JSON document, written a page at a time: at 100,000
/// groups the whole answer as one value is about a gigabyte.
async fn write_every_page(mut client: Admin, mut s: v1::StatusResponse) -> anyhow::Result<()> {
    // Written a page at a time: at 100,000 groups the whole answer as one value is about a
    // gigabyte.
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let mut head = tollgate_controller::observe::status::status_json(&v1::StatusResponse {
        groups: Vec::new(),
        ..s.clone()
    });
    if let Some(o) = head.as_object_mut() {
        o.remove("groups");
    }
    let mut open = serde_json::to_string(&head)?;
    open.pop();
    write!(out, "{open}{}\"groups\":[", if open.len() > 1 { "," } else { "" })?;
    let mut first = true;
    loop {
        let page = tollgate_controller::observe::status::status_json(&s);
        for g in page["groups"].as_array().into_iter().flatten() {
            write!(out, "{}{g}", if first { "" } else { "," })?;
            first = false;
        }
        if s.next_page_token.is_empty() {
            break;
        }
        let page_token = std::mem::take(&mut s.next_page_token);
        s = client.status(v1::StatusRequest { page_size: 0, page_token }).await.map_err(rpc)?.into_inner();
    }
    writeln!(out, "]}}")?;
    Ok(())
}

/// The groups' table, and TiDB's diagnostics: how each group's consumption moved, and what
/// was blocked.
fn print_groups(s: &v1::StatusResponse) {
    say(format!(
        "{:<24} {:>10} {:>10} {:>10} {:>10} {:>10} {:>4} {:>7}",
        "GROUP", "RESERVED", "LIMIT", "TARGET", "ADMITTED", "DEMAND", "BUSY", "CLIENTS"
    ));
    for g in &s.groups {
        let (reserved, limit) = match &g.settings {
            Some(st) => (fmt_units(st.reserved), name_of(st)),
            None => ("-".into(), "-".into()),
        };
        say(format!(
            "{:<24} {:>10} {:>10} {:>10} {:>10.1} {:>10.1} {:>4} {:>7}",
            g.name,
            reserved,
            limit,
            g.target.map_or("-".into(), |t| format!("{t:.1}")),
            g.admitted,
            g.demand,
            // Saturation limits it; or it is held at its backends' room below saturation.
            if g.busy {
                "yes"
            } else if g.headroom.is_some() {
                "room"
            } else {
                "no"
            },
            g.clients
        ));
    }
    print_marks(s);
}

/// The low and high water marks and average of a rate, or dashes.
fn marks(m: &Option<v1::RateMarks>) -> [String; 3] {
    match m {
        Some(m) => [m.low, m.average, m.high].map(|v| format!("{v:.1}")),
        None => ["-".to_string(), "-".to_string(), "-".to_string()],
    }
}

/// A largest request's cost, or a dash when none was told.
fn largest(v: f64) -> String {
    if v > 0.0 { format!("{v:.1}") } else { "-".to_string() }
}

/// TiDB's diagnostics: how each group's consumption moved, its largest requests and what was
/// blocked; then the same per client token.
fn print_marks(s: &v1::StatusResponse) {
    say("");
    say(format!(
        "{:<24} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>10} {:>10}",
        "GROUP",
        "LOW/1m",
        "AVG/1m",
        "HIGH/1m",
        "LOW/1h",
        "AVG/1h",
        "HIGH/1h",
        "LARGEST/1m",
        "LARGEST/1h",
        "BLOCKED"
    ));
    for g in &s.groups {
        let ([l1, a1, h1], [lh, ah, hh]) = (marks(&g.last_minute), marks(&g.last_hour));
        let (x1, xh) = (largest(g.largest_last_minute), largest(g.largest_last_hour));
        say(format!(
            "{:<24} {l1:>9} {a1:>9} {h1:>9} {lh:>9} {ah:>9} {hh:>9} {x1:>10} {xh:>10} {:>10}",
            g.name,
            g.throttled_total + g.waited_total
        ));
    }
    if s.tokens.is_empty() {
        return;
    }
    say("");
    say(format!(
        "{:<18} {:>12} {:>9} {:>9} {:>9} {:>10} {:>10} {:>10}  NAME",
        "TOKEN", "CONSUMED", "LOW/1m", "AVG/1m", "HIGH/1m", "LARGEST/1m", "LARGEST/1h", "REFUSED"
    ));
    for t in &s.tokens {
        let [l1, a1, h1] = marks(&t.last_minute);
        let (x1, xh) = (largest(t.largest_last_minute), largest(t.largest_last_hour));
        say(format!(
            "{:<18} {:>12.1} {l1:>9} {a1:>9} {h1:>9} {x1:>10} {xh:>10} {:>10}  {}",
            t.id, t.consumed_total, t.throttled_total, t.label
        ));
    }
}

pub async fn status(server: &Target, json: bool, all: bool) -> anyhow::Result<()> {
    let mut client = connect(server).await?;
    // The first page of groups; with `all`, every page.
    let mut s = client.status(v1::StatusRequest::default()).await.map_err(rpc)?.into_inner();
    // A follower serves no clients: the leader's status is the one that says what happens.
    if s.role == "follower"
        && let Some(leader) = s.leader.clone()
        && let Some((c, answer)) = leader_status(server, &leader).await
    {
        (client, s) = (c, answer);
    }
    if json && all {
        return write_every_page(client, s).await;
    }
    while all && !s.next_page_token.is_empty() {
        let page_token = std::mem::take(&mut s.next_page_token);
        let page =
            client.status(v1::StatusRequest { page_size: 0, page_token }).await.map_err(rpc)?.into_inner();
        s.groups.extend(page.groups);
        s.next_page_token = page.next_page_token;
    }
    if json {
        let mut v = tollgate_controller::observe::status::status_json(&s);
        if let Some(o) = v.as_object_mut().filter(|_| !s.next_page_token.is_empty()) {
            o.insert("more_groups".into(), true.into());
        }
        say(v);
        return Ok(());
    }
    if s.role != "standalone" {
        say(format!("role: {} (leader: {})", s.role, s.leader.as_deref().unwrap_or("none elected")));
    }
    if let Some(region) = &s.region {
        let decaying =
            if s.upstream_safe_mode { ", its shares decaying: the global tier does not answer" } else { "" };
        say(format!("region: {region}{decaying}"));
    }
    say(format!("capacity: {}", s.capacity.map_or("unlimited".into(), fmt_units)));
    // What the figures count: every rate below is in these units a second.
    let unit = if s.unit.is_empty() { "units" } else { s.unit.as_str() };
    let model = if s.cost_model.is_empty() { "count" } else { s.cost_model.as_str() };
    say(format!("units: {unit} a second (cost model {model})"));
    for w in &s.warnings {
        say(format!("warning: {w}"));
    }
    say_files_and_domains(&s);
    print_groups(&s);
    print_backends_and_clients(&s);
    if !s.next_page_token.is_empty() {
        say("");
        say(format!("the first {} groups by name; `tollgate status --all` lists every one", s.groups.len()));
    }
    Ok(())
}

/// The backends and clients the controller names (at most 100 of each), under the groups.
fn print_backends_and_clients(s: &v1::StatusResponse) {
    if !s.backend_detail.is_empty() {
        say("");
        say(format!(
            "{:<24} {:<10} {:>8} {:>8} {:>10} {:>7}  TOP GROUPS",
            "BACKEND", "ZONE", "UTIL", "LIMITS", "LOAD", "SEEN"
        ));
        for b in &s.backend_detail {
            let top: Vec<String> =
                b.top_groups.iter().map(|g| format!("{} {:.1}", g.group, g.units_per_s)).collect();
            say(format!(
                "{:<24} {:<10} {:>8.2} {:>8} {:>10.1} {:>6.1}s  {}",
                b.name,
                b.zone,
                b.utilisation,
                if b.limiting { "yes" } else { "no" },
                b.load,
                b.seen_s,
                top.join(", ")
            ));
        }
        for b in s.backend_detail.iter().filter(|b| !b.inert.is_empty()) {
            say(format!("warning: backend {}: {}", b.name, b.inert));
        }
        if s.backends as usize > s.backend_detail.len() {
            say(format!("... and {} more backends", s.backends as usize - s.backend_detail.len()));
        }
    }
    if !s.client_detail.is_empty() {
        say("");
        say(format!(
            "{:<32} {:>7} {:>7} {:>10} {:>7}  TOP GRANTS",
            "CLIENT", "LAPSED", "GROUPS", "GRANTED", "SEEN"
        ));
        for c in &s.client_detail {
            let top: Vec<String> =
                c.top_grants.iter().map(|g| format!("{} {:.1}", g.group, g.rate)).collect();
            say(format!(
                "{:<32} {:>7} {:>7} {:>10.1} {:>6.1}s  {}",
                c.client_id,
                if c.lapsed { "yes" } else { "no" },
                c.groups,
                c.granted,
                c.seen_s,
                top.join(", ")
            ));
        }
        if s.clients as usize > s.client_detail.len() {
            say(format!(
                "... and {} more clients ({:.1} units/s granted to them); {} lapsed in all",
                s.clients as usize - s.client_detail.len(),
                s.others_granted,
                s.clients_lapsed
            ));
        }
    }
}

/// A Unix time in milliseconds as UTC, `2026-11-23T01:02:03.456Z`.
pub(crate) fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (year, month, day) = tollgate_model::settings::civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        ms % 1000
    )
}

/// `tollgate audit`.
pub async fn audit(server: &Target, since: Option<Since>, limit: u32, json: bool) -> anyhow::Result<()> {
    let since_unix_ms = match since {
        None => 0,
        Some(Since::UnixMs(ms)) => ms,
        Some(Since::Ago(d)) => {
            let now = tollgate_controller::wall_ms();
            now.saturating_sub(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        }
    };
    let mut client = connect(server).await?;
    let records =
        client.audit(v1::AuditRequest { since_unix_ms, limit }).await.map_err(rpc)?.into_inner().records;
    for r in &records {
        if json {
            let parse = |v: &Option<String>| {
                v.as_deref().map(|t| serde_json::from_str::<serde_json::Value>(t).unwrap_or(t.into()))
            };
            say(serde_json::json!({
                "at": utc(r.at_unix_ms),
                "at_unix_ms": r.at_unix_ms,
                "who": r.who,
                "what": r.what,
                "before": parse(&r.before),
                "after": parse(&r.after),
            })
            .to_string());
        } else {
            say(format!(
                "{}  {}  {}\n    before: {}\n    after:  {}",
                utc(r.at_unix_ms),
                r.who,
                r.what,
                r.before.as_deref().unwrap_or("-"),
                r.after.as_deref().unwrap_or("-")
            ));
        }
    }
    if records.is_empty() && !json {
        say("no changes recorded in that span");
    }
    Ok(())
}

/// The status's settings files followed and what answers each Envoy domain.
fn say_files_and_domains(s: &v1::StatusResponse) {
    for f in &s.settings_files {
        let revision = if f.revision.is_empty() { "none applied" } else { f.revision.as_str() };
        say(format!("settings file: {} ({}), revision {revision}, {} applied", f.path, f.kind, f.applied));
        if !f.rejected.is_empty() {
            say(format!("  rejected, the revision in force stays: {}", f.rejected.replace('\n', "\n  ")));
        }
    }
    for d in &s.domains {
        say(format!("rls domain {}: {} ({})", d.domain, d.answered_by, d.count));
    }
    if !s.domains.is_empty() || s.rules_everywhere {
        say(if s.rules_everywhere {
            "rls: rules with no domain apply in every other domain (the implicit tenant rule is off)"
        } else {
            "rls: in every other domain, the implicit tenant rule (an entry tenant=X counts against group X)"
        });
    }
}

#[cfg(test)]
mod audit_tests {
    use super::utc;

    #[test]
    fn unix_milliseconds_read_as_utc() {
        assert_eq!(utc(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(utc(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(utc(1_795_395_723_456), "2026-11-23T01:02:03.456Z");
    }
}

/// `tollgate audit --since`: a span back from now, or a Unix time in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Since {
    /// This long ago.
    Ago(std::time::Duration),
    /// This Unix time, in milliseconds.
    UnixMs(u64),
}

pub(crate) fn parse_since(s: &str) -> Result<Since, String> {
    let s = s.trim();
    if let Ok(ms) = s.parse::<u64>() {
        return Ok(Since::UnixMs(ms));
    }
    // An RFC 3339 time, as `tollgate audit` prints them (`2026-11-27T06:33:35Z`).
    if let Ok(at) = humantime::parse_rfc3339_weak(s) {
        let ms = at
            .duration_since(std::time::UNIX_EPOCH)
            .map_err(|_| format!("a time after 1970 is expected, got {s:?}"))?
            .as_millis();
        return Ok(Since::UnixMs(u64::try_from(ms).unwrap_or(u64::MAX)));
    }
    // A span: `90s`, `30m`, `1h30m`, `2w`.
    let span = humantime::parse_duration(s).map_err(|_| {
        format!(
            "expected a span such as 90s, 30m, 1h30m, 12h, 7d or 2w, an RFC 3339 time such as \
             2026-11-27T06:30:00Z, or a Unix time in milliseconds; got {s:?}"
        )
    })?;
    if span > std::time::Duration::from_secs(100 * 365 * 86_400) {
        return Err(format!("at most 100 years back, got {s:?}"));
    }
    Ok(Since::Ago(span))
}

#[cfg(test)]
mod since_tests {
    use super::*;

    /// Regression: `--since` took only one number and one unit, not the times `audit` prints.
    #[test]
    fn since_takes_compound_spans_rfc3339_times_and_unix_milliseconds() {
        let ago = |s: &str| match parse_since(s).unwrap() {
            Since::Ago(d) => d.as_secs(),
            other => panic!("{s}: {other:?}"),
        };
        assert_eq!(ago("90s"), 90);
        assert_eq!(ago("1h30m"), 5400);
        assert_eq!(ago("2w"), 14 * 86_400);
        assert_eq!(ago("7d"), 7 * 86_400);
        assert_eq!(parse_since("2026-11-27T06:30:00Z").unwrap(), Since::UnixMs(1_795_761_000_000));
        assert_eq!(parse_since("1795761000000").unwrap(), Since::UnixMs(1_795_761_000_000));
        assert!(parse_since("soon").unwrap_err().contains("RFC 3339"));
        assert!(parse_since("200y").unwrap_err().contains("at most 100 years"));
    }
}

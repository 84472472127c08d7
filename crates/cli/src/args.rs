//! The command line: every subcommand and option of `tollgate`, as clap parses them.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// Tollgate: global admission control for shared, multi-tenant systems.
#[derive(Parser)]
#[command(name = "tollgate", version, about, long_about = None)]
pub(crate) struct Cli {
    /// The controller to administer.
    #[arg(
        long,
        global = true,
        help_heading = "Connection",
        env = "TOLLGATE_SERVER",
        default_value = "http://127.0.0.1:7460"
    )]
    pub(crate) server: String,
    /// How long an admin call may take before it counts as unanswered, in milliseconds.
    #[arg(long, global = true, help_heading = "Connection", env = "TOLLGATE_TIMEOUT_MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub(crate) timeout_ms: u64,
    /// The token for a server started with --auth (`tollgate token create` prints one).
    #[arg(long, global = true, help_heading = "Connection", env = "TOLLGATE_TOKEN", hide_env_values = true)]
    pub(crate) token: Option<String>,
    /// PEM authority to check an https:// server's certificate against (default: the
    /// system's trusted authorities).
    #[arg(long, global = true, help_heading = "Connection", env = "TOLLGATE_CA", value_name = "FILE")]
    pub(crate) ca: Option<PathBuf>,
    /// PEM client certificate, for a server with mutual TLS (with --key).
    #[arg(
        long,
        global = true,
        help_heading = "Connection",
        env = "TOLLGATE_CERT",
        value_name = "FILE",
        requires = "key"
    )]
    pub(crate) cert: Option<PathBuf>,
    /// PEM key of --cert.
    #[arg(
        long,
        global = true,
        help_heading = "Connection",
        env = "TOLLGATE_KEY",
        value_name = "FILE",
        requires = "cert"
    )]
    pub(crate) key: Option<PathBuf>,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand)]
pub(crate) enum BenchCommand {
    /// Admission exchanges over real gRPC: exchanges/s, group grants/s, p50 and p99 latency.
    Exchange(crate::bench::ExchangeArgs),
    /// How closely remote clients hold limits and reservations, beside a Redis counter per
    /// request. Run it against a test controller: it creates groups and sets the capacity.
    Accuracy(crate::bench::AccuracyArgs),
    /// How fast the controller reins in a tenant whose surge saturates a real service
    /// (examples/kv-service): when it is marked busy, the peak utilisation, when it settles.
    Surge(crate::bench::surge::SurgeArgs),
    /// Whether request classes hold critical work through an overload of a real service
    /// (examples/kv-service): critical success and p99, with classes and without.
    Overload(crate::bench::overload::OverloadArgs),
    /// Whether a service that learns its own capacity holds an overload of 1 to 8 times what
    /// it can do (examples/kv-service --work cpu): goodput, p99 and critical success beside no
    /// limiter and a static token bucket, and how soon a slowdown is followed.
    Capacity(crate::bench::capacity::CapacityArgs),
    /// How long saturation limiting takes to settle after a demand step, a lifted quota and a
    /// capacity cut, in simulated seconds, beside a plain multiplicative law.
    Converge(crate::bench::converge::ConvergeArgs),
    /// How long a new group's first request takes to be answered, through `POST /v1/check`
    /// and the rate-limit service (RLS): new groups one after another, p50, p99 and the
    /// largest. It creates no settings; the groups it names are new to the server.
    FirstAnswer(crate::bench::first::FirstAnswerArgs),
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Run the controller: gRPC for clients, backends and admin; HTTP for metrics and status.
    Server(Box<ServerArgs>),
    /// FoundationDB-style tag quotas, in bytes/s.
    #[command(subcommand)]
    Quota(crate::admin::Quota),
    /// TiDB-style resource groups.
    #[command(subcommand)]
    Group(Box<crate::admin::Group>),
    /// Couchbase-style node settings.
    #[command(subcommand)]
    Node(crate::admin::Node),
    /// Show how a ramp-up mode turns a usage pattern into pools: one line per epoch,
    /// `EPOCH POOL USED` (`EPOCH - -` for an epoch without a call).
    Ramp(crate::ramp::RampArgs),
    /// Load programs that measure a running controller.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// TiDB's resource-group statements: CREATE, ALTER and DROP RESOURCE GROUP, SHOW
    /// RESOURCE GROUPS, SHOW CREATE RESOURCE GROUP. Several are separated by `;`; all are
    /// parsed before any runs.
    Sql {
        /// The statements, such as "CREATE RESOURCE GROUP oltp RU_PER_SEC=20000, PRIORITY=HIGH".
        #[arg(conflicts_with = "file")]
        statements: Option<String>,
        /// Read the statements from a file (`-`: standard input).
        #[arg(long, short)]
        file: Option<PathBuf>,
    },
    /// Turn another limiter's limit file into groups, patterns and what names them: an
    /// envoy/ratelimit YAML becomes each domain's descriptor tree (matched as envoy/ratelimit
    /// matches), a Limitador limits file mapping rules. Everything is checked first; what
    /// Tollgate cannot express is refused with its line and the reason, and then nothing
    /// changes. The file's domains (namespaces) are answered by it alone; other domains keep
    /// theirs, and the implicit tenant rule where no rule names them. A domain that has rules
    /// or a tree of its own already is replaced only with --replace.
    Import {
        /// The file's format.
        #[arg(value_enum)]
        format: ImportFormat,
        /// The file (`-`: standard input).
        file: PathBuf,
        /// Print what would change, and change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Replace what answers the file's domains now (their rules or descriptor tree), when
        /// the file's differ.
        #[arg(long)]
        replace: bool,
    },
    /// Fit the `linear` cost model to measurements: a CSV with a header naming columns among
    /// requests (or reads and writes), read_bytes, write_bytes and cpu_ms, and the observed
    /// resource use. Prints the coefficients, the fit's quality and a settings-file snippet.
    Calibrate {
        /// The CSV file (`-`: standard input).
        file: PathBuf,
        /// The column holding the observed resource use (busy time, say).
        #[arg(long, default_value = "observed")]
        observed: String,
    },
    /// Follow the trace of every rate computation on a running server, as JSON lines: per
    /// group per tick every input and output of its target ("rate"), and per backend report
    /// each group it carries ("busy_group"). Runs until stopped, or for `--count` lines.
    Trace {
        /// Only this group's events.
        group: Option<String>,
        /// Stop after this many lines.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        count: Option<u64>,
        /// Stop after this many seconds (an error if nothing was printed by then).
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..=86_400))]
        timeout: Option<u64>,
    },
    /// Envoy's rate-limit service on the gRPC port: its mapping rules, and a request to try.
    #[command(subcommand)]
    Rls(crate::admin::rls::Rls),
    /// Metering: what each group consumed, minute by minute as the controller recorded it
    /// (durable across restarts and failovers).
    Usage {
        /// Only this group.
        group: Option<String>,
        /// From this long ago (`90s`, `30m`, `12h`, `7d`), or a Unix time in milliseconds;
        /// default everything kept.
        #[arg(long, value_parser = crate::admin::parse_since)]
        since: Option<crate::admin::Since>,
        /// One JSON object per group per minute.
        #[arg(long, conflicts_with = "csv")]
        json: bool,
        /// CSV: minute,group,consumed,admitted,throttled,would_refuse.
        #[arg(long)]
        csv: bool,
    },
    /// Credentials for a server started with --auth: create, list, revoke.
    #[command(subcommand)]
    Token(crate::admin::token::Token),
    /// The audit log: every change to the settings, oldest first, with who made it and the
    /// value before and after.
    Audit {
        /// Only changes this recent (`90s`, `30m`, `12h`, `7d`), or since a Unix time in
        /// milliseconds.
        #[arg(long, value_parser = crate::admin::parse_since)]
        since: Option<crate::admin::Since>,
        /// At most this many (1 to 10000).
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=10_000))]
        limit: u32,
        /// One JSON object per line, for scripts.
        #[arg(long)]
        json: bool,
    },
    /// The capacity and the groups' settings, target, admitted rate, demand and clients: the
    /// first 1,000 groups by name, or every one with --all.
    Status {
        /// Print JSON for scripts.
        #[arg(long)]
        json: bool,
        /// Every group, fetched (and with --json written) a page at a time, rather than the
        /// first 1,000.
        #[arg(long)]
        all: bool,
    },
    /// Validate a settings file: prints every problem with its line; exits 1 if there is any.
    CheckConfig {
        /// The TOML settings file.
        file: PathBuf,
        /// Check it as `tollgate server --config` reads it, rather than as the embedded
        /// limiter does (`Tollgate::from_file`).
        #[arg(long)]
        for_server: bool,
    },
    /// Simulate a scenario in virtual time: prints one line per phase, writes
    /// timeline.csv, summary.json and timeline.png. Exits 0 when every phase passed, 1 when
    /// one failed, 2 for a malformed scenario.
    Sim {
        /// The scenario file (see docs/simulation.md).
        scenario: PathBuf,
        /// Where to write the timeline, summary and chart [default: sim-out/NAME].
        #[arg(long)]
        out: Option<PathBuf>,
        /// Replaces the scenario's seed.
        #[arg(long)]
        seed: Option<u64>,
        /// Writes the trace of every rate computation here, as JSON lines (see `tollgate
        /// trace`).
        #[arg(long)]
        trace: Option<PathBuf>,
        /// Runs this many seeds (from --seed, or the scenario's) and checks the fault
        /// invariants in each: prints every seed that breaks one, with the time (exit 1), or
        /// that all hold. Writes no files.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..=100_000), conflicts_with_all = ["out", "trace"])]
        seeds: Option<u64>,
    },
}

/// `tollgate server`'s options.
#[derive(clap::Args)]
pub(crate) struct ServerArgs {
    /// Where settings are kept (unless --etcd is given).
    #[arg(long, default_value = "tollgate-data")]
    pub(crate) data: PathBuf,
    /// Keep the settings in etcd instead: its members' client URLs, comma-separated
    /// (`http://127.0.0.1:2379`). Controllers on the same etcd and prefix share one set of
    /// settings. Needs a tollgate built with `--features etcd`.
    #[arg(long, value_name = "URL[,URL...]")]
    pub(crate) etcd: Option<String>,
    /// The etcd key prefix the settings live under.
    #[arg(long, default_value = tollgate_controller::DEFAULT_ETCD_PREFIX, requires = "etcd")]
    pub(crate) etcd_prefix: String,
    /// The gRPC URL clients and other controllers are told to reach this one at (with
    /// --etcd); default: http:// (https:// with TLS) and the bound --grpc address.
    #[arg(long, requires = "etcd")]
    pub(crate) advertise: Option<String>,
    /// Serve this region's clients: the controllers given the same region elect a leader of
    /// their own, which leases each group's share for the region from the global tier, by the
    /// region's demand. The global tier is the controllers on the same --etcd and prefix
    /// without --region, or, with --upstream, the controllers at those URLs (the region then
    /// keeps its own store: its own --etcd, or the embedded one). 1 to 63 lowercase letters,
    /// digits and -.
    #[arg(long, value_parser = parse_region)]
    pub(crate) region: Option<String>,
    /// With --region: the global tier's gRPC URLs, comma-separated, tried in turn; the region
    /// copies the global tier's groups into its own store and leases their shares there.
    #[arg(long, requires = "region", value_name = "URL[,URL...]", value_delimiter = ',')]
    pub(crate) upstream: Vec<String>,
    /// With --upstream: a file holding the token the region calls the global tier with (one
    /// made there by `tollgate token create --role region`).
    #[arg(long, requires = "upstream", value_name = "FILE")]
    pub(crate) upstream_token_file: Option<std::path::PathBuf>,
    /// With --upstream: the PEM authority the global tier's certificate is checked against
    /// (https:// URLs); default: the system's.
    #[arg(long, requires = "upstream", value_name = "FILE")]
    pub(crate) upstream_ca: Option<std::path::PathBuf>,
    /// Shard the groups over the controllers on the same etcd and prefix (with --etcd): each
    /// owns the shards a map in etcd gives it and grants for their groups, and passes the
    /// others' parts of an exchange on to their owners. Give every controller the same number,
    /// 1 to 4096; 256 is a good start.
    #[arg(long, requires = "etcd", conflicts_with = "region", value_parser = clap::value_parser!(u16).range(1..=4096))]
    pub(crate) shards: Option<u16>,
    /// Seconds a controller's etcd lease lasts (with --etcd), 1 to 60: a controller whose
    /// process dies is replaced at once (the others find its port closed and revoke its
    /// lease); one whose host is down or cut off, about this long after.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=60), requires = "etcd")]
    pub(crate) election_lease_s: u64,
    /// The gRPC listen address.
    #[arg(long, default_value = "127.0.0.1:7460")]
    pub(crate) grpc: std::net::SocketAddr,
    /// The HTTP listen address (/metrics, /healthz, /status).
    #[arg(long, default_value = "127.0.0.1:7461")]
    pub(crate) http: std::net::SocketAddr,
    /// Listen on addresses other than loopback without both --auth and TLS, although then
    /// anyone who reaches them could change every quota or read every token on the wire.
    #[arg(long)]
    pub(crate) insecure: bool,
    /// Every call needs a token whose role covers it (`tollgate token create`); `/healthz`
    /// stays open. The first start writes an admin token to DATA/admin.token.
    #[arg(long)]
    pub(crate) auth: bool,
    /// With --auth: when no admin token is live, take the token in FILE (as `tollgate token
    /// create` prints one: `tg_` and hex digits; a mounted secret) as the first admin token,
    /// instead of making one and writing it to DATA/admin.token.
    #[arg(long, value_name = "FILE", requires = "auth")]
    pub(crate) admin_token_file: Option<PathBuf>,
    /// PEM certificate chain: both listeners speak TLS (with --tls-key).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub(crate) tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub(crate) tls_key: Option<PathBuf>,
    /// PEM authority that signs client certificates: mutual TLS, every client shows one.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub(crate) tls_client_ca: Option<PathBuf>,
    /// Only client certificates with this common name (repeat it, or separate names by
    /// commas; at most 1000).
    #[arg(long, value_name = "NAME", value_delimiter = ',', requires = "tls_client_ca")]
    pub(crate) tls_allow_name: Vec<String>,
    /// PEM authority that signs the other controllers' certificates: a follower trusts it
    /// when it calls the leader for its front ends' grants. Default: --tls-client-ca, else
    /// the system's authorities.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub(crate) tls_peer_ca: Option<PathBuf>,
    /// The cost model the clients price requests with (`count`, `fdb`, `ru` or `couchbase`):
    /// status says what a unit counts by it. Default: the `[cost]` of --config, else `count`.
    #[arg(long, value_parser = ["count", "fdb", "ru", "couchbase"])]
    pub(crate) cost_model: Option<String>,
    /// The engine's tick and the exchange period asked of clients, in milliseconds.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..=60_000))]
    pub(crate) tick_ms: u64,
    /// How long a grant holds without renewal, in milliseconds.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(100..=3_600_000))]
    pub(crate) lease_ms: u64,
    /// How many of the worst zones saturation limiting ignores (a sick zone is not a
    /// workload problem), among the zones reporting: never every one, so none with one zone.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(0..=1000))]
    pub(crate) ignore_worst_zones: u64,
    /// Units/s a group must put on a saturated backend for that backend to limit it: 0, any
    /// load; FoundationDB's is 409600 (100 pages/s, with costs in bytes).
    #[arg(long, default_value_t = 0.0)]
    pub(crate) limiting_threshold: f64,
    /// Queue bytes at which a backend is at its target: saturation ratio 1 (FoundationDB's
    /// storage queue target). A utilisation report reads as this many bytes times it.
    #[arg(long, default_value_t = 800e6)]
    pub(crate) queue_target_bytes: f64,
    /// Queue bytes over which the ratio falls from 1 to its floor of 0.5 (FoundationDB's
    /// spring); at most the target.
    #[arg(long, default_value_t = 200e6)]
    pub(crate) queue_spring_bytes: f64,
    /// How saturation limits a group: `rate` (its own load × the backend's ratio,
    /// FoundationDB 7.4), `quota` (the backend's limiting cost shared by the groups' limits,
    /// FoundationDB 7.3) or `multiplicative` (its previous limit × the ratio: a plain
    /// controller, for comparison).
    #[arg(long, default_value = "rate", value_parser = ["rate", "quota", "multiplicative"])]
    pub(crate) limiting_law: String,
    /// Over how long a remote client takes up a grant whose rate rises, in milliseconds
    /// (TiDB's trickle); a fall applies at once. 0: at once.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=60_000))]
    pub(crate) trickle_ms: u64,
    /// The most groups the engine tracks, each with its own state (1 to 1000000); groups
    /// named past it share the `default` group's state until some are forgotten. A global
    /// tier over many regions' tenants needs as many as they use.
    #[arg(long, default_value_t = tollgate_model::engine::EngineSettings::default().max_tracked_groups as u64,
          value_parser = clap::value_parser!(u64).range(1..=tollgate_model::config::MAX_TRACKED_GROUPS_MAX))]
    pub(crate) max_groups: u64,
    /// Folding time of the smoothers of each group's average cost, in seconds (0.1 to 600).
    #[arg(long, default_value_t = 2.0)]
    pub(crate) cost_folding_s: f64,
    /// How often groups' consumption (what budgets are checked against, and the minute-by-minute
    /// usage records `tollgate usage` reads) and resumable ramps are written to the store, in
    /// milliseconds: at most a minute; also at a clean stop.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(100..=60_000))]
    pub(crate) flush_ms: u64,
    /// How the log on standard error is written: `text`, a line for people, or `json`, one
    /// JSON object a line (`timestamp`, `level`, `fields`, `target`) for a log collector.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub(crate) log_format: LogFormat,
    /// Connections open at once on each port (gRPC and HTTP); past it, connections idle for
    /// 10 s make room, else new ones are closed at once. Default 10,000, lowered to fit the
    /// open-file limit (`ulimit -n`, raised to its hard limit at start); a value that does
    /// not fit stops the start.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub(crate) max_connections: Option<u64>,
    /// A gRPC connection with no traffic for this long is closed, in milliseconds.
    #[arg(long, default_value_t = 300_000, value_parser = clap::value_parser!(u64).range(100..=86_400_000))]
    pub(crate) idle_timeout_ms: u64,
    /// Requests a second one connection may make, gRPC and HTTP; past it calls are refused
    /// (RESOURCE_EXHAUSTED, HTTP 429) until the second turns.
    #[arg(long, default_value_t = 50_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub(crate) max_requests_per_conn_s: u64,
    /// gRPC calls open at once on one connection (HTTP/2 streams).
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(crate) max_streams_per_conn: u32,
    /// Groups `/metrics` names one by one, the busiest by demand (0 to 1,000,000); the rest
    /// are added up in one series labelled `group="(others)"`. The default keeps the page
    /// near 2.5 MB whatever the number of groups.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    pub(crate) metrics_groups: u64,
    /// One charge (`POST /v1/charge`, Envoy's `tollgate_charge`) may take at most what its
    /// group repays in this many seconds: its burst, or its limit over them, whichever is
    /// larger (1 to 86,400). A group with no limit takes any charge up to 10⁹ units.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub(crate) charge_repay_s: u64,
    /// A settings file (the embedded limiter's TOML) whose node settings and groups are
    /// written at start where the store holds none; a broken file stops the start. It is
    /// followed: when it changes (and on SIGHUP) what changed in it is applied, and a file that
    /// does not read is refused whole while the running settings stay.
    #[arg(long)]
    pub(crate) config: Option<PathBuf>,
    /// An envoy/ratelimit or Limitador limits file to apply at start and to follow as it
    /// changes (and on SIGHUP), as `tollgate import --replace` applies it:
    /// `envoy-ratelimit=FILE` or `limitador=FILE`. Repeatable.
    #[arg(long = "import", value_name = "FORMAT=FILE", value_parser = parse_import)]
    pub(crate) imports: Vec<tollgate_controller::settings::files::FollowedFile>,
}

fn parse_import(text: &str) -> Result<tollgate_controller::settings::files::FollowedFile, String> {
    tollgate_controller::settings::files::FollowedFile::parse_import(text)
}

/// How `tollgate server` writes its log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LogFormat {
    /// A line for people.
    Text,
    /// One JSON object a line.
    Json,
}

/// The limit files `tollgate import` reads.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum ImportFormat {
    /// envoy/ratelimit's configuration (domain, descriptors, rate_limit).
    EnvoyRatelimit,
    /// Limitador's limits file (namespace, max_value, seconds, conditions, variables).
    Limitador,
}

fn parse_region(name: &str) -> Result<String, String> {
    tollgate_controller::check_region(name).map(|()| name.to_string())
}

//! `tollgate server`: run the controller until SIGINT or SIGTERM.

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::bail;
use tollgate_controller::{Server, ServerOptions, shutdown_signal};
use tollgate_model::config::{Config, NodeSettings};
use tollgate_model::cost::CostModel;
use tollgate_model::engine::{COST_FOLDING_S, LimitingLaw, SaturationSettings};

use crate::args::ServerArgs;

/// The largest `--config` file read, in bytes.
const CONFIG_MAX_BYTES: usize = 64 << 20;

/// Reads `--config`: a broken file stops the start with every problem, as `check-config`
/// prints them, before the store is opened. Also says which of its settings only the
/// embedded limiter uses.
fn defaults(path: &Path) -> anyhow::Result<(Config, Vec<String>)> {
    let text = crate::read_text(path, CONFIG_MAX_BYTES)?;
    if text.len() > CONFIG_MAX_BYTES {
        bail!("--config {}: larger than {CONFIG_MAX_BYTES} bytes", path.display());
    }
    let config = match Config::parse(&text) {
        Ok(c) => c,
        Err(_) => {
            let report = crate::check::check(&path.display().to_string(), &text, true);
            bail!(
                "--config {} is not a valid settings file; the server did not start and nothing was changed:\n{}",
                path.display(),
                report.text.trim_end()
            );
        }
    };
    // The settings' warnings are the controller's to log, from what it holds once the file is
    // applied.
    let mut notes = Vec::new();
    let node = NodeSettings::default();
    for (key, differs) in [
        ("realloc_ms", config.node.realloc_interval != node.realloc_interval),
        ("max_wait_ms", config.node.max_wait != node.max_wait),
        ("max_tracked_groups", config.node.max_tracked_groups != node.max_tracked_groups),
    ] {
        if differs {
            notes.push(format!(
                "{key} in {} is for the embedded limiter and the clients that load this file; the server does not use it",
                path.display()
            ));
        }
    }
    Ok((config, notes))
}

/// The files the server follows: the settings file (and its text as the start reads it),
/// then the import files in the order given.
type Followed = (Option<String>, Vec<tollgate_controller::settings::files::FollowedFile>);

fn followed(a: &ServerArgs) -> anyhow::Result<Followed> {
    let text = a.config.as_ref().map(|p| crate::read_text(p, CONFIG_MAX_BYTES)).transpose()?;
    let files = a
        .config
        .iter()
        .map(|p| tollgate_controller::settings::files::FollowedFile {
            path: p.clone(),
            kind: tollgate_controller::settings::files::FileKind::Config,
        })
        .chain(a.imports.iter().cloned())
        .collect();
    Ok((text, files))
}

/// The token in `--admin-token-file`'s FILE (the first kilobyte, trimmed), if it reads as one.
fn token_file(flag: &str, path: &std::path::Path) -> anyhow::Result<String> {
    let read = || -> anyhow::Result<String> {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::Read::take(std::fs::File::open(path)?, 1024), &mut text)?;
        let token = text.trim();
        anyhow::ensure!(
            token.len() == 84 && token.starts_with("tg_"),
            "expected one token, tg_ID_SECRET (16 and 64 hex digits), as `tollgate token create` prints"
        );
        Ok(token.to_string())
    };
    read().map_err(|e| anyhow::anyhow!("{flag} {}: {e}", path.display()))
}

/// The global tier a region with a store of its own reaches (`--upstream`), checked.
fn upstream(a: &ServerArgs) -> anyhow::Result<Option<tollgate_controller::Upstream>> {
    if a.upstream.is_empty() {
        return Ok(None);
    }
    let token =
        a.upstream_token_file.as_deref().map(|p| token_file("--upstream-token-file", p)).transpose()?;
    let access = tollgate_limiter::access::Access { token, ca_file: a.upstream_ca.clone(), identity: None };
    let upstream = tollgate_controller::Upstream { urls: a.upstream.clone(), access };
    upstream.check().map_err(anyhow::Error::msg)?;
    Ok(Some(upstream))
}

/// Refuses to listen beyond loopback without credentials and TLS (unless `--insecure`), and
/// checks the names TLS lets in.
fn check_exposure(a: &ServerArgs) -> anyhow::Result<()> {
    // Safe by default: without credentials and TLS whoever reaches the ports can change
    // every quota, so only loopback unless the operator says otherwise.
    let secured = a.auth && a.tls_cert.is_some();
    for (flag, addr) in [("--grpc", a.grpc), ("--http", a.http)] {
        if !addr.ip().is_loopback() && !secured && !a.insecure {
            let missing = match (a.auth, a.tls_cert.is_some()) {
                (false, false) => "without --auth and TLS (--tls-cert, --tls-key)",
                (false, true) => "without --auth",
                _ => "without TLS (--tls-cert, --tls-key)",
            };
            bail!(
                "{flag} {addr}: not a loopback address, and the server would run {missing}: \
                 anyone who reaches it could change every quota or read tokens on the wire. Give \
                 both, listen on 127.0.0.1, or give --insecure to listen there anyway"
            );
        }
    }
    if a.tls_allow_name.len() > tollgate_controller::front::listen::ALLOWED_NAMES_MAX
        || a.tls_allow_name.iter().any(|n| n.trim().is_empty() || n.len() > 255)
    {
        bail!(
            "--tls-allow-name: 1 to {} names of 1 to 255 bytes each",
            tollgate_controller::front::listen::ALLOWED_NAMES_MAX
        );
    }
    Ok(())
}

/// What a unit counts: the flag, else the settings file's [cost], else requests.
fn cost_model(
    a: &ServerArgs,
    defaults: Option<&tollgate_model::config::Config>,
) -> anyhow::Result<CostModel> {
    let from_file = defaults.map(|c| c.cost_model);
    Ok(match a.cost_model.as_deref() {
        None => from_file.unwrap_or_default(),
        Some(name) => {
            let model = match name {
                "fdb" => CostModel::fdb(),
                "ru" => CostModel::ru(),
                "couchbase" => CostModel::Couchbase,
                _ => CostModel::Count,
            };
            if let Some(file) = from_file.filter(|f| f.name() != model.name()) {
                bail!(
                    "--cost-model {name}: the --config file's [cost] says {}; give one or make them agree",
                    file.name()
                );
            }
            model
        }
    })
}

fn options(a: ServerArgs) -> anyhow::Result<(ServerOptions, Vec<String>)> {
    check_exposure(&a)?;
    let admin_token =
        a.admin_token_file.as_deref().map(|p| token_file("--admin-token-file", p)).transpose()?;
    let tls = match (&a.tls_cert, &a.tls_key) {
        (Some(cert), Some(key)) => Some(tollgate_controller::front::listen::TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: a.tls_client_ca.clone(),
            allowed_names: a.tls_allow_name.iter().map(|n| n.trim().to_string()).collect(),
            peer_ca: a.tls_peer_ca.clone(),
        }),
        _ => None,
    };
    let saturation = SaturationSettings {
        queue_target_bytes: a.queue_target_bytes,
        queue_spring_bytes: a.queue_spring_bytes,
        limiting_threshold: a.limiting_threshold,
        ignore_worst_zones: a.ignore_worst_zones as usize,
        law: LimitingLaw::from_name(&a.limiting_law).unwrap_or_default(),
    };
    if let Some((key, rule)) = saturation.problems().into_iter().next() {
        bail!("--{}: {}", key.replace('_', "-"), rule.replace("queue_target_bytes", "--queue-target-bytes"));
    }
    // FoundationDB's threshold is 100 pages a second in bytes: in requests or request units it
    // leaves every tenant below it, and saturation limiting with it.
    let threshold_note = (saturation.limiting_threshold > 0.0).then(|| {
        format!(
            "saturation limits only groups that put at least {} units/s on a saturated backend \
             (--limiting-threshold): a group below that there is never limited by it, whatever \
             the backend's load; `tollgate status` names a backend left inert so",
            saturation.limiting_threshold
        )
    });
    if !COST_FOLDING_S.contains(&a.cost_folding_s) {
        bail!(
            "--cost-folding-s: must be from {} to {} seconds, got {}",
            COST_FOLDING_S.start(),
            COST_FOLDING_S.end(),
            a.cost_folding_s
        );
    }
    let (defaults, mut notes) = match &a.config {
        Some(path) => {
            let (c, notes) = defaults(path)?;
            (Some(c), notes)
        }
        None => (None, Vec::new()),
    };
    let (defaults_text, follow) = followed(&a)?;
    notes.extend(threshold_note);
    let etcd = match &a.etcd {
        Some(urls) => {
            Some(tollgate_controller::EtcdTarget::parse(urls, &a.etcd_prefix).map_err(anyhow::Error::msg)?)
        }
        None => None,
    };
    if let Some(a) = &a.advertise {
        tollgate_controller::cluster::role::check_advertise(a)
            .map_err(|e| anyhow::anyhow!("--advertise: {e}, the gRPC address others reach"))?;
    }
    let cost_model = cost_model(&a, defaults.as_ref())?;
    let (max_connections, fitted) = tollgate_controller::front::conn::fit_connections(
        a.max_connections.map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
        tollgate_controller::front::conn::open_file_limit(),
    )
    .map_err(anyhow::Error::msg)?;
    notes.extend(fitted);
    let opts = ServerOptions {
        etcd,
        advertise: a.advertise.clone(),
        election_lease: Duration::from_secs(a.election_lease_s),
        region: a.region.clone(),
        upstream: upstream(&a)?,
        shards: a.shards,
        data: a.data,
        grpc: a.grpc,
        http: a.http,
        tick: Duration::from_millis(a.tick_ms),
        lease: Duration::from_millis(a.lease_ms),
        cost_model,
        saturation,
        cost_folding: Duration::from_secs_f64(a.cost_folding_s),
        trickle: Duration::from_millis(a.trickle_ms),
        max_groups: a.max_groups as usize,
        flush_interval: Duration::from_millis(a.flush_ms),
        limits: tollgate_controller::front::conn::Limits {
            max_connections,
            idle_timeout: Duration::from_millis(a.idle_timeout_ms),
            max_requests_per_s: a.max_requests_per_conn_s,
            max_streams: a.max_streams_per_conn,
            metrics_groups: tollgate_controller::observe::series::MetricsGroups::new(a.metrics_groups)
                .map_err(anyhow::Error::msg)?,
            charge_bound: tollgate_controller::front::charges::ChargeBound::new(a.charge_repay_s)
                .map_err(anyhow::Error::msg)?,
        },
        defaults,
        defaults_text,
        follow,
        tls,
        auth: a.auth,
        admin_token,
    };
    Ok((opts, notes))
}

/// Binds, prints where it listens (tests read this line), and serves.
pub fn run(args: ServerArgs) -> anyhow::Result<ExitCode> {
    let log_format = args.log_format;
    let (opts, notes) = options(args)?;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let log = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match log_format {
        crate::args::LogFormat::Text => {
            log.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).init()
        }
        crate::args::LogFormat::Json => log.json().init(),
    }
    for note in notes {
        tracing::warn!("{note}");
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async {
        let server = Server::bind(&opts).await?;
        let settings = match &opts.etcd {
            Some(t) => format!("etcd {} prefix {}", t.endpoints.join(","), t.prefix),
            None => opts.data.display().to_string(),
        };
        crate::say(format!(
            "tollgate server listening: grpc {} http {} data {settings}",
            server.grpc_addr(),
            server.http_addr(),
        ));
        if let Some(file) = server.first_token_file() {
            crate::say(format!(
                "the first admin token is in {} (readable only by you): export TOLLGATE_TOKEN=$(cat {})",
                file.display(),
                file.display()
            ));
        }
        tracing::info!(grpc = %server.grpc_addr(), http = %server.http_addr(), "serving");
        server.run(shutdown_signal()).await?;
        tracing::info!("stopped");
        Ok(ExitCode::SUCCESS)
    })
}

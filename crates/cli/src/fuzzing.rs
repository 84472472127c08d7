//! Entry points for fuzzing: each takes arbitrary bytes and must never panic, whatever they
//! are. The `fuzz/` targets run them under libFuzzer (`scripts/fuzz.sh`, nightly), and
//! `tests/fuzz.rs` runs them on random inputs under `cargo test`, so a regression fails CI.

use std::sync::{Arc, OnceLock};

use clap::Parser;
use prost::Message;
use tollgate_core::config::Config;
use tollgate_core::engine::EngineSettings;
use tollgate_core::settings::GroupName;
use tollgate_core::time::Nanos;
use tollgate_proto::v1;
use tollgate_server::Controller;
use tollgate_server::controller::PutMode;
use tollgate_server::store::MemoryStore;

/// A settings file: parsed, checked as `check-config` does, and built into a limiter if valid.
pub fn settings_file(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = crate::check::check("fuzz.toml", text);
    if let Ok(config) = Config::parse(text) {
        let _ = config.warnings();
        let _ = tollgate_client::Tollgate::embedded(config);
    }
}

/// A scenario file: parsed (not run: a valid one may run for a long simulated time).
pub fn scenario(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = tollgate_sim::Scenario::parse(text);
}

/// A command line: NUL-separated arguments after `tollgate`, through every parser the command
/// has (subcommands, numbers, limits, ramps, addresses). Nothing is run.
pub fn cli_args(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let args = std::iter::once("tollgate").chain(text.split('\0'));
    let _ = crate::Cli::try_parse_from(args);
}

fn controller() -> &'static Arc<Controller> {
    static CONTROLLER: OnceLock<Arc<Controller>> = OnceLock::new();
    CONTROLLER.get_or_init(|| {
        let settings =
            EngineSettings { max_tracked_groups: 10_000, max_clients: 10_000, ..EngineSettings::default() };
        Arc::new(Controller::new(Box::new(MemoryStore::default()), settings, Nanos::ZERO, 0).expect("memory"))
    })
}

/// A gRPC message: the first byte picks which, the rest is its encoding; what decodes is
/// handed to the controller's handler for it, as the server would. The controller lives
/// across calls, so state builds up as it would in a server.
pub fn grpc_message(data: &[u8]) {
    let Some((&which, bytes)) = data.split_first() else { return };
    let c = controller();
    let now = Nanos(u64::from(which) * 1_000_000_000);
    match which % 8 {
        0 => {
            if let Ok(m) = v1::ExchangeRequest::decode(bytes) {
                let _ = c.exchange(now, &m);
            }
        }
        1 => {
            if let Ok(m) = v1::BackendReport::decode(bytes) {
                let _ = c.backend_report(now, &m);
            }
        }
        2 => {
            if let Ok(m) = v1::PutGroupRequest::decode(bytes)
                && let Ok(name) = GroupName::new(&m.name)
            {
                let mode = match m.mode % 3 {
                    0 => PutMode::Upsert,
                    1 => PutMode::Create,
                    _ => PutMode::Alter,
                };
                let _ = c.put_group(name, &m.patch.unwrap_or_default(), mode);
            }
        }
        3 => {
            if let Ok(m) = v1::DropGroupRequest::decode(bytes)
                && let Ok(name) = GroupName::new(&m.name)
            {
                let _ = c.drop_group(&name);
            }
        }
        4 => {
            if let Ok(m) = v1::SetCapacityRequest::decode(bytes) {
                let _ = c.set_capacity(m.capacity);
            }
        }
        5 => {
            if let Ok(m) = v1::SetModeRequest::decode(bytes) {
                let _ = c.set_mode(tollgate_server::convert::mode_from_proto(m.mode()));
            }
        }
        6 => {
            if let Ok(m) = v1::StatusRequest::decode(bytes)
                && let Ok(page) = tollgate_server::status::Page::of(m.page_size, &m.page_token)
            {
                let _ = tollgate_server::status::status_json(&tollgate_server::status::status_response(
                    c, now, &page,
                ));
            }
        }
        _ => c.tick(now),
    }
}

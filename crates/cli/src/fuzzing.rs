//! Entry points for fuzzing: each takes arbitrary bytes and must never panic, whatever they
//! are. The `fuzz/` targets run them under libFuzzer (`scripts/fuzz.sh`, nightly), and
//! `tests/it/fuzz.rs` runs them on random inputs under `cargo test`, so a regression fails CI.

use std::sync::{Arc, OnceLock};

use clap::Parser;
use prost::Message;
use tollgate_controller::front::grpc::Services;
use tollgate_controller::store::MemoryStore;
use tollgate_controller::{Controller, Node};
use tollgate_model::config::Config;
use tollgate_model::engine::EngineSettings;
use tollgate_model::time::Nanos;
use tollgate_proto::v1::{self, admin_server::Admin, admission_server::Admission, backend_server::Backend};

/// A settings file: parsed, checked as `check-config` does, and built into a limiter if valid.
pub fn settings_file(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = crate::check::check("fuzz.toml", text, false);
    if let Ok(config) = Config::parse(text) {
        let _ = config.warnings();
        let _ = tollgate_limiter::Tollgate::embedded(config);
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
    let _ = crate::args::Cli::try_parse_from(args);
}

/// The texts operators type at the admin commands: the first byte picks the parser, the rest
/// is the text. 0: `tollgate sql` statements; 1: a node properties document; 2: a group
/// properties document; 3: a `tollgate calibrate` CSV, parsed and fitted.
pub fn admin_text(data: &[u8]) {
    let Some((&which, rest)) = data.split_first() else { return };
    let Ok(text) = std::str::from_utf8(rest) else { return };
    match which % 4 {
        0 => drop(crate::admin::sql::parse(text)),
        1 => drop(tollgate_controller::front::properties::node_change(text)),
        3 => {
            if let Ok(data) = crate::calibrate::parse(text, "observed")
                && let Ok(fit) = crate::calibrate::fit(&data)
            {
                let _ = crate::calibrate::report(&data, &fit);
            }
        }
        _ => {
            let current =
                tollgate_proto::v1::GroupSettings { reserved: 5.0, limit: Some(10.0), ..Default::default() };
            let _ = tollgate_controller::front::properties::group_patch(text, Some(&current));
        }
    }
}

/// The controller and its gRPC services, kept across calls so that state builds up as it
/// would in a server, and a runtime to call the handlers on.
struct Served {
    controller: Arc<Controller>,
    services: Services,
    runtime: tokio::runtime::Runtime,
}

fn served() -> &'static Served {
    static SERVED: OnceLock<Served> = OnceLock::new();
    SERVED.get_or_init(|| {
        let settings =
            EngineSettings { max_tracked_groups: 10_000, max_clients: 10_000, ..EngineSettings::default() };
        let node = Node::open(Box::new(MemoryStore::default()), settings, Nanos::ZERO, 0).expect("memory");
        let controller = node.controller.clone();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime");
        let services = runtime.block_on(async { Services::new(node) });
        Served { controller, services, runtime }
    })
}

fn decoded<M: Message + Default>(bytes: &[u8]) -> Option<tonic::Request<M>> {
    M::decode(bytes).ok().map(tonic::Request::new)
}

/// A gRPC message: the first byte picks the call, the rest is its request's encoding; what
/// decodes is handed to the server's own handler for that call (the one tonic calls; an
/// exchange's bytes go as they are to the hand reader the server uses, checked to accept just
/// what the generated code accepts, and then decoded to the typed handler too), and a
/// status answer is also rendered as the HTTP `/status` JSON. The byte also moves the engine's
/// clock for a tick, so ticks interleave with the calls.
pub fn grpc_message(data: &[u8]) {
    let Some((&which, bytes)) = data.split_first() else { return };
    let Served { controller, services: s, runtime } = served();
    // A message decoded as the method's request, when it decodes, and handed to it.
    macro_rules! call {
        ($method:path) => {
            if let Some(r) = decoded(bytes) {
                let _ = $method(s, r).await;
            }
        };
    }
    runtime.block_on(async {
        match which % 12 {
            0 => {
                // The server reads exchanges by hand: it must accept exactly what the
                // generated code accepts, and answer whatever comes.
                let by_hand = tollgate_proto::wire::ExchangeView::decode(bytes).is_ok();
                assert_eq!(by_hand, v1::ExchangeRequest::decode(bytes).is_ok(), "read by hand: {by_hand}");
                let _ = s.exchange_encoded(&tonic::Request::new(prost::bytes::Bytes::copy_from_slice(bytes)));
                if let Some(r) = decoded(bytes) {
                    let _ = Admission::exchange(s, r).await;
                }
            }
            1 => call!(Backend::report),
            2 => call!(Admin::put_group),
            3 => call!(Admin::drop_group),
            4 => call!(Admin::get_group),
            5 => call!(Admin::list_groups),
            6 => call!(Admin::set_capacity),
            7 => call!(Admin::set_mode),
            8 => call!(Admin::get_node),
            9 => {
                if let Some(r) = decoded(bytes)
                    && let Ok(answer) = Admin::status(s, r).await
                {
                    let _ = tollgate_controller::observe::status::status_json(answer.get_ref());
                }
            }
            10 => call!(Backend::get_settings),
            _ => controller.pacer().tick(Nanos(u64::from(which) * 1_000_000_000)),
        }
    });
}

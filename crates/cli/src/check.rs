//! `tollgate check-config`: validate a settings file without applying it.

use std::fmt::Write;

use tollgate_model::config::Config;
use tollgate_model::settings::Limit;

/// What `check-config` prints, and whether the file is valid.
pub struct Report {
    pub ok: bool,
    pub text: String,
}

/// Checks `src` (read from `path`): one line per problem, `path:line: field: rule`; or a
/// summary of what the file sets up, with any warnings. Unless `for_server`, what parses must
/// also be what the embedded limiter builds from.
pub fn check(path: &str, src: &str, for_server: bool) -> Report {
    let mut text = String::new();
    match Config::parse(src) {
        Err(errors) => {
            for e in &errors.0 {
                let _ = writeln!(text, "{path}:{}: {}: {}", e.line, e.field, e.rule);
            }
            let n = errors.0.len();
            let _ = writeln!(text, "{n} problem{} found; nothing applied", if n == 1 { "" } else { "s" });
            Report { ok: false, text }
        }
        Ok(config) => {
            if !for_server && let Err(e) = tollgate_limiter::check_embedded(&config) {
                let _ = writeln!(text, "{path}: {e}");
                let _ = writeln!(
                    text,
                    "1 problem found for the embedded limiter (Tollgate::from_file); give \
                     --for-server to check the file as tollgate server --config reads it"
                );
                return Report { ok: false, text };
            }
            let capacity = config.node.capacity.map_or("none".to_string(), |c| format!("{c} units/s"));
            let _ = writeln!(
                text,
                "{path}: ok: {} group{}, capacity {capacity}, mode {:?}, cost model {}",
                config.groups.len(),
                if config.groups.len() == 1 { "" } else { "s" },
                config.node.mode,
                config.cost_model.name(),
            );
            for (name, g) in &config.groups {
                let limit = match g.limit() {
                    Limit::Units(u) => format!("{u}"),
                    Limit::Unlimited => "unlimited".into(),
                };
                let _ = writeln!(
                    text,
                    "  {name}: reserved {} limit {limit} priority {} weight {}",
                    g.reserved(),
                    g.priority().level(),
                    g.weight()
                );
            }
            for w in config.warnings() {
                let _ = writeln!(text, "warning: {w}");
            }
            Report { ok: true, text }
        }
    }
}

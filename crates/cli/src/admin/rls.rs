//! `tollgate rls`: the Envoy rate-limit service's mapping rules, and a request to try it.

use clap::Subcommand;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor, rate_limit_descriptor::Entry,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, rate_limit_response::Code};
use tollgate_proto::v1;

use crate::admin::{Target, connect, rpc};
use crate::say;

/// `tollgate rls …`.
#[derive(Subcommand)]
pub enum Rls {
    /// Print the mapping rules, as JSON.
    Rules,
    /// Replace the mapping rules: a JSON array of {"domain", "key", "value", "group"} and
    /// optionally "then" (the entries that must follow, in order: [{"key", "value"}]), "whole"
    /// (true: match only a whole descriptor), "name" and "replaces" (names of rules whose
    /// descriptors are not limited in a request that matches this one), tried in order;
    /// "{value}" in group stands for the entry's value and "{KEY}" for the value of the
    /// matched entry KEY; an empty domain or value matches any. `[]` for none (then an entry
    /// with key `tenant` names the group).
    SetRules {
        /// The rules, or `@FILE` to read them from a file.
        json: String,
    },
    /// Ask the rate-limit service as Envoy would: one descriptor per --descriptor.
    Check {
        /// The domain.
        #[arg(long, default_value = "tollgate")]
        domain: String,
        /// A descriptor's entries, `key=value,key=value` (repeat for several descriptors).
        #[arg(long = "descriptor", required = true)]
        descriptors: Vec<String>,
        /// The units each descriptor costs (Envoy's hits_addend; 0 means 1).
        #[arg(long, default_value_t = 0)]
        hits: u32,
    },
}

fn descriptor(text: &str) -> anyhow::Result<RateLimitDescriptor> {
    let entries = text
        .split(',')
        .map(|pair| {
            let (k, v) = pair.split_once('=').ok_or_else(|| {
                anyhow::anyhow!("--descriptor: expected key=value[,key=value], got {text:?}")
            })?;
            Ok(Entry { key: k.trim().to_string(), value: v.trim().to_string() })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(RateLimitDescriptor { entries, ..RateLimitDescriptor::default() })
}

/// Runs a `tollgate rls` command.
pub async fn run(server: &Target, cmd: Rls) -> anyhow::Result<()> {
    match cmd {
        Rls::Rules => {
            let mut client = connect(server).await?;
            let rules = client.get_rls_rules(v1::GetRlsRulesRequest {}).await.map_err(rpc)?.into_inner();
            say(pretty(&rules.rules_json));
        }
        Rls::SetRules { json } => {
            let text = match json.strip_prefix('@') {
                Some(file) => {
                    crate::read_text(std::path::Path::new(file), tollgate_model::rls::RULES_MAX_BYTES)?
                }
                None => json,
            };
            let mut client = connect(server).await?;
            let set =
                client.set_rls_rules(v1::RlsRules { rules_json: text }).await.map_err(rpc)?.into_inner();
            say(pretty(&set.rules_json));
        }
        Rls::Check { domain, descriptors, hits } => {
            let descriptors =
                descriptors.iter().map(|d| descriptor(d)).collect::<anyhow::Result<Vec<_>>>()?;
            let channel = crate::admin::channel(server).await?;
            let mut client = RateLimitServiceClient::new(channel);
            let request = RateLimitRequest { domain, descriptors, hits_addend: hits };
            let answer = client.should_rate_limit(request).await.map_err(rpc)?.into_inner();
            let name = |code: i32| Code::try_from(code).map_or("UNKNOWN", |c| c.as_str_name());
            say(name(answer.overall_code));
            for (i, s) in answer.statuses.iter().enumerate() {
                let limit = s.current_limit.as_ref().map_or("none".to_string(), |l| {
                    format!("{}/{} ({})", l.requests_per_unit, unit_name(l.unit), l.name)
                });
                // When the limit starts afresh: the end of a quota's window, a rate's refill
                // (what Envoy's x-ratelimit-reset says, in whole seconds there).
                let reset = s.duration_until_reset.as_ref().map_or(String::new(), |d| {
                    format!("  resets in {:.3} s", d.seconds as f64 + f64::from(d.nanos) / 1e9)
                });
                say(format!(
                    "  [{i}] {}  limit {limit}  remaining {}{reset}",
                    name(s.code),
                    s.limit_remaining
                ));
            }
        }
    }
    Ok(())
}

/// A limit's unit as people write it: `second`, `minute`, …
fn unit_name(unit: i32) -> String {
    envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit::try_from(unit)
        .map_or_else(|_| format!("unit {unit}"), |u| u.as_str_name().to_ascii_lowercase())
}

fn pretty(json: &str) -> String {
    serde_json::from_str::<serde_json::Value>(json)
        .and_then(|v| serde_json::to_string_pretty(&v))
        .unwrap_or_else(|_| json.to_string())
}

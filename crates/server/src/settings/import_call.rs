//! The admin API's `ImportLimits`: a limits file sent as text, turned into groups, patterns
//! and what names them by the same reading and the same preview as `tollgate import`, and
//! written as a server following the file (`--import`) writes it. Any client of the admin API
//! imports this way, in any language.

use tollgate_model::settings::GroupName;
use tollgate_proto::v1;

use crate::error::AdminError;
use crate::node::Node;
use crate::settings::files::{Parts, apply_import};
use crate::settings::import::{self, FILE_MAX_BYTES, Format};

/// Reads, checks and (unless it is a dry run, or refused) writes `request`'s file for `who`.
pub(crate) fn import_limits(
    node: &Node,
    request: &v1::ImportLimitsRequest,
    who: &str,
) -> Result<v1::ImportLimitsResponse, AdminError> {
    let format = match v1::ImportFormat::try_from(request.format) {
        Ok(v1::ImportFormat::EnvoyRatelimit) => Format::EnvoyRatelimit,
        Ok(v1::ImportFormat::Limitador) => Format::Limitador,
        _ => {
            return Err(AdminError::Rule(format!(
                "format: give IMPORT_FORMAT_ENVOY_RATELIMIT or IMPORT_FORMAT_LIMITADOR, got {}",
                request.format
            )));
        }
    };
    if request.text.len() > FILE_MAX_BYTES {
        return Err(AdminError::Rule(format!(
            "text: at most {FILE_MAX_BYTES} bytes, got {}",
            request.text.len()
        )));
    }
    let plan = import::plan(format, &request.text);
    if !plan.refused.is_empty() {
        let lines: Vec<String> =
            plan.refused.iter().map(|(line, why)| format!("line {line}: {why}")).collect();
        return Err(AdminError::Rule(format!(
            "{}\n{} refused; nothing changed",
            lines.join("\n"),
            lines.len()
        )));
    }
    let notes = plan
        .notes
        .iter()
        .map(|(line, note)| v1::ImportNote { line: *line as u32, note: note.clone() })
        .collect();
    let admin = node.controller.admin();
    let before: Vec<Option<v1::GroupSettings>> = plan
        .groups
        .iter()
        .map(|g| {
            let name = GroupName::new(&g.name).ok()?;
            admin.group(&name).map(|s| tollgate_proto::convert::settings_to_proto(&s))
        })
        .collect();
    let preview = import::preview(&plan, &node.rls_rules.get(), &before).map_err(AdminError::Rule)?;
    if !request.replace
        && let Some(why) = preview.blocked("replace")
    {
        return Err(AdminError::Refused(why));
    }
    let mut response = v1::ImportLimitsResponse {
        notes,
        changes: preview.lines.clone(),
        applied: false,
        summary: String::new(),
    };
    if request.dry_run {
        return Ok(response);
    }
    let parts = Parts { controller: &node.controller, rls_rules: &node.rls_rules };
    apply_import(parts, None, &plan, who).map_err(AdminError::Rule)?;
    response.applied = true;
    response.summary = preview.summary(&plan);
    Ok(response)
}

//! `tollgate import`: the limit files of envoy/ratelimit and Limitador turned into groups,
//! patterns and what names them (see `tollgate_controller::settings::import`), sent through the admin
//! API. A file is read whole and checked before anything is sent; what it holds that Tollgate
//! cannot express is refused with its line and the reason, and then nothing changes.
//! `--dry-run` prints what would change.

use std::fmt::Write as _;

use tollgate_controller::settings::import::{FILE_MAX_BYTES, Format, Imported, Shape, plan, preview};
use tollgate_model::rls::RuleSet;
use tollgate_proto::v1;

use crate::admin::{Admin, Target, connect, rpc};
use crate::say;

/// `tollgate import FORMAT FILE [--dry-run] [--replace]`.
pub async fn run(
    target: &Target,
    format: Format,
    file: &std::path::Path,
    (dry_run, replace): (bool, bool),
) -> anyhow::Result<()> {
    let text = crate::read_text(file, FILE_MAX_BYTES)?;
    let plan = plan(format, &text);
    let shown = file.display();
    for (line, note) in &plan.notes {
        say(format!("{shown}:{line}: note: {note}"));
    }
    if !plan.refused.is_empty() {
        let mut out = String::new();
        for (line, why) in &plan.refused {
            let _ = writeln!(out, "{shown}:{line}: {why}");
        }
        anyhow::bail!("{out}{} refused; nothing changed", plan.refused.len());
    }
    let mut client = connect(target).await?;
    let current = client.get_rls_rules(v1::GetRlsRulesRequest {}).await.map_err(rpc)?.into_inner();
    let current = RuleSet::from_json(&current.rules_json).map_err(anyhow::Error::msg)?;
    let mut before = Vec::with_capacity(plan.groups.len());
    for g in &plan.groups {
        before.push(crate::admin::get(&mut client, &g.name).await?);
    }
    let preview = preview(&plan, &current, &before).map_err(anyhow::Error::msg)?;
    for line in &preview.lines {
        say(line.clone());
    }
    if !replace && let Some(why) = preview.blocked("--replace") {
        anyhow::bail!(why);
    }
    if dry_run {
        say("dry run: nothing changed");
        return Ok(());
    }
    let changes: Vec<(&Imported, Option<v1::GroupSettings>)> =
        preview.changed.iter().map(|&i| (&plan.groups[i], before[i].clone())).collect();
    apply(&mut client, &changes, &preview.next).await?;
    say(preview.summary(&plan));
    Ok(())
}

/// Writes the changed groups, then the rules; if a write fails, what was written is put back.
async fn apply(
    client: &mut Admin,
    changes: &[(&Imported, Option<v1::GroupSettings>)],
    rules: &RuleSet,
) -> anyhow::Result<()> {
    let mut written = Vec::new();
    let mut failed = None;
    for (g, before) in changes {
        let req = v1::PutGroupRequest {
            name: g.name.clone(),
            patch: Some(g.shape.patch()),
            mode: v1::PutMode::Upsert as i32,
        };
        match client.put_group(req).await {
            Ok(_) => written.push((g, before)),
            Err(e) => {
                failed = Some(anyhow::anyhow!("group {}: {}", g.name, rpc(e)));
                break;
            }
        }
    }
    if failed.is_none() {
        let json = rules.to_json();
        if let Err(e) = client.set_rls_rules(v1::RlsRules { rules_json: json }).await {
            failed = Some(anyhow::anyhow!("rules: {}", rpc(e)));
        }
    }
    let Some(error) = failed else { return Ok(()) };
    for (g, before) in written.into_iter().rev() {
        let _ = match before {
            Some(b) => {
                let patch = Some(Shape::of(b).patch());
                let req =
                    v1::PutGroupRequest { name: g.name.clone(), patch, mode: v1::PutMode::Upsert as i32 };
                client.put_group(req).await.map(|_| ())
            }
            None => {
                let req = v1::DropGroupRequest { name: g.name.clone(), if_exists: true };
                client.drop_group(req).await.map(|_| ())
            }
        };
    }
    Err(error.context("the import failed; the groups it had written were put back"))
}

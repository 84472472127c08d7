//! Settings files the server follows: `--config FILE` (Tollgate's settings file) and
//! `--import FORMAT=FILE` (an envoy/ratelimit or Limitador limits file, as `tollgate import`
//! reads it).
//!
//! Each is read again when it changes (looked at every second, so a Kubernetes ConfigMap
//! mounted as a file is followed as kubelet rewrites it) and on SIGHUP. A file that reads is
//! applied as the difference from its last revision, through the same audited path as the
//! admin API, the audit naming the file and its revision:
//!
//! - a settings file: each group whose settings in the file changed is set, each group the
//!   file no longer has is dropped, the node settings it changed are set, and its mapping
//!   rules replace the rules (imported files' trees and limits stay). What an operator changed
//!   at run time in a part the file did not change stays; at start the file only fills what
//!   the store lacks.
//! - an import file: its groups and patterns are set as `tollgate import --replace` sets them,
//!   those it no longer has are dropped, and its domains are answered by it alone.
//!
//! A file that does not read, or that the checks refuse, is refused whole: nothing of it
//! applies, the running settings stay, and the error (with its line) is logged, shown in
//! `/status`, in `/readyz`'s answer and in `tollgate_settings_file_rejected`. Each file's
//! revision in force (a hash of its text) is shown the same way.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tollgate_model::config::Config;
use tollgate_model::rls::RuleSet;
use tollgate_model::settings::GroupName;

use crate::controller::Controller;
use crate::front::rls::RlsRules;
use crate::settings::import::{self, Plan};

/// How often the files are looked at.
pub const LOOK_EVERY: Duration = Duration::from_secs(1);

/// The largest file taken, in bytes.
pub const FILE_MAX_BYTES: usize = 64 << 20;

/// What a file's revision is applied to.
#[derive(Clone, Copy)]
pub struct Parts<'a> {
    /// The groups' and the node's settings.
    pub controller: &'a Controller,
    /// How Envoy's descriptors name groups.
    pub rls_rules: &'a RlsRules,
}

pub use crate::settings::followed::{FileKind, FollowedFile};

/// A followed file as status shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct FileStatus {
    /// Where it is.
    pub path: String,
    /// `config`, `envoy-ratelimit` or `limitador`.
    pub kind: &'static str,
    /// The revision in force (a hash of its text), once one was applied.
    pub revision: Option<String>,
    /// Why the file as it is now is refused, while it is.
    pub rejected: Option<String>,
    /// Revisions applied since the server started.
    pub applied: u64,
}

/// What a file was when it was last applied.
#[derive(Debug)]
enum Last {
    Config(Box<Config>),
    Import(Box<Plan>),
}

#[derive(Debug)]
struct Followed {
    file: FollowedFile,
    status: FileStatus,
    /// The hash of the text last read (applied or refused).
    seen: Option<u64>,
    last: Option<Last>,
}

/// The files a server follows, and where each is at.
#[derive(Debug, Default)]
pub struct Files {
    files: Mutex<Vec<Followed>>,
}

/// A text's revision: the first 8 bytes of its SHA-256.
fn hash(text: &str) -> u64 {
    let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest.as_ref()[..8]);
    u64::from_be_bytes(first)
}

impl Files {
    /// Files to follow; `config_at_start` is the settings file's text as the start applied it
    /// (where the store lacked it), so that only its later changes are applied.
    pub fn new(files: Vec<FollowedFile>, config_at_start: Option<(&str, Config)>) -> Files {
        let files = files
            .into_iter()
            .map(|file| {
                let mut f = Followed {
                    status: FileStatus {
                        path: file.path.display().to_string(),
                        kind: file.kind.name(),
                        revision: None,
                        rejected: None,
                        applied: 0,
                    },
                    file,
                    seen: None,
                    last: None,
                };
                if let (FileKind::Config, Some((text, config))) = (f.file.kind, &config_at_start) {
                    let h = hash(text);
                    (f.seen, f.last) = (Some(h), Some(Last::Config(Box::new(config.clone()))));
                    f.status.revision = Some(format!("{h:016x}"));
                }
                f
            })
            .collect();
        Files { files: Mutex::new(files) }
    }

    /// Whether any file is followed.
    pub fn is_empty(&self) -> bool {
        self.files.lock().unwrap_or_else(PoisonError::into_inner).is_empty()
    }

    /// Every file, as status shows it.
    pub fn status(&self) -> Vec<FileStatus> {
        self.files.lock().unwrap_or_else(PoisonError::into_inner).iter().map(|f| f.status.clone()).collect()
    }

    /// Reads every file again and applies those that changed (all of them with `force`) to
    /// `parts`. Blocks on the store: call it where blocking is allowed.
    pub fn check(&self, parts: Parts<'_>, force: bool) {
        let mut files = self.files.lock().unwrap_or_else(PoisonError::into_inner);
        for f in files.iter_mut() {
            let text = match read(&f.file.path) {
                Ok(t) => t,
                Err(why) => {
                    reject(f, why);
                    continue;
                }
            };
            let h = hash(&text);
            if f.seen == Some(h) && !force {
                continue;
            }
            f.seen = Some(h);
            let revision = format!("{h:016x}");
            let who = format!("file {} (revision {revision})", f.file.path.display());
            match parse_and_apply(parts, f, &text, &who) {
                Ok(last) => {
                    f.last = Some(last);
                    f.status.revision = Some(revision.clone());
                    f.status.rejected = None;
                    f.status.applied += 1;
                    tracing::info!(file = %f.file.path.display(), revision, "settings file applied");
                }
                Err(why) => reject(f, why),
            }
        }
    }
}

fn reject(f: &mut Followed, why: String) {
    if f.status.rejected.as_ref() != Some(&why) {
        tracing::error!(file = %f.file.path.display(), error = %why, "settings file refused; the running settings stay");
    }
    f.status.rejected = Some(why);
}

fn read(path: &std::path::Path) -> Result<String, String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if meta.len() > FILE_MAX_BYTES as u64 {
        return Err(format!("{}: larger than {FILE_MAX_BYTES} bytes", path.display()));
    }
    std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// Reads `text` as `f`'s kind and applies the difference from its last revision.
fn parse_and_apply(node: Parts<'_>, f: &Followed, text: &str, who: &str) -> Result<Last, String> {
    let shown = f.file.path.display();
    match f.file.kind {
        FileKind::Config => {
            let config = Config::parse(text).map_err(|errors| {
                let lines: Vec<String> =
                    errors.0.iter().map(|e| format!("{shown}:{}: {}: {}", e.line, e.field, e.rule)).collect();
                lines.join("\n")
            })?;
            let old = match &f.last {
                Some(Last::Config(c)) => Some(&**c),
                _ => None,
            };
            apply_config(node, old, &config, who).map_err(|e| format!("{shown}: {e}"))?;
            Ok(Last::Config(Box::new(config)))
        }
        FileKind::Import(format) => {
            let plan = import::plan(format, text);
            if !plan.refused.is_empty() {
                let lines: Vec<String> =
                    plan.refused.iter().map(|(line, why)| format!("{shown}:{line}: {why}")).collect();
                return Err(lines.join("\n"));
            }
            let old = match &f.last {
                Some(Last::Import(p)) => Some(&**p),
                _ => None,
            };
            apply_import(node, old, &plan, who).map_err(|e| format!("{shown}: {e}"))?;
            Ok(Last::Import(Box::new(plan)))
        }
    }
}

/// Checks what a change would set before anything is: a file is refused whole.
fn check_groups<'a>(
    groups: impl Iterator<Item = (&'a GroupName, &'a tollgate_model::settings::GroupSettings)>,
) -> Result<(), String> {
    for (name, s) in groups {
        tollgate_model::settings::check_pattern(name.as_str(), s).map_err(|e| format!("{name}: {e}"))?;
    }
    Ok(())
}

fn apply_config(node: Parts<'_>, old: Option<&Config>, new: &Config, who: &str) -> Result<(), String> {
    let c = node.controller;
    let changed: Vec<(&GroupName, &tollgate_model::settings::GroupSettings)> =
        new.groups.iter().filter(|(n, s)| old.is_none_or(|o| o.groups.get(*n) != Some(*s))).collect();
    check_groups(changed.iter().copied())?;
    for (name, s) in changed {
        c.admin()
            .set_group(name.clone(), s.clone(), who, crate::clock::wall_ms())
            .map_err(|e| format!("{name}: {e}"))?;
    }
    if let Some(old) = old {
        for name in old.groups.keys().filter(|n| !new.groups.contains_key(*n)) {
            c.admin().drop_group(name, who).map_err(|e| format!("{name}: {e}"))?;
        }
    }
    let (n, o) = (&new.node, old.map(|o| &o.node));
    let differs =
        |f: &dyn Fn(&tollgate_model::config::NodeSettings) -> String| o.is_none_or(|o| f(o) != f(n));
    fn e(e: impl std::fmt::Display) -> String {
        format!("node: {e}")
    }
    if differs(&|s| format!("{:?}", s.capacity)) {
        c.admin().set_capacity(n.capacity, who).map_err(e)?;
    }
    if differs(&|s| format!("{:?}", s.mode)) {
        c.admin().set_mode(n.mode, who).map_err(e)?;
    }
    if differs(&|s| s.slow_start.to_string()) {
        c.admin().set_slow_start(n.slow_start, who).map_err(e)?;
    }
    if differs(&|s| s.shadow.to_string()) {
        c.admin().set_shadow(n.shadow, who).map_err(e)?;
    }
    if differs(&|s| s.throttling.to_string()) {
        c.admin().set_throttling(n.throttling, who).map_err(e)?;
    }
    if old.is_none_or(|o| o.rls_rules != new.rls_rules) {
        let current = node.rls_rules.get();
        let set = RuleSet { rules: new.rls_rules.clone().unwrap_or_default(), ..(*current).clone() };
        node.rls_rules.set(set, who).map_err(|e| format!("rls.rules: {e}"))?;
    }
    Ok(())
}

pub(crate) fn apply_import(
    node: Parts<'_>,
    old: Option<&Plan>,
    plan: &Plan,
    who: &str,
) -> Result<(), String> {
    let c = node.controller;
    let mut writes = Vec::new();
    for g in &plan.groups {
        let name = GroupName::new(&g.name).map_err(|e| format!("{}: {}", g.name, e.rule))?;
        let current = c.admin().group(&name);
        let next =
            tollgate_proto::convert::apply_patch(current.clone().unwrap_or_default(), &g.shape.patch())
                .map_err(|e| format!("{}: {e}", g.name))?;
        if current.as_ref() != Some(&next) {
            writes.push((name, next));
        }
    }
    check_groups(writes.iter().map(|(n, s)| (n, s)))?;
    for (name, s) in writes {
        c.admin()
            .set_group(name.clone(), s, who, crate::clock::wall_ms())
            .map_err(|e| format!("{name}: {e}"))?;
    }
    if let Some(old) = old {
        for gone in old.groups.iter().filter(|o| !plan.groups.iter().any(|g| g.name == o.name)) {
            if let Ok(name) = GroupName::new(&gone.name) {
                c.admin().drop_group(&name, who).map_err(|e| format!("{name}: {e}"))?;
            }
        }
    }
    let current = node.rls_rules.get();
    let next = import::merged(&current, plan);
    if *current != next {
        node.rls_rules.set(next, who).map_err(|e| format!("rules: {e}"))?;
    }
    Ok(())
}

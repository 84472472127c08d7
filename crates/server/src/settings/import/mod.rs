//! Other limiters' limit files, read: envoy/ratelimit's YAML and Limitador's limits file
//! turned into groups, patterns and what names them (descriptor trees, limit sets), checked
//! whole. `tollgate import` sends what a file becomes through the admin API; a server following
//! an import file (`--import`) applies it itself.
//!
//! A file is read whole and checked as the server would check it; what it holds that Tollgate
//! cannot express is refused with its line and the reason, and then nothing changes.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use tollgate_model::rls::{RlsRule, RuleSet, Tree};
use tollgate_model::settings::{BudgetPeriod, GroupName, GroupSettings};
use tollgate_proto::v1;

mod envoy;
mod limitador;
mod yaml;

/// The largest file taken, in bytes.
pub const FILE_MAX_BYTES: usize = 4 << 20;

/// Which format a file is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// envoy/ratelimit's YAML: `domain`, nested `descriptors`, `rate_limit`.
    EnvoyRatelimit,
    /// Limitador's limits file: a list of `namespace`, `max_value`, `seconds`, `conditions`,
    /// `variables`.
    Limitador,
}

/// What a group (or pattern) is set to: a rate, a burst, quotas per window. The import sets
/// these and nothing else of a group that exists.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Shape {
    /// Units/s; `None`: unlimited.
    pub limit: Option<f64>,
    /// `None`: one second of the grant.
    pub burst: Option<f64>,
    /// Units per window.
    pub quotas: BTreeMap<BudgetPeriod, f64>,
    /// Shadow mode (envoy/ratelimit's `shadow_mode`): counted, never refused.
    pub shadow: bool,
}

impl Shape {
    /// In words: `limit 500/s`, `unlimited, quota 4/minute`.
    pub fn describe(&self) -> String {
        let mut out = match self.limit {
            Some(l) => format!("limit {l}/s"),
            None => "unlimited".to_string(),
        };
        if let Some(b) = self.burst {
            let _ = write!(out, ", burst {b}");
        }
        for (w, n) in &self.quotas {
            let _ = write!(out, ", quota {n}/{}", w.name());
        }
        if self.shadow {
            out.push_str(", shadow mode");
        }
        out
    }

    /// The patch that gives a group exactly this shape (other settings untouched).
    pub fn patch(&self) -> v1::GroupPatch {
        // The named windows it has no quota over are cleared; its own set.
        let quotas = BudgetPeriod::ALL
            .into_iter()
            .filter(|w| !self.quotas.contains_key(w))
            .map(|w| (w.name().to_string(), 0.0))
            .chain(self.quotas.iter().map(|(w, n)| (w.name().to_string(), *n)))
            .collect();
        v1::GroupPatch {
            limit: self.limit,
            unlimited: self.limit.is_none(),
            burst: self.burst,
            clear_burst: self.burst.is_none(),
            quotas,
            shadow: Some(self.shadow),
            ..v1::GroupPatch::default()
        }
    }

    /// A stored group's shape.
    pub fn of(s: &v1::GroupSettings) -> Shape {
        let quotas = s.quotas.iter().filter_map(|(w, n)| Some((BudgetPeriod::parse(w).ok()?, *n))).collect();
        Shape { limit: s.limit, burst: s.burst, quotas, shadow: s.shadow }
    }
}

/// One group or pattern a file sets, with the line it comes from.
#[derive(Debug, Clone, PartialEq)]
pub struct Imported {
    /// The group's or pattern's name.
    pub name: String,
    /// The file's line it comes from.
    pub line: usize,
    /// What it is set to.
    pub shape: Shape,
}

/// What a file becomes: groups and patterns, and the mapping rules or descriptor trees that
/// answer its domains in place of what answered them before; or every line it is refused at.
#[derive(Debug, Default)]
pub struct Plan {
    /// The domains (namespaces) the file answers for.
    pub domains: Vec<String>,
    /// The groups and patterns it sets.
    pub groups: Vec<Imported>,
    /// Its mapping rules.
    pub rules: Vec<RlsRule>,
    /// envoy/ratelimit's descriptor trees, one per domain.
    pub trees: Vec<Tree>,
    /// Limitador's limits, one set per namespace.
    pub limits: Vec<tollgate_model::rls::LimitSet>,
    /// What was read and has no effect here, with why.
    pub notes: Vec<(usize, String)>,
    /// Each line the file is refused at, and why.
    pub refused: Vec<(usize, String)>,
}

impl Plan {
    fn refuse(&mut self, line: usize, why: impl Into<String>) {
        self.refused.push((line, why.into()));
    }

    /// Adds a group, or merges windows into one already there from the same file (several
    /// limits on the same descriptors); refuses two rates for one group.
    fn add(&mut self, g: Imported) {
        match self.groups.iter_mut().find(|o| o.name == g.name) {
            None => self.groups.push(g),
            Some(o) => {
                if o.shape.limit.is_some() && g.shape.limit.is_some() && o.shape.limit != g.shape.limit {
                    self.refused.push((
                        g.line,
                        format!("{}: a second rate for the same descriptors (line {})", g.name, o.line),
                    ));
                    return;
                }
                o.shape.limit = o.shape.limit.or(g.shape.limit);
                o.shape.burst = o.shape.burst.or(g.shape.burst);
                // One limit of several in shadow mode would let the others refuse: the group
                // is in shadow mode only when each of its limits is.
                o.shape.shadow &= g.shape.shadow;
                for (w, n) in g.shape.quotas {
                    let q = o.shape.quotas.entry(w).or_insert(n);
                    *q = q.min(n);
                }
            }
        }
    }

    /// Checks every group's settings and the rules as the server would, so that a write is
    /// refused here, before anything changes.
    fn check(&mut self) {
        for g in self.groups.clone() {
            if let Err(e) = GroupName::new(&g.name) {
                self.refuse(g.line, format!("group {:?}: {}", g.name, e.rule));
                continue;
            }
            match tollgate_proto::convert::apply_patch(GroupSettings::default(), &g.shape.patch()) {
                Ok(s) => {
                    if let Err(e) = tollgate_model::settings::check_pattern(&g.name, &s) {
                        self.refuse(g.line, format!("{}: {e}", g.name));
                    }
                }
                Err(e) => self.refuse(g.line, format!("{}: {e}", g.name)),
            }
        }
        let set =
            RuleSet { rules: self.rules.clone(), trees: self.trees.clone(), limits: self.limits.clone() };
        if let Err(e) = set.check() {
            self.refuse(0, e);
        }
    }
}

/// Reads `text` (from `file`) as `format`.
pub fn plan(format: Format, text: &str) -> Plan {
    let mut plan = Plan::default();
    match yaml::parse(text) {
        Err((line, why)) => plan.refuse(line, why),
        Ok(docs) => match format {
            Format::EnvoyRatelimit => envoy::read(&docs, &mut plan),
            Format::Limitador => limitador::read(&docs, &mut plan),
        },
    }
    if plan.refused.is_empty() {
        plan.check();
    }
    plan.refused.sort();
    plan
}

/// `current` with `plan`'s domains answered by its rules or trees alone: their earlier rules
/// and trees go, the file's rules come before the others kept.
pub fn merged(current: &RuleSet, plan: &Plan) -> RuleSet {
    let ours = |d: &str| plan.domains.iter().any(|p| p == d);
    let kept = current.rules.iter().filter(|r| !ours(&r.domain)).cloned();
    RuleSet {
        rules: plan.rules.iter().cloned().chain(kept).collect(),
        trees: current
            .trees
            .iter()
            .filter(|t| !ours(&t.domain))
            .cloned()
            .chain(plan.trees.iter().cloned())
            .collect(),
        limits: current
            .limits
            .iter()
            .filter(|l| !ours(&l.domain))
            .cloned()
            .chain(plan.limits.iter().cloned())
            .collect(),
    }
}

/// Says what the import does to each of its domains and to the others; returns the domains
/// whose rules or tree it would drop for different ones (`--replace` lets it).
pub fn describe_domains(
    current: &RuleSet,
    next: &RuleSet,
    plan: &Plan,
    say: &mut dyn FnMut(String),
) -> Vec<String> {
    let mut dropped = Vec::new();
    for d in &plan.domains {
        let before_rules: Vec<&RlsRule> = current.rules.iter().filter(|r| r.domain == *d).collect();
        let after_rules: Vec<&RlsRule> = next.rules.iter().filter(|r| r.domain == *d).collect();
        let (before_tree, after_tree) = (current.tree(d), next.tree(d));
        let (before_set, after_set) = (current.limit_set(d), next.limit_set(d));
        let what = match (after_tree, after_set) {
            (Some(t), _) => format!("its envoy/ratelimit descriptor tree ({} limits)", t.limits().len()),
            (_, Some(l)) => format!("its Limitador limits ({})", l.limits.len()),
            _ => format!("{} rules", after_rules.len()),
        };
        let was = match (before_tree, before_rules.len()) {
            _ if before_set.is_some() => format!("Limitador limits ({})", before_set.map_or(0, |l| l.limits.len())),
            (Some(t), _) => format!("a descriptor tree of {} limits", t.limits().len()),
            (None, 0) if !current.names_domain(d) => {
                "nothing of its own: the implicit tenant rule (an entry tenant=X counts against group X) stops applying there".to_string()
            }
            (None, 0) => "the rules of every domain".to_string(),
            (None, n) => format!("{n} rules"),
        };
        let had_own = before_tree.is_some() || before_set.is_some() || !before_rules.is_empty();
        if had_own && (before_tree != after_tree || before_set != after_set || before_rules != after_rules) {
            dropped.push(format!("domain {d}"));
        }
        say(format!("domain {d}: answered by {what}, in place of {was}"));
    }
    let others: Vec<&str> = next
        .trees
        .iter()
        .map(|t| t.domain.as_str())
        .chain(next.limits.iter().map(|l| l.domain.as_str()))
        .chain(next.rules.iter().map(|r| r.domain.as_str()))
        .filter(|d| !d.is_empty() && !plan.domains.iter().any(|p| p == d))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let anywhere = next.rules.iter().filter(|r| r.domain.is_empty()).count();
    say(format!(
        "other domains keep what answers them ({}); {}",
        if others.is_empty() { "none has rules of its own".to_string() } else { others.join(", ") },
        if anywhere > 0 {
            format!("{anywhere} rules of every domain apply where no tree does")
        } else {
            "the implicit tenant rule still applies in every domain no rule or tree names".to_string()
        }
    ));
    dropped
}

/// What importing a plan does against what is in force, as `tollgate import` and the admin
/// API's `ImportLimits` say it.
#[derive(Debug)]
pub struct Preview {
    /// A line per group or pattern (`create group NAME: limit 5/s`, `keep …`, `change …
    /// (was …)`), per domain the file answers, and per rule it adds.
    pub lines: Vec<String>,
    /// The domains that would lose what answers them now (which only a replace allows).
    pub dropped: Vec<String>,
    /// The plan's groups and patterns that change (indices into `plan.groups`).
    pub changed: Vec<usize>,
    /// The rules, trees and limits in force after it.
    pub next: RuleSet,
}

/// What importing `plan` does, given the rules in force and each of its groups' stored
/// settings (`before`, in `plan.groups`' order; `None`: no such group yet). An error when the
/// rules it leaves break a rule.
pub fn preview(
    plan: &Plan,
    current: &RuleSet,
    before: &[Option<v1::GroupSettings>],
) -> Result<Preview, String> {
    let next = merged(current, plan);
    next.check()?;
    let mut lines = Vec::new();
    let mut changed = Vec::new();
    for (i, (g, before)) in plan.groups.iter().zip(before).enumerate() {
        let verb = match before {
            None => "create",
            Some(b) if Shape::of(b) == g.shape => "keep",
            Some(_) => "change",
        };
        let kind = if tollgate_model::settings::is_pattern(&g.name) { "pattern" } else { "group" };
        let was = before
            .as_ref()
            .filter(|_| verb == "change")
            .map(|b| format!(" (was {})", Shape::of(b).describe()))
            .unwrap_or_default();
        lines.push(format!("{verb} {kind} {}: {}{was}", g.name, g.shape.describe()));
        if verb != "keep" {
            changed.push(i);
        }
    }
    let dropped = describe_domains(current, &next, plan, &mut |line| lines.push(line));
    for r in &plan.rules {
        lines.push(format!("  {}", serde_json::to_string(r).unwrap_or_default()));
    }
    Ok(Preview { lines, dropped, changed, next })
}

impl Preview {
    /// Why it may not go ahead without a replace, saying how to `give` one (`--replace`);
    /// `None` when it may.
    pub fn blocked(&self, give: &str) -> Option<String> {
        (!self.dropped.is_empty()).then(|| {
            format!(
                "{} would lose what answers them now ({}): give {give} to replace it; nothing changed",
                if self.dropped.len() == 1 { "a domain" } else { "domains" },
                self.dropped.join(", ")
            )
        })
    }

    /// What a write of `plan` did, in a line.
    pub fn summary(&self, plan: &Plan) -> String {
        format!(
            "imported: {} groups and patterns written, {} rules, {} descriptor trees, {} namespaces of limits",
            self.changed.len(),
            plan.rules.len(),
            plan.trees.len(),
            plan.limits.len()
        )
    }
}

/// A name fragment for a descriptor entry in a group's name: `key=value`.
fn part(key: &str, value: &str) -> String {
    format!("{key}={value}")
}

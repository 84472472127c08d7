//! The settings file: a node, a cost model and groups, in TOML.
//!
//! ```toml
//! [node]
//! capacity = 1000          # units/s the backend sustains; omit for no node-wide ceiling
//! mode = "share"           # "share" (by priority and weight) or "fcfs" (Couchbase's free pool)
//! realloc_ms = 100         # how often allowances are recomputed from demand
//! max_wait_ms = 1000       # how long `acquire` waits before giving up
//! max_tracked_groups = 10000
//! shadow = false           # true: decide and count, never refuse (would-be refusals counted)
//! throttling = true        # false: the one switch, throttling off with every setting kept
//!
//! [cost]
//! model = "ru"             # count | fdb | ru | couchbase | linear, with its coefficients
//!
//! [groups.default]         # what unknown groups get (unlimited if absent)
//! limit = 100
//!
//! [groups.checkout]
//! reserved = 600
//! limit = "unlimited"
//! priority = "high"        # low | medium | high, or 1 to 16
//! weight = 2
//! ```
//!
//! [`Config::parse`] reports *every* problem, each with its line, the field and the rule,
//! and returns no configuration at all if there is one: a file is applied whole or not at all.

use std::collections::BTreeMap;
use std::time::Duration;

use toml::de::{DeTable, DeValue};

pub use crate::toml_reader::{ConfigError, ConfigErrors, line_of};
use crate::toml_reader::{Reader, Value};

pub use crate::allocate::AllocationMode;
use crate::cost::{CostModel, LinearCoefficients, RuCoefficients};
use crate::settings::{GroupName, GroupSettings, check_group_name};

/// Node-wide settings.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeSettings {
    /// Units/s the backend sustains; `None` for no node-wide ceiling.
    pub capacity: Option<f64>,
    /// How capacity is shared.
    pub mode: AllocationMode,
    /// Couchbase's slow start: a group with no client reserves a tenth of its reservation.
    pub slow_start: bool,
    /// How often allowances are recomputed from measured demand.
    pub realloc_interval: Duration,
    /// How long `acquire` waits at most before failing as throttled.
    pub max_wait: Duration,
    /// Groups tracked separately; beyond this, new groups share the default group's state.
    pub max_tracked_groups: usize,
    /// Every group in shadow mode: decided and counted, never refused (see
    /// [`GroupSettings::shadow`]).
    pub shadow: bool,
    /// The one switch: `false` turns throttling off for the whole node, every setting kept
    /// (FoundationDB's and TiDB's switch). Nothing is refused; demand and consumption are
    /// still counted.
    pub throttling: bool,
}

impl Default for NodeSettings {
    fn default() -> Self {
        Self {
            capacity: None,
            mode: AllocationMode::Share,
            slow_start: false,
            realloc_interval: Duration::from_millis(100),
            max_wait: Duration::from_secs(1),
            max_tracked_groups: 10_000,
            shadow: false,
            throttling: true,
        }
    }
}

/// Limits on the node settings, checked on the way in.
pub const REALLOC_MS_MAX: u64 = 60_000;
/// The longest `max_wait_ms` accepted.
pub const MAX_WAIT_MS_MAX: u64 = 600_000;
/// The most groups that can be tracked separately.
pub const MAX_TRACKED_GROUPS_MAX: u64 = 1_000_000;

/// A whole configuration: node, cost model and groups.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Config {
    /// Node-wide settings.
    pub node: NodeSettings,
    /// How requests are priced.
    pub cost_model: CostModel,
    /// Configured groups, by name (may include `default`).
    pub groups: BTreeMap<GroupName, GroupSettings>,
    /// How Envoy rate-limit requests name groups (`[[rls.rules]]`, [`crate::rls`]); `None`
    /// when the file has no `[rls]` section.
    pub rls_rules: Option<Vec<crate::rls::RlsRule>>,
}

impl Config {
    /// Parses and validates a settings file, reporting every problem with its line.
    pub fn parse(src: &str) -> Result<Config, ConfigErrors> {
        let mut p = Reader::new(src);
        let config = match DeTable::parse(src) {
            Ok(doc) => p.document(doc.get_ref()),
            Err(e) => {
                let line = e.span().map_or(1, |s| line_of(src, s.start));
                p.errors.push(ConfigError {
                    line,
                    field: "(syntax)".into(),
                    rule: e.message().trim().to_string(),
                });
                Config::default()
            }
        };
        if p.errors.is_empty() {
            Ok(config)
        } else {
            p.errors.sort_by_key(|e| e.line);
            Err(ConfigErrors(p.errors))
        }
    }

    /// Things that are allowed but probably not meant, such as reservations adding up to
    /// more than the capacity.
    pub fn warnings(&self) -> Vec<String> {
        settings_warnings(self.node.capacity, self.node.mode, self.groups.iter())
    }

    /// The settings for `group`: its own if configured, else the most specific pattern's that
    /// matches it (see [`is_pattern`](crate::settings::is_pattern)), else the `default`
    /// group's, else the built-in default (unlimited).
    pub fn settings_for(&self, group: &str) -> GroupSettings {
        let mut patterns: Vec<_> =
            self.groups.iter().filter(|(n, _)| crate::settings::is_pattern(n.as_str())).collect();
        crate::settings::sort_patterns(&mut patterns);
        self.groups
            .iter()
            .find(|(name, _)| name.as_str() == group)
            .map(|(_, s)| s)
            .or_else(|| crate::settings::matching_pattern(&patterns, group).copied())
            .or_else(|| {
                self.groups
                    .iter()
                    .find(|(name, _)| name.as_str() == crate::settings::DEFAULT_GROUP)
                    .map(|(_, s)| s)
            })
            .cloned()
            .unwrap_or_default()
    }
}

impl Reader<'_> {
    pub(crate) fn document(&mut self, doc: &DeTable<'_>) -> Config {
        let mut config = Config::default();
        for (key, value) in doc.iter() {
            match key.get_ref().as_ref() {
                "node" => config.node = self.node(value),
                "cost" => config.cost_model = self.cost(value),
                "groups" => config.groups = self.groups(value),
                "rls" => config.rls_rules = Some(self.rls(value)),
                other => self.error(key.span(), other, "unknown section; expected node, cost, groups or rls"),
            }
        }
        config
    }

    /// `[rls]`: `rules`, an array of tables with `domain`, `key`, `value`, `group`.
    fn rls(&mut self, value: &Value<'_>) -> Vec<crate::rls::RlsRule> {
        let mut rules = Vec::new();
        let Some(mut f) = self.fields("rls", value) else { return rules };
        if let Some((path, v)) = f.take("rules") {
            let DeValue::Array(items) = v.get_ref() else {
                self.error(v.span(), &path, "must be an array of tables ([[rls.rules]])");
                return rules;
            };
            if items.len() > crate::rls::RULES_MAX {
                self.error(v.span(), &path, format!("at most {} rules", crate::rls::RULES_MAX));
                return rules;
            }
            for (i, item) in items.iter().enumerate() {
                let at = format!("{path}[{i}]");
                let Some(mut r) = self.fields(&at, item) else { continue };
                let mut rule = crate::rls::RlsRule::default();
                for (name, slot) in [
                    ("domain", &mut rule.domain),
                    ("key", &mut rule.key),
                    ("value", &mut rule.value),
                    ("group", &mut rule.group),
                ] {
                    if let Some((p, v)) = r.take(name)
                        && let Some(text) = self.string(&p, v)
                    {
                        *slot = text.to_string();
                    }
                }
                if let Some((p, v)) = r.take("name")
                    && let Some(text) = self.string(&p, v)
                {
                    rule.name = text.to_string();
                }
                if let Some((p, v)) = r.take("then") {
                    rule.then = self.rule_entries(&p, v);
                }
                if let Some((p, v)) = r.take("whole") {
                    rule.whole = self.boolean(&p, v).unwrap_or(false);
                }
                if let Some((p, v)) = r.take("replaces") {
                    rule.replaces = self.strings(&p, v);
                }
                self.finish(r, "domain, key, value, group, then, whole, name, replaces");
                match rule.check(&at) {
                    Ok(()) => rules.push(rule),
                    Err(e) => {
                        let (field, why) = e.split_once(": ").unwrap_or((&at, &e));
                        self.error(item.span(), field, why);
                    }
                }
            }
        }
        self.finish(f, "rules");
        rules
    }

    /// An array of strings.
    fn strings(&mut self, path: &str, value: &Value<'_>) -> Vec<String> {
        let DeValue::Array(items) = value.get_ref() else {
            self.error(value.span(), path, "must be an array of strings");
            return Vec::new();
        };
        let mut out = Vec::new();
        for (i, item) in items.iter().enumerate() {
            if let Some(text) = self.string(&format!("{path}[{i}]"), item) {
                out.push(text.to_string());
            }
        }
        out
    }

    /// A rule's `then`: an array of `{ key, value }` tables.
    fn rule_entries(&mut self, path: &str, value: &Value<'_>) -> Vec<crate::rls::RuleEntry> {
        let DeValue::Array(items) = value.get_ref() else {
            self.error(value.span(), path, "must be an array of { key, value } tables");
            return Vec::new();
        };
        let mut out = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let at = format!("{path}[{i}]");
            let Some(mut f) = self.fields(&at, item) else { continue };
            let mut e = crate::rls::RuleEntry::default();
            for (name, slot) in [("key", &mut e.key), ("value", &mut e.value)] {
                if let Some((p, v)) = f.take(name)
                    && let Some(text) = self.string(&p, v)
                {
                    *slot = text.to_string();
                }
            }
            self.finish(f, "key, value");
            out.push(e);
        }
        out
    }

    fn node(&mut self, value: &Value<'_>) -> NodeSettings {
        let mut node = NodeSettings::default();
        let Some(mut f) = self.fields("node", value) else { return node };
        if let Some((path, v)) = f.take("capacity") {
            node.capacity = self.positive(&path, v);
        }
        if let Some((path, v)) = f.take("mode") {
            match self.string(&path, v) {
                Some("share") => node.mode = AllocationMode::Share,
                Some("fcfs") => node.mode = AllocationMode::Fcfs,
                Some(other) => self.error(v.span(), path, format!("must be share or fcfs, got {other:?}")),
                None => {}
            }
        }
        if let Some((path, v)) = f.take("slow_start")
            && let Some(b) = self.boolean(&path, v)
        {
            node.slow_start = b;
        }
        if let Some((path, v)) = f.take("realloc_ms")
            && let Some(ms) = self.integer(&path, v, 1, REALLOC_MS_MAX)
        {
            node.realloc_interval = Duration::from_millis(ms);
        }
        if let Some((path, v)) = f.take("max_wait_ms")
            && let Some(ms) = self.integer(&path, v, 0, MAX_WAIT_MS_MAX)
        {
            node.max_wait = Duration::from_millis(ms);
        }
        if let Some((path, v)) = f.take("max_tracked_groups")
            && let Some(n) = self.integer(&path, v, 1, MAX_TRACKED_GROUPS_MAX)
        {
            node.max_tracked_groups = n as usize;
        }
        if let Some((path, v)) = f.take("shadow")
            && let Some(b) = self.boolean(&path, v)
        {
            node.shadow = b;
        }
        if let Some((path, v)) = f.take("throttling")
            && let Some(b) = self.boolean(&path, v)
        {
            node.throttling = b;
        }
        self.finish(
            f,
            "capacity, mode, slow_start, realloc_ms, max_wait_ms, max_tracked_groups, shadow, throttling",
        );
        node
    }

    /// A settings file's `[cost]` table: the model and its coefficients, every problem
    /// reported under `cost.KEY`. The simulator reads a scenario's `[cost]` with it, so that
    /// what `tollgate calibrate` prints works there too.
    pub fn cost(&mut self, value: &Value<'_>) -> CostModel {
        let Some(mut f) = self.fields("cost", value) else { return CostModel::Count };
        let model = match f.take("model") {
            Some((path, v)) => self.string(&path, v).map(|s| (s, v.span(), path)),
            None => {
                self.error(value.span(), "cost.model", "is required: count, fdb, ru, couchbase or linear");
                None
            }
        };
        let mut num = |p: &mut Self, key: &str, default: f64| match f.take(key) {
            Some((path, v)) => p.non_negative(&path, v).unwrap_or(default),
            None => default,
        };
        let result = match model {
            Some(("count", _, _)) => CostModel::Count,
            Some(("couchbase", _, _)) => CostModel::Couchbase,
            Some(("fdb", span, _)) => {
                let fungibility = num(self, "fungibility", crate::cost::FDB_DEFAULT_FUNGIBILITY);
                if fungibility == 0.0 {
                    self.error(span, "cost.fungibility", "must be above 0");
                }
                CostModel::Fdb { fungibility }
            }
            Some(("ru", _, _)) => {
                let d = RuCoefficients::default();
                CostModel::Ru(RuCoefficients {
                    read_base: num(self, "read_base", d.read_base),
                    read_per_batch: num(self, "read_per_batch", d.read_per_batch),
                    read_per_byte: num(self, "read_per_byte", d.read_per_byte),
                    read_per_cpu_ms: num(self, "read_per_cpu_ms", d.read_per_cpu_ms),
                    write_base: num(self, "write_base", d.write_base),
                    write_per_batch: num(self, "write_per_batch", d.write_per_batch),
                    write_per_byte: num(self, "write_per_byte", d.write_per_byte),
                    batch_proportion: num(self, "batch_proportion", d.batch_proportion),
                })
            }
            Some(("linear", _, _)) => CostModel::Linear(LinearCoefficients {
                read_base: num(self, "read_base", 0.0),
                read_per_byte: num(self, "read_per_byte", 0.0),
                write_base: num(self, "write_base", 0.0),
                write_per_byte: num(self, "write_per_byte", 0.0),
                per_cpu_ms: num(self, "per_cpu_ms", 0.0),
            }),
            Some((other, span, path)) => {
                self.error(span, path, format!("must be count, fdb, ru, couchbase or linear, got {other:?}"));
                CostModel::Count
            }
            None => CostModel::Count,
        };
        let known = match result {
            CostModel::Fdb { .. } => "model, fungibility",
            CostModel::Ru(_) => {
                "model, read_base, read_per_batch, read_per_byte, read_per_cpu_ms, write_base, \
                 write_per_batch, write_per_byte, batch_proportion"
            }
            CostModel::Linear(_) => "model, read_base, read_per_byte, write_base, write_per_byte, per_cpu_ms",
            CostModel::Count | CostModel::Couchbase => "model",
        };
        self.finish(f, known);
        result
    }

    fn groups(&mut self, value: &Value<'_>) -> BTreeMap<GroupName, GroupSettings> {
        let mut groups = BTreeMap::new();
        let DeValue::Table(table) = value.get_ref() else {
            self.error(value.span(), "groups", "must be a table of groups");
            return groups;
        };
        for (key, value) in table.iter() {
            let name: &str = key.get_ref();
            if let Err(e) = check_group_name(name) {
                self.error(key.span(), format!("groups.{name:?}"), e.rule);
                continue;
            }
            if let Some(settings) = self.group(&format!("groups.{name}"), value) {
                if let Err(e) = crate::settings::check_pattern(name, &settings) {
                    self.error(key.span(), format!("groups.{name}.{}", e.field), e.rule);
                    continue;
                }
                groups.insert(GroupName::new(name).expect("checked above"), settings);
            }
        }
        for e in crate::hierarchy::check(&groups) {
            self.error(value.span(), format!("groups.{}.{}", e.group, e.error.field), e.error.rule);
        }
        let patterns = groups.keys().filter(|n| crate::settings::is_pattern(n.as_str())).count();
        if patterns > crate::settings::PATTERNS_MAX {
            self.error(
                value.span(),
                "groups",
                format!("at most {} patterns (names with *), got {patterns}", crate::settings::PATTERNS_MAX),
            );
        }
        groups
    }
}

/// Settings that are allowed but probably unintended, in words for people: reservations adding
/// up past the node capacity, a limit above it, a priority or weight in the first-come mode
/// (where neither acts). `tollgate check-config` prints them for a file; the server logs them
/// when its settings come to hold one and shows them in its status.
pub fn settings_warnings<'a>(
    capacity: Option<f64>,
    mode: AllocationMode,
    groups: impl Iterator<Item = (&'a GroupName, &'a GroupSettings)>,
) -> Vec<String> {
    let mut warnings = Vec::new();
    let mut reserved = 0.0;
    for (name, s) in groups {
        // A child's reservation is part of its parent's.
        if s.parent().is_none() {
            reserved += s.reserved();
        }
        if let Some(capacity) = capacity
            && s.limit().as_f64().is_finite()
            && s.limit().as_f64() > capacity
        {
            warnings.push(format!(
                "groups.{name}.limit {} is above the node capacity {capacity}: the capacity bounds \
                 the group first",
                s.limit().as_f64()
            ));
        }
        if mode == AllocationMode::Fcfs
            && (s.priority() != crate::settings::Priority::MEDIUM || s.weight() != 1.0)
        {
            warnings.push(format!(
                "groups.{name}: priority and weight do nothing in fcfs mode (the free pool goes to \
                 groups in the order they first asked); use mode = \"share\" for them"
            ));
        }
    }
    if let Some(capacity) = capacity
        && reserved > capacity
    {
        warnings.insert(
            0,
            format!(
                "the groups reserve {reserved} units/s in all, more than the node capacity {capacity}: \
                 reservations will be honoured and the capacity exceeded"
            ),
        );
    }
    warnings
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::{Limit, Priority, RampMode};

    #[test]
    fn a_full_file_parses() {
        let src = r#"
[node]
capacity = 1_000
mode = "share"
realloc_ms = 50

[cost]
model = "ru"
write_per_byte = 0.002

[groups.default]
limit = 100

[groups.checkout]
reserved = 600
limit = "unlimited"
priority = "high"
weight = 2

[groups.batch]
reserved = 0
limit = 300.5
priority = 3
burst = 50
[groups.batch.ramp]
min = 10
max = 300
duration_s = 30
mode = "go_back_n"
"#;
        let c = Config::parse(src).unwrap();
        assert_eq!(c.node.capacity, Some(1000.0));
        assert_eq!(c.node.realloc_interval, Duration::from_millis(50));
        let CostModel::Ru(ru) = c.cost_model else { panic!("ru expected") };
        assert_eq!(ru.write_per_byte, 0.002);
        assert_eq!(ru.read_base, 0.125);
        let checkout = c.settings_for("checkout");
        assert_eq!(checkout.priority(), Priority::HIGH);
        assert_eq!(checkout.limit(), Limit::Unlimited);
        let batch = c.settings_for("batch");
        assert_eq!(batch.limit(), Limit::Units(300.5));
        assert_eq!(batch.ramp().unwrap().mode, RampMode::GoBackN);
        // Unknown groups get the default group's settings.
        assert_eq!(c.settings_for("nobody").limit(), Limit::Units(100.0));
        assert!(c.warnings().is_empty());
    }

    #[test]
    fn every_problem_is_reported_with_its_line() {
        let src = r#"[node]
capacity = -5
mode = "fair"
speed = 3

[groups.a]
reserved = 700
limit = 500

[groups.b]
weight = "heavy"
priority = 42
"#;
        let errors = Config::parse(src).unwrap_err().0;
        let got: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(
            got,
            [
                "line 2: node.capacity: must be above 0, got -5",
                "line 3: node.mode: must be share or fcfs, got \"fair\"",
                "line 4: node.speed: unknown field; expected one of capacity, mode, slow_start, realloc_ms, max_wait_ms, max_tracked_groups, \
             shadow, throttling",
                "line 7: groups.a.reserved: must not exceed limit (700 > 500)",
                "line 11: groups.b.weight: must be a number, got string",
                "line 12: groups.b.priority: must be a whole number from 1 to 16, got 42",
            ]
        );
    }

    #[test]
    fn syntax_errors_carry_their_line() {
        let errors = Config::parse("[node]\ncapacity = = 3\n").unwrap_err().0;
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].line, 2);
        assert_eq!(errors[0].field, "(syntax)");
    }

    #[test]
    fn overcommitted_reservations_are_a_warning() {
        let c =
            Config::parse("[node]\ncapacity = 100\n[groups.a]\nreserved = 80\n[groups.b]\nreserved = 80\n")
                .unwrap();
        assert_eq!(c.warnings().len(), 1);
    }

    #[test]
    fn rules_with_nested_entries_and_quotas_are_read_and_named_when_wrong() {
        let c = Config::parse(
            "[groups.a]\nquotas = { minute = 10, day = 100 }\n[[rls.rules]]\nkey = \"tenant\"\nthen = [{ key = \"plan\", value = \"gold\" }]\ngroup = \"{tenant}-gold\"\n",
        )
        .unwrap();
        let rules = c.rls_rules.unwrap();
        assert_eq!(rules[0].then, [crate::rls::RuleEntry { key: "plan".into(), value: "gold".into() }]);
        let a = &c.groups[&GroupName::new("a").unwrap()];
        assert_eq!(
            a.quotas().collect::<Vec<_>>(),
            [(crate::settings::BudgetPeriod::Minute, 10.0), (crate::settings::BudgetPeriod::Day, 100.0)]
        );
        let e = Config::parse(
            "[[rls.rules]]\nkey = \"t\"\ngroup = \"g\"\nthen = [{ key = \"p\", colour = \"red\" }]\n",
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("rls.rules[0].then[0].colour: unknown field; expected one of key, value"),
            "{e}"
        );
    }

    #[test]
    fn an_empty_file_is_the_default() {
        assert_eq!(Config::parse("").unwrap(), Config::default());
    }
}

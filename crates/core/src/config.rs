//! The settings file: a node, a cost model and groups, in TOML.
//!
//! ```toml
//! [node]
//! capacity = 1000          # units/s the backend sustains; omit for no node-wide ceiling
//! mode = "share"           # "share" (max-min allocation) or "fcfs" (Couchbase slots)
//! realloc_ms = 100         # how often allowances are recomputed from demand
//! max_wait_ms = 1000       # how long `acquire` waits before giving up
//! max_tracked_groups = 10000
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
use std::fmt;
use std::ops::Range;
use std::time::Duration;

use toml::Spanned;
use toml::de::{DeTable, DeValue};

use crate::cost::{CostModel, LinearCoefficients, RuCoefficients};
use crate::settings::{
    GroupName, GroupSettings, Limit, Priority, RampMode, RampSettings, SettingError, check_group_name,
};

/// How the node's capacity is shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AllocationMode {
    /// Token buckets fed by max-min allocation of the capacity (TiDB-like), recomputed from
    /// demand every `realloc_interval`.
    #[default]
    Share,
    /// Couchbase's one-second slots, free pool first come first served.
    Fcfs,
}

/// Node-wide settings.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeSettings {
    /// Units/s the backend sustains; `None` for no node-wide ceiling.
    pub capacity: Option<f64>,
    /// How capacity is shared.
    pub mode: AllocationMode,
    /// How often allowances are recomputed from measured demand.
    pub realloc_interval: Duration,
    /// How long `acquire` waits at most before failing as throttled.
    pub max_wait: Duration,
    /// Groups tracked separately; beyond this, new groups share the default group's state.
    pub max_tracked_groups: usize,
}

impl Default for NodeSettings {
    fn default() -> Self {
        Self {
            capacity: None,
            mode: AllocationMode::Share,
            realloc_interval: Duration::from_millis(100),
            max_wait: Duration::from_secs(1),
            max_tracked_groups: 10_000,
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
}

/// One problem in a settings file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// 1-based line of the offending key or value.
    pub line: usize,
    /// The field's path, such as `groups.checkout.reserved`.
    pub field: String,
    /// The rule it breaks.
    pub rule: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}: {}", self.line, self.field, self.rule)
    }
}

impl std::error::Error for ConfigError {}

/// Every problem found in a settings file (never empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

impl Config {
    /// Parses and validates a settings file, reporting every problem with its line.
    pub fn parse(src: &str) -> Result<Config, ConfigErrors> {
        let mut p = Parser { src, errors: Vec::new() };
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
        let mut warnings = Vec::new();
        let reserved: f64 = self.groups.values().map(GroupSettings::reserved).sum();
        if let Some(capacity) = self.node.capacity
            && reserved > capacity
        {
            warnings.push(format!(
                "the groups reserve {reserved} units/s in all, more than the node capacity {capacity}: \
                 reservations will be honoured and the capacity exceeded"
            ));
        }
        warnings
    }

    /// The settings for `group`: its own if configured, else the `default` group's, else the
    /// built-in default (unlimited).
    pub fn settings_for(&self, group: &str) -> GroupSettings {
        self.groups
            .iter()
            .find(|(name, _)| name.as_str() == group)
            .or_else(|| self.groups.iter().find(|(name, _)| name.as_str() == crate::settings::DEFAULT_GROUP))
            .map(|(_, s)| s.clone())
            .unwrap_or_default()
    }
}

/// The 1-based line holding byte `offset` of `src`.
pub fn line_of(src: &str, offset: usize) -> usize {
    src.as_bytes()[..offset.min(src.len())].iter().filter(|&&b| b == b'\n').count() + 1
}

type Value<'a> = Spanned<DeValue<'a>>;

struct Parser<'s> {
    src: &'s str,
    errors: Vec<ConfigError>,
}

/// A table's entries, with the path that leads to it for error messages.
struct Fields<'t, 'a> {
    path: String,
    entries: Vec<(&'t str, Range<usize>, &'t Value<'a>)>,
}

impl<'t, 'a> Fields<'t, 'a> {
    fn take(&mut self, key: &str) -> Option<(String, &'t Value<'a>)> {
        let i = self.entries.iter().position(|(k, _, _)| *k == key)?;
        let (k, _, v) = self.entries.remove(i);
        Some((format!("{}.{k}", self.path), v))
    }
}

impl Parser<'_> {
    fn error(&mut self, span: Range<usize>, field: impl Into<String>, rule: impl Into<String>) {
        self.errors.push(ConfigError {
            line: line_of(self.src, span.start),
            field: field.into(),
            rule: rule.into(),
        });
    }

    fn setting_error(&mut self, span: Range<usize>, prefix: &str, e: SettingError) {
        self.error(span, format!("{prefix}.{}", e.field), e.rule);
    }

    fn fields<'t, 'a>(&mut self, path: &str, value: &'t Value<'a>) -> Option<Fields<'t, 'a>> {
        match value.get_ref() {
            DeValue::Table(t) => Some(Fields {
                path: path.to_string(),
                entries: t.iter().map(|(k, v)| (k.get_ref().as_ref(), k.span(), v)).collect(),
            }),
            other => {
                self.error(value.span(), path, format!("must be a table, got {}", other.type_str()));
                None
            }
        }
    }

    /// Every key not taken is unknown.
    fn finish(&mut self, fields: Fields<'_, '_>, known: &str) {
        for (k, span, _) in fields.entries {
            self.error(
                span,
                format!("{}.{k}", fields.path),
                format!("unknown field; expected one of {known}"),
            );
        }
    }

    fn document(&mut self, doc: &DeTable<'_>) -> Config {
        let mut config = Config::default();
        for (key, value) in doc.iter() {
            match key.get_ref().as_ref() {
                "node" => config.node = self.node(value),
                "cost" => config.cost_model = self.cost(value),
                "groups" => config.groups = self.groups(value),
                other => self.error(key.span(), other, "unknown section; expected node, cost or groups"),
            }
        }
        if config.node.mode == AllocationMode::Fcfs {
            for (name, g) in &config.groups {
                if g.burst().is_some() || g.ramp().is_some() {
                    let at = doc.get("groups").map_or(0..0, Spanned::span);
                    self.error(at, format!("groups.{name}"), "burst and ramp do not apply in fcfs mode");
                }
            }
        }
        config
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
        if let Some((path, v)) = f.take("realloc_ms") {
            if let Some(ms) = self.integer(&path, v, 1, REALLOC_MS_MAX) {
                node.realloc_interval = Duration::from_millis(ms);
            }
        }
        if let Some((path, v)) = f.take("max_wait_ms") {
            if let Some(ms) = self.integer(&path, v, 0, MAX_WAIT_MS_MAX) {
                node.max_wait = Duration::from_millis(ms);
            }
        }
        if let Some((path, v)) = f.take("max_tracked_groups") {
            if let Some(n) = self.integer(&path, v, 1, MAX_TRACKED_GROUPS_MAX) {
                node.max_tracked_groups = n as usize;
            }
        }
        self.finish(f, "capacity, mode, realloc_ms, max_wait_ms, max_tracked_groups");
        node
    }

    fn cost(&mut self, value: &Value<'_>) -> CostModel {
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
            if let Some(settings) = self.group(name, value) {
                groups.insert(GroupName::new(name).expect("checked above"), settings);
            }
        }
        groups
    }

    fn group(&mut self, name: &str, value: &Value<'_>) -> Option<GroupSettings> {
        let path = format!("groups.{name}");
        let mut f = self.fields(&path, value)?;
        // Where each key is, for rules that span fields (reserved above limit).
        let spans: Vec<(String, Range<usize>)> =
            f.entries.iter().map(|(k, span, _)| (k.to_string(), span.clone())).collect();
        let before = self.errors.len();
        let mut b = GroupSettings::builder();
        if let Some((p, v)) = f.take("reserved") {
            b = b.reserved(self.non_negative(&p, v).unwrap_or(0.0));
        }
        if let Some((p, v)) = f.take("limit") {
            match v.get_ref() {
                DeValue::String(s) if s == "unlimited" => b = b.limit_of(Limit::Unlimited),
                DeValue::String(s) => {
                    self.error(v.span(), p, format!("must be a number or \"unlimited\", got {s:?}"))
                }
                _ => {
                    if let Some(limit) = self.non_negative(&p, v) {
                        b = b.limit(limit);
                    }
                }
            }
        }
        if let Some((p, v)) = f.take("burst") {
            if let Some(x) = self.positive(&p, v) {
                b = b.burst(x);
            }
        }
        if let Some((p, v)) = f.take("weight") {
            if let Some(x) = self.positive(&p, v) {
                b = b.weight(x);
            }
        }
        if let Some((p, v)) = f.take("budget") {
            if let Some(x) = self.positive(&p, v) {
                b = b.budget(x);
            }
        }
        if let Some((p, v)) = f.take("priority") {
            let parsed = match v.get_ref() {
                DeValue::String(s) => Priority::from_name(s).map_err(|e| e.rule),
                DeValue::Integer(_) => match self.integer(&p, v, 1, 16) {
                    Some(level) => Priority::new(level as u8).map_err(|e| e.rule),
                    None => return None,
                },
                other => Err(format!("must be low, medium, high or 1 to 16, got {}", other.type_str())),
            };
            match parsed {
                Ok(priority) => b = b.priority(priority),
                Err(rule) => self.error(v.span(), p, rule),
            }
        }
        if let Some((p, v)) = f.take("ramp") {
            if let Some(ramp) = self.ramp(&p, v) {
                b = b.ramp(ramp);
            }
        }
        self.finish(f, "reserved, limit, burst, priority, weight, budget, ramp");
        if self.errors.len() > before {
            return None;
        }
        match b.build() {
            Ok(settings) => Some(settings),
            Err(errors) => {
                for e in errors.0 {
                    let key = e.field.split('.').next().unwrap_or_default();
                    let span = spans.iter().find(|(k, _)| k == key).map_or(value.span(), |(_, s)| s.clone());
                    self.setting_error(span, &path, e);
                }
                None
            }
        }
    }

    fn ramp(&mut self, path: &str, value: &Value<'_>) -> Option<RampSettings> {
        let mut f = self.fields(path, value)?;
        let mut required = |p: &mut Self, key: &str| match f.take(key) {
            Some((kp, v)) => p.non_negative(&kp, v),
            None => {
                p.error(value.span(), format!("{path}.{key}"), "is required");
                None
            }
        };
        let min = required(self, "min");
        let max = required(self, "max");
        let duration_s = required(self, "duration_s");
        let mut ramp = RampSettings::new(min.unwrap_or(0.0), max.unwrap_or(0.0), Duration::ZERO);
        if let Some(d) = duration_s {
            ramp.duration = Duration::from_secs_f64(d);
        }
        if let Some((p, v)) = f.take("mode") {
            if let Some(s) = self.string(&p, v) {
                match RampMode::from_name(s) {
                    Ok(mode) => ramp.mode = mode,
                    Err(e) => self.error(v.span(), p, e.rule),
                }
            }
        }
        if let Some((p, v)) = f.take("threshold_pct") {
            ramp.threshold_pct = self.non_negative(&p, v).unwrap_or(ramp.threshold_pct);
        }
        if let Some((p, v)) = f.take("ramp_down_pct") {
            ramp.ramp_down_pct = self.non_negative(&p, v).unwrap_or(ramp.ramp_down_pct);
        }
        if let Some((p, v)) = f.take("cool_down_s") {
            if let Some(s) = self.non_negative(&p, v) {
                ramp.cool_down = Duration::from_secs_f64(s);
            }
        }
        if let Some((p, v)) = f.take("resume_ttl_s") {
            if let Some(s) = self.positive(&p, v) {
                ramp.resume_ttl = Some(Duration::from_secs_f64(s));
            }
        }
        self.finish(f, "min, max, duration_s, mode, threshold_pct, ramp_down_pct, cool_down_s, resume_ttl_s");
        Some(ramp)
    }

    fn string<'v>(&mut self, path: &str, v: &'v Value<'_>) -> Option<&'v str> {
        match v.get_ref() {
            DeValue::String(s) => Some(s.as_ref()),
            other => {
                self.error(v.span(), path, format!("must be a string, got {}", other.type_str()));
                None
            }
        }
    }

    fn number(&mut self, path: &str, v: &Value<'_>) -> Option<f64> {
        let parsed = match v.get_ref() {
            DeValue::Integer(i) => {
                i64::from_str_radix(&i.as_str().replace('_', ""), i.radix()).ok().map(|n| n as f64)
            }
            DeValue::Float(x) => x.as_str().replace('_', "").parse::<f64>().ok(),
            other => {
                self.error(v.span(), path, format!("must be a number, got {}", other.type_str()));
                return None;
            }
        };
        match parsed {
            Some(x) if x.is_finite() => Some(x),
            _ => {
                self.error(v.span(), path, "must be a finite number");
                None
            }
        }
    }

    fn non_negative(&mut self, path: &str, v: &Value<'_>) -> Option<f64> {
        let x = self.number(path, v)?;
        if x < 0.0 {
            self.error(v.span(), path, format!("must not be negative, got {x}"));
            return None;
        }
        Some(x)
    }

    fn positive(&mut self, path: &str, v: &Value<'_>) -> Option<f64> {
        let x = self.number(path, v)?;
        if x <= 0.0 {
            self.error(v.span(), path, format!("must be above 0, got {x}"));
            return None;
        }
        Some(x)
    }

    fn integer(&mut self, path: &str, v: &Value<'_>, min: u64, max: u64) -> Option<u64> {
        let DeValue::Integer(i) = v.get_ref() else {
            self.error(v.span(), path, format!("must be a whole number from {min} to {max}"));
            return None;
        };
        match u64::from_str_radix(&i.as_str().replace('_', ""), i.radix()) {
            Ok(n) if (min..=max).contains(&n) => Some(n),
            _ => {
                self.error(
                    v.span(),
                    path,
                    format!("must be a whole number from {min} to {max}, got {}", i.as_str()),
                );
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
                "line 4: node.speed: unknown field; expected one of capacity, mode, realloc_ms, max_wait_ms, max_tracked_groups",
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
    fn an_empty_file_is_the_default() {
        assert_eq!(Config::parse("").unwrap(), Config::default());
    }
}

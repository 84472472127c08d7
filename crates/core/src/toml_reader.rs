//! Reading TOML with every problem reported by line, field and rule.
//!
//! The settings file and the simulator's scenarios share this reader. It walks a parsed
//! document that keeps the byte span of every key and value, checks each value against its
//! rule, and collects *all* problems (never just the first), each with the 1-based line of the
//! offending key or value. Group settings (`reserved`, `limit`, `burst`, …) are read here
//! once for every file that carries them.

use std::fmt;
use std::ops::Range;
use std::time::Duration;

use toml::Spanned;
use toml::de::DeValue;

use crate::settings::{
    DroppedWork, GroupSettings, GroupSettingsBuilder, Limit, Priority, RampMode, RampSettings, SettingError,
};

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

/// The 1-based line holding byte `offset` of `src`.
pub fn line_of(src: &str, offset: usize) -> usize {
    src.as_bytes()[..offset.min(src.len())].iter().filter(|&&b| b == b'\n').count() + 1
}

/// The keys a group's settings may use.
pub const GROUP_KEYS: &str = "reserved, limit, burst, priority, weight, budget, budget_period, quotas, ramp, dropped, debt_repay_s, \
     reads_writes_apart, backend_limit, background, shadow, critical_reserve, max_in_flight, parent";

/// A value with its span.
pub type Value<'a> = Spanned<DeValue<'a>>;

/// Reads values and collects problems.
pub struct Reader<'s> {
    src: &'s str,
    /// Byte offsets where each line starts, built at the first problem: finding a line is
    /// then a binary search, so a file with many problems is still read in linear time.
    line_starts: Vec<usize>,
    /// The problems found so far.
    pub errors: Vec<ConfigError>,
}

/// A table's entries, with the path that leads to it for error messages. Take the keys you
/// know; [`Reader::finish`] reports the rest as unknown.
pub struct Fields<'t, 'a> {
    path: String,
    entries: Vec<(&'t str, Range<usize>, &'t Value<'a>)>,
}

impl<'t, 'a> Fields<'t, 'a> {
    /// Takes `key`: its full path and value.
    pub fn take(&mut self, key: &str) -> Option<(String, &'t Value<'a>)> {
        let i = self.entries.iter().position(|(k, _, _)| *k == key)?;
        let (k, _, v) = self.entries.remove(i);
        Some((format!("{}.{k}", self.path), v))
    }
}

impl<'t, 'a> Fields<'t, 'a> {
    /// The table's path.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Where `key` is, if present.
    pub fn span_of(&self, key: &str) -> Option<Range<usize>> {
        self.entries.iter().find(|(k, _, _)| *k == key).map(|(_, s, _)| s.clone())
    }
}

impl<'s> Reader<'s> {
    /// A reader of `src`.
    pub fn new(src: &'s str) -> Self {
        Self { src, line_starts: Vec::new(), errors: Vec::new() }
    }

    /// The text being read.
    pub fn src(&self) -> &'s str {
        self.src
    }

    /// Records a problem at `span`.
    pub fn error(&mut self, span: Range<usize>, field: impl Into<String>, rule: impl Into<String>) {
        let line = self.line(span.start);
        self.errors.push(ConfigError { line, field: field.into(), rule: rule.into() });
    }

    /// The 1-based line holding byte `offset`.
    fn line(&mut self, offset: usize) -> usize {
        if self.line_starts.is_empty() {
            self.line_starts.push(0);
            self.line_starts
                .extend(self.src.bytes().enumerate().filter(|(_, b)| *b == b'\n').map(|(i, _)| i + 1));
        }
        self.line_starts.partition_point(|&start| start <= offset.min(self.src.len()))
    }

    /// Records a broken settings rule, under `prefix`.
    pub fn setting_error(&mut self, span: Range<usize>, prefix: &str, e: SettingError) {
        self.error(span, format!("{prefix}.{}", e.field), e.rule);
    }

    /// The entries of a table, or a problem if `value` is not one.
    pub fn fields<'t, 'a>(&mut self, path: &str, value: &'t Value<'a>) -> Option<Fields<'t, 'a>> {
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

    /// Reports every key not taken as unknown, listing the `known` ones.
    pub fn finish(&mut self, fields: Fields<'_, '_>, known: &str) {
        for (k, span, _) in fields.entries {
            self.error(
                span,
                format!("{}.{k}", fields.path),
                format!("unknown field; expected one of {known}"),
            );
        }
    }

    /// A group's settings from the table at `value` (path `path`).
    pub fn group(&mut self, path: &str, value: &Value<'_>) -> Option<GroupSettings> {
        let mut f = self.fields(path, value)?;
        self.group_from(&mut f, GroupSettings::builder(), value.span(), GROUP_KEYS)
    }

    /// Reads the group keys from `f` on top of `b`, reports the keys left over (listing
    /// `known`), and validates the result. `at` is where cross-field problems point when the
    /// field itself is absent.
    pub fn group_from(
        &mut self,
        f: &mut Fields<'_, '_>,
        mut b: GroupSettingsBuilder,
        at: Range<usize>,
        known: &str,
    ) -> Option<GroupSettings> {
        let path = f.path.clone();
        // Where each key is, for rules that span fields (reserved above limit).
        let spans: Vec<(String, Range<usize>)> =
            f.entries.iter().map(|(k, span, _)| (k.to_string(), span.clone())).collect();
        let before = self.errors.len();
        b = self.quota_keys(f, b);
        b = self.behaviour_keys(f, b)?;
        let rest = Fields { path: f.path.clone(), entries: std::mem::take(&mut f.entries) };
        self.finish(rest, known);
        if self.errors.len() > before {
            return None;
        }
        match b.build() {
            Ok(settings) => Some(settings),
            Err(errors) => {
                for e in errors.0 {
                    let key = e.field.split('.').next().unwrap_or_default();
                    let span = spans.iter().find(|(k, _)| k == key).map_or(at.clone(), |(_, s)| s.clone());
                    self.setting_error(span, &path, e);
                }
                None
            }
        }
    }

    /// The group keys that size its quota: reservation, limit, burst, weight and budget.
    fn quota_keys(&mut self, f: &mut Fields<'_, '_>, mut b: GroupSettingsBuilder) -> GroupSettingsBuilder {
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
        if let Some((p, v)) = f.take("burst")
            && let Some(x) = self.positive(&p, v)
        {
            b = b.burst(x);
        }
        if let Some((p, v)) = f.take("weight")
            && let Some(x) = self.positive(&p, v)
        {
            b = b.weight(x);
        }
        if let Some((p, v)) = f.take("budget")
            && let Some(x) = self.positive(&p, v)
        {
            b = b.budget(x);
        }
        if let Some((p, v)) = f.take("budget_period")
            && let Some(text) = self.string(&p, v)
        {
            match crate::settings::BudgetPeriod::parse(text) {
                Ok(period) => b = b.budget_period(period),
                Err(rule) => self.error(v.span(), &p, rule),
            }
        }
        if let Some((p, v)) = f.take("quotas")
            && let Some(q) = self.fields(&p, v)
        {
            // Each key a window: a name, a number of seconds (`90s`), or one from the first
            // request (`90s-from-first`).
            for (k, span, wv) in q.entries {
                let wp = format!("{}.{k}", q.path);
                match crate::settings::BudgetPeriod::parse(k) {
                    Ok(window) => {
                        if let Some(units) = self.positive(&wp, wv) {
                            b = b.quota(window, units);
                        }
                    }
                    Err(rule) => self.error(span, wp, rule),
                }
            }
        }
        b
    }

    /// The group keys that say how it is served: priority, ramp, dropped work, backend limit,
    /// background, shadow mode, and [those of its share](Self::share_keys). `None` when the
    /// priority is not a level (its error is reported).
    fn behaviour_keys(
        &mut self,
        f: &mut Fields<'_, '_>,
        mut b: GroupSettingsBuilder,
    ) -> Option<GroupSettingsBuilder> {
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
        if let Some((p, v)) = f.take("ramp")
            && let Some(ramp) = self.ramp(&p, v)
        {
            b = b.ramp(ramp);
        }
        if let Some((p, v)) = f.take("dropped")
            && let Some(s) = self.string(&p, v)
        {
            match DroppedWork::from_name(s) {
                Ok(d) => b = b.dropped(d),
                Err(e) => self.error(v.span(), p, e.rule),
            }
        }
        if let Some((p, v)) = f.take("backend_limit")
            && let Some(x) = self.positive(&p, v)
        {
            b = b.backend_limit(Some(x));
        }
        if let Some((p, v)) = f.take("background")
            && let Some(on) = self.boolean(&p, v)
        {
            b = b.background(on);
        }
        if let Some((p, v)) = f.take("shadow")
            && let Some(on) = self.boolean(&p, v)
        {
            b = b.shadow(on);
        }
        Some(self.share_keys(f, b))
    }

    /// The group keys that say how its share is taken: critical reserve, parent, in-flight
    /// quota, reads and writes apart, debt repayment.
    fn share_keys(&mut self, f: &mut Fields<'_, '_>, mut b: GroupSettingsBuilder) -> GroupSettingsBuilder {
        if let Some((p, v)) = f.take("critical_reserve")
            && let Some(x) = self.non_negative(&p, v)
        {
            b = b.critical_reserve(x);
        }
        if let Some((p, v)) = f.take("parent")
            && let Some(name) = self.string(&p, v)
        {
            match crate::settings::GroupName::new(name) {
                Ok(parent) => b = b.parent(Some(parent)),
                Err(e) => self.error(v.span(), &p, e.rule),
            }
        }
        if let Some((p, v)) = f.take("max_in_flight")
            && let Some(n) = self.integer(&p, v, 1, u64::from(crate::settings::MAX_IN_FLIGHT))
        {
            b = b.max_in_flight(u32::try_from(n).ok());
        }
        if let Some((p, v)) = f.take("reads_writes_apart")
            && let Some(apart) = self.boolean(&p, v)
        {
            b = b.reads_writes_apart(apart);
        }
        if let Some((p, v)) = f.take("debt_repay_s")
            && let Some(s) = self.non_negative(&p, v)
            && let Some(d) = self.duration(&p, v, s)
        {
            b = b.debt_repay(d);
        }
        b
    }

    /// A ramp-up table.
    pub fn ramp(&mut self, path: &str, value: &Value<'_>) -> Option<RampSettings> {
        let mut f = self.fields(path, value)?;
        let mut required = |p: &mut Self, key: &str| match f.take(key) {
            Some((kp, v)) => p.non_negative(&kp, v).map(|x| (x, kp, v)),
            None => {
                p.error(value.span(), format!("{path}.{key}"), "is required");
                None
            }
        };
        let min = required(self, "min").map(|(x, _, _)| x);
        let max = required(self, "max").map(|(x, _, _)| x);
        let duration = required(self, "duration_s");
        let mut ramp = RampSettings::new(min.unwrap_or(0.0), max.unwrap_or(0.0), Duration::ZERO);
        if let Some((d, kp, v)) = duration {
            ramp.duration = self.duration(&kp, v, d).unwrap_or(Duration::ZERO);
        }
        if let Some((p, v)) = f.take("mode")
            && let Some(s) = self.string(&p, v)
        {
            match RampMode::from_name(s) {
                Ok(mode) => ramp.mode = mode,
                Err(e) => self.error(v.span(), p, e.rule),
            }
        }
        if let Some((p, v)) = f.take("threshold_pct") {
            ramp.threshold_pct = self.non_negative(&p, v).unwrap_or(ramp.threshold_pct);
        }
        if let Some((p, v)) = f.take("ramp_down_pct") {
            ramp.ramp_down_pct = self.non_negative(&p, v).unwrap_or(ramp.ramp_down_pct);
        }
        if let Some((p, v)) = f.take("cool_down_s")
            && let Some(s) = self.non_negative(&p, v)
        {
            ramp.cool_down = self.duration(&p, v, s).unwrap_or(ramp.cool_down);
        }
        if let Some((p, v)) = f.take("resume_ttl_s")
            && let Some(s) = self.positive(&p, v)
        {
            ramp.resume_ttl = self.duration(&p, v, s);
        }
        self.finish(f, "min, max, duration_s, mode, threshold_pct, ramp_down_pct, cool_down_s, resume_ttl_s");
        Some(ramp)
    }

    /// Seconds as a duration, at most [`DURATION_MAX`](crate::settings::DURATION_MAX).
    pub fn duration(&mut self, path: &str, v: &Value<'_>, seconds: f64) -> Option<Duration> {
        let max = crate::settings::DURATION_MAX;
        match Duration::try_from_secs_f64(seconds) {
            Ok(d) if d <= max => Some(d),
            _ => {
                self.error(
                    v.span(),
                    path,
                    format!("must be at most {} seconds, got {seconds}", max.as_secs()),
                );
                None
            }
        }
    }

    /// A string.
    pub fn string<'v>(&mut self, path: &str, v: &'v Value<'_>) -> Option<&'v str> {
        match v.get_ref() {
            DeValue::String(s) => Some(s.as_ref()),
            other => {
                self.error(v.span(), path, format!("must be a string, got {}", other.type_str()));
                None
            }
        }
    }

    /// A boolean.
    pub fn boolean(&mut self, path: &str, v: &Value<'_>) -> Option<bool> {
        match v.get_ref() {
            DeValue::Boolean(b) => Some(*b),
            other => {
                self.error(v.span(), path, format!("must be true or false, got {}", other.type_str()));
                None
            }
        }
    }

    /// A finite number, integer or float.
    pub fn number(&mut self, path: &str, v: &Value<'_>) -> Option<f64> {
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

    /// A finite number, at least 0.
    pub fn non_negative(&mut self, path: &str, v: &Value<'_>) -> Option<f64> {
        let x = self.number(path, v)?;
        if x < 0.0 {
            self.error(v.span(), path, format!("must not be negative, got {x}"));
            return None;
        }
        Some(x)
    }

    /// A finite number above 0.
    pub fn positive(&mut self, path: &str, v: &Value<'_>) -> Option<f64> {
        let x = self.number(path, v)?;
        if x <= 0.0 {
            self.error(v.span(), path, format!("must be above 0, got {x}"));
            return None;
        }
        Some(x)
    }

    /// A whole number from `min` to `max`.
    pub fn integer(&mut self, path: &str, v: &Value<'_>, min: u64, max: u64) -> Option<u64> {
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

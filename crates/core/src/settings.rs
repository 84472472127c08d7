//! Group settings: what each tenant is promised and allowed.
//!
//! A *group* is the tenant being controlled (FoundationDB tag, Couchbase bucket, TiDB resource
//! group, Numaflow vertex). Its settings say what it may use: at least `reserved` units/s
//! while it asks for them, never more than `limit`, with `burst` units of banked allowance, a
//! `priority` and `weight` for sharing free capacity, and optionally a ramp-up and a budget.
//!
//! Settings cannot be built invalid: [`GroupSettingsBuilder::build`] checks every rule and
//! returns *all* broken ones, each naming the field and the rule.

use std::fmt;
use std::time::Duration;

use thiserror::Error;

/// The longest group name, in bytes.
pub const GROUP_NAME_MAX_BYTES: usize = 255;

pub use crate::fields::{DURATION_MAX, MAX_IN_FLIGHT, RATE_MAX, UNITS_MAX, WEIGHT_MAX};

/// The name of the group that unknown groups fall back to.
pub const DEFAULT_GROUP: &str = "default";

/// One broken rule: which field, and what the rule is.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{field}: {rule}")]
pub struct SettingError {
    /// The field, as written in a settings file (`reserved`, `ramp.min`, …).
    pub field: String,
    /// The rule it breaks, with the offending value.
    pub rule: String,
}

impl SettingError {
    /// A broken rule for `field`.
    pub fn new(field: impl Into<String>, rule: impl Into<String>) -> Self {
        Self { field: field.into(), rule: rule.into() }
    }
}

/// Every rule a set of settings breaks (never empty).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct SettingErrors(pub Vec<SettingError>);

/// A validated group name: 1 to 255 bytes of printable text.
///
/// Cloning it is cheap and touches no shared counter for names of up to 23 bytes (held
/// inline); a longer name is shared. A refusal carries its group's name, so this keeps a
/// refusal from writing to memory other threads read.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupName(smol_str::SmolStr);

impl GroupName {
    /// Checks `name` against the rules.
    ///
    /// ```
    /// use tollgate_model::settings::GroupName;
    /// assert!(GroupName::new("tenant-a").is_ok());
    /// assert!(GroupName::new("").is_err());
    /// assert!(GroupName::new("bad\nname").is_err());
    /// ```
    pub fn new(name: &str) -> Result<Self, SettingError> {
        check_group_name(name)?;
        Ok(Self(smol_str::SmolStr::new(name)))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The `default` group.
    pub fn default_group() -> Self {
        Self(smol_str::SmolStr::new_static(DEFAULT_GROUP))
    }
}

impl fmt::Display for GroupName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A name hashes and compares as its text, so maps keyed by `GroupName` can be searched with
/// a `&str`.
impl std::borrow::Borrow<str> for GroupName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for GroupName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl PartialEq<str> for GroupName {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for GroupName {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

/// Whether a configured name is a **pattern** rather than a group: it holds `*`, which stands
/// for any run of characters. A pattern's settings apply to every group it matches that is not
/// configured by its own name (a tenant per descriptor value, each held to the same limit);
/// the most specific pattern wins (the most characters other than `*`, then the first by
/// name); a group no pattern matches takes the `default` group's settings.
pub fn is_pattern(name: &str) -> bool {
    name.contains('*')
}

/// Whether `name` matches `pattern`, where `*` stands for any run of characters.
///
/// ```
/// use tollgate_model::settings::glob_matches;
/// assert!(glob_matches("rl/user=*/path=*", "rl/user=ann/path=/a"));
/// assert!(!glob_matches("rl/user=*", "rl/path=/a"));
/// ```
pub fn glob_matches(pattern: &str, name: &str) -> bool {
    // Iterative with one backtrack point: linear in practice, no recursion to exhaust.
    let (p, s) = (pattern.as_bytes(), name.as_bytes());
    let (mut pi, mut si) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, si));
            pi += 1;
        } else if pi < p.len() && p[pi] == s[si] {
            pi += 1;
            si += 1;
        } else if let Some((sp, ss)) = star {
            pi = sp + 1;
            si = ss + 1;
            star = Some((sp, ss + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

/// Sorts patterns so that the first that matches a name is the most specific (see
/// [`is_pattern`]).
pub fn sort_patterns<N: AsRef<str>, T>(patterns: &mut [(N, T)]) {
    let literal = |p: &str| p.bytes().filter(|&c| c != b'*').count();
    patterns.sort_by(|(a, _), (b, _)| {
        let (a, b) = (a.as_ref(), b.as_ref());
        literal(b).cmp(&literal(a)).then_with(|| a.cmp(b))
    });
}

/// The first of `sorted` (as [`sort_patterns`] leaves them) that matches `name`.
pub fn matching_pattern<'a, N: AsRef<str>, T>(sorted: &'a [(N, T)], name: &str) -> Option<&'a T> {
    sorted.iter().find(|(p, _)| glob_matches(p.as_ref(), name)).map(|(_, t)| t)
}

/// The most patterns a node holds among its configured groups.
pub const PATTERNS_MAX: usize = 1000;

/// What a pattern's settings may not hold: a reservation (the groups it names are unbounded,
/// so their reservations could not add up to anything a capacity covers).
pub fn check_pattern(name: &str, settings: &GroupSettings) -> Result<(), SettingError> {
    if is_pattern(name) && settings.reserved() > 0.0 {
        return Err(SettingError::new(
            "reserved",
            format!(
                "a pattern ({name}) may not reserve: every group it matches would, without bound; \
                 reserve for groups by their own names"
            ),
        ));
    }
    Ok(())
}

/// Checks a group name without allocating: 1 to 255 bytes, no control characters.
pub fn check_group_name(name: &str) -> Result<(), SettingError> {
    if name.is_empty() {
        return Err(SettingError::new("name", "must not be empty"));
    }
    if name.len() > GROUP_NAME_MAX_BYTES {
        return Err(SettingError::new(
            "name",
            format!("must be at most {GROUP_NAME_MAX_BYTES} bytes, got {}", name.len()),
        ));
    }
    if let Some(c) = name.chars().find(|c| c.is_control()) {
        return Err(SettingError::new(
            "name",
            format!("must be printable text, found control character {c:?}"),
        ));
    }
    Ok(())
}

/// A rate ceiling in units/s, or none.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Limit {
    /// Never admitted above this many units/s.
    Units(f64),
    /// No ceiling: the group may use any free capacity (TiDB's BURSTABLE).
    Unlimited,
}

impl Limit {
    /// The ceiling as a number; infinity when unlimited.
    pub fn as_f64(self) -> f64 {
        match self {
            Limit::Units(u) => u,
            Limit::Unlimited => f64::INFINITY,
        }
    }

    /// Whether there is a ceiling.
    pub fn is_finite(self) -> bool {
        matches!(self, Limit::Units(_))
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Limit::Units(u) => write!(f, "{u}"),
            Limit::Unlimited => f.write_str("unlimited"),
        }
    }
}

/// Priority 1 (lowest) to 16 (highest). Free capacity and queued work go to higher first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Priority(u8);

impl Priority {
    /// TiDB's LOW.
    pub const LOW: Priority = Priority(1);
    /// TiDB's MEDIUM, the default.
    pub const MEDIUM: Priority = Priority(8);
    /// TiDB's HIGH.
    pub const HIGH: Priority = Priority(16);

    /// A priority from 1 to 16.
    pub fn new(level: u8) -> Result<Self, SettingError> {
        if (1..=16).contains(&level) {
            Ok(Priority(level))
        } else {
            Err(SettingError::new(
                "priority",
                format!("must be 1 to 16, or low, medium or high; got {level}"),
            ))
        }
    }

    /// `low`, `medium` or `high`.
    pub fn from_name(name: &str) -> Result<Self, SettingError> {
        match name {
            "low" => Ok(Priority::LOW),
            "medium" => Ok(Priority::MEDIUM),
            "high" => Ok(Priority::HIGH),
            other => Err(SettingError::new(
                "priority",
                format!("must be 1 to 16, or low, medium or high; got {other:?}"),
            )),
        }
    }

    /// The level, 1 to 16.
    pub fn level(self) -> u8 {
        self.0
    }
}

impl Default for Priority {
    /// Medium.
    fn default() -> Self {
        Priority::MEDIUM
    }
}

/// How a ramp-up pool grows (Numaflow's modes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RampMode {
    /// Grows every epoch, used or not.
    Scheduled,
    /// Grows only in epochs with at least one call.
    #[default]
    Relaxed,
    /// Grows only if last epoch's utilisation reached the threshold.
    OnlyIfUsed,
    /// Like `OnlyIfUsed`, and shrinks when under the threshold or idle past the cool-down.
    GoBackN,
}

impl RampMode {
    /// The mode's name in a settings file.
    pub fn name(self) -> &'static str {
        match self {
            RampMode::Scheduled => "scheduled",
            RampMode::Relaxed => "relaxed",
            RampMode::OnlyIfUsed => "only_if_used",
            RampMode::GoBackN => "go_back_n",
        }
    }

    /// Parses a mode name, with underscores or dashes (`go_back_n` or `go-back-n`).
    pub fn from_name(name: &str) -> Result<Self, SettingError> {
        let name_ = name.replace('-', "_");
        [RampMode::Scheduled, RampMode::Relaxed, RampMode::OnlyIfUsed, RampMode::GoBackN]
            .into_iter()
            .find(|m| m.name() == name_)
            .ok_or_else(|| {
                SettingError::new(
                    "ramp.mode",
                    format!("must be scheduled, relaxed, only_if_used or go_back_n; got {name:?}"),
                )
            })
    }
}

/// What happens to the cost of work that was admitted and then dropped before it reached the
/// protected resource (Numaflow's `to_drop`: a dropped message need not count).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DroppedWork {
    /// Given back to the group's tokens, and not counted as consumed.
    #[default]
    Return,
    /// Kept: counted as consumed, as if the work had run.
    Count,
}

impl DroppedWork {
    /// Its name in a settings file.
    pub fn name(self) -> &'static str {
        match self {
            DroppedWork::Return => "return",
            DroppedWork::Count => "count",
        }
    }

    /// Parses a name.
    pub fn from_name(name: &str) -> Result<Self, SettingError> {
        match name {
            "return" => Ok(DroppedWork::Return),
            "count" => Ok(DroppedWork::Count),
            other => Err(SettingError::new("dropped", format!("must be return or count; got {other:?}"))),
        }
    }
}

/// How long a debt is paid back over by default: TiDB's token-bucket period.
pub const DEBT_REPAY_DEFAULT: Duration = Duration::from_secs(5);

/// A ramp-up: the group's ceiling grows from `min` to `max` units/s over `duration`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RampSettings {
    /// Starting pool, units per one-second epoch.
    pub min: f64,
    /// Final pool, units per one-second epoch.
    pub max: f64,
    /// How long the ramp takes if it grows every epoch.
    pub duration: Duration,
    /// When the pool grows.
    pub mode: RampMode,
    /// Utilisation (percent of the pool) an epoch needs for `only_if_used` and `go_back_n`.
    pub threshold_pct: f64,
    /// How far `go_back_n` shrinks, as a percent of one epoch's growth.
    pub ramp_down_pct: f64,
    /// How long `go_back_n` waits idle before shrinking for every epoch missed.
    pub cool_down: Duration,
    /// A restart within this long resumes at the last pool instead of `min`.
    pub resume_ttl: Option<Duration>,
}

impl RampSettings {
    /// A relaxed ramp from `min` to `max` over `duration`, with the other fields at defaults.
    pub fn new(min: f64, max: f64, duration: Duration) -> Self {
        Self {
            min,
            max,
            duration,
            mode: RampMode::Relaxed,
            threshold_pct: 50.0,
            ramp_down_pct: 50.0,
            cool_down: Duration::from_secs(5),
            resume_ttl: None,
        }
    }

    /// Every rule these ramp settings break.
    pub fn validate(&self) -> Result<(), SettingErrors> {
        let mut errors = Vec::new();
        self.check(&mut errors);
        if errors.is_empty() { Ok(()) } else { Err(SettingErrors(errors)) }
    }

    fn check(&self, errors: &mut Vec<SettingError>) {
        let min_ok = check_rate("ramp.min", self.min, errors);
        let max_ok = check_rate("ramp.max", self.max, errors);
        if min_ok && max_ok && self.min > self.max {
            errors.push(SettingError::new(
                "ramp.min",
                format!("must not exceed ramp.max ({} > {})", self.min, self.max),
            ));
        }
        if self.duration.is_zero() {
            errors.push(SettingError::new("ramp.duration_s", "must be above 0"));
        }
        for (field, d) in [
            ("ramp.duration_s", Some(self.duration)),
            ("ramp.cool_down_s", Some(self.cool_down)),
            ("ramp.resume_ttl_s", self.resume_ttl),
        ] {
            if let Some(d) = d
                && d > DURATION_MAX
            {
                errors.push(SettingError::new(
                    field,
                    format!("must be at most {} seconds, got {}", DURATION_MAX.as_secs(), d.as_secs_f64()),
                ));
            }
        }
        if self.resume_ttl.is_some_and(|t| t.is_zero()) {
            errors.push(SettingError::new("ramp.resume_ttl_s", "must be above 0"));
        }
        // Numaflow truncates the cool-down to whole seconds; at 0 every call counts as a gap
        // with nothing to shrink, and the pool never moves from its start again.
        if self.mode == RampMode::GoBackN && self.cool_down < Duration::from_secs(1) {
            errors.push(SettingError::new(
                "ramp.cool_down_s",
                format!(
                    "must be at least 1 in go_back_n mode (below it the pool never grows), got {}",
                    self.cool_down.as_secs_f64()
                ),
            ));
        }
        if !(self.threshold_pct > 0.0 && self.threshold_pct <= 100.0) {
            errors.push(SettingError::new(
                "ramp.threshold_pct",
                format!("must be above 0 and at most 100, got {}", self.threshold_pct),
            ));
        }
        if !(self.ramp_down_pct >= 0.0 && self.ramp_down_pct <= 100.0) {
            errors.push(SettingError::new(
                "ramp.ramp_down_pct",
                format!("must be from 0 to 100, got {}", self.ramp_down_pct),
            ));
        }
    }
}

/// Units per window, shortest window first: none at all for most groups.
#[derive(Debug, Clone, Default, PartialEq)]
struct Quotas(Option<Box<[(BudgetPeriod, f64)]>>);

/// The most windows one group has quotas over.
pub const QUOTAS_MAX: usize = 8;

impl Quotas {
    fn get(&self, w: BudgetPeriod) -> Option<f64> {
        self.0.as_ref().and_then(|q| q.iter().find(|(p, _)| *p == w).map(|(_, u)| *u))
    }

    fn set(&mut self, w: BudgetPeriod, units: Option<f64>) {
        let mut q: Vec<(BudgetPeriod, f64)> = self.0.take().map(Vec::from).unwrap_or_default();
        q.retain(|(p, _)| *p != w);
        if let Some(u) = units {
            q.push((w, u));
            q.sort_by_key(|(p, _)| (p.span_ms(), *p));
        }
        self.0 = (!q.is_empty()).then(|| q.into_boxed_slice());
    }

    fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |q| q.len())
    }
}

/// A group's validated settings. Build with [`GroupSettings::builder`].
///
/// ```
/// use tollgate_model::settings::{GroupSettings, Limit, Priority};
///
/// let s = GroupSettings::builder().reserved(600.0).limit(1000.0).priority(Priority::HIGH).build()?;
/// assert_eq!(s.limit(), Limit::Units(1000.0));
/// assert_eq!(s.burst_for(800.0), 800.0); // one second of the grant by default
///
/// let broken = GroupSettings::builder().reserved(700.0).limit(500.0).weight(0.0).build();
/// assert_eq!(broken.unwrap_err().0.len(), 2); // every broken rule is reported
/// # Ok::<(), tollgate_model::settings::SettingErrors>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct GroupSettings {
    reserved: f64,
    limit: Limit,
    burst: Option<f64>,
    priority: Priority,
    weight: f64,
    ramp: Option<RampSettings>,
    /// Units per window, by [`BudgetPeriod`] in order; boxed, as most groups have none.
    quotas: Quotas,
    budget_period: BudgetPeriod,
    dropped: DroppedWork,
    debt_repay: Duration,
    reads_writes_apart: bool,
    backend_limit: Option<f64>,
    background: bool,
    shadow: bool,
    critical_reserve: f64,
    /// At most this many requests in flight at once, across all clients.
    max_in_flight: Option<u32>,
    /// The group it is nested under (see [`crate::hierarchy`]).
    parent: Option<GroupName>,
}

/// The window a quota is counted over: each UTC minute, hour, day, week (from Monday) or
/// calendar month; windows of a number of seconds one after another from the Unix epoch
/// (envoy/ratelimit's week, month and year are such windows); a number of seconds from the
/// first request after the last such window ended (Limitador's windows); or the group's whole
/// life. A group may carry a quota for each of several windows at once; a group's *budget* is
/// the quota of its `budget_period` (one of the named windows).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum BudgetPeriod {
    /// Each UTC minute.
    Minute,
    /// Each UTC hour.
    Hour,
    /// Each UTC day.
    Day,
    /// Each week, from Monday 00:00 UTC.
    Week,
    /// Each UTC calendar month.
    Month,
    /// Everything the group ever consumed.
    #[default]
    Total,
    /// Windows of this many seconds, one after another from the Unix epoch (`"90s"`).
    Every(u32),
    /// A window of this many seconds from the first request after the last one ended
    /// (`"90s-from-first"`).
    FromFirst(u32),
}

/// The longest window of a number of seconds: a leap year.
pub const WINDOW_SECONDS_MAX: u32 = 366 * 86_400;

impl BudgetPeriod {
    /// The named windows, shortest first.
    pub const ALL: [BudgetPeriod; 6] = [
        BudgetPeriod::Minute,
        BudgetPeriod::Hour,
        BudgetPeriod::Day,
        BudgetPeriod::Week,
        BudgetPeriod::Month,
        BudgetPeriod::Total,
    ];

    /// Its name in settings: `minute`, `hour`, `day`, `week`, `month`, `total`, `90s`,
    /// `90s-from-first`.
    pub fn name(self) -> std::borrow::Cow<'static, str> {
        match self {
            BudgetPeriod::Minute => "minute".into(),
            BudgetPeriod::Hour => "hour".into(),
            BudgetPeriod::Total => "total".into(),
            BudgetPeriod::Day => "day".into(),
            BudgetPeriod::Week => "week".into(),
            BudgetPeriod::Month => "month".into(),
            BudgetPeriod::Every(s) => format!("{s}s").into(),
            BudgetPeriod::FromFirst(s) => format!("{s}s-from-first").into(),
        }
    }

    /// How long it lasts, in milliseconds (a month: 31 days, for ordering; the group's life:
    /// never ending).
    pub fn span_ms(self) -> u64 {
        const DAY: u64 = 86_400_000;
        match self {
            BudgetPeriod::Minute => 60_000,
            BudgetPeriod::Hour => 3_600_000,
            BudgetPeriod::Day => DAY,
            BudgetPeriod::Week => 7 * DAY,
            BudgetPeriod::Month => 31 * DAY,
            BudgetPeriod::Total => u64::MAX,
            BudgetPeriod::Every(s) | BudgetPeriod::FromFirst(s) => u64::from(s) * 1000,
        }
    }

    /// The window named `name`, or the rule.
    ///
    /// ```
    /// use tollgate_model::settings::BudgetPeriod;
    /// assert_eq!(BudgetPeriod::parse("hour"), Ok(BudgetPeriod::Hour));
    /// assert_eq!(BudgetPeriod::parse("604800s"), Ok(BudgetPeriod::Every(604_800)));
    /// assert_eq!(BudgetPeriod::parse("60s-from-first"), Ok(BudgetPeriod::FromFirst(60)));
    /// assert!(BudgetPeriod::parse("0s").is_err());
    /// ```
    pub fn parse(name: &str) -> Result<BudgetPeriod, String> {
        match name {
            "total" | "" => return Ok(BudgetPeriod::Total),
            "minute" => return Ok(BudgetPeriod::Minute),
            "hour" => return Ok(BudgetPeriod::Hour),
            "day" => return Ok(BudgetPeriod::Day),
            "week" => return Ok(BudgetPeriod::Week),
            "month" => return Ok(BudgetPeriod::Month),
            _ => {}
        }
        let rule = || {
            format!(
                "must be minute, hour, day, week, month, total, a number of seconds such as 90s, or one from the first request such as 90s-from-first (1 to {WINDOW_SECONDS_MAX} s), got {name:?}"
            )
        };
        let (digits, from_first) = match name.strip_suffix("s-from-first") {
            Some(d) => (d, true),
            None => (name.strip_suffix('s').ok_or_else(rule)?, false),
        };
        let seconds: u32 =
            digits.parse().ok().filter(|s| (1..=WINDOW_SECONDS_MAX).contains(s)).ok_or_else(rule)?;
        Ok(if from_first { BudgetPeriod::FromFirst(seconds) } else { BudgetPeriod::Every(seconds) })
    }

    /// Whether the clock places it on whole minutes (a minute, an hour, a day, a week, a month,
    /// or a number of whole minutes): its start falls between two minutes' usage records.
    pub fn begins_on_minutes(self) -> bool {
        match self {
            BudgetPeriod::Total | BudgetPeriod::FromFirst(_) => false,
            BudgetPeriod::Every(s) => s % 60 == 0,
            _ => true,
        }
    }

    /// Whether it is one of the named windows a budget may count over.
    pub fn is_named(self) -> bool {
        BudgetPeriod::ALL.contains(&self)
    }

    /// When the period holding `wall_ms` (Unix milliseconds) ends: the next one's start;
    /// `None` for `Total`, which never ends.
    ///
    /// ```
    /// use tollgate_model::settings::BudgetPeriod;
    /// let t = 1_795_395_723_456; // 2026-11-23T01:02:03.456Z, a Monday
    /// assert_eq!(BudgetPeriod::Minute.end_of(t), Some(1_795_395_780_000));
    /// assert_eq!(BudgetPeriod::Week.end_of(t), Some(1_795_996_800_000)); // the next Monday
    /// assert_eq!(BudgetPeriod::Month.end_of(t), Some(1_796_083_200_000)); // 2026-12-01T00:00Z
    /// assert_eq!(BudgetPeriod::Total.end_of(t), None);
    /// ```
    pub fn end_of(self, wall_ms: u64) -> Option<u64> {
        const DAY: u64 = 86_400_000;
        let start = self.start_of(wall_ms);
        match self {
            BudgetPeriod::Total => None,
            BudgetPeriod::Minute => Some(start + 60_000),
            BudgetPeriod::Hour => Some(start + 3_600_000),
            BudgetPeriod::Day => Some(start + DAY),
            BudgetPeriod::Week => Some(start + 7 * DAY),
            BudgetPeriod::Month => {
                let (y, m, _) = civil_from_days((start / DAY) as i64);
                let (y, m) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
                Some(days_from_civil(y, m, 1).max(0) as u64 * DAY)
            }
            BudgetPeriod::Every(_) | BudgetPeriod::FromFirst(_) => Some(start + self.span_ms()),
        }
    }

    /// When the period holding `wall_ms` (Unix milliseconds) began; 0 for `Total`.
    ///
    /// ```
    /// use tollgate_model::settings::BudgetPeriod;
    /// let t = 1_795_395_723_456; // 2026-11-23T01:02:03.456Z, a Monday
    /// assert_eq!(BudgetPeriod::Day.start_of(t), 1_795_392_000_000); // 2026-11-23T00:00Z
    /// assert_eq!(BudgetPeriod::Week.start_of(t), 1_795_392_000_000);
    /// assert_eq!(BudgetPeriod::Month.start_of(t), 1_793_491_200_000); // 2026-11-01T00:00Z
    /// ```
    pub fn start_of(self, wall_ms: u64) -> u64 {
        const DAY: u64 = 86_400_000;
        let day = wall_ms / DAY;
        match self {
            BudgetPeriod::Total => 0,
            BudgetPeriod::Minute => wall_ms / 60_000 * 60_000,
            BudgetPeriod::Hour => wall_ms / 3_600_000 * 3_600_000,
            BudgetPeriod::Day => day * DAY,
            // 1970-01-01 was a Thursday: three days after a Monday.
            BudgetPeriod::Week => (day - (day + 3) % 7) * DAY,
            BudgetPeriod::Month => {
                let (y, m, _) = civil_from_days(day as i64);
                days_from_civil(y, m, 1).max(0) as u64 * DAY
            }
            // A window from the first request has no start the clock alone gives: its start
            // is kept where its quota is counted; this is the start of the span it would take
            // from the epoch.
            BudgetPeriod::Every(_) | BudgetPeriod::FromFirst(_) => wall_ms / self.span_ms() * self.span_ms(),
        }
    }
}

/// Days since 1970-01-01 to (year, month, day), in the proleptic Gregorian calendar (eras of
/// 400 years of 146,097 days).
///
/// ```
/// assert_eq!(tollgate_model::settings::civil_from_days(20_780), (2026, 11, 23));
/// ```
pub fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// (year, month, day) to days since 1970-01-01.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

impl Default for GroupSettings {
    /// Nothing reserved, unlimited, medium priority, weight 1: what unknown groups get unless
    /// a `default` group is configured.
    fn default() -> Self {
        Self {
            reserved: 0.0,
            limit: Limit::Unlimited,
            burst: None,
            priority: Priority::MEDIUM,
            weight: 1.0,
            ramp: None,
            quotas: Quotas::default(),
            budget_period: BudgetPeriod::Total,
            dropped: DroppedWork::Return,
            debt_repay: DEBT_REPAY_DEFAULT,
            reads_writes_apart: false,
            backend_limit: None,
            background: false,
            shadow: false,
            critical_reserve: 0.0,
            max_in_flight: None,
            parent: None,
        }
    }
}

impl GroupSettings {
    /// Starts from the defaults.
    pub fn builder() -> GroupSettingsBuilder {
        GroupSettingsBuilder { settings: GroupSettings::default() }
    }

    /// A builder holding these settings, to change some of them.
    pub fn to_builder(&self) -> GroupSettingsBuilder {
        GroupSettingsBuilder { settings: self.clone() }
    }

    /// TiDB's `RU_PER_SEC = n`: reserved and limited at `n`.
    pub fn fixed(rate: f64) -> Result<Self, SettingErrors> {
        Self::builder().reserved(rate).limit(rate).build()
    }

    /// Units/s never throttled below while demanded.
    pub fn reserved(&self) -> f64 {
        self.reserved
    }

    /// Units/s never admitted above.
    pub fn limit(&self) -> Limit {
        self.limit
    }

    /// The configured burst, if any.
    pub fn burst(&self) -> Option<f64> {
        self.burst
    }

    /// The burst for a grant of `rate` units/s: the configured one, or one second of `rate`.
    pub fn burst_for(&self, rate: f64) -> f64 {
        self.burst.unwrap_or(rate)
    }

    /// Priority for free capacity and queued work.
    pub fn priority(&self) -> Priority {
        self.priority
    }

    /// Share of free capacity among groups of one priority.
    pub fn weight(&self) -> f64 {
        self.weight
    }

    /// The ramp-up, if any.
    pub fn ramp(&self) -> Option<&RampSettings> {
        self.ramp.as_ref()
    }

    /// The budget in units, if any: the quota of [`budget_period`](Self::budget_period).
    pub fn budget(&self) -> Option<f64> {
        self.quotas.get(self.budget_period)
    }

    /// The quota counted over `window`, if any.
    pub fn quota(&self, window: BudgetPeriod) -> Option<f64> {
        self.quotas.get(window)
    }

    /// Every quota, shortest window first: a request is refused (the group admits nothing)
    /// while any is spent.
    pub fn quotas(&self) -> impl Iterator<Item = (BudgetPeriod, f64)> + '_ {
        self.quotas.0.iter().flat_map(|q| q.iter().copied())
    }

    /// Whether the group has any quota.
    pub fn has_quotas(&self) -> bool {
        self.quotas.0.is_some()
    }

    /// Over what span the budget is counted.
    pub fn budget_period(&self) -> BudgetPeriod {
        self.budget_period
    }

    /// What dropped work does to the group's tokens and consumption.
    pub fn dropped(&self) -> DroppedWork {
        self.dropped
    }

    /// Over how long a debt (a cost settled above what was admitted, beyond the tokens held)
    /// is paid back from the refill while admissions go on at the reduced rate; zero: at once,
    /// every admission waiting until it is paid.
    pub fn debt_repay(&self) -> Duration {
        self.debt_repay
    }

    /// FoundationDB's accounting: the limit and the reservation apply to reads and to writes
    /// each, from the group's average read and write cost per request, rather than to their
    /// sum (see the engine).
    pub fn reads_writes_apart(&self) -> bool {
        self.reads_writes_apart
    }

    /// TiKV's soft quota: the units/s the group may use on each backend, whatever the backend's
    /// load. A backend's scheduler (`tollgate_limiter::scheduler`) holds the group's work back
    /// past it, even when the backend is not saturated. `None`: no such limit.
    pub fn backend_limit(&self) -> Option<f64> {
        self.backend_limit
    }

    /// The group is a backend's own background work (compaction, replication): on a backend
    /// with a known capacity its work runs under a limiter that gives it what the front-end
    /// groups leave, retuned every second (TiKV's background limiter).
    pub fn background(&self) -> bool {
        self.background
    }

    /// Shadow mode: the group's requests are decided and counted as usual but never refused;
    /// what would have been refused is counted as `would_refuse` (envoy/ratelimit's
    /// `shadow_mode`, a dark launch of a new limit).
    pub fn shadow(&self) -> bool {
        self.shadow
    }

    /// The share of the group's burst kept for critical work (0 to
    /// [`CRITICAL_RESERVE_MAX`](crate::class::CRITICAL_RESERVE_MAX)): normal and sheddable
    /// work leave it in the bucket (see [`crate::class`]).
    pub fn critical_reserve(&self) -> f64 {
        self.critical_reserve
    }

    /// The most requests the group may have in flight at once across all its clients
    /// (`None`: no such limit). A permit holds a slot until it is dropped or settled.
    pub fn max_in_flight(&self) -> Option<u32> {
        self.max_in_flight
    }

    /// The group it is nested under: the parent's limit caps this group's and its siblings'
    /// grants together, and this group's reservation comes out of the parent's (see
    /// [`crate::hierarchy`]).
    pub fn parent(&self) -> Option<&GroupName> {
        self.parent.as_ref()
    }

    /// The rules of the caps a group may have beside its limit: in flight, per backend.
    fn check_caps(&self, errors: &mut Vec<SettingError>) {
        use crate::fields::{BACKEND_LIMIT, MAX_IN_FLIGHT_FIELD};
        let in_flight = MAX_IN_FLIGHT_FIELD.range.expect("declared with a range");
        if let Some(n) = self.max_in_flight
            && !in_flight.holds(f64::from(n))
        {
            errors.push(SettingError::new(
                MAX_IN_FLIGHT_FIELD.name,
                format!("must be a whole number from {} to {}, got {n}", in_flight.min, in_flight.max),
            ));
        }
        if let Some(l) = self.backend_limit {
            check_positive(BACKEND_LIMIT.name, l, BACKEND_LIMIT.range.map_or(RATE_MAX, |r| r.max), errors);
        }
    }

    /// Every rule these settings break (empty when valid). The names and ranges are the
    /// declared ones ([`crate::fields`]).
    fn problems(&self) -> Vec<SettingError> {
        use crate::fields::{BURST, CRITICAL_RESERVE, WEIGHT};
        let mut errors = Vec::new();
        self.check_caps(&mut errors);
        let reserved_ok = check_rate("reserved", self.reserved, &mut errors);
        if let Limit::Units(limit) = self.limit {
            let limit_ok = check_rate("limit", limit, &mut errors);
            if reserved_ok && limit_ok && self.reserved > limit {
                errors.push(SettingError::new(
                    "reserved",
                    format!("must not exceed limit ({} > {limit})", self.reserved),
                ));
            }
        }
        if let Some(burst) = self.burst {
            check_positive(BURST.name, burst, BURST.range.map_or(UNITS_MAX, |r| r.max), &mut errors);
        }
        check_positive(WEIGHT.name, self.weight, WEIGHT.range.map_or(WEIGHT_MAX, |r| r.max), &mut errors);
        let reserve_max = CRITICAL_RESERVE.range.map_or(0.0, |r| r.max);
        if !CRITICAL_RESERVE.range.is_some_and(|r| r.holds(self.critical_reserve)) {
            errors.push(SettingError::new(
                CRITICAL_RESERVE.name,
                format!(
                    "must be a share of the burst from 0 to {reserve_max}, got {}",
                    self.critical_reserve
                ),
            ));
        }
        for (window, units) in self.quotas() {
            let field = if window == self.budget_period {
                "budget".to_string()
            } else {
                format!("quotas.{}", window.name())
            };
            check_positive(&field, units, UNITS_MAX, &mut errors);
        }
        if self.budget_period != BudgetPeriod::Total && self.budget().is_none() {
            errors.push(SettingError::new("budget_period", "needs a budget to count per period"));
        }
        if !self.budget_period.is_named() {
            errors.push(SettingError::new(
                "budget_period",
                format!(
                    "must be minute, hour, day, week, month or total, got {} (give other windows under quotas)",
                    self.budget_period.name()
                ),
            ));
        }
        if self.quotas.len() > QUOTAS_MAX {
            errors.push(SettingError::new(
                "quotas",
                format!("at most {QUOTAS_MAX} windows, got {}", self.quotas.len()),
            ));
        }
        if let Some(ramp) = &self.ramp {
            ramp.check(&mut errors);
        }
        if self.debt_repay > DURATION_MAX {
            errors.push(SettingError::new(
                "debt_repay_s",
                format!(
                    "must be at most {} seconds, got {}",
                    DURATION_MAX.as_secs(),
                    self.debt_repay.as_secs_f64()
                ),
            ));
        }
        errors
    }
}

/// Collects group settings; [`build`](Self::build) validates them all at once.
#[derive(Debug, Clone)]
pub struct GroupSettingsBuilder {
    settings: GroupSettings,
}

impl GroupSettingsBuilder {
    /// Units/s reserved (default 0).
    pub fn reserved(mut self, units_per_s: f64) -> Self {
        self.settings.reserved = units_per_s;
        self
    }

    /// A finite limit in units/s.
    pub fn limit(mut self, units_per_s: f64) -> Self {
        self.settings.limit = Limit::Units(units_per_s);
        self
    }

    /// The limit, finite or not (default unlimited).
    pub fn limit_of(mut self, limit: Limit) -> Self {
        self.settings.limit = limit;
        self
    }

    /// Units a client may bank (default one second of its grant).
    pub fn burst(mut self, units: f64) -> Self {
        self.settings.burst = Some(units);
        self
    }

    /// Priority (default medium).
    pub fn priority(mut self, priority: Priority) -> Self {
        self.settings.priority = priority;
        self
    }

    /// Weight among groups of one priority (default 1).
    pub fn weight(mut self, weight: f64) -> Self {
        self.settings.weight = weight;
        self
    }

    /// A ramp-up.
    pub fn ramp(mut self, ramp: RampSettings) -> Self {
        self.settings.ramp = Some(ramp);
        self
    }

    /// A budget in units: the quota of the budget's period (the group's life unless
    /// [`budget_period`](Self::budget_period) says otherwise).
    pub fn budget(mut self, units: f64) -> Self {
        self.settings.quotas.set(self.settings.budget_period, Some(units));
        self
    }

    /// A quota of `units` counted over `window` (beside any other window's).
    pub fn quota(mut self, window: BudgetPeriod, units: f64) -> Self {
        self.settings.quotas.set(window, Some(units));
        self
    }

    /// No quota over `window` (the budget too, when it is the budget's period).
    pub fn no_quota(mut self, window: BudgetPeriod) -> Self {
        self.settings.quotas.set(window, None);
        self
    }

    /// What dropped work does (default: returned).
    pub fn dropped(mut self, dropped: DroppedWork) -> Self {
        self.settings.dropped = dropped;
        self
    }

    /// Over how long a debt is paid back (default 5 s; zero: at once, blocking).
    pub fn debt_repay(mut self, period: Duration) -> Self {
        self.settings.debt_repay = period;
        self
    }

    /// A soft quota on each backend, units/s (`None`: none, the default).
    pub fn backend_limit(mut self, units_per_s: Option<f64>) -> Self {
        self.settings.backend_limit = units_per_s;
        self
    }

    /// Marks the group as a backend's background work (default: front-end work).
    pub fn background(mut self, background: bool) -> Self {
        self.settings.background = background;
        self
    }

    /// Puts the group in shadow mode: never refused, would-be refusals counted.
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.settings.shadow = shadow;
        self
    }

    /// Keeps `share` of the burst for critical work (see [`crate::class`]).
    pub fn critical_reserve(mut self, share: f64) -> Self {
        self.settings.critical_reserve = share;
        self
    }

    /// Nests the group under `parent` (`None`: a group of its own).
    pub fn parent(mut self, parent: Option<GroupName>) -> Self {
        self.settings.parent = parent;
        self
    }

    /// Limits the requests in flight at once across all clients (`None`: no limit).
    pub fn max_in_flight(mut self, slots: Option<u32>) -> Self {
        self.settings.max_in_flight = slots;
        self
    }

    /// Reads and writes accounted apart (default: together).
    pub fn reads_writes_apart(mut self, apart: bool) -> Self {
        self.settings.reads_writes_apart = apart;
        self
    }

    /// No ramp-up.
    pub fn no_ramp(mut self) -> Self {
        self.settings.ramp = None;
        self
    }

    /// Counts the budget per `period` rather than over the group's life: a budget already
    /// set moves to that window.
    pub fn budget_period(mut self, period: BudgetPeriod) -> Self {
        let old = self.settings.budget_period;
        if old != period
            && let Some(units) = self.settings.quotas.get(old)
        {
            self.settings.quotas.set(old, None);
            self.settings.quotas.set(period, Some(units));
        }
        self.settings.budget_period = period;
        self
    }

    /// No budget (the quota of the budget's period); other windows' quotas stay.
    pub fn no_budget(mut self) -> Self {
        self.settings.quotas.set(self.settings.budget_period, None);
        self.settings.budget_period = BudgetPeriod::Total;
        self
    }

    /// The default burst: one second of the grant.
    pub fn no_burst(mut self) -> Self {
        self.settings.burst = None;
        self
    }

    /// The settings, or every rule they break.
    pub fn build(self) -> Result<GroupSettings, SettingErrors> {
        let problems = self.settings.problems();
        if problems.is_empty() { Ok(self.settings) } else { Err(SettingErrors(problems)) }
    }
}

/// A rate: finite, not negative, at most [`RATE_MAX`]. Returns whether it passed.
fn check_rate(field: &str, value: f64, errors: &mut Vec<SettingError>) -> bool {
    if !value.is_finite() {
        errors.push(SettingError::new(field, format!("must be a finite number, got {value}")));
        false
    } else if value < 0.0 {
        errors.push(SettingError::new(field, format!("must not be negative, got {value}")));
        false
    } else if value > RATE_MAX {
        errors.push(SettingError::new(
            field,
            format!("must be at most {RATE_MAX:e} units/s, got {}", shown(value)),
        ));
        false
    } else {
        true
    }
}

/// A finite number above zero and at most `max`.
fn check_positive(field: &str, value: f64, max: f64, errors: &mut Vec<SettingError>) {
    if !(value.is_finite() && value > 0.0) {
        errors.push(SettingError::new(field, format!("must be a finite number above 0, got {value}")));
    } else if value > max {
        errors.push(SettingError::new(field, format!("must be at most {max:e}, got {}", shown(value))));
    }
}

/// A number as a person reads it in an error: in full while that is exact, else in
/// scientific notation (`1.2345678901234568e20`, not `123456789012345680000`).
fn shown(value: f64) -> String {
    if value.abs() < 1e15 { value.to_string() } else { format!("{value:e}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_one_to_255_printable_bytes() {
        assert!(GroupName::new("a").is_ok());
        assert!(GroupName::new("tenant a/β").is_ok());
        assert!(GroupName::new(&"x".repeat(255)).is_ok());
        let long = GroupName::new(&"x".repeat(256)).unwrap_err();
        assert_eq!(long.to_string(), "name: must be at most 255 bytes, got 256");
        assert_eq!(GroupName::new("").unwrap_err().to_string(), "name: must not be empty");
        assert!(GroupName::new("tab\there").is_err());
    }

    #[test]
    fn defaults_are_unlimited_medium_weight_one() {
        let s = GroupSettings::builder().build().unwrap();
        assert_eq!(s.reserved(), 0.0);
        assert_eq!(s.limit(), Limit::Unlimited);
        assert_eq!(s.priority(), Priority::MEDIUM);
        assert_eq!(s.weight(), 1.0);
        assert_eq!(s.burst_for(250.0), 250.0);
    }

    #[test]
    fn every_broken_rule_is_reported_with_its_field() {
        let errors = GroupSettings::builder()
            .reserved(f64::NAN)
            .limit(-5.0)
            .burst(0.0)
            .weight(f64::INFINITY)
            .budget(-1.0)
            .ramp(RampSettings { threshold_pct: 0.0, ..RampSettings::new(10.0, 5.0, Duration::ZERO) })
            .build()
            .unwrap_err()
            .0;
        let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "reserved",
                "limit",
                "burst",
                "weight",
                "budget",
                "ramp.min",
                "ramp.duration_s",
                "ramp.threshold_pct"
            ]
        );
    }

    #[test]
    fn reserved_above_limit_is_refused() {
        let e = GroupSettings::builder().reserved(10.0).limit(5.0).build().unwrap_err();
        assert_eq!(e.to_string(), "reserved: must not exceed limit (10 > 5)");
        // Equal is fine: TiDB's RU_PER_SEC.
        assert!(GroupSettings::fixed(1000.0).is_ok());
    }

    #[test]
    fn priorities_by_name_or_level() {
        assert_eq!(Priority::from_name("high").unwrap(), Priority::HIGH);
        assert_eq!(Priority::new(3).unwrap().level(), 3);
        assert!(Priority::new(0).is_err());
        assert!(Priority::new(17).is_err());
        assert!(Priority::from_name("urgent").is_err());
        assert_eq!(RampMode::from_name("go_back_n").unwrap(), RampMode::GoBackN);
        assert_eq!(RampMode::from_name("go-back-n").unwrap(), RampMode::GoBackN);
        assert_eq!(RampMode::from_name("only-if-used").unwrap(), RampMode::OnlyIfUsed);
    }
}

//! The HTTP API's bodies as types (the JSON forms other surfaces print use them too): what requests may carry (unknown fields refused, each value
//! checked for its kind with the field named) and what answers hold. The OpenAPI document's
//! schemas are made from these same types.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;
use tollgate_model::settings::BudgetPeriod;
use tollgate_proto::v1;
use utoipa::ToSchema;

/// A field a patch may give, clear with `null`, or leave out.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum Patch<T> {
    /// Not in the body: unchanged.
    #[default]
    Absent,
    /// `null`: cleared.
    Null,
    /// A new value.
    Value(T),
}

impl<T> Patch<T> {
    /// Into a protocol patch's two fields for it: `value` set from a new value (through
    /// `to`), `clear` set by `null`, neither when absent.
    fn set<U>(&self, value: &mut Option<U>, clear: &mut bool, to: impl FnOnce(&T) -> U) {
        match self {
            Patch::Absent => {}
            Patch::Null => *clear = true,
            Patch::Value(v) => *value = Some(to(v)),
        }
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Patch<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Option::<T>::deserialize(d).map(|o| o.map_or(Patch::Null, Patch::Value))
    }
}

/// A finite number (JSON has no infinities; this refuses what is not a number, naming it).
fn finite<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    match Value::deserialize(d)? {
        Value::Number(n) => {
            n.as_f64().filter(|f| f.is_finite()).ok_or_else(|| D::Error::custom("must be a finite number"))
        }
        other => Err(D::Error::custom(format!("must be a finite number, got {}", kind(&other)))),
    }
}

fn finite_opt<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    finite(d).map(Some)
}

fn finite_patch<'de, D: Deserializer<'de>>(d: D) -> Result<Patch<f64>, D::Error> {
    match Value::deserialize(d)? {
        Value::Null => Ok(Patch::Null),
        v => finite(v).map(Patch::Value).map_err(D::Error::custom),
    }
}

/// What a JSON value is, as error messages say it.
pub(crate) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A group's ceiling: units/s, or `"unlimited"` (TiDB's BURSTABLE).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, ToSchema)]
#[serde(untagged)]
pub enum LimitValue {
    /// Never admitted above this many units/s.
    Units(f64),
    /// No ceiling.
    #[schema(value_type = String, example = "unlimited")]
    Unlimited(Unlimited),
}

/// The word `"unlimited"`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Unlimited {
    /// No ceiling.
    Unlimited,
}

impl<'de> Deserialize<'de> for LimitValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Value::deserialize(d)? {
            Value::String(s) if s == "unlimited" => Ok(LimitValue::Unlimited(Unlimited::Unlimited)),
            Value::Number(n) if n.as_f64().is_some_and(f64::is_finite) => {
                Ok(LimitValue::Units(n.as_f64().unwrap_or(0.0)))
            }
            other => {
                Err(D::Error::custom(format!("must be a number or \"unlimited\", got {}", kind(&other))))
            }
        }
    }
}

/// A priority: `low`, `medium` or `high` (TiDB's three), or a level from 1 to 16.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[serde(untagged)]
pub enum PriorityValue {
    /// `low` (1), `medium` (8) or `high` (16).
    Name(PriorityName),
    /// A level, 1 (lowest) to 16 (highest).
    Level(u32),
}

/// The named priorities.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum PriorityName {
    /// Level 1.
    Low,
    /// Level 8.
    Medium,
    /// Level 16.
    High,
}

impl PriorityValue {
    /// The level, 1 to 16.
    pub fn level(&self) -> u32 {
        match self {
            PriorityValue::Name(PriorityName::Low) => 1,
            PriorityValue::Name(PriorityName::Medium) => 8,
            PriorityValue::Name(PriorityName::High) => 16,
            PriorityValue::Level(n) => *n,
        }
    }

    fn of(level: u32) -> PriorityValue {
        match level {
            1 => PriorityValue::Name(PriorityName::Low),
            8 => PriorityValue::Name(PriorityName::Medium),
            16 => PriorityValue::Name(PriorityName::High),
            n => PriorityValue::Level(n),
        }
    }
}

impl<'de> Deserialize<'de> for PriorityValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let rule = "must be low, medium, high or 1 to 16";
        match Value::deserialize(d)? {
            Value::String(s) => match s.as_str() {
                "low" => Ok(PriorityValue::Name(PriorityName::Low)),
                "medium" => Ok(PriorityValue::Name(PriorityName::Medium)),
                "high" => Ok(PriorityValue::Name(PriorityName::High)),
                _ => Err(D::Error::custom(format!("{rule}, got {s:?}"))),
            },
            Value::Number(n) => match n.as_u64() {
                Some(l @ 1..=16) => Ok(PriorityValue::Level(l as u32)),
                _ => Err(D::Error::custom(format!("{rule}, got {n}"))),
            },
            other => Err(D::Error::custom(format!("{rule}, got {}", kind(&other)))),
        }
    }
}

/// The window a quota (or the budget) is counted over.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum BudgetPeriodName {
    /// The group's whole life.
    Total,
    /// Each UTC minute.
    Minute,
    /// Each UTC hour.
    Hour,
    /// Each UTC day.
    Day,
    /// Each UTC week, from Monday.
    Week,
    /// Each UTC month.
    Month,
}

/// Units per window, for each window with a quota.
#[derive(Debug, Clone, Default, PartialEq, Serialize, ToSchema)]
pub struct Quotas {
    /// Each UTC minute.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub minute: Option<f64>,
    /// Each UTC hour.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hour: Option<f64>,
    /// Each UTC day.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub day: Option<f64>,
    /// Each UTC week, from Monday.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub week: Option<f64>,
    /// Each UTC calendar month.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub month: Option<f64>,
    /// The group's whole life.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total: Option<f64>,
    /// Windows of a number of seconds, by name: `"90s"` (one after another from the Unix
    /// epoch) or `"90s-from-first"` (from the first request after the last one ended).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub seconds: BTreeMap<String, f64>,
}

/// The windows [`Quotas`] names a field each.
const NAMED_WINDOWS: [&str; 6] = ["minute", "hour", "day", "week", "month", "total"];

impl Quotas {
    fn from_map(m: &std::collections::HashMap<String, f64>) -> Quotas {
        let get = |w: &str| m.get(w).copied();
        Quotas {
            minute: get("minute"),
            hour: get("hour"),
            day: get("day"),
            week: get("week"),
            month: get("month"),
            total: get("total"),
            seconds: m
                .iter()
                .filter(|(w, _)| !NAMED_WINDOWS.contains(&w.as_str()))
                .map(|(w, u)| (w.clone(), *u))
                .collect(),
        }
    }
}

/// Quotas to change: units for a window, `null` to remove its quota, absent to leave it.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct QuotasPatch {
    /// Each UTC minute.
    #[serde(default, deserialize_with = "finite_patch")]
    #[schema(value_type = Option<f64>)]
    pub minute: Patch<f64>,
    /// Each UTC hour.
    #[serde(default, deserialize_with = "finite_patch")]
    #[schema(value_type = Option<f64>)]
    pub hour: Patch<f64>,
    /// Each UTC day.
    #[serde(default, deserialize_with = "finite_patch")]
    #[schema(value_type = Option<f64>)]
    pub day: Patch<f64>,
    /// Each UTC week, from Monday.
    #[serde(default, deserialize_with = "finite_patch")]
    #[schema(value_type = Option<f64>)]
    pub week: Patch<f64>,
    /// Each UTC calendar month.
    #[serde(default, deserialize_with = "finite_patch")]
    #[schema(value_type = Option<f64>)]
    pub month: Patch<f64>,
    /// The group's whole life.
    #[serde(default, deserialize_with = "finite_patch")]
    #[schema(value_type = Option<f64>)]
    pub total: Patch<f64>,
    /// Windows of a number of seconds, by name (`"90s"`, `"90s-from-first"`; 1 s to a leap
    /// year): units for a window, `null` to remove its quota; those not named are left.
    #[serde(default, deserialize_with = "seconds_patch")]
    #[schema(value_type = BTreeMap<String, Option<f64>>)]
    pub seconds: BTreeMap<String, Option<f64>>,
}

/// Windows of seconds and their units (`null`: remove), each name a window of seconds.
fn seconds_patch<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, Option<f64>>, D::Error> {
    let Value::Object(windows) = Value::deserialize(d)? else {
        return Err(D::Error::custom("must be an object of window names to units"));
    };
    let mut out = BTreeMap::new();
    for (name, units) in windows {
        match BudgetPeriod::parse(&name) {
            Ok(BudgetPeriod::Every(_) | BudgetPeriod::FromFirst(_)) => {}
            Ok(_) => {
                return Err(D::Error::custom(format!("{name:?} is a named window: set it as quotas.{name}")));
            }
            Err(rule) => return Err(D::Error::custom(format!("{name:?}: {rule}"))),
        }
        let units = match units {
            Value::Null => None,
            v => Some(finite(v).map_err(|e| D::Error::custom(format!("{name:?}: {e}")))?),
        };
        out.insert(name, units);
    }
    Ok(out)
}

impl QuotasPatch {
    fn windows(&self) -> [(&'static str, &Patch<f64>); 6] {
        [
            ("minute", &self.minute),
            ("hour", &self.hour),
            ("day", &self.day),
            ("week", &self.week),
            ("month", &self.month),
            ("total", &self.total),
        ]
    }
}

/// What happens to the units of work admitted and then dropped unused.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Dropped {
    /// Counted as consumed.
    Count,
    /// Returned to the group.
    Return,
}

/// How a ramp raises a group's pool.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RampModeName {
    /// From min to max over the duration, used or not.
    Scheduled,
    /// Up while the pool is used past the threshold.
    Relaxed,
    /// Up only when the pool was used.
    OnlyIfUsed,
    /// Up when used, back down when not.
    #[serde(alias = "go-back-n")]
    GoBackN,
}

/// A ramp-up: the pool rises from `min` to `max` over `duration_s` (docs/ramp.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Ramp {
    /// Units/s at the start.
    #[serde(deserialize_with = "finite")]
    pub min: f64,
    /// Units/s at the end.
    #[serde(deserialize_with = "finite")]
    pub max: f64,
    /// Seconds from `min` to `max`.
    #[serde(deserialize_with = "finite")]
    pub duration_s: f64,
    /// How it rises.
    #[serde(default = "relaxed")]
    pub mode: RampModeName,
    /// The use, in percent of the pool, past which it rises.
    #[serde(default, deserialize_with = "finite_opt", skip_serializing_if = "Option::is_none")]
    pub threshold_pct: Option<f64>,
    /// How far it steps back, in percent, when not used.
    #[serde(default, deserialize_with = "finite_opt", skip_serializing_if = "Option::is_none")]
    pub ramp_down_pct: Option<f64>,
    /// Seconds between steps down.
    #[serde(default, deserialize_with = "finite_opt", skip_serializing_if = "Option::is_none")]
    pub cool_down_s: Option<f64>,
    /// Seconds a ramp under way survives a restart.
    #[serde(default, deserialize_with = "finite_opt", skip_serializing_if = "Option::is_none")]
    pub resume_ttl_s: Option<f64>,
}

fn relaxed() -> RampModeName {
    RampModeName::Relaxed
}

/// A group's settings as they are: every setting, with its default where none was given.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct GroupSettings {
    /// Units/s never throttled below while asked for.
    pub reserved: f64,
    /// Units/s never admitted above; `null`: unlimited.
    pub limit: Option<f64>,
    /// Units the group may bank; `null`: one second of its limit.
    pub burst: Option<f64>,
    /// Its priority.
    pub priority: PriorityValue,
    /// Its weight among groups of its priority.
    pub weight: f64,
    /// Units it may consume over its budget period; `null`: no budget. The budget is the
    /// quota of `budget_period`, and is among `quotas` too.
    pub budget: Option<f64>,
    /// The window its budget counts over.
    pub budget_period: BudgetPeriodName,
    /// Units it may consume per window, for each window that has a quota: counts, never
    /// overrun; while any is spent the group admits nothing, its reservation included.
    pub quotas: Quotas,
    /// Its ramp-up, if any.
    pub ramp: Option<Ramp>,
    /// What dropped work counts for.
    pub dropped: Dropped,
    /// Seconds over which debt is paid back.
    pub debt_repay_s: f64,
    /// Reads and writes are limited apart (TiDB's RU for reads and writes).
    pub reads_writes_apart: bool,
    /// Units/s the group may put on its backend; `null`: no such cap.
    pub backend_limit: Option<f64>,
    /// Background work: admitted only from what others leave.
    pub background: bool,
    /// Shadow mode: decided and counted, never refused (`would_refuse_total` in the status).
    pub shadow: bool,
    /// The share of the burst (0 to 0.9) normal and sheddable requests leave for critical ones.
    pub critical_reserve: f64,
    /// The most requests in flight at once across all clients; `null`: no such limit.
    pub max_in_flight: Option<u32>,
    /// The group it is nested under; `null`: a group of its own.
    pub parent: Option<String>,
}

impl From<&v1::GroupSettings> for GroupSettings {
    fn from(s: &v1::GroupSettings) -> GroupSettings {
        let ramp = s.ramp.as_ref().map(|r| Ramp {
            min: r.min,
            max: r.max,
            duration_s: r.duration_s,
            mode: match v1::RampMode::try_from(r.mode) {
                Ok(v1::RampMode::Scheduled) => RampModeName::Scheduled,
                Ok(v1::RampMode::OnlyIfUsed) => RampModeName::OnlyIfUsed,
                Ok(v1::RampMode::GoBackN) => RampModeName::GoBackN,
                _ => RampModeName::Relaxed,
            },
            threshold_pct: r.threshold_pct,
            ramp_down_pct: r.ramp_down_pct,
            cool_down_s: r.cool_down_s,
            resume_ttl_s: r.resume_ttl_s,
        });
        GroupSettings {
            reserved: s.reserved,
            limit: s.limit,
            burst: s.burst,
            priority: PriorityValue::of(s.priority),
            weight: s.weight,
            budget: s.budget,
            quotas: Quotas::from_map(&s.quotas),
            budget_period: match s.budget_period.as_str() {
                "minute" => BudgetPeriodName::Minute,
                "hour" => BudgetPeriodName::Hour,
                "day" => BudgetPeriodName::Day,
                "week" => BudgetPeriodName::Week,
                "month" => BudgetPeriodName::Month,
                _ => BudgetPeriodName::Total,
            },
            ramp,
            dropped: if s.count_dropped { Dropped::Count } else { Dropped::Return },
            debt_repay_s: s.debt_repay_s.unwrap_or(5.0),
            reads_writes_apart: s.reads_writes_apart,
            backend_limit: s.backend_limit,
            background: s.background,
            shadow: s.shadow,
            critical_reserve: s.critical_reserve,
            max_in_flight: s.max_in_flight,
            parent: s.parent.clone(),
        }
    }
}

/// A group, named, with its settings.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Group {
    /// Its name.
    pub name: String,
    /// Its settings.
    pub settings: GroupSettings,
}

/// A page of groups, by name.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct GroupPage {
    /// The groups on this page.
    pub groups: Vec<Group>,
    /// Pass as `page_token` for the next page; `null` on the last.
    pub next_page_token: Option<String>,
}

/// A group's settings to set: only the fields given change; `null` clears what may be
/// cleared (`burst`, `budget`, `ramp`, `backend_limit`, `max_in_flight`, `parent`) and makes
/// `limit` unlimited.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GroupBody {
    /// The group's name: required to create one with `POST /v1/groups`; elsewhere the path
    /// names it, and a name given here must be the same.
    #[serde(default)]
    pub name: Option<String>,
    /// Units/s never throttled below while asked for.
    #[serde(default, deserialize_with = "finite_opt")]
    #[schema(minimum = 0.0, maximum = 1e15)]
    pub reserved: Option<f64>,
    /// Units/s never admitted above, or `"unlimited"`.
    #[serde(default)]
    #[schema(value_type = Option<LimitValue>)]
    pub limit: Patch<LimitValue>,
    /// Units the group may bank.
    #[serde(default, deserialize_with = "finite_patch")]
    #[schema(value_type = Option<f64>, exclusive_minimum = 0.0, maximum = 1e18)]
    pub burst: Patch<f64>,
    /// Its priority.
    #[serde(default)]
    pub priority: Option<PriorityValue>,
    /// Its weight among groups of its priority.
    #[serde(default, deserialize_with = "finite_opt")]
    #[schema(exclusive_minimum = 0.0, maximum = 1e6)]
    pub weight: Option<f64>,
    /// Units it may consume over its budget period.
    #[serde(default, deserialize_with = "finite_patch")]
    #[schema(value_type = Option<f64>, exclusive_minimum = 0.0, maximum = 1e18)]
    pub budget: Patch<f64>,
    /// The window its budget counts over (a budget already set moves to it).
    #[serde(default)]
    pub budget_period: Option<BudgetPeriodName>,
    /// Quotas per window: units for each window given, `null` to remove one; the windows not
    /// given are unchanged.
    #[serde(default)]
    pub quotas: Option<QuotasPatch>,
    /// Its ramp-up.
    #[serde(default)]
    #[schema(value_type = Option<Ramp>)]
    pub ramp: Patch<Ramp>,
    /// What dropped work counts for.
    #[serde(default)]
    pub dropped: Option<Dropped>,
    /// Seconds over which debt is paid back.
    #[serde(default, deserialize_with = "finite_opt")]
    #[schema(minimum = 0.0, maximum = 31536000.0)]
    pub debt_repay_s: Option<f64>,
    /// Reads and writes are limited apart.
    #[serde(default)]
    pub reads_writes_apart: Option<bool>,
    /// Units/s the group may put on its backend.
    #[serde(default, deserialize_with = "finite_patch")]
    #[schema(value_type = Option<f64>, exclusive_minimum = 0.0, maximum = 1e15)]
    pub backend_limit: Patch<f64>,
    /// Background work: admitted only from what others leave.
    #[serde(default)]
    pub background: Option<bool>,
    /// Shadow mode on or off.
    #[serde(default)]
    pub shadow: Option<bool>,
    /// The share of the burst kept for critical requests, 0 to 0.9.
    #[serde(default, deserialize_with = "finite_opt")]
    #[schema(minimum = 0.0, maximum = 0.9)]
    pub critical_reserve: Option<f64>,
    /// The most requests in flight at once across all clients (1 to 1,000,000); `null`
    /// removes the limit.
    #[serde(default)]
    #[schema(value_type = Option<u32>, minimum = 1, maximum = 1000000)]
    pub max_in_flight: Patch<u64>,
    /// The group to nest it under (a configured group, at most 8 levels deep, no cycle);
    /// `null` makes it a group of its own.
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub parent: Patch<String>,
}

impl GroupBody {
    /// The change it asks for, in the contract's terms.
    pub fn to_patch(&self) -> v1::GroupPatch {
        let mut p =
            v1::GroupPatch { reserved: self.reserved, weight: self.weight, ..v1::GroupPatch::default() };
        match self.limit {
            Patch::Absent => {}
            Patch::Null | Patch::Value(LimitValue::Unlimited(_)) => p.unlimited = true,
            Patch::Value(LimitValue::Units(u)) => p.limit = Some(u),
        }
        self.burst.set(&mut p.burst, &mut p.clear_burst, |v| *v);
        p.priority = self.priority.as_ref().map(PriorityValue::level);
        self.budget.set(&mut p.budget, &mut p.clear_budget, |v| *v);
        if let Some(q) = &self.quotas {
            for (name, patch) in q.windows() {
                match patch {
                    Patch::Absent => {}
                    Patch::Null => {
                        p.quotas.insert(name.into(), 0.0);
                    }
                    Patch::Value(u) => {
                        p.quotas.insert(name.into(), *u);
                    }
                }
            }
            for (name, units) in &q.seconds {
                p.quotas.insert(name.clone(), units.unwrap_or(0.0));
            }
        }
        p.budget_period = self.budget_period.map(|b| {
            match b {
                BudgetPeriodName::Total => "total",
                BudgetPeriodName::Minute => "minute",
                BudgetPeriodName::Hour => "hour",
                BudgetPeriodName::Day => "day",
                BudgetPeriodName::Week => "week",
                BudgetPeriodName::Month => "month",
            }
            .to_string()
        });
        self.ramp.set(&mut p.ramp, &mut p.clear_ramp, ramp_to_proto);
        p.count_dropped = self.dropped.map(|d| d == Dropped::Count);
        p.debt_repay_s = self.debt_repay_s;
        p.reads_writes_apart = self.reads_writes_apart;
        self.backend_limit.set(&mut p.backend_limit, &mut p.clear_backend_limit, |v| *v);
        p.background = self.background;
        p.shadow = self.shadow;
        p.critical_reserve = self.critical_reserve;
        // Past u32, it is past the limit: refused as the largest u32 would be.
        self.max_in_flight
            .set(&mut p.max_in_flight, &mut p.clear_max_in_flight, |n| u32::try_from(*n).unwrap_or(u32::MAX));
        self.parent.set(&mut p.parent, &mut p.clear_parent, Clone::clone);
        p
    }
}

fn ramp_to_proto(r: &Ramp) -> v1::RampSettings {
    v1::RampSettings {
        min: r.min,
        max: r.max,
        duration_s: r.duration_s,
        mode: match r.mode {
            RampModeName::Scheduled => v1::RampMode::Scheduled,
            RampModeName::Relaxed => v1::RampMode::Relaxed,
            RampModeName::OnlyIfUsed => v1::RampMode::OnlyIfUsed,
            RampModeName::GoBackN => v1::RampMode::GoBackN,
        } as i32,
        threshold_pct: r.threshold_pct,
        ramp_down_pct: r.ramp_down_pct,
        cool_down_s: r.cool_down_s,
        resume_ttl_s: r.resume_ttl_s,
    }
}

/// How free capacity is shared.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ModeName {
    /// Reservations first, then the rest by priority and weight.
    Share,
    /// First come, first served.
    Fcfs,
}

/// The node settings.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct NodeSettings {
    /// Units/s the backend sustains; `null`: none set.
    pub capacity: Option<f64>,
    /// How free capacity is shared.
    pub mode: ModeName,
    /// A group with no client reserves a tenth of its reservation until a tick has seen one.
    pub slow_start: bool,
    /// Every group in shadow mode: decided and counted, never refused.
    pub shadow: bool,
    /// The one switch: `false` while throttling is off for the whole node (every setting
    /// kept, nothing refused).
    pub throttling: bool,
}

/// Node settings to change: only the fields given change; `capacity: null` removes it.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NodeBody {
    /// Units/s the backend sustains; `null` removes it.
    #[serde(default, deserialize_with = "finite_patch")]
    #[schema(value_type = Option<f64>)]
    pub capacity: Patch<f64>,
    /// How free capacity is shared.
    #[serde(default)]
    pub mode: Option<ModeName>,
    /// Slow start on or off.
    #[serde(default)]
    pub slow_start: Option<bool>,
    /// Every group in shadow mode, or only those whose settings ask for it.
    #[serde(default)]
    pub shadow: Option<bool>,
    /// The one switch: throttling on (`true`) or off for the whole node.
    #[serde(default)]
    pub throttling: Option<bool>,
}

/// An admission to decide.
#[derive(Debug, Clone, PartialEq, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckBody<'a> {
    /// The group the work belongs to (created on first use from the default group's settings);
    /// absent: the token's default group.
    #[serde(default, borrow)]
    pub group: Option<Cow<'a, str>>,
    /// Its cost in units, 0 to 1e9; 1 when not given.
    #[serde(default = "one", deserialize_with = "finite")]
    pub cost: f64,
    /// Its class within the group: critical work is served first, sheddable work refused
    /// first; normal when not given.
    #[serde(default)]
    pub class: ClassName,
    /// Admit it whatever the group has left, still counted against the group and the
    /// capacity (Couchbase's Unthrottled privilege): only for a token with the
    /// `unthrottled` privilege, or a server without `--auth`.
    #[serde(default)]
    pub unthrottled: bool,
}

/// A request to admit and keep a permit until it is released: for groups with an in-flight
/// quota (`max_in_flight`), the permit holds one of its slots meanwhile.
#[derive(Debug, Clone, PartialEq, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AcquireBody<'a> {
    /// The group the work belongs to; absent: the token's default group.
    #[serde(default, borrow)]
    pub group: Option<Cow<'a, str>>,
    /// Its cost in units, 0 to 1e9; 1 when not given.
    #[serde(default = "one", deserialize_with = "finite")]
    pub cost: f64,
    /// Its class within the group; normal when not given.
    #[serde(default)]
    pub class: ClassName,
    /// Seconds until the permit is released by itself, should the caller never release it
    /// (1 to 86,400; 60 when not given). `POST /v1/renew` extends it.
    #[serde(default, deserialize_with = "finite_opt")]
    pub lease_s: Option<f64>,
}

/// A permit handed out.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Acquired {
    /// Always `true`.
    pub admitted: bool,
    /// The group.
    pub group: String,
    /// The permit's id: give it to `POST /v1/release` when the work is done.
    pub permit: String,
    /// Seconds until the permit is released by itself.
    pub lease_s: f64,
    /// Whole units left in this server's grant for the group now.
    pub remaining: f64,
}

/// A permit to give back.
#[derive(Debug, Clone, PartialEq, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReleaseBody {
    /// The permit's id, as `POST /v1/acquire` gave it.
    pub permit: String,
    /// What the work really cost, 0 to 1e9, once known: more than admitted becomes debt,
    /// less is given back. Absent: the cost admitted stands.
    #[serde(default, deserialize_with = "finite_opt")]
    pub cost: Option<f64>,
}

/// A permit given back.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Released {
    /// The group.
    pub group: String,
    /// The permit's id.
    pub permit: String,
    /// The cost the work was settled at.
    pub cost: f64,
}

/// A permit's lease to extend.
#[derive(Debug, Clone, PartialEq, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RenewBody {
    /// The permit's id, as `POST /v1/acquire` gave it.
    pub permit: String,
    /// Seconds from now until it is released by itself (1 to 86,400; 60 when not given).
    #[serde(default, deserialize_with = "finite_opt")]
    pub lease_s: Option<f64>,
}

/// A permit's lease extended.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Renewed {
    /// The group.
    pub group: String,
    /// The permit's id.
    pub permit: String,
    /// Seconds from now until it is released by itself.
    pub lease_s: f64,
}

/// A request's class within its group.
#[derive(Debug, Clone, Copy, PartialEq, Default, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ClassName {
    /// May empty the group's bucket.
    Critical,
    /// Leaves the group's `critical_reserve`.
    #[default]
    Normal,
    /// Refused first.
    Sheddable,
}

impl ClassName {
    /// The client library's class.
    pub fn class(self) -> tollgate_limiter::RequestClass {
        match self {
            ClassName::Critical => tollgate_limiter::RequestClass::Critical,
            ClassName::Normal => tollgate_limiter::RequestClass::Normal,
            ClassName::Sheddable => tollgate_limiter::RequestClass::Sheddable,
        }
    }
}

/// Work already done, charged whatever the group has left (or, with `refund`, units given
/// back).
#[derive(Debug, Clone, PartialEq, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ChargeBody<'a> {
    /// The group the work belongs to; absent: the token's default group.
    #[serde(default, borrow)]
    pub group: Option<Cow<'a, str>>,
    /// Units, 0 to 1e9.
    #[serde(deserialize_with = "finite")]
    pub units: f64,
    /// Give the units back instead (a deposit), never past the group's burst.
    #[serde(default)]
    pub refund: bool,
}

/// A charge or refund made.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Charged {
    /// Units charged (negative: refunded).
    pub charged: f64,
    /// The group.
    pub group: String,
    /// Units left in this server's grant for the group now; below zero while a debt is owed.
    pub remaining: f64,
}

fn one() -> f64 {
    1.0
}

/// An admission granted.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Admitted {
    /// Always `true`.
    pub admitted: bool,
    /// The group.
    pub group: String,
    /// Whole units left in this server's grant for the group now.
    pub remaining: f64,
}

/// An admission refused for now.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Refused {
    /// Always `false`.
    pub admitted: bool,
    /// The group.
    pub group: String,
    /// Milliseconds until it may be admitted (also in `Retry-After`, in seconds).
    pub retry_after_ms: u64,
}

/// A group dropped.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct DroppedGroup {
    /// The group dropped; `null` with `?if_exists=true` when there was none.
    pub dropped: Option<String>,
}

/// What went wrong (RFC 9457 problem details), naming the field and the rule it broke.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Problem {
    /// Always `about:blank`: the status says what kind of problem it is.
    #[serde(rename = "type")]
    pub kind: String,
    /// The status's reason phrase.
    pub title: String,
    /// The HTTP status.
    pub status: u16,
    /// What went wrong, in a sentence (`field: rule`).
    pub detail: String,
    /// The same sentence (kept for clients that read `error`).
    pub error: String,
    /// The field or parameter at fault; empty when none is.
    pub field: String,
    /// The rule it broke.
    pub rule: String,
}

/// The problems any call may meet with `--auth`.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)]
pub enum AuthProblems {
    /// No token, or one refused.
    #[response(
        status = 401,
        description = "No token, or one refused",
        content_type = "application/problem+json"
    )]
    Unauthorized(Problem),
    /// A token whose role does not cover the call.
    #[response(
        status = 403,
        description = "A token whose role does not cover it",
        content_type = "application/problem+json"
    )]
    Forbidden(Problem),
}

/// The problems a change may meet beside [`AuthProblems`].
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)]
pub enum ChangeProblems {
    /// A field breaks a rule.
    #[response(
        status = 400,
        description = "A field breaks a rule",
        content_type = "application/problem+json"
    )]
    BadRequest(Problem),
    /// The body is over 64 KiB.
    #[response(
        status = 413,
        description = "The body is too large",
        content_type = "application/problem+json"
    )]
    TooLarge(Problem),
    /// The store cannot take the change now.
    #[response(
        status = 503,
        description = "The store cannot take the change now",
        content_type = "application/problem+json"
    )]
    Unavailable(Problem),
}

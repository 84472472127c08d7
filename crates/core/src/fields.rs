//! Every group setting, declared once: its name, kind, range, default, unit and meaning.
//!
//! The layers a setting passes through take their names and ranges from here: the settings'
//! own checks ([`GroupSettings`](crate::settings::GroupSettings)), the TOML reader's list of
//! keys, and the Python client's table (`clients/python/tollgate/_fields.py`, generated from
//! [`python_table`] and checked current by a test). The layers written by hand (the protocol's
//! messages, the HTTP body and its OpenAPI schema, the `tollgate group` flags) are checked
//! against this table by the conformance test (`crates/cli/tests/it/fields.rs`): a layer
//! that lacks a setting, or states another range, fails it.
//!
//! Adding a setting is one entry here and its behaviour in the engine; the conformance test
//! then names each layer still missing it.

use std::time::Duration;

/// The longest duration any setting takes (a ramp's duration, cool-down or resume TTL): one
/// year.
pub const DURATION_MAX: Duration = Duration::from_secs(365 * 24 * 3600);

/// The largest rate any setting takes, in units/s (reserved, limit, a ramp's min and max):
/// far above any real rate, low enough that sums of many stay exact to a unit.
pub const RATE_MAX: f64 = 1e15;

/// The largest amount any setting takes, in units (burst, budget).
pub const UNITS_MAX: f64 = 1e18;

/// The largest weight.
pub const WEIGHT_MAX: f64 = 1e6;

/// The largest `max_in_flight`: a million requests in flight in one group.
pub const MAX_IN_FLIGHT: u32 = 1_000_000;

/// The largest `critical_reserve`: some of the burst is always open to normal work.
pub const CRITICAL_RESERVE_MAX: f64 = 0.9;

/// What kind of value a setting takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Kind {
    /// A number.
    Number,
    /// A whole number.
    Whole,
    /// `true` or `false`.
    Flag,
    /// One of these words.
    Choice(&'static [&'static str]),
    /// A group's name.
    Name,
    /// A table of keys of its own.
    Table,
}

/// The range of a number: from `min` (excluded when `above_min`) to `max`, both in the
/// setting's unit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Range {
    /// The least value, or the bound values must be above.
    pub min: f64,
    /// Whether `min` itself is refused.
    pub above_min: bool,
    /// The greatest value.
    pub max: f64,
}

impl Range {
    /// From `min` to `max`, both allowed.
    pub const fn from(min: f64, max: f64) -> Range {
        Range { min, above_min: false, max }
    }

    /// Above `min`, up to `max`.
    pub const fn above(min: f64, max: f64) -> Range {
        Range { min, above_min: true, max }
    }

    /// Whether `value` is within.
    pub fn holds(&self, value: f64) -> bool {
        value.is_finite()
            && value <= self.max
            && if self.above_min { value > self.min } else { value >= self.min }
    }
}

/// One group setting.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Field {
    /// Its name: the TOML key, the JSON field and (but for [`Field::proto`]) the protocol's.
    pub name: &'static str,
    /// Its name in the protocol's messages, where it differs.
    pub proto: &'static str,
    /// Its `tollgate group create/alter` flag, without the dashes.
    pub flag: &'static str,
    /// What it takes.
    pub kind: Kind,
    /// For a number, its range.
    pub range: Option<Range>,
    /// Its default, as TOML writes it (`""`: none).
    pub default: &'static str,
    /// The unit of a number (`""`: none).
    pub unit: &'static str,
    /// A value that holds, as TOML writes it (for the conformance test).
    pub example: &'static str,
    /// What it does.
    pub doc: &'static str,
}

const fn field(name: &'static str, kind: Kind, range: Option<Range>, doc: &'static str) -> Field {
    Field { name, proto: name, flag: name, kind, range, default: "", unit: "", example: "", doc }
}

const fn with(f: Field, default: &'static str, unit: &'static str, example: &'static str) -> Field {
    Field { default, unit, example, ..f }
}

/// Units/s never throttled below while asked for.
pub const RESERVED: Field = with(
    field(
        "reserved",
        Kind::Number,
        Some(Range::from(0.0, RATE_MAX)),
        "units/s never throttled below while asked for",
    ),
    "0",
    "units/s",
    "10.0",
);
/// Units/s never admitted above.
pub const LIMIT: Field = with(
    field("limit", Kind::Number, Some(Range::from(0.0, RATE_MAX)), "units/s never admitted above"),
    "unlimited",
    "units/s",
    "100.0",
);
/// Units a client may bank.
pub const BURST: Field = with(
    field("burst", Kind::Number, Some(Range::above(0.0, UNITS_MAX)), "units a client may bank"),
    "one second of the grant",
    "units",
    "50.0",
);
/// Priority for free capacity and queued work.
pub const PRIORITY: Field = with(
    field(
        "priority",
        Kind::Whole,
        Some(Range::from(1.0, 16.0)),
        "priority for free capacity: low, medium, high or 1 to 16",
    ),
    "medium",
    "",
    "16",
);
/// Share of free capacity among groups of one priority.
pub const WEIGHT: Field = with(
    field(
        "weight",
        Kind::Number,
        Some(Range::above(0.0, WEIGHT_MAX)),
        "share of free capacity among groups of one priority",
    ),
    "1",
    "",
    "2.0",
);
/// Units the group may consume over its budget period.
pub const BUDGET: Field = with(
    field(
        "budget",
        Kind::Number,
        Some(Range::above(0.0, UNITS_MAX)),
        "units the group may consume over its budget period",
    ),
    "",
    "units",
    "1000.0",
);
/// The window the budget counts over.
pub const BUDGET_PERIOD: Field = with(
    field(
        "budget_period",
        Kind::Choice(&["total", "minute", "hour", "day", "week", "month"]),
        None,
        "the window the budget counts over",
    ),
    "total",
    "",
    "\"total\"",
);
/// Units per window, for each window with a quota.
pub const QUOTAS: Field = Field {
    flag: "quota",
    ..with(
        field("quotas", Kind::Table, None, "units per window, for each window with a quota"),
        "",
        "units",
        "{ minute = 100 }",
    )
};
/// The ramp-up.
pub const RAMP: Field = with(
    field("ramp", Kind::Table, None, "a ramp-up of the limit"),
    "",
    "",
    "{ min = 1, max = 10, duration_s = 5 }",
);
/// What work admitted and then dropped does.
pub const DROPPED: Field = Field {
    proto: "count_dropped",
    ..with(
        field(
            "dropped",
            Kind::Choice(&["return", "count"]),
            None,
            "what work admitted and then dropped does",
        ),
        "return",
        "",
        "\"count\"",
    )
};
/// Over how long a debt is paid back.
pub const DEBT_REPAY_S: Field = with(
    field(
        "debt_repay_s",
        Kind::Number,
        Some(Range::from(0.0, DURATION_MAX.as_secs() as f64)),
        "over how long a debt is paid back from the refill",
    ),
    "5",
    "s",
    "2.0",
);
/// Reads and writes limited apart.
pub const READS_WRITES_APART: Field = with(
    field("reads_writes_apart", Kind::Flag, None, "the limit and reservation apply to reads and writes each"),
    "false",
    "",
    "true",
);
/// The units/s the group may use on each backend.
pub const BACKEND_LIMIT: Field = with(
    field(
        "backend_limit",
        Kind::Number,
        Some(Range::above(0.0, RATE_MAX)),
        "units/s the group may use on each backend",
    ),
    "",
    "units/s",
    "40.0",
);
/// A backend's own background work.
pub const BACKGROUND: Field = with(
    field("background", Kind::Flag, None, "a backend's own background work, served from what others leave"),
    "false",
    "",
    "true",
);
/// Shadow mode.
pub const SHADOW: Field =
    with(field("shadow", Kind::Flag, None, "decided and counted, never refused"), "false", "", "true");
/// The share of the burst kept for critical work.
pub const CRITICAL_RESERVE: Field = with(
    field(
        "critical_reserve",
        Kind::Number,
        Some(Range::from(0.0, CRITICAL_RESERVE_MAX)),
        "the share of the burst normal and sheddable work leave for critical work",
    ),
    "0",
    "",
    "0.5",
);
/// The most requests in flight at once.
pub const MAX_IN_FLIGHT_FIELD: Field = with(
    field(
        "max_in_flight",
        Kind::Whole,
        Some(Range::from(1.0, MAX_IN_FLIGHT as f64)),
        "the most requests in flight at once across all clients",
    ),
    "",
    "requests",
    "10",
);
/// The group it is nested under.
pub const PARENT: Field =
    with(field("parent", Kind::Name, None, "the group it is nested under"), "", "", "\"p\"");

/// Every group setting, in the order the documents list them.
pub const GROUP_FIELDS: &[Field] = &[
    RESERVED,
    LIMIT,
    BURST,
    PRIORITY,
    WEIGHT,
    BUDGET,
    BUDGET_PERIOD,
    QUOTAS,
    RAMP,
    DROPPED,
    DEBT_REPAY_S,
    READS_WRITES_APART,
    BACKEND_LIMIT,
    BACKGROUND,
    SHADOW,
    CRITICAL_RESERVE,
    MAX_IN_FLIGHT_FIELD,
    PARENT,
];

/// The setting called `name`.
pub fn field_named(name: &str) -> Option<&'static Field> {
    GROUP_FIELDS.iter().find(|f| f.name == name)
}

/// The settings' names, comma-separated, for errors that list them.
pub fn names() -> String {
    GROUP_FIELDS.iter().map(|f| f.name).collect::<Vec<_>>().join(", ")
}

/// The Python client's table of settings (`clients/python/tollgate/_fields.py`), generated
/// from [`GROUP_FIELDS`].
pub fn python_table() -> String {
    let mut out = String::from(
        "\"\"\"The group settings, as the server declares them: name to (kind, least, greatest, unit).\n\n\
         Generated from the server's declaration of its settings (`tollgate_model::fields`); a test\n\
         checks it is current. Do not edit.\"\"\"\n\n\
         from typing import Dict, Optional, Tuple\n\n\
         FIELDS: Dict[str, Tuple[str, Optional[float], Optional[float], str]] = {\n",
    );
    for f in GROUP_FIELDS {
        let kind = match f.kind {
            Kind::Number => "number",
            Kind::Whole => "whole",
            Kind::Flag => "flag",
            Kind::Choice(_) => "choice",
            Kind::Name => "name",
            Kind::Table => "table",
        };
        let (min, max) = match f.range {
            Some(r) => (python_number(r.min), python_number(r.max)),
            None => ("None".to_string(), "None".to_string()),
        };
        out.push_str(&format!("    \"{}\": (\"{kind}\", {min}, {max}, \"{}\"),\n", f.name, f.unit));
    }
    out.push_str("}\n");
    out
}

fn python_number(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e12 { format!("{x:.1}") } else { format!("{x:e}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_setting_is_declared_once_with_an_example_in_its_range() {
        for (i, f) in GROUP_FIELDS.iter().enumerate() {
            assert!(GROUP_FIELDS[..i].iter().all(|g| g.name != f.name), "{} declared twice", f.name);
            assert!(!f.example.is_empty() && !f.doc.is_empty(), "{}: example and doc", f.name);
            if let Some(r) = f.range {
                let x: f64 = f.example.parse().unwrap();
                assert!(r.holds(x), "{}: its example {x} is out of its range", f.name);
                assert!(!r.holds(r.max * 2.0 + 1.0), "{}: above the range holds", f.name);
            }
        }
    }
}

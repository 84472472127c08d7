//! Storage scenarios: a file with a `[storage]` table, which `tollgate sim` runs in the
//! [`storage`](crate::storage) simulation and checks against the totals it expects.
//!
//! ```toml
//! name = "dmclock-fan-out"
//!
//! [storage]
//! backends = [100, 100, 100]   # each backend's capacity, units/s
//! cross = true                 # charge the work other backends did (dmClock)
//! split = "none"               # a limit's shares: "none", "even" or "follow-load"
//! lend_idle = false            # idle backends lend capacity past a share
//! max_wait_s = 2               # optional: a request waiting longer for its share is refused
//! warm_up_s = 10
//! measure_s = 30
//!
//! [[storage.group]]
//! name = "spread"
//! rate = 1000                  # sets its weight, as a reservation or limit does
//! offers = ["busy", "busy", 10] # units/s to each backend; "busy": work always waits
//! sizes = [1, 1, 1, 25]        # optional: each request's cost, taken in turn (default [1])
//! limit = 150                  # optional: held to a share of it on each backend
//! expect = 70                  # optional: the units/s it should get over all backends
//! within = 0.05                # the tolerance of `expect` (a share of it; 0.05 unless set)
//! ```

use std::time::Duration;

use tollgate_model::config::{ConfigError, ConfigErrors};
use tollgate_model::settings::GroupName;
use tollgate_model::toml_reader::{Reader, Value, line_of};
use toml::de::{DeTable, DeValue};

use crate::storage::{GroupMarks, Split, StorageGroup, StorageOutcome, StorageSpec};

/// The most backends a storage scenario has.
pub const STORAGE_BACKENDS_MAX: usize = 16;
/// The most groups a storage scenario has.
pub const STORAGE_GROUPS_MAX: usize = 100;
/// The largest capacity of a backend, units/s (the simulation serves one unit at a time).
pub const STORAGE_CAPACITY_MAX: f64 = 10_000.0;
/// The longest simulated time, warm-up and measure together, seconds.
pub const STORAGE_SECONDS_MAX: f64 = 600.0;
/// The most request sizes a group cycles through.
pub const STORAGE_SIZES_MAX: usize = 64;
/// The tolerance of an expectation unless the scenario sets one.
const WITHIN_DEFAULT: f64 = 0.05;

/// A storage scenario: the simulation to run and what each group should get.
#[derive(Debug, Clone)]
pub struct StorageScenario {
    /// Its name.
    pub name: String,
    /// The simulation.
    pub spec: StorageSpec,
    /// By group, in the spec's order: the units/s expected over all backends and the
    /// tolerance, a share of it.
    pub expect: Vec<Option<(f64, f64)>>,
}

impl StorageScenario {
    /// Whether `src` is a storage scenario (it has a `[storage]` table).
    pub fn is_storage(src: &str) -> bool {
        DeTable::parse(src).is_ok_and(|doc| doc.get_ref().contains_key("storage"))
    }

    /// Parses a storage scenario, reporting every problem with its line and key.
    pub fn parse(src: &str) -> Result<StorageScenario, ConfigErrors> {
        let mut r = Reader::new(src);
        let parsed = match DeTable::parse(src) {
            Ok(doc) => read(&mut r, doc.get_ref()),
            Err(e) => {
                let line = e.span().map_or(1, |s| line_of(src, s.start));
                let rule = e.message().trim().to_string();
                r.errors.push(ConfigError { line, field: "(syntax)".into(), rule });
                None
            }
        };
        match parsed {
            Some(s) if r.errors.is_empty() => Ok(s),
            _ => {
                let mut errors = r.errors;
                errors.sort_by_key(|e| e.line);
                Err(ConfigErrors(errors))
            }
        }
    }

    /// Two lines per group (what it got over all backends and on each, and its expectation;
    /// then its high-water marks), and whether every expectation held.
    pub fn verdict(&self, out: &StorageOutcome) -> (Vec<String>, bool) {
        let mut passed = true;
        let mut lines = Vec::new();
        for (g, group) in self.spec.groups.iter().enumerate() {
            let got = out.total(g);
            let each: Vec<String> = out.served[g].iter().map(|u| format!("{u:.1}")).collect();
            let mut line = format!("{}: {got:.1} units/s (backends: {})", group.name, each.join(", "));
            if let Some((want, within)) = self.expect[g] {
                let ok = (got - want).abs() <= want * within;
                passed &= ok;
                let verdict = if ok { "ok" } else { "FAILED" };
                line.push_str(&format!("; expected {want} within {:.0} %: {verdict}", within * 100.0));
            }
            lines.push(line);
            lines.push(marks_line(&out.marks[g]));
        }
        (lines, passed)
    }
}

/// A group's marks as the controller would show them at the end of the run.
fn marks_line(m: &GroupMarks) -> String {
    let rate = m.rate.0.map_or("none".to_string(), |r| {
        format!("low {:.1}, average {:.1}, high {:.1}", r.low, r.average, r.high)
    });
    format!(
        "  marks: largest request {:.1} (last minute), {:.1} (last hour); units/s over the last minute: {rate}; refused {}",
        m.largest.0, m.largest.1, m.refused
    )
}

fn read(r: &mut Reader<'_>, doc: &DeTable<'_>) -> Option<StorageScenario> {
    let name = match doc.get("name") {
        Some(v) => r.string("name", v).map(str::to_string)?,
        None => {
            r.error(0..0, "name", "is required");
            return None;
        }
    };
    if let Some((k, _)) = doc.iter().find(|(k, _)| !matches!(k.get_ref().as_ref(), "name" | "storage")) {
        r.error(k.span(), k.get_ref().as_ref(), "unknown field; expected one of name, storage");
    }
    let storage = doc.get("storage")?;
    let mut f = r.fields("storage", storage)?;
    let backends = match f.take("backends") {
        Some((path, v)) => bounded(r, &path, v, "capacities, units/s", "backends", STORAGE_BACKENDS_MAX),
        None => {
            r.error(storage.span(), "storage.backends", "is required");
            None
        }
    };
    let flag = |r: &mut Reader<'_>, f: &mut tollgate_model::toml_reader::Fields<'_, '_>, key| {
        f.take(key).and_then(|(p, v)| r.boolean(&p, v)).unwrap_or(false)
    };
    let (cross, lend_idle) = (flag(r, &mut f, "cross"), flag(r, &mut f, "lend_idle"));
    let split = f.take("split").map_or(Some(Split::None), |(p, v)| match r.string(&p, v)? {
        "none" => Some(Split::None),
        "even" => Some(Split::Even),
        "follow-load" => Some(Split::FollowLoad),
        other => {
            r.error(v.span(), p, format!("must be none, even or follow-load, got {other:?}"));
            None
        }
    });
    let mut seconds = |key: &str, default: f64| {
        f.take(key).map_or(Some(default), |(p, v)| {
            let s = r.positive(&p, v)?;
            if s > STORAGE_SECONDS_MAX {
                r.error(v.span(), p, format!("must be at most {STORAGE_SECONDS_MAX} seconds, got {s}"));
                return None;
            }
            Some(s)
        })
    };
    let (warm_up, measure) = (seconds("warm_up_s", 10.0), seconds("measure_s", 30.0));
    let max_wait = f.take("max_wait_s").map_or(Some(None), |(p, v)| max_wait(r, &p, v).map(Some));
    let groups = f.take("group").and_then(|(p, v)| groups(r, &p, v, backends.as_ref().map_or(0, Vec::len)));
    r.finish(f, "backends, cross, split, lend_idle, max_wait_s, warm_up_s, measure_s, group");
    let (warm_up, measure) = (warm_up?, measure?);
    if warm_up + measure > STORAGE_SECONDS_MAX {
        r.error(
            storage.span(),
            "storage.measure_s",
            format!("warm_up_s + measure_s must be at most {STORAGE_SECONDS_MAX}"),
        );
    }
    let (groups, expect): (Vec<_>, Vec<_>) = groups?.into_iter().unzip();
    let spec = StorageSpec {
        capacities: backends?,
        groups,
        cross,
        split: split?,
        lend_idle,
        max_wait: max_wait?,
        warm_up: Duration::from_secs_f64(warm_up),
        measure: Duration::from_secs_f64(measure),
    };
    Some(StorageScenario { name, spec, expect })
}

fn max_wait(r: &mut Reader<'_>, path: &str, v: &Value<'_>) -> Option<Duration> {
    let s = r.positive(path, v)?;
    if s > STORAGE_SECONDS_MAX {
        r.error(v.span(), path, format!("must be at most {STORAGE_SECONDS_MAX} seconds, got {s}"));
        return None;
    }
    Some(Duration::from_secs_f64(s))
}

/// An array at `path` of 1 to `most` numbers above 0 and at most [`STORAGE_CAPACITY_MAX`]:
/// `what` the array holds and `each` its items, for the errors.
fn bounded(
    r: &mut Reader<'_>,
    path: &str,
    v: &Value<'_>,
    what: &str,
    each: &str,
    most: usize,
) -> Option<Vec<f64>> {
    let DeValue::Array(items) = v.get_ref() else {
        r.error(v.span(), path, format!("must be an array of {what}"));
        return None;
    };
    if items.is_empty() || items.len() > most {
        r.error(v.span(), path, format!("must hold 1 to {most} {each}, got {}", items.len()));
        return None;
    }
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let p = format!("{path}[{i}]");
        let c = r.positive(&p, item)?;
        if c > STORAGE_CAPACITY_MAX {
            r.error(item.span(), p, format!("must be at most {STORAGE_CAPACITY_MAX}, got {c}"));
            return None;
        }
        out.push(c);
    }
    Some(out)
}

type Expected = Option<(f64, f64)>;

fn groups(
    r: &mut Reader<'_>,
    path: &str,
    v: &Value<'_>,
    backends: usize,
) -> Option<Vec<(StorageGroup, Expected)>> {
    let DeValue::Array(items) = v.get_ref() else {
        r.error(v.span(), path, "must be an array of tables ([[storage.group]])");
        return None;
    };
    if items.is_empty() || items.len() > STORAGE_GROUPS_MAX {
        r.error(v.span(), path, format!("must hold 1 to {STORAGE_GROUPS_MAX} groups, got {}", items.len()));
        return None;
    }
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let path = format!("{path}[{i}]");
        let mut f = r.fields(&path, item)?;
        let name = f.take("name").and_then(|(p, v)| {
            let s = r.string(&p, v)?;
            GroupName::new(s).map_err(|e| r.error(v.span(), p, e.rule)).ok()
        });
        let rate = f.take("rate").map_or(Some(0.0), |(p, v)| r.non_negative(&p, v));
        let limit = f.take("limit").map(|(p, v)| r.positive(&p, v));
        let offers = f.take("offers").and_then(|(p, v)| offers(r, &p, v, backends));
        let sizes = f.take("sizes").map_or(Some(vec![1.0]), |(p, v)| {
            bounded(r, &p, v, "request costs, units", "costs", STORAGE_SIZES_MAX)
        });
        let expect = f.take("expect").map(|(p, v)| r.non_negative(&p, v));
        let within = f.take("within").map_or(Some(WITHIN_DEFAULT), |(p, v)| r.positive(&p, v));
        r.finish(f, "name, rate, offers, sizes, limit, expect, within");
        // Given but not good: the problem is recorded; nothing is simulated.
        if matches!(limit, Some(None)) || matches!(expect, Some(None)) || within.is_none() {
            return None;
        }
        let group =
            StorageGroup { name: name?, rate: rate?, offers: offers?, sizes: sizes?, limit: limit.flatten() };
        out.push((group, expect.flatten().zip(within)));
    }
    Some(out)
}

fn offers(r: &mut Reader<'_>, path: &str, v: &Value<'_>, backends: usize) -> Option<Vec<f64>> {
    let DeValue::Array(items) = v.get_ref() else {
        r.error(v.span(), path, "must be an array: units/s to each backend, or \"busy\"");
        return None;
    };
    if items.len() != backends {
        r.error(v.span(), path, format!("must name one offer per backend ({backends}), got {}", items.len()));
        return None;
    }
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let p = format!("{path}[{i}]");
        out.push(match item.get_ref() {
            DeValue::String(s) if s.as_ref() == "busy" => f64::INFINITY,
            _ => r.non_negative(&p, item)?,
        });
    }
    Some(out)
}

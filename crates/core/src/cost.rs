//! Cost models: what a request did, priced in units.
//!
//! Every quota, grant and measurement in Tollgate is in abstract *units*. A cost model turns a
//! description of one operation ([`Usage`]) into units, so that one quota can cover cheap and
//! expensive requests alike. The models reproduce the source designs:
//!
//! | model | read | write |
//! | --- | --- | --- |
//! | `count` | 1 per request (or the units given) | the same |
//! | `fdb` | 4096 × max(1, ⌈bytes/4096⌉) | fungibility (4) × the same, truncated |
//! | `ru` | 0.125 + 0.5 × 0.7 + bytes/65536 + cpu_ms/3 | (1 + 1 × 0.7 + bytes/1024) × replicas |
//! | `couchbase` | ⌈bytes/4096⌉ | ⌈bytes/1024⌉, × 2 when durable |
//! | `linear` | base + bytes × per-byte + cpu_ms × per-ms, with user coefficients | the same |
//!
//! Part of a cost is often only known once the request has run (the bytes a read returned, the
//! CPU it burnt). [`CostModel::upfront`] prices what is known before execution; the client
//! admits on that and settles the permit with [`CostModel::cost`] afterwards (post-hoc), the
//! difference becoming debt or being returned. Sources: FoundationDB's page cost (its global
//! tag throttler's design), TiDB's request-unit model (its resource control design),
//! Couchbase's read and write units (its memcached throttling design).

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// FoundationDB's page: costs are whole pages of this many bytes.
pub const FDB_PAGE_BYTES: u64 = 4096;
/// FoundationDB's default write/read fungibility ratio: a write costs this many reads.
pub const FDB_DEFAULT_FUNGIBILITY: f64 = 4.0;
/// Couchbase's read unit size in bytes.
pub const COUCHBASE_READ_UNIT_BYTES: u64 = 4096;
/// Couchbase's write unit size in bytes.
pub const COUCHBASE_WRITE_UNIT_BYTES: u64 = 1024;

/// Whether an operation reads or writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpKind {
    /// A read: its size and CPU are usually known only afterwards.
    Read,
    /// A write: its size is known before it runs.
    Write,
}

/// What one operation did (or is expected to do).
///
/// ```
/// use tollgate_model::cost::{CostModel, Usage};
///
/// let read = Usage::read(10_000).with_cpu_ms(3.0);
/// assert_eq!(CostModel::fdb().cost(&read).unwrap(), 12_288.0); // three 4 KiB pages
/// assert_eq!(CostModel::couchbase().cost(&read).unwrap(), 3.0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Usage {
    /// Read or write.
    pub kind: OpKind,
    /// Bytes read (for a read) or written (for a write).
    pub bytes: u64,
    /// CPU milliseconds spent serving it (charged on reads by the `ru` model).
    pub cpu_ms: f64,
    /// How many replicas a write goes to (`ru` multiplies by it); at least 1.
    pub replicas: u32,
    /// A durable write (`couchbase` charges it twice).
    pub durable: bool,
    /// Units the caller priced itself; when set, every model uses it as is.
    pub units: Option<f64>,
}

impl Usage {
    /// A read of `bytes` bytes.
    pub fn read(bytes: u64) -> Self {
        Self { kind: OpKind::Read, bytes, cpu_ms: 0.0, replicas: 1, durable: false, units: None }
    }

    /// A write of `bytes` bytes.
    pub fn write(bytes: u64) -> Self {
        Self { kind: OpKind::Write, ..Self::read(bytes) }
    }

    /// A request the caller has priced itself at `units`.
    pub fn units(units: f64) -> Self {
        Self { units: Some(units), ..Self::read(0) }
    }

    /// The same, having used `cpu_ms` milliseconds of CPU.
    pub fn with_cpu_ms(self, cpu_ms: f64) -> Self {
        Self { cpu_ms, ..self }
    }

    /// The same, written to `replicas` replicas.
    pub fn with_replicas(self, replicas: u32) -> Self {
        Self { replicas, ..self }
    }

    /// The same, as a durable write.
    pub fn durable(self) -> Self {
        Self { durable: true, ..self }
    }
}

/// A cost that cannot be used.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum CostError {
    /// The cost, or a number it was computed from, is NaN or infinite.
    #[error("{field} must be a finite number, got {value}")]
    NotFinite {
        /// Which input.
        field: &'static str,
        /// What it was.
        value: f64,
    },
    /// The cost, or a number it was computed from, is below zero.
    #[error("{field} must not be negative, got {value}")]
    Negative {
        /// Which input.
        field: &'static str,
        /// What it was.
        value: f64,
    },
    /// A write to zero replicas.
    #[error("replicas must be at least 1")]
    NoReplicas,
}

/// Checks that `value` can be used as a cost or a cost input: finite and not negative.
pub fn check_cost(field: &'static str, value: f64) -> Result<f64, CostError> {
    if !value.is_finite() {
        return Err(CostError::NotFinite { field, value });
    }
    if value < 0.0 {
        return Err(CostError::Negative { field, value });
    }
    Ok(value)
}

/// TiDB's request-unit coefficients. The defaults are TiDB's.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RuCoefficients {
    /// Per read request.
    pub read_base: f64,
    /// Per read batch, scaled by `batch_proportion`.
    pub read_per_batch: f64,
    /// Per byte read.
    pub read_per_byte: f64,
    /// Per CPU millisecond (reads only).
    pub read_per_cpu_ms: f64,
    /// Per write request.
    pub write_base: f64,
    /// Per write batch, scaled by `batch_proportion`.
    pub write_per_batch: f64,
    /// Per byte written, before the replica factor.
    pub write_per_byte: f64,
    /// The average share of a batch one request stands for.
    pub batch_proportion: f64,
}

impl Default for RuCoefficients {
    fn default() -> Self {
        Self {
            read_base: 0.125,
            read_per_batch: 0.5,
            read_per_byte: 1.0 / 65536.0,
            read_per_cpu_ms: 1.0 / 3.0,
            write_base: 1.0,
            write_per_batch: 1.0,
            write_per_byte: 1.0 / 1024.0,
            batch_proportion: 0.7,
        }
    }
}

/// A user-defined linear model: `base + bytes × per_byte + cpu_ms × per_cpu_ms`, per kind.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LinearCoefficients {
    /// Units per read request.
    pub read_base: f64,
    /// Units per byte read.
    pub read_per_byte: f64,
    /// Units per write request.
    pub write_base: f64,
    /// Units per byte written.
    pub write_per_byte: f64,
    /// Units per CPU millisecond, reads and writes alike.
    pub per_cpu_ms: f64,
}

/// What a group's requests did, in detail (TiDB's `Consumption`): read and write request
/// units, bytes, CPU and request counts. Running totals, or the difference of two.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Consumption {
    /// Read request units: what reads cost, priced by the model.
    pub rru: f64,
    /// Write request units.
    pub wru: f64,
    /// Bytes read.
    pub read_bytes: f64,
    /// Bytes written.
    pub write_bytes: f64,
    /// CPU milliseconds spent serving them.
    pub cpu_ms: f64,
    /// Read requests.
    pub read_rpcs: f64,
    /// Write requests.
    pub write_rpcs: f64,
}

impl Consumption {
    /// The field names, in the order of [`values`](Self::values).
    pub const NAMES: [&'static str; 7] =
        ["rru", "wru", "read_bytes", "write_bytes", "cpu_ms", "read_rpcs", "write_rpcs"];

    /// One request that did `usage`, priced by `model`.
    pub fn of(model: &CostModel, usage: &Usage) -> Result<Self, CostError> {
        let units = model.cost(usage)?;
        let bytes = usage.bytes as f64;
        Ok(match usage.kind {
            OpKind::Read => Self {
                rru: units,
                read_bytes: bytes,
                cpu_ms: usage.cpu_ms,
                read_rpcs: 1.0,
                ..Self::default()
            },
            OpKind::Write => Self {
                wru: units,
                write_bytes: bytes,
                cpu_ms: usage.cpu_ms,
                write_rpcs: 1.0,
                ..Self::default()
            },
        })
    }

    /// The values, in the order of [`NAMES`](Self::NAMES).
    pub fn values(&self) -> [f64; 7] {
        [self.rru, self.wru, self.read_bytes, self.write_bytes, self.cpu_ms, self.read_rpcs, self.write_rpcs]
    }

    /// From values in the order of [`NAMES`](Self::NAMES).
    pub fn from_values(v: [f64; 7]) -> Self {
        let [rru, wru, read_bytes, write_bytes, cpu_ms, read_rpcs, write_rpcs] = v;
        Self { rru, wru, read_bytes, write_bytes, cpu_ms, read_rpcs, write_rpcs }
    }

    /// Adds `other` in.
    pub fn add(&mut self, other: &Consumption) {
        let mut v = self.values();
        for (a, b) in v.iter_mut().zip(other.values()) {
            *a += b;
        }
        *self = Self::from_values(v);
    }

    /// What was added since `earlier` (never negative).
    pub fn since(&self, earlier: &Consumption) -> Consumption {
        let mut v = self.values();
        for (a, b) in v.iter_mut().zip(earlier.values()) {
            *a = (*a - b).max(0.0);
        }
        Self::from_values(v)
    }

    /// Nothing at all.
    pub fn is_zero(&self) -> bool {
        self.values().iter().all(|v| *v == 0.0)
    }
}

/// How requests are priced in units. See the [module documentation](self) for the formulas.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum CostModel {
    /// One unit per request, or the units given.
    #[default]
    Count,
    /// FoundationDB: bytes rounded up to whole 4 KiB pages, writes `fungibility` times dearer.
    Fdb {
        /// How many reads of the same size one write costs (FoundationDB's default: 4).
        fungibility: f64,
    },
    /// TiDB request units.
    Ru(RuCoefficients),
    /// Couchbase read and write units.
    Couchbase,
    /// User coefficients.
    Linear(LinearCoefficients),
}

impl CostModel {
    /// What one unit of cost counts under this model, in words for people: `requests`,
    /// `bytes` (FoundationDB's, in whole pages), `request units` (TiDB's), `read and write
    /// units` (Couchbase's) or `calibrated units`.
    pub fn unit(&self) -> &'static str {
        match self {
            CostModel::Count => "requests",
            CostModel::Fdb { .. } => "bytes",
            CostModel::Ru(_) => "request units",
            CostModel::Couchbase => "read and write units",
            CostModel::Linear(_) => "calibrated units",
        }
    }

    /// FoundationDB's model with the default fungibility ratio.
    pub fn fdb() -> Self {
        CostModel::Fdb { fungibility: FDB_DEFAULT_FUNGIBILITY }
    }

    /// TiDB's model with the default coefficients.
    pub fn ru() -> Self {
        CostModel::Ru(RuCoefficients::default())
    }

    /// Couchbase's model.
    pub fn couchbase() -> Self {
        CostModel::Couchbase
    }

    /// The model's name as written in a settings file.
    pub fn name(&self) -> &'static str {
        match self {
            CostModel::Count => "count",
            CostModel::Fdb { .. } => "fdb",
            CostModel::Ru(_) => "ru",
            CostModel::Couchbase => "couchbase",
            CostModel::Linear(_) => "linear",
        }
    }

    /// Checks the model's own coefficients: each finite and not negative, fungibility above 0.
    pub fn validate(&self) -> Result<(), CostError> {
        match self {
            CostModel::Count | CostModel::Couchbase => Ok(()),
            CostModel::Fdb { fungibility } => {
                check_cost("fungibility", *fungibility)?;
                if *fungibility == 0.0 {
                    return Err(CostError::Negative { field: "fungibility", value: 0.0 });
                }
                Ok(())
            }
            CostModel::Ru(c) => {
                for (field, v) in [
                    ("read_base", c.read_base),
                    ("read_per_batch", c.read_per_batch),
                    ("read_per_byte", c.read_per_byte),
                    ("read_per_cpu_ms", c.read_per_cpu_ms),
                    ("write_base", c.write_base),
                    ("write_per_batch", c.write_per_batch),
                    ("write_per_byte", c.write_per_byte),
                    ("batch_proportion", c.batch_proportion),
                ] {
                    check_cost(field, v)?;
                }
                Ok(())
            }
            CostModel::Linear(c) => {
                for (field, v) in [
                    ("read_base", c.read_base),
                    ("read_per_byte", c.read_per_byte),
                    ("write_base", c.write_base),
                    ("write_per_byte", c.write_per_byte),
                    ("per_cpu_ms", c.per_cpu_ms),
                ] {
                    check_cost(field, v)?;
                }
                Ok(())
            }
        }
    }

    /// The full cost of what `usage` did.
    pub fn cost(&self, usage: &Usage) -> Result<f64, CostError> {
        if let Some(units) = usage.units {
            return check_cost("units", units);
        }
        check_cost("cpu_ms", usage.cpu_ms)?;
        if usage.replicas == 0 {
            return Err(CostError::NoReplicas);
        }
        let bytes = usage.bytes;
        let units = match (self, usage.kind) {
            (CostModel::Count, _) => 1.0,
            (CostModel::Fdb { .. }, OpKind::Read) => fdb_pages_bytes(bytes) as f64,
            // FoundationDB keeps costs as integers: the product is truncated.
            (CostModel::Fdb { fungibility }, OpKind::Write) => {
                (fungibility * fdb_pages_bytes(bytes) as f64).trunc()
            }
            (CostModel::Ru(c), OpKind::Read) => {
                c.read_base
                    + c.read_per_batch * c.batch_proportion
                    + bytes as f64 * c.read_per_byte
                    + usage.cpu_ms * c.read_per_cpu_ms
            }
            (CostModel::Ru(c), OpKind::Write) => {
                (c.write_base + c.write_per_batch * c.batch_proportion + bytes as f64 * c.write_per_byte)
                    * f64::from(usage.replicas)
            }
            (CostModel::Couchbase, OpKind::Read) => bytes.div_ceil(COUCHBASE_READ_UNIT_BYTES) as f64,
            (CostModel::Couchbase, OpKind::Write) => {
                let units = bytes.div_ceil(COUCHBASE_WRITE_UNIT_BYTES) as f64;
                if usage.durable { units * 2.0 } else { units }
            }
            (CostModel::Linear(c), OpKind::Read) => {
                c.read_base + bytes as f64 * c.read_per_byte + usage.cpu_ms * c.per_cpu_ms
            }
            (CostModel::Linear(c), OpKind::Write) => {
                c.write_base + bytes as f64 * c.write_per_byte + usage.cpu_ms * c.per_cpu_ms
            }
        };
        check_cost("cost", units)
    }

    /// The part of the cost known before the operation runs: what admission charges.
    ///
    /// A write's size is known up front, so a write is charged in full. A read's size and CPU
    /// are known only afterwards, so a read is charged what a read of nothing costs: one page
    /// for `fdb`, 0.475 RU for `ru`, the base for `linear`. Couchbase admits a request only
    /// while its gauge is strictly below the limit, which for whole units is the same as
    /// charging one unit up front; so `couchbase` charges a read 1.
    pub fn upfront(&self, usage: &Usage) -> Result<f64, CostError> {
        if usage.units.is_some() || usage.kind == OpKind::Write {
            return self.cost(usage);
        }
        let before = Usage { bytes: 0, cpu_ms: 0.0, ..*usage };
        let units = self.cost(&before)?;
        Ok(match self {
            CostModel::Couchbase => units.max(1.0),
            _ => units,
        })
    }
}

/// `bytes` rounded up to whole FoundationDB pages, at least one page, in bytes.
fn fdb_pages_bytes(bytes: u64) -> u64 {
    bytes.div_ceil(FDB_PAGE_BYTES).max(1) * FDB_PAGE_BYTES
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn count_is_one_per_request_or_the_units_given() {
        let m = CostModel::Count;
        assert_eq!(m.cost(&Usage::read(1 << 20)).unwrap(), 1.0);
        assert_eq!(m.cost(&Usage::write(7)).unwrap(), 1.0);
        assert_eq!(m.cost(&Usage::units(12.5)).unwrap(), 12.5);
    }

    #[test]
    fn fdb_rounds_up_to_pages_and_weighs_writes_four_times() {
        let m = CostModel::fdb();
        // A read of nothing still costs one page.
        assert_eq!(m.cost(&Usage::read(0)).unwrap(), 4096.0);
        assert_eq!(m.cost(&Usage::read(1)).unwrap(), 4096.0);
        assert_eq!(m.cost(&Usage::read(4096)).unwrap(), 4096.0);
        assert_eq!(m.cost(&Usage::read(4097)).unwrap(), 8192.0);
        // Writes: 4 × pages.
        assert_eq!(m.cost(&Usage::write(100)).unwrap(), 16_384.0);
        assert_eq!(m.cost(&Usage::write(8193)).unwrap(), 4.0 * 12_288.0);
        // A fractional ratio is truncated after multiplying, as FoundationDB's integers are.
        let odd = CostModel::Fdb { fungibility: 1.3 };
        assert_eq!(odd.cost(&Usage::write(1)).unwrap(), 5324.0); // 1.3 × 4096 = 5324.8
    }

    #[test]
    fn ru_matches_tidb_by_hand() {
        let m = CostModel::ru();
        // Read: 0.125 + 0.5 × 0.7 = 0.475, + 64 KiB → 1, + 6 ms CPU → 2.
        assert!(close(m.cost(&Usage::read(0)).unwrap(), 0.475));
        assert!(close(m.cost(&Usage::read(65_536).with_cpu_ms(6.0)).unwrap(), 3.475));
        // Write: (1 + 0.7 + 2048/1024) × 3 replicas = 11.1; CPU is not charged on writes.
        assert!(close(m.cost(&Usage::write(2048).with_replicas(3).with_cpu_ms(9.0)).unwrap(), 11.1));
        assert!(close(m.cost(&Usage::write(0)).unwrap(), 1.7));
    }

    #[test]
    fn couchbase_units_round_up_and_durable_writes_double() {
        let m = CostModel::couchbase();
        assert_eq!(m.cost(&Usage::read(1)).unwrap(), 1.0);
        assert_eq!(m.cost(&Usage::read(4096)).unwrap(), 1.0);
        assert_eq!(m.cost(&Usage::read(4097)).unwrap(), 2.0);
        assert_eq!(m.cost(&Usage::write(1024)).unwrap(), 1.0);
        assert_eq!(m.cost(&Usage::write(1025)).unwrap(), 2.0);
        assert_eq!(m.cost(&Usage::write(1025).durable()).unwrap(), 4.0);
    }

    #[test]
    fn linear_uses_the_users_coefficients() {
        let m = CostModel::Linear(LinearCoefficients {
            read_base: 1.0,
            read_per_byte: 0.001,
            write_base: 5.0,
            write_per_byte: 0.01,
            per_cpu_ms: 0.5,
        });
        assert!(close(m.cost(&Usage::read(2000).with_cpu_ms(4.0)).unwrap(), 1.0 + 2.0 + 2.0));
        assert!(close(m.cost(&Usage::write(300)).unwrap(), 5.0 + 3.0));
    }

    #[test]
    fn upfront_prices_only_what_is_known_before_running() {
        let read = Usage::read(200_000).with_cpu_ms(30.0);
        assert!(close(CostModel::ru().upfront(&read).unwrap(), 0.475));
        assert_eq!(CostModel::fdb().upfront(&read).unwrap(), 4096.0);
        assert_eq!(CostModel::couchbase().upfront(&read).unwrap(), 1.0);
        // Writes are known in full.
        let write = Usage::write(3000).with_replicas(3);
        let ru = CostModel::ru();
        assert_eq!(ru.upfront(&write).unwrap(), ru.cost(&write).unwrap());
        // The rest is settled afterwards: upfront + post-hoc = full cost.
        let post_hoc = ru.cost(&read).unwrap() - ru.upfront(&read).unwrap();
        assert!(close(post_hoc, 200_000.0 / 65_536.0 + 10.0));
    }

    #[test]
    fn bad_numbers_are_errors_naming_the_input() {
        let m = CostModel::ru();
        assert_eq!(
            m.cost(&Usage::units(f64::NAN)).unwrap_err().to_string(),
            "units must be a finite number, got NaN"
        );
        assert!(matches!(m.cost(&Usage::units(-1.0)), Err(CostError::Negative { field: "units", .. })));
        assert!(matches!(
            m.cost(&Usage::read(1).with_cpu_ms(f64::INFINITY)),
            Err(CostError::NotFinite { field: "cpu_ms", .. })
        ));
        assert_eq!(m.cost(&Usage::write(1).with_replicas(0)), Err(CostError::NoReplicas));
        assert!(CostModel::Fdb { fungibility: 0.0 }.validate().is_err());
        assert!(
            CostModel::Linear(LinearCoefficients { read_base: -1.0, ..Default::default() })
                .validate()
                .is_err()
        );
    }
}

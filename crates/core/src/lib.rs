//! Tollgate's core: the model and the algorithms, with no I/O, no network and no clock reads.
//!
//! Everything here is a function of state, input and `now`; time is passed in as
//! [`time::Nanos`]. The modules, by concept:
//!
//! - [`adaptive`]: limits learned from latency, and client-side adaptive throttling.
//! - [`cost`]: cost models, what a request did priced in units.
//! - [`settings`]: group settings and their validation.
//! - [`config`]: the TOML settings file, with every problem reported by line.
//! - [`smooth`]: FoundationDB's exponential and Holt's linear smoothers.
//! - [`bucket`]: the lock-free token bucket with burst, debt and refunds.
//! - [`class`]: request classes within a group (critical, normal, sheddable).
//! - [`allocate`]: dividing a node's capacity among groups (by priority and weight, or first
//!   come first served).
//! - [`demand`]: what a client asks for, the one definition every mode reports.
//! - [`engine`]: the one model of demand, allocation and grants that every mode drives.
//! - [`epoch`]: a pool shared by several clients per one-second epoch (store mode).
//! - [`ramp`]: Numaflow's ramp-up of a group's pool from `min` to `max`, in four modes.
//! - [`schedule`]: TiKV's fair queue by priority and virtual time, with dmClock's charge for
//!   work done on other backends.
//! - [`spread`]: where each group is served, summed over the backends (dmClock's
//!   cross-backend term, the controller's half).
//! - [`shard`]: groups sharded over controllers: the shard map, its moves, the capacity split.
//! - [`time`]: the `Clock` trait and a manual clock for tests.
//! - [`toml_reader`]: reading TOML with every problem reported by line, field and rule.

pub mod adaptive;
pub mod allocate;
pub mod bucket;
pub mod class;
pub mod config;
pub mod cost;
pub mod demand;
pub mod engine;
pub mod epoch;
pub mod fields;
pub mod hierarchy;
pub mod prometheus;
pub mod ramp;
pub mod rls;
pub mod schedule;
pub mod settings;
pub mod shard;
pub mod smooth;
pub mod spread;
pub mod time;
pub mod toml_reader;

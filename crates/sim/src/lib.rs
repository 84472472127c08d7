//! Deterministic what-if simulation: a scenario in; a verdict, a timeline and a chart out.
//!
//! The simulator drives `tollgate server`'s own controller ([`tollgate_controller::Controller`],
//! over the one engine in `tollgate_model::engine`) and real remote client handles, whose
//! exchanges it delivers in process, in virtual time, against mock backends ([`world`]).
//! Nothing is re-implemented for the simulation. A scenario and a seed always give the same
//! result.

pub mod chart;
pub mod faults;
pub mod invariants;
pub mod output;
pub mod rng;
pub mod run;
pub mod scenario;
mod shards;
pub mod storage;
pub mod storage_scenario;
pub mod world;

pub use run::{Outcome, PhaseResult, RunHooks, Sample, run, run_seeds, run_traced, run_with};
pub use scenario::Scenario;

//! Deterministic what-if simulation: a scenario in; a verdict, a timeline and a chart out.
//!
//! The simulator drives the real controller pipeline ([`tollgate_core::pipeline`]) and the
//! real client token buckets ([`tollgate_core::bucket`]) in virtual time, against mock
//! backends. Nothing is re-implemented for the simulation. A scenario and a seed always give
//! the same result.

pub mod chart;
pub mod engine;
pub mod output;
pub mod rng;
pub mod scenario;

pub use engine::{Outcome, PhaseResult, Sample, run};
pub use scenario::Scenario;

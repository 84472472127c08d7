//! Observation: the Prometheus metrics, the status document, the history of rates, the
//! trace of rate computations, the process's own figures and the memory it holds. It reads
//! the controller and the cluster; it calls nothing that changes them.

pub(crate) mod history;
pub(crate) mod memory;
pub(crate) mod metrics;
pub mod peaks;
pub(crate) mod process;
pub mod series;
pub mod status;
pub(crate) mod trace;

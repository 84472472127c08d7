//! The simulator's integration tests, one binary for the crate: every scenario passes, the
//! fault sweeps hold every invariant over their seeds (and the canaries are caught), and the
//! simulator predicts what the real server does.

mod equivalence;
mod faults;
mod scenarios;
mod storage;

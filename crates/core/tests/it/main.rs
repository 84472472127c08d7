//! The model's integration tests, one binary for the crate: the laws allocation, the bucket,
//! the engine and quotas per window keep on random inputs, and the table of shared cases other clients check
//! themselves against.

mod allocation_laws;
mod engine_laws;
mod quota_laws;
mod shared_cases;

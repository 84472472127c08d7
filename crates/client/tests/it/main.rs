//! The client library's integration tests, one binary for the crate: each module is an area
//! (the behavioural suite in every mode, the embedded limiter, the store on a real
//! `redis-server`, the scheduler). The allocation count (`tests/no_alloc.rs`) is a binary of
//! its own, since it installs a counting global allocator.

mod acquire;
mod background;
mod embedded;
mod modes;
mod replicas_env;
mod scheduler;
mod store;

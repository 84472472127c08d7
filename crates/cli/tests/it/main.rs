//! The `tollgate` command's integration tests, one binary for the crate: each module is an
//! area, run against the real server binary and the real parts around it (etcd, Envoy,
//! Prometheus, buildah). One binary links once; `cargo test -p tollgate-cli --test it
//! etcd::` (or `cargo nextest run -E 'test(/^etcd::/)'`) runs one area.

mod common;

mod api;
mod cases;
mod cli;
mod deploy;
mod docs;
mod e2e;
mod envoy;
#[cfg(feature = "etcd")]
mod etcd;
mod fields;
mod files;
mod fuzz;
mod import;
mod marks;
mod observability;
#[cfg(feature = "etcd")]
mod regions;
mod remote;
mod rlqs;
mod rls;
mod security;
mod server;

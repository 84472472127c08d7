//! Tollgate's gRPC contract, package `tollgate.v1`, and its generated Rust code.
//!
//! The `.proto` file (`proto/tollgate/v1/tollgate.proto`) is the contract for clients in
//! other languages. It is compiled with protox at build time, so no `protoc` is needed.

/// The generated code. Generated items carry the `.proto` file's comments as their docs.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod v1 {
    tonic::include_proto!("tollgate.v1");
}

pub mod convert;
pub mod frames;
pub mod wire;

/// The most groups one exchange may carry.
pub const EXCHANGE_GROUPS_MAX: usize = 1000;
/// The most groups one backend report may carry.
pub const REPORT_GROUPS_MAX: usize = 10_000;
/// The longest client id, in bytes.
pub const CLIENT_ID_MAX_BYTES: usize = 128;
/// The longest backend id or zone, in bytes.
pub const BACKEND_ID_MAX_BYTES: usize = 255;

//! Tollgate's gRPC contract, package `tollgate.v1`, and its generated Rust code.
//!
//! The `.proto` file (`proto/tollgate/v1/tollgate.proto`) is the contract for clients in
//! other languages. It is compiled with protox at build time, so no `protoc` is needed.

/// The generated code. Generated items carry the `.proto` file's comments as their docs.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod v1 {
    tonic::include_proto!("tollgate.v1");
}

pub mod check;
pub mod convert;
pub mod frames;
pub mod wire;

pub use check::{BACKEND_ID_MAX_BYTES, CLIENT_ID_MAX_BYTES, EXCHANGE_GROUPS_MAX, REPORT_GROUPS_MAX};

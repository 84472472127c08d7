//! The front ends: what callers reach. The listeners and their connection caps, gRPC (the
//! exchange and the admin service), the HTTP API with its OpenAPI schema and the dashboard,
//! Envoy's rate-limit (RLS) and quota (RLQS) services, permits, holds and charges, and what
//! the HTTP port answers while the store loads. A front end calls the controller, the
//! cluster (to pass a call on), access and observation; nothing below calls a front end.

pub(crate) mod api;
pub(crate) mod body;
pub mod charges;
pub mod conn;
pub(crate) mod dashboard;
pub(crate) mod direct;
pub mod grpc;
pub mod guard;
pub mod holds;
pub(crate) mod http;
pub(crate) mod inline;
pub(crate) mod json;
pub mod listen;
pub(crate) mod loading;
pub(crate) mod permits;
pub mod properties;
pub(crate) mod rlqs;
pub(crate) mod rls;
pub(crate) mod schema;
pub(crate) mod stream;

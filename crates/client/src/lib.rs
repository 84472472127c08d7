//! Tollgate's client library: admit, delay or refuse each request by its cost, per tenant.
//!
//! One [`Tollgate`] handle per process. For each request, name the tenant's group and the
//! cost in units; the handle admits it now ([`Tollgate::try_acquire`]), makes it wait
//! ([`Tollgate::acquire`]), or refuses it with a typed [`AcquireError::Throttled`] carrying
//! the retry-after. Each group gets at least its reserved rate while it asks for it, never
//! more than its limit, and the node's capacity is shared by priority and weight.
//!
//! Three ways to be fed, one API: *embedded* ([`Tollgate::from_toml`], [`Tollgate::builder`]),
//! where the allocation runs in process like Couchbase's per-node throttling; *remote*
//! ([`Tollgate::remote`]), where `tollgate server` grants each process its share like TiDB's
//! and FoundationDB's controllers; and *store* ([`Tollgate::store`]), where processes agree
//! through Redis on how many share each pool, like Numaflow.
//!
//! ```
//! use tollgate_limiter::{AcquireError, Tollgate};
//!
//! let gate = Tollgate::from_toml(r#"
//!     [node]
//!     capacity = 1000
//!     [groups.tenant-a]
//!     reserved = 600
//!     [groups.tenant-b]
//!     reserved = 200
//!     limit = 400
//! "#)?;
//! match gate.try_acquire("tenant-a", 5.0) {
//!     Ok(permit) => {
//!         // ... serve the request, then settle with what it really cost:
//!         permit.settle(7.5)?;
//!     }
//!     Err(AcquireError::Throttled { retry_after, .. }) => { /* answer 429, Retry-After */ }
//!     Err(other) => return Err(other.into()),
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod access;
mod admit;
mod builder;
pub mod clock;
mod connect;
mod embedded;
mod error;
mod group;
mod handle;
mod inner;
pub mod layer;
mod metrics;
mod names;
pub mod node_share;
mod permit;
pub mod quiet;
pub mod remote;
pub mod reporter;
pub mod scheduler;
pub mod shards;
pub mod store;
mod store_quota;
mod tally;
pub mod throttle;

pub use builder::{Builder, check as check_embedded};
pub use embedded::BACKGROUND_GROUPS;
pub use error::{AcquireError, BuildError, ExchangeError};
pub use handle::{ClassCounts, GroupHandle, GroupStats, InFlightStats, QuotaLeft, Tollgate};
pub use layer::{TollgateLayer, TollgateService};
pub use permit::Permit;
pub use remote::{Driver, ExchangeFailures, RemoteOptions, RemoteStatus, SafeModePolicy};
pub use store::{StoreGroupStatus, StoreOptions, StoreStatus};
pub use tollgate_model as core;
pub use tollgate_model::class::RequestClass;

/// The README's and the concept guide's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
#[doc = include_str!("../../../docs/concepts.md")]
#[doc = include_str!("../../../docs/operations.md")]
#[doc = include_str!("../../../docs/store.md")]
#[doc = include_str!("../../../docs/backend.md")]
pub struct DocumentationExamples;

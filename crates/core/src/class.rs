//! Request classes within a group: critical work goes first, sheddable work is refused first.
//!
//! Within one tenant not every request matters as much: a checkout against a recommendation,
//! a user's query against a background refresh. Stripe, Netflix and Uber shed by such a class
//! inside a tenant's quota. Tollgate does it in the group's own bucket, so it costs nothing
//! while the group is within its allowance and needs no coordination between processes:
//!
//! - **critical** work may draw the bucket down to empty;
//! - **normal** work (the default) stops where a `critical_reserve` share of the burst is
//!   left, kept for critical bursts;
//! - **sheddable** work stops halfway between that and a full bucket.
//!
//! While the group asks for less than its grant the bucket stays near full and every class
//! is admitted. Once it asks for more (the group throttled, or the node's saturation or
//! capacity lowering its grant), the bucket hovers near the normal floor: sheddable work is
//! refused first, normal work next, and critical work finds tokens as long as it alone asks
//! for less than the grant.
//!
//! ```
//! use tollgate_model::class::RequestClass;
//!
//! // A quarter of the burst kept for critical work.
//! assert_eq!(RequestClass::Critical.floor(0.25), 0.0);
//! assert_eq!(RequestClass::Normal.floor(0.25), 0.25);
//! assert_eq!(RequestClass::Sheddable.floor(0.25), 0.625);
//! assert_eq!(RequestClass::from_name("sheddable"), Ok(RequestClass::Sheddable));
//! ```

pub use crate::fields::CRITICAL_RESERVE_MAX;

/// How much a request matters within its group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum RequestClass {
    /// Served while the bucket holds anything: the group's most important work.
    Critical,
    /// The default.
    #[default]
    Normal,
    /// Refused first when the group asks for more than it is granted.
    Sheddable,
}

impl RequestClass {
    /// Every class, most important first.
    pub const ALL: [RequestClass; 3] =
        [RequestClass::Critical, RequestClass::Normal, RequestClass::Sheddable];

    /// Its name, as settings, the CLI and metrics write it.
    pub fn name(self) -> &'static str {
        match self {
            RequestClass::Critical => "critical",
            RequestClass::Normal => "normal",
            RequestClass::Sheddable => "sheddable",
        }
    }

    /// A class from its name; the error says which names there are.
    pub fn from_name(name: &str) -> Result<RequestClass, String> {
        RequestClass::ALL
            .into_iter()
            .find(|c| c.name() == name)
            .ok_or_else(|| format!("must be critical, normal or sheddable, got {name:?}"))
    }

    /// The share of the bucket's burst this class must leave in it (0 to 1), given the
    /// group's `critical_reserve` (0 to [`CRITICAL_RESERVE_MAX`]).
    pub fn floor(self, critical_reserve: f64) -> f64 {
        let reserve = critical_reserve.clamp(0.0, CRITICAL_RESERVE_MAX);
        match self {
            RequestClass::Critical => 0.0,
            RequestClass::Normal => reserve,
            RequestClass::Sheddable => reserve + (1.0 - reserve) / 2.0,
        }
    }
}

//! What can go wrong when building a limiter or admitting a request.

use std::time::Duration;

use thiserror::Error;
use tollgate_model::cost::CostError;
use tollgate_model::settings::{GroupName, SettingError};

/// Why a request was not admitted.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum AcquireError {
    /// The group is over its allowance: try again after `retry_after`.
    #[error("group \"{group}\" is throttled: retry after {retry_after:?}")]
    Throttled {
        /// The group that was throttled (shared, not copied: refusing allocates nothing).
        group: GroupName,
        /// How long until the request could be admitted (a duration, never a deadline).
        retry_after: Duration,
    },
    /// The cost is larger than the group's burst can ever hold: waiting would never help.
    #[error(
        "a cost of {cost} units can never be admitted for group \"{group}\": its burst holds at most {burst} units"
    )]
    NeverAdmissible {
        /// The group.
        group: GroupName,
        /// The cost asked for.
        cost: f64,
        /// The most the group's bucket can ever hold.
        burst: f64,
    },
    /// The cost is NaN, infinite or negative.
    #[error("invalid cost: {0}")]
    InvalidCost(#[from] CostError),
    /// The group name breaks the naming rules. (Boxed: a rare error, and the largest, kept
    /// out of the way of the result every admission returns.)
    #[error("invalid group name: {0}")]
    InvalidGroup(Box<SettingError>),
    /// The controller refuses this client for good (an unknown, expired or revoked token, a
    /// permission refused): nothing is admitted until it accepts the client again. Retrying
    /// does not help; fix the credential. The controller's whole answer is in
    /// [`RemoteStatus::rejected`](crate::RemoteStatus::rejected). (Nothing here owns memory
    /// but the name, as in a throttled refusal: dropping the error every refusal returns
    /// stays a few instructions.)
    #[error("group \"{group}\": the controller refuses this client; remote_status().rejected has its answer")]
    Rejected {
        /// The group asked for.
        group: GroupName,
    },
}

impl AcquireError {
    /// Whether waiting and retrying can help (true only for [`AcquireError::Throttled`]).
    pub fn is_transient(&self) -> bool {
        matches!(self, AcquireError::Throttled { .. })
    }

    /// The retry-after of a throttled request.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            AcquireError::Throttled { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }
}

/// Why an exchange with the controller failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ExchangeError {
    /// The controller could not be reached, or the connection broke.
    #[error("transport: {0}")]
    Transport(String),
    /// No answer within the exchange timeout.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The controller answered with an error.
    #[error("rejected ({code:?}): {message}")]
    Rejected {
        /// The gRPC status code.
        code: tonic::Code,
        /// What the controller said.
        message: String,
    },
}

impl ExchangeError {
    /// The error a gRPC call ended with: a broken or refused connection is a transport error,
    /// anything else the controller's rejection.
    pub fn of(status: &tonic::Status) -> ExchangeError {
        let transport =
            status.code() == tonic::Code::Unavailable && std::error::Error::source(status).is_some();
        if transport {
            ExchangeError::Transport(status.message().to_string())
        } else {
            ExchangeError::Rejected { code: status.code(), message: status.message().to_string() }
        }
    }

    /// Whether trying again may help: an outage (the network, a controller restarting, a
    /// follower, an overloaded controller) may pass; a rejection of the client itself (an
    /// unknown or revoked token, a permission refused, a request the contract refuses) does
    /// not, and is surfaced as such rather than handled like an outage.
    pub fn is_transient(&self) -> bool {
        match self {
            ExchangeError::Transport(_) | ExchangeError::Timeout(_) => true,
            ExchangeError::Rejected { code, .. } => !matches!(
                code,
                tonic::Code::Unauthenticated
                    | tonic::Code::PermissionDenied
                    | tonic::Code::InvalidArgument
                    | tonic::Code::FailedPrecondition
                    | tonic::Code::NotFound
                    | tonic::Code::AlreadyExists
                    | tonic::Code::OutOfRange
                    | tonic::Code::Unimplemented
                    | tonic::Code::DataLoss
            ),
        }
    }
}

/// Why a limiter could not be built.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum BuildError {
    /// The settings file has problems; each names its line, field and rule.
    #[error("invalid settings:\n{0}")]
    Config(#[from] tollgate_model::config::ConfigErrors),
    /// A setting this mode cannot carry out: the handle is not built rather than ignore it.
    #[error("{field} cannot apply in {mode} mode: {reason}")]
    Unsupported {
        /// The mode: `embedded`, `remote` or `store`.
        mode: &'static str,
        /// The setting, as the settings file names it (`node.capacity`, `groups.a.budget`).
        field: String,
        /// Why, and what to do instead.
        reason: &'static str,
    },
    /// The cost model's coefficients are invalid.
    #[error("cost model: {0}")]
    CostModel(#[from] CostError),
    /// Remote mode needs a tokio runtime to run its exchanges in.
    #[error("Tollgate::remote must be called inside a tokio runtime")]
    NoRuntime,
    /// The controller's address is not usable.
    #[error("invalid controller URL {url:?}: {reason}")]
    Remote {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The settings file could not be read.
    #[error("cannot read settings file {path}: {reason}")]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// What the system said.
        reason: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every admission returns a `Result` holding this error: its rare, large variants are
    /// boxed so that it stays as small as the common one, a refusal with its retry-after.
    #[test]
    fn an_admissions_error_is_no_larger_than_a_refusal_needs() {
        let throttled = std::mem::size_of::<GroupName>() + std::mem::size_of::<Duration>();
        assert!(
            std::mem::size_of::<AcquireError>() <= throttled + 8,
            "AcquireError is {} bytes",
            std::mem::size_of::<AcquireError>()
        );
        // The same size as a Result: the Ok case is a niche of the error, not a tag beside it.
        assert_eq!(
            std::mem::size_of::<Result<crate::Permit<'static>, AcquireError>>(),
            std::mem::size_of::<AcquireError>()
        );
    }
}

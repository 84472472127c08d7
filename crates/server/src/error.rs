//! Why an admin change failed, the same for every part that makes one (groups and the node,
//! credentials, RLS rules) and every front end that answers with it (gRPC and HTTP).

use tollgate_model::settings::{SettingError, SettingErrors};
use tonic::Status;

use crate::store::StoreError;

/// Why an admin change failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminError {
    /// The settings break rules; nothing changed.
    #[error("{0}")]
    Invalid(SettingErrors),
    /// No such group.
    #[error("group {0:?} does not exist")]
    NotFound(String),
    /// No such token.
    #[error("token {0} does not exist")]
    NoToken(String),
    /// The group exists already.
    #[error("group {0:?} already exists")]
    AlreadyExists(String),
    /// The store failed; nothing changed.
    #[error("{0}")]
    Store(#[from] StoreError),
    /// An argument breaks a rule (the message names it); nothing changed.
    #[error("{0}")]
    Rule(String),
    /// The change would leave things unusable (revoking the last admin token); nothing changed.
    #[error("{0}")]
    Refused(String),
}

impl AdminError {
    /// One setting's rule broken: `field` names it.
    pub fn invalid(field: &str, rule: impl Into<String>) -> AdminError {
        AdminError::Invalid(SettingErrors(vec![SettingError::new(field, rule.into())]))
    }
}

impl From<AdminError> for Status {
    fn from(e: AdminError) -> Status {
        match e {
            AdminError::Invalid(errors) => Status::invalid_argument(errors.to_string()),
            AdminError::NotFound(_) | AdminError::NoToken(_) => Status::not_found(e.to_string()),
            AdminError::Rule(rule) => Status::invalid_argument(rule),
            AdminError::Refused(why) => Status::failed_precondition(why),
            AdminError::AlreadyExists(_) => Status::already_exists(e.to_string()),
            AdminError::Store(s) if s.is_transient() => Status::unavailable(s.to_string()),
            AdminError::Store(s) => Status::internal(s.to_string()),
        }
    }
}

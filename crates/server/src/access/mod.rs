//! Who may do what: the controller's credentials (made, listed, revoked, each durable and in
//! the audit log; taken from another controller through the shared store), whether calls need
//! one, and which credential owns each client id. [`crate::access::auth`] holds the rules (what a
//! token is, which role may call what); this holds the state.

pub(crate) mod auth;
pub mod credentials;

//! The controller's credentials and who owns each client id: the state behind the rules of
//! [`crate::access::auth`].
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard};

use crate::access::auth::{Caller, Credential, NewCredential, Owners, Refused, TOKENS_MAX, Tokens};
use crate::clock::wall_ms;
use crate::error::AdminError;
use crate::store::{Shared, StoreError, audited};

/// The credentials and the client ids they own: made, checked, revoked, followed from other
/// controllers, each change durable and audited.
pub struct Access {
    store: Shared,
    /// Every credential.
    tokens: RwLock<Tokens>,
    /// Which credential owns each client id.
    owners: Mutex<Owners>,
    /// Whether calls need a credential (`tollgate server --auth`).
    required: AtomicBool,
}

impl Access {
    /// The credentials `stored` holds (by id, as JSON), written through `store`.
    pub fn new(
        store: Shared,
        stored: &std::collections::BTreeMap<String, String>,
    ) -> Result<Access, StoreError> {
        let tokens = Tokens::from_stored(stored).map_err(|reason| StoreError::Corrupt {
            path: Default::default(),
            what: "credentials".into(),
            reason,
        })?;
        Ok(Access {
            store,
            tokens: RwLock::new(tokens),
            owners: Mutex::default(),
            required: AtomicBool::new(false),
        })
    }

    fn tokens_read(&self) -> RwLockReadGuard<'_, Tokens> {
        self.tokens.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Turns authentication on or off (`tollgate server --auth`).
    pub fn require_auth(&self, on: bool) {
        self.required.store(on, Ordering::Relaxed);
    }

    /// Whether calls need a credential.
    pub fn auth_required(&self) -> bool {
        self.required.load(Ordering::Relaxed)
    }

    /// The credential an `authorization` header value names, or why not.
    pub fn authenticate(&self, header: Option<&[u8]>) -> Result<Arc<Credential>, Refused> {
        self.tokens_read().authenticate(header, wall_ms())
    }

    /// Makes a credential, with the token `given` (which must read `tg_ID_SECRET`) or a random
    /// one; returns it and its token (shown this once). Durable before it returns, and in the
    /// audit log.
    pub fn create_token(
        &self,
        new: &NewCredential,
        who: &str,
        given: Option<&str>,
    ) -> Result<(Credential, String), AdminError> {
        if new.name.starts_with(crate::access::auth::PEER_TOKEN_PREFIX) {
            return Err(AdminError::Rule(format!(
                "name: names beginning `{}` are kept for the controllers' own tokens, got `{}`",
                crate::access::auth::PEER_TOKEN_PREFIX,
                new.name
            )));
        }
        self.create_token_as(new, who, given)
    }

    /// Makes a controller's own token ([`Credential::is_peer`]), named `name`.
    pub(crate) fn create_peer_token(&self, name: &str) -> Result<(Credential, String), AdminError> {
        let new = NewCredential {
            role: crate::access::auth::Role::Client.name().into(),
            groups: "*".into(),
            unthrottled: true,
            default_group: String::new(),
            expires_in_s: 0,
            name: name.to_string(),
        };
        self.create_token_as(&new, name, None)
    }

    /// [`create_token`](Self::create_token) with the token `given` ([`Credential::issue_as`]).
    fn create_token_as(
        &self,
        new: &NewCredential,
        who: &str,
        given: Option<&str>,
    ) -> Result<(Credential, String), AdminError> {
        let (credential, token) = Credential::issue_as(new, wall_ms(), given).map_err(AdminError::Rule)?;
        let mut store = self.store.lock();
        if self.tokens_read().get(&credential.id).is_some() {
            return Err(AdminError::Refused(format!("token {} exists already", credential.id)));
        }
        if self.tokens_read().len() >= TOKENS_MAX {
            return Err(AdminError::Refused(format!(
                "at most {TOKENS_MAX} tokens; revoke some first (tollgate token list)"
            )));
        }
        audited(
            &mut store,
            who,
            format!("token.create {}", credential.id),
            None,
            Some(credential.audit_json()),
        )
        .put_credential(&credential.id, &credential.to_json())?;
        self.tokens.write().unwrap_or_else(PoisonError::into_inner).put(credential.clone());
        Ok((credential, token))
    }

    /// Revokes a credential. The last admin credential that has not expired cannot be revoked
    /// (nobody could make another); make a new one first.
    pub fn revoke_token(&self, id: &str, who: &str) -> Result<Arc<Credential>, AdminError> {
        let mut store = self.store.lock();
        let Some(credential) = self.tokens_read().get(id).cloned() else {
            return Err(AdminError::NoToken(id.to_string()));
        };
        let now = wall_ms();
        let live = credential.expires_unix_ms == 0 || credential.expires_unix_ms > now;
        if credential.role == Ok(crate::access::auth::Role::Admin)
            && live
            && self.tokens_read().live_admins(now) <= 1
        {
            return Err(AdminError::Refused(format!(
                "token {id} is the last admin token; create another admin token before revoking it"
            )));
        }
        audited(&mut store, who, format!("token.revoke {id}"), Some(credential.audit_json()), None)
            .drop_credential(id)?;
        self.tokens.write().unwrap_or_else(PoisonError::into_inner).remove(id);
        Ok(credential)
    }

    /// Sets the default group of client token `id` (empty: none). Durable and audited before
    /// it returns.
    pub fn set_token_group(
        &self,
        id: &str,
        default_group: &str,
        who: &str,
    ) -> Result<Arc<Credential>, AdminError> {
        let mut store = self.store.lock();
        let Some(credential) = self.tokens_read().get(id).cloned() else {
            return Err(AdminError::NoToken(id.to_string()));
        };
        let changed = credential.with_default_group(default_group).map_err(AdminError::Rule)?;
        audited(
            &mut store,
            who,
            format!("token.alter {id}"),
            Some(credential.audit_json()),
            Some(changed.audit_json()),
        )
        .put_credential(id, &changed.to_json())?;
        let changed = Arc::new(changed);
        self.tokens.write().unwrap_or_else(PoisonError::into_inner).put((*changed).clone());
        Ok(changed)
    }

    /// Every credential, by id.
    pub fn tokens(&self) -> Vec<Arc<Credential>> {
        self.tokens_read().all()
    }

    /// With authentication on and no admin credential that has not expired: makes one and
    /// returns its token (the server writes it to a file for the operator); with `given`, that
    /// token (one the operator made and handed the server, a Kubernetes secret).
    pub fn ensure_admin_token(&self, given: Option<&str>) -> Result<Option<String>, AdminError> {
        if self.tokens_read().live_admins(wall_ms()) > 0 {
            return Ok(None);
        }
        let new =
            NewCredential { role: "admin".into(), name: "first-admin".into(), ..NewCredential::default() };
        self.create_token_as(&new, "server start", given).map(|(_, token)| Some(token))
    }

    /// Takes a credential as another controller stored it (`None`: revoked). Says whether
    /// anything changed.
    pub fn sync_credential(&self, id: &str, record: Option<&str>) -> bool {
        let mut tokens = self.tokens.write().unwrap_or_else(PoisonError::into_inner);
        match record {
            None => tokens.remove(id).is_some(),
            Some(json) => match Credential::from_json(json) {
                Ok(c) if tokens.get(id).map(|held| **held == c) != Some(true) => {
                    tokens.put(c);
                    true
                }
                Ok(_) => false,
                Err(e) => {
                    tracing::error!(id, error = %e, "a stored credential cannot be read; it is not accepted");
                    tokens.remove(id).is_some()
                }
            },
        }
    }

    /// Checks that `caller` (when authentication is on) may take client id `client`: the
    /// first credential to use an id keeps it while the id is in use.
    pub fn bind_client(&self, client: &str, caller: Option<&Caller>) -> Result<(), Refused> {
        let Some(Caller(credential)) = caller else { return Ok(()) };
        let tokens = self.tokens_read();
        let live = |id: &str| tokens.get(id).is_some();
        self.owners.lock().unwrap_or_else(PoisonError::into_inner).bind(
            client,
            &credential.id,
            wall_ms(),
            live,
        )
    }
}

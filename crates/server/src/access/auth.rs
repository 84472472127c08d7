//! Credentials: bearer tokens with roles, kept by the controller as hashes.
//!
//! A token reads `tg_ID_SECRET`: `ID` is 16 hex digits, public, and names the credential in
//! `token list`, `token revoke` and the audit log; `SECRET` is 64 hex digits from the
//! system's random source. The store keeps the credential's settings and the SHA-256 of the
//! whole token, never the token; a token is shown once, when it is made.
//!
//! Roles, each a set of calls (Couchbase guards its throttle commands with privileges in the
//! same spirit): **admin** may do everything; **client** exchanges for grants, limited to
//! the groups its patterns match; **backend** reports load and reads the group settings;
//! **reader** reads status, metrics, settings and the audit-free views; **region** is a
//! region's controllers leasing from the global tier: a client of every group that reads
//! the groups as a reader does. `/healthz` and `/readyz` are open.
//! The unthrottled privilege belongs to a client credential made with it: only such a client
//! may admit work as unthrottled through the controller.

use std::collections::HashMap;
use std::sync::Arc;

use tollgate_proto::v1;

/// What a credential may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// Everything.
    Admin,
    /// Exchanges for grants (its groups only).
    Client,
    /// Backend reports and the group settings a backend schedules by.
    Backend,
    /// Status, metrics and settings, read only.
    Reader,
    /// A region's controllers leasing from the global tier (`--upstream`): exchanges for
    /// every group, and what a reader reads (the groups it copies).
    Region,
}

impl Role {
    /// Every role, in the order `token list` shows them.
    pub const ALL: [Role; 5] = [Role::Admin, Role::Client, Role::Backend, Role::Reader, Role::Region];

    /// Its name, as given to `token create --role`.
    pub fn name(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Client => "client",
            Role::Backend => "backend",
            Role::Reader => "reader",
            Role::Region => "region",
        }
    }

    /// The role named `name`, or the rule.
    pub fn parse(name: &str) -> Result<Role, String> {
        Role::ALL
            .into_iter()
            .find(|r| r.name() == name)
            .ok_or_else(|| format!("role: must be admin, client, backend, reader or region, got {name:?}"))
    }

    /// Whether this role may make a call that needs `needed`.
    pub fn covers(self, needed: Role) -> bool {
        self == Role::Admin
            || self == needed
            || (self == Role::Region && matches!(needed, Role::Client | Role::Reader))
    }
}

/// The longest group pattern list a client token may carry, in bytes.
pub const GROUPS_MAX_BYTES: usize = 1024;
/// The most credentials the store holds.
pub const TOKENS_MAX: usize = 10_000;
/// The longest credential lifetime, in seconds (ten years).
pub const EXPIRES_MAX_S: u64 = 10 * 366 * 24 * 3600;
/// The longest `authorization` value taken, in bytes; a longer one is refused unread.
pub const HEADER_MAX_BYTES: usize = 256;

/// One credential, as the controller holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct Credential {
    /// Its public id (16 hex digits).
    pub id: String,
    /// A label for people (may be empty).
    pub name: String,
    /// Its role; the stored name when this server does not know it (such a token is refused).
    pub role: Result<Role, String>,
    /// For a client: the group patterns, comma-separated (empty: every group).
    pub groups: String,
    /// For a client: may admit work as unthrottled.
    pub unthrottled: bool,
    /// For a client: the group its work goes to when a request names none (TiDB's
    /// `ALTER USER … RESOURCE GROUP`); empty: none.
    pub default_group: String,
    /// When it was made, in Unix milliseconds.
    pub created_unix_ms: u64,
    /// When it expires, in Unix milliseconds (0: never).
    pub expires_unix_ms: u64,
    /// SHA-256 of the whole token.
    hash: [u8; 32],
}

/// What to make a credential with (`token create`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NewCredential {
    /// The role's name.
    pub role: String,
    /// Group patterns (client only).
    pub groups: String,
    /// The unthrottled privilege (client only).
    pub unthrottled: bool,
    /// The default group (client only; empty: none).
    pub default_group: String,
    /// Lifetime in seconds (0: never expires).
    pub expires_in_s: u64,
    /// A label.
    pub name: String,
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect()
}

/// How the names of the controllers' own tokens begin; no other token may be named so.
pub const PEER_TOKEN_PREFIX: &str = "controller-";

/// The name of the token a controller that advertises `advertise` calls the leader with:
/// [`PEER_TOKEN_PREFIX`] and 16 hex digits of the address's SHA-256, the same at every start.
pub(crate) fn peer_token_name(advertise: &str) -> String {
    format!("{PEER_TOKEN_PREFIX}{}", &hex(&sha256(advertise))[..16])
}

fn sha256(token: &str) -> [u8; 32] {
    let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut out = [0; 32];
    out.copy_from_slice(digest.as_ref());
    out
}

/// Compares in time independent of where the bytes differ.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether `name` matches one of the comma-separated `patterns` (`*`: any run of characters;
/// empty patterns: every name).
pub fn matches(patterns: &str, name: &str) -> bool {
    patterns.is_empty() || patterns.split(',').any(|p| tollgate_model::settings::glob_matches(p.trim(), name))
}

/// Checks a group pattern list: the rule, prefixed by the field.
fn check_groups(groups: &str) -> Result<(), String> {
    if groups.len() > GROUPS_MAX_BYTES {
        return Err(format!("groups: at most {GROUPS_MAX_BYTES} bytes, got {}", groups.len()));
    }
    if groups.is_empty() {
        return Ok(());
    }
    for p in groups.split(',') {
        let p = p.trim();
        if p.is_empty() {
            return Err(format!("groups: an empty pattern in {groups:?}"));
        }
        if let Some(c) = p.chars().find(|c| !(c.is_ascii_alphanumeric() || "._-:/*".contains(*c))) {
            return Err(format!("groups: pattern {p:?} holds {c:?}; use letters, digits, . _ - : / and *"));
        }
    }
    Ok(())
}

fn check_label(name: &str) -> Result<(), String> {
    if name.len() > 64 || name.chars().any(|c| !(c.is_ascii_alphanumeric() || "._-".contains(c))) {
        return Err(format!("name: 1 to 64 characters from A-Z a-z 0-9 . _ -, got {name:?}"));
    }
    Ok(())
}

/// A default group: empty (none), or a group's name (not a pattern) that the token's group
/// patterns allow.
fn check_default_group(group: &str, patterns: &str) -> Result<(), String> {
    if group.is_empty() {
        return Ok(());
    }
    tollgate_model::settings::check_group_name(group).map_err(|e| format!("default_group: {}", e.rule))?;
    if tollgate_model::settings::is_pattern(group) {
        return Err(format!("default_group: {group:?} is a pattern; name one group"));
    }
    if !matches(patterns, group) {
        return Err(format!("default_group: {group:?} is not among the token's groups ({patterns})"));
    }
    Ok(())
}

impl Credential {
    /// Checks `new` and makes a credential from it with a fresh token: the credential, and
    /// the token (to show once).
    pub fn issue(new: &NewCredential, now_unix_ms: u64) -> Result<(Credential, String), String> {
        Credential::issue_as(new, now_unix_ms, None)
    }

    /// [`issue`](Self::issue), with the token `given` (which must read `tg_ID_SECRET`, 16 and
    /// 64 hex digits, as `tollgate token create` prints) rather than a random one.
    pub fn issue_as(
        new: &NewCredential,
        now_unix_ms: u64,
        given: Option<&str>,
    ) -> Result<(Credential, String), String> {
        let role = Role::parse(&new.role)?;
        check_groups(&new.groups)?;
        check_label(&new.name)?;
        if role != Role::Client
            && (!new.groups.is_empty() || new.unthrottled || !new.default_group.is_empty())
        {
            return Err(format!(
                "groups, unthrottled and default_group: only for a client token, and this one is {}",
                role.name()
            ));
        }
        let groups = new.groups.split(',').map(str::trim).collect::<Vec<_>>().join(",");
        check_default_group(&new.default_group, &groups)?;
        if new.expires_in_s > EXPIRES_MAX_S {
            return Err(format!("expires: at most {EXPIRES_MAX_S} s (ten years), got {}", new.expires_in_s));
        }
        let (id, token) = match given {
            Some(token) => {
                let id = token_id(token).ok_or_else(|| {
                    "token: expected tg_ID_SECRET (16 and 64 hex digits), as `tollgate token create` prints"
                        .to_string()
                })?;
                (id.to_string(), token.to_string())
            }
            None => {
                let rng = ring::rand::SystemRandom::new();
                let mut random = [0u8; 40];
                ring::rand::SecureRandom::fill(&rng, &mut random)
                    .map_err(|_| "the system's random source failed".to_string())?;
                let id = hex(&random[..8]);
                let token = format!("tg_{id}_{}", hex(&random[8..]));
                (id, token)
            }
        };
        let credential = Credential {
            id,
            name: new.name.clone(),
            role: Ok(role),
            groups,
            unthrottled: new.unthrottled,
            default_group: new.default_group.clone(),
            created_unix_ms: now_unix_ms,
            expires_unix_ms: match new.expires_in_s {
                0 => 0,
                s => now_unix_ms.saturating_add(s.saturating_mul(1000)),
            },
            hash: sha256(&token),
        };
        Ok((credential, token))
    }

    /// The role's name, known or not.
    pub fn role_name(&self) -> &str {
        match &self.role {
            Ok(r) => r.name(),
            Err(name) => name,
        }
    }

    /// How the audit log and errors name it: `token ID (ROLE, NAME)`.
    pub fn label(&self) -> String {
        if self.name.is_empty() {
            format!("token {} ({})", self.id, self.role_name())
        } else {
            format!("token {} ({}, {})", self.id, self.role_name(), self.name)
        }
    }

    /// The group a request that names none goes to: the token's default group. `Err` says
    /// why there is none, naming the field.
    pub fn group_or_default(&self, named: Option<&str>) -> Result<String, String> {
        match named {
            Some(g) => Ok(g.to_string()),
            None if !self.default_group.is_empty() => Ok(self.default_group.clone()),
            None => Err(format!("group: required, as {} has no default group", self.label())),
        }
    }

    /// This credential with `default_group` as its default group (empty: none), checked.
    pub fn with_default_group(&self, default_group: &str) -> Result<Credential, String> {
        if self.role != Ok(Role::Client) && !default_group.is_empty() {
            return Err(format!(
                "default_group: only for a client token, and this one is {}",
                self.role_name()
            ));
        }
        check_default_group(default_group, &self.groups)?;
        Ok(Credential { default_group: default_group.to_string(), ..self.clone() })
    }

    /// Whether this is a controller's own token (a client token for every group, unthrottled,
    /// named `controller-…`), with which a follower passes on exchanges it has checked
    /// against its own caller's token: the leader does not bind their client ids to it.
    pub fn is_peer(&self) -> bool {
        self.name.starts_with(PEER_TOKEN_PREFIX)
            && self.role == Ok(Role::Client)
            && self.groups == "*"
            && self.unthrottled
    }

    /// Whether this credential may exchange for `group`.
    pub fn allows_group(&self, group: &str) -> bool {
        self.role != Ok(Role::Client) || matches(&self.groups, group)
    }

    /// As the store keeps it (JSON, with the hash and never the token).
    pub fn to_json(&self) -> String {
        serde_json::json!({
            "id": self.id,
            "name": self.name,
            "role": self.role_name(),
            "groups": self.groups,
            "unthrottled": self.unthrottled,
            "default_group": self.default_group,
            "created_unix_ms": self.created_unix_ms,
            "expires_unix_ms": self.expires_unix_ms,
            "sha256": hex(&self.hash),
        })
        .to_string()
    }

    /// As the audit log shows it: the stored form without the hash.
    pub fn audit_json(&self) -> String {
        let mut v: serde_json::Value = serde_json::from_str(&self.to_json()).unwrap_or_default();
        if let Some(o) = v.as_object_mut() {
            o.remove("sha256");
        }
        v.to_string()
    }

    /// From its stored form.
    pub fn from_json(text: &str) -> Result<Credential, String> {
        let v: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let s = |k: &str| v.get(k).and_then(serde_json::Value::as_str).map(str::to_string);
        let n = |k: &str| v.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
        let id = s("id").ok_or("id missing")?;
        let role_name = s("role").ok_or("role missing")?;
        let hash = unhex(&s("sha256").ok_or("sha256 missing")?)
            .and_then(|b| <[u8; 32]>::try_from(b).ok())
            .ok_or("sha256: not 32 bytes in hex")?;
        Ok(Credential {
            id,
            name: s("name").unwrap_or_default(),
            role: Role::parse(&role_name).map_err(|_| role_name),
            groups: s("groups").unwrap_or_default(),
            unthrottled: v.get("unthrottled").and_then(serde_json::Value::as_bool).unwrap_or(false),
            default_group: s("default_group").unwrap_or_default(),
            created_unix_ms: n("created_unix_ms"),
            expires_unix_ms: n("expires_unix_ms"),
            hash,
        })
    }

    /// As the admin API shows it.
    pub fn info(&self) -> v1::TokenInfo {
        v1::TokenInfo {
            id: self.id.clone(),
            role: self.role_name().to_string(),
            groups: self.groups.clone(),
            unthrottled: self.unthrottled,
            created_unix_ms: self.created_unix_ms,
            expires_unix_ms: self.expires_unix_ms,
            name: self.name.clone(),
            default_group: self.default_group.clone(),
        }
    }
}

/// Why a call was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refused {
    /// No credential was given.
    #[error(
        "this server requires a token: give `authorization: Bearer TOKEN` (the CLI: --token or TOLLGATE_TOKEN)"
    )]
    Missing,
    /// The credential is not a token of ours.
    #[error("malformed token: {0}")]
    Malformed(String),
    /// No such credential, or the secret does not match.
    #[error("unknown token {0} (revoked, or never issued here)")]
    Unknown(String),
    /// The credential's time has passed.
    #[error("token {0} expired")]
    Expired(String),
    /// The stored role is not one this server knows.
    #[error("token {id} has role {role:?}, which this server does not know; issue a new token")]
    UnknownRole {
        /// The credential.
        id: String,
        /// Its stored role.
        role: String,
    },
    /// The role does not cover the call.
    #[error("{who} may not call {call}: it needs the {needed} role")]
    Forbidden {
        /// The credential's label.
        who: String,
        /// The method or endpoint.
        call: String,
        /// The role it needs.
        needed: &'static str,
    },
    /// A client credential's group patterns do not match a group.
    #[error("{who} may not exchange for group {group:?}: its groups are {patterns:?}")]
    Group {
        /// The credential's label.
        who: String,
        /// The group asked for.
        group: String,
        /// The credential's patterns.
        patterns: String,
    },
    /// The client id is in use by another credential.
    #[error("client id {client:?} belongs to another credential; give each client its own id")]
    ClientTaken {
        /// The client id.
        client: String,
    },
    /// The client certificate's name is not on the allow-list.
    #[error("client certificate {0} is not on the server's allow-list (--tls-allow-name)")]
    CertName(String),
    /// Too many requests on one connection.
    #[error("more than {0} requests a second on this connection; slow down or open another connection")]
    ConnRate(u64),
}

impl Refused {
    /// The gRPC status it is sent as.
    pub fn status(&self) -> tonic::Status {
        match self {
            Refused::Forbidden { .. } | Refused::Group { .. } | Refused::ClientTaken { .. } => {
                tonic::Status::permission_denied(self.to_string())
            }
            Refused::ConnRate(_) => tonic::Status::resource_exhausted(self.to_string()),
            _ => tonic::Status::unauthenticated(self.to_string()),
        }
    }

    /// The HTTP status it is sent as.
    pub fn http_status(&self) -> u16 {
        match self {
            Refused::Forbidden { .. } | Refused::Group { .. } | Refused::ClientTaken { .. } => 403,
            Refused::ConnRate(_) => 429,
            _ => 401,
        }
    }
}

/// The credential a call was made with, put in the request's extensions by the front ends.
#[derive(Debug, Clone)]
pub struct Caller(pub Arc<Credential>);

/// Every credential, by id.
#[derive(Debug, Default, Clone)]
pub struct Tokens {
    by_id: HashMap<String, Arc<Credential>>,
}

impl Tokens {
    /// From the stored records (id → JSON); a record that cannot be read is an error naming it.
    pub fn from_stored<'a>(
        records: impl IntoIterator<Item = (&'a String, &'a String)>,
    ) -> Result<Tokens, String> {
        let mut by_id = HashMap::new();
        for (id, json) in records {
            let c = Credential::from_json(json).map_err(|e| format!("credential {id}: {e}"))?;
            by_id.insert(id.clone(), Arc::new(c));
        }
        Ok(Tokens { by_id })
    }

    /// The credential `id`.
    pub fn get(&self, id: &str) -> Option<&Arc<Credential>> {
        self.by_id.get(id)
    }

    /// Adds or replaces a credential.
    pub fn put(&mut self, c: Credential) {
        self.by_id.insert(c.id.clone(), Arc::new(c));
    }

    /// Removes a credential.
    pub fn remove(&mut self, id: &str) -> Option<Arc<Credential>> {
        self.by_id.remove(id)
    }

    /// How many.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Every credential, by id.
    pub fn all(&self) -> Vec<Arc<Credential>> {
        let mut v: Vec<_> = self.by_id.values().cloned().collect();
        v.sort_by(|a, b| a.id.cmp(&b.id));
        v
    }

    /// Admin credentials that have not expired at `now_unix_ms`.
    pub fn live_admins(&self, now_unix_ms: u64) -> usize {
        self.by_id
            .values()
            .filter(|c| {
                c.role == Ok(Role::Admin) && (c.expires_unix_ms == 0 || c.expires_unix_ms > now_unix_ms)
            })
            .count()
    }

    /// The credential `authorization` names, or why not. `header` is the whole header value.
    pub fn authenticate(&self, header: Option<&[u8]>, now_unix_ms: u64) -> Result<Arc<Credential>, Refused> {
        let header = header.ok_or(Refused::Missing)?;
        if header.len() > HEADER_MAX_BYTES {
            return Err(Refused::Malformed(format!("the header is over {HEADER_MAX_BYTES} bytes")));
        }
        let text = std::str::from_utf8(header).map_err(|_| Refused::Malformed("not UTF-8".into()))?;
        let token = text
            .strip_prefix("Bearer ")
            .ok_or_else(|| Refused::Malformed("expected `Bearer TOKEN`".into()))?
            .trim();
        let id = token_id(token).ok_or_else(|| {
            Refused::Malformed("expected tg_ID_SECRET, as `tollgate token create` prints".into())
        })?;
        let c = self.by_id.get(id).ok_or_else(|| Refused::Unknown(id.to_string()))?;
        if !same(&c.hash, &sha256(token)) {
            return Err(Refused::Unknown(id.to_string()));
        }
        if c.expires_unix_ms != 0 && c.expires_unix_ms <= now_unix_ms {
            return Err(Refused::Expired(id.to_string()));
        }
        if let Err(role) = &c.role {
            return Err(Refused::UnknownRole { id: id.to_string(), role: role.clone() });
        }
        Ok(c.clone())
    }
}

/// The role a gRPC method needs (by its path, `/package.Service/Method`); unknown methods
/// need admin.
pub fn grpc_role(path: &str) -> Role {
    match path {
        "/tollgate.v1.Admission/Exchange" => Role::Client,
        "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
        | "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas" => Role::Client,
        "/tollgate.v1.Backend/Report"
        | "/tollgate.v1.Backend/WatchSettings"
        | "/tollgate.v1.Backend/GetSettings" => Role::Backend,
        "/tollgate.v1.Admin/GetGroup"
        | "/tollgate.v1.Admin/ListGroups"
        | "/tollgate.v1.Admin/GetNode"
        | "/tollgate.v1.Admin/Status"
        | "/tollgate.v1.Admin/Trace"
        | "/tollgate.v1.Admin/GetRlsRules"
        | "/tollgate.v1.Admin/Usage" => Role::Reader,
        _ => Role::Admin,
    }
}

/// The role an HTTP request needs; `None`: open to all.
pub fn http_role(method: &axum::http::Method, path: &str) -> Option<Role> {
    // The probes, and the dashboard's page and static files (they hold no data; the routes
    // they read do).
    if path == "/healthz" || path == "/readyz" || path == "/" || path.starts_with("/assets/") {
        return None;
    }
    // Admission and what goes with it: a service's client token, for its groups.
    if matches!(path, "/v1/check" | "/v1/charge" | "/v1/acquire" | "/v1/release" | "/v1/renew") {
        return Some(Role::Client);
    }
    if method == axum::http::Method::GET || method == axum::http::Method::HEAD {
        Some(Role::Reader)
    } else {
        Some(Role::Admin)
    }
}

/// Which credential owns each client id, so that another credential cannot take a client's
/// place (its grants and its share): the first to exchange with an id owns it until the id
/// has been idle for [`OWNER_IDLE_MS`].
#[derive(Debug, Default)]
pub struct Owners {
    by_client: HashMap<String, (String, u64)>,
}

/// How long an idle client id stays bound to its credential.
pub const OWNER_IDLE_MS: u64 = 10 * 60 * 1000;
/// The most client ids bound at once.
pub const OWNERS_MAX: usize = 1_000_000;

impl Owners {
    /// Binds `client` to `credential` (or checks that it is bound to it). An id bound to a
    /// credential that is no longer `live` (revoked) is free at once.
    pub fn bind(
        &mut self,
        client: &str,
        credential: &str,
        now_unix_ms: u64,
        live: impl Fn(&str) -> bool,
    ) -> Result<(), Refused> {
        if let Some((owner, seen)) = self.by_client.get_mut(client) {
            if owner == credential || now_unix_ms.saturating_sub(*seen) > OWNER_IDLE_MS || !live(owner) {
                owner.clear();
                owner.push_str(credential);
                *seen = now_unix_ms;
                return Ok(());
            }
            return Err(Refused::ClientTaken { client: client.to_string() });
        }
        if self.by_client.len() >= OWNERS_MAX {
            self.by_client.retain(|_, (_, seen)| now_unix_ms.saturating_sub(*seen) <= OWNER_IDLE_MS);
            if self.by_client.len() >= OWNERS_MAX {
                return Err(Refused::ClientTaken { client: client.to_string() });
            }
        }
        self.by_client.insert(client.to_string(), (credential.to_string(), now_unix_ms));
        Ok(())
    }
}

/// The `ID` of a token that reads `tg_ID_SECRET` (16 and 64 hex digits); `None` otherwise.
fn token_id(token: &str) -> Option<&str> {
    let (id, secret) = token.strip_prefix("tg_")?.split_once('_')?;
    let hexdigits = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    (hexdigits(id, 16) && hexdigits(secret, 64)).then_some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new(role: &str) -> NewCredential {
        NewCredential { role: role.into(), ..NewCredential::default() }
    }

    #[test]
    fn a_region_token_exchanges_for_every_group_and_reads_but_changes_nothing() {
        let (c, _) = Credential::issue(&new("region"), 0).unwrap();
        let role = c.role.clone().unwrap();
        assert_eq!(role, Role::Region);
        assert!(role.covers(grpc_role("/tollgate.v1.Admission/Exchange")));
        assert!(role.covers(grpc_role("/tollgate.v1.Admin/ListGroups")));
        assert!(!role.covers(grpc_role("/tollgate.v1.Admin/PutGroup")));
        assert!(!role.covers(grpc_role("/tollgate.v1.Backend/Report")));
        assert!(c.allows_group("any-group"));
        assert!(Credential::issue(&NewCredential { groups: "a".into(), ..new("region") }, 0).is_err());
    }

    #[test]
    fn a_token_authenticates_once_issued_and_never_after_its_time() {
        let (c, token) =
            Credential::issue(&NewCredential { expires_in_s: 60, ..new("reader") }, 1_000).unwrap();
        assert!(token.starts_with(&format!("tg_{}_", c.id)));
        assert!(!c.to_json().contains(&token[20..]), "the store never sees the secret");
        let mut tokens = Tokens::default();
        tokens.put(Credential::from_json(&c.to_json()).unwrap());
        let header = format!("Bearer {token}");
        assert_eq!(tokens.authenticate(Some(header.as_bytes()), 2_000).unwrap().id, c.id);
        assert_eq!(tokens.authenticate(Some(header.as_bytes()), 61_000), Err(Refused::Expired(c.id.clone())));
        let mut wrong = header.clone();
        wrong.pop();
        wrong.push(if header.ends_with('0') { '1' } else { '0' });
        assert_eq!(tokens.authenticate(Some(wrong.as_bytes()), 2_000), Err(Refused::Unknown(c.id.clone())));
        assert_eq!(tokens.authenticate(None, 2_000), Err(Refused::Missing));
        for bad in ["Bearer", "Basic abc", "Bearer tg_", "Bearer tg_zz_zz", &"x".repeat(300)] {
            assert!(
                matches!(tokens.authenticate(Some(bad.as_bytes()), 2_000), Err(Refused::Malformed(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_stored_role_this_server_does_not_know_is_refused_by_name() {
        let (c, token) = Credential::issue(&new("reader"), 0).unwrap();
        let json = c.to_json().replace("\"reader\"", "\"auditor\"");
        let mut tokens = Tokens::default();
        tokens.put(Credential::from_json(&json).unwrap());
        let got = tokens.authenticate(Some(format!("Bearer {token}").as_bytes()), 1);
        assert_eq!(got, Err(Refused::UnknownRole { id: c.id, role: "auditor".into() }));
    }

    #[test]
    fn group_patterns_match_with_stars() {
        assert!(matches("", "anything"));
        assert!(matches("tenant-*", "tenant-a"));
        assert!(matches("a,b*", "bz"));
        assert!(!matches("tenant-*", "other"));
        assert!(matches("*-x-*", "a-x-b"));
        assert!(!matches("a*b", "acbd"));
        assert!(check_groups("a b").is_err());
        assert!(check_groups("a,,b").is_err());
        assert!(Credential::issue(&NewCredential { groups: "a".into(), ..new("reader") }, 0).is_err());
        assert!(Credential::issue(&new("root"), 0).unwrap_err().contains("role"));
    }

    #[test]
    fn a_client_id_stays_with_its_credential_until_idle() {
        let mut o = Owners::default();
        let all = |_: &str| true;
        o.bind("c1", "A", 0, all).unwrap();
        o.bind("c1", "A", 10, all).unwrap();
        assert!(o.bind("c1", "B", 20, all).is_err());
        o.bind("c1", "B", 20 + OWNER_IDLE_MS + 1, all).unwrap();
        // An id whose credential was revoked is free at once.
        o.bind("c2", "A", 0, all).unwrap();
        o.bind("c2", "B", 10, |id| id != "A").unwrap();
        assert!(o.bind("c2", "A", 20, all).is_err());
    }
}

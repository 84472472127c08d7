//! Reaching a controller that asks for credentials or speaks TLS: a bearer token on every
//! call, and for `https://` addresses the authority to check the controller's certificate
//! against (and, for mutual TLS, this client's own certificate and key).
//!
//! ```
//! use tollgate_limiter::access::Access;
//! let access = Access { token: Some("tg_0123456789abcdef_".to_string() + &"0".repeat(64)), ..Access::default() };
//! assert!(access.bearer().is_ok());
//! ```

use std::path::PathBuf;

use tollgate_proto::frames::EndKnownCalls;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// A token and TLS files; the default is neither (a plain controller without `--auth`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Access {
    /// The token, as `tollgate token create` printed it.
    pub token: Option<String>,
    /// PEM authority for the controller's certificate (`https://` addresses); `None`: the
    /// system's trusted authorities.
    pub ca_file: Option<PathBuf>,
    /// PEM certificate and key this client shows, for a controller with mutual TLS.
    pub identity: Option<(PathBuf, PathBuf)>,
}

/// The longest file read for a certificate, key or authority, in bytes.
const PEM_MAX_BYTES: u64 = 1 << 20;

fn read_pem(path: &PathBuf, what: &str) -> Result<Vec<u8>, String> {
    let len = std::fs::metadata(path).map_err(|e| format!("{what} {}: {e}", path.display()))?.len();
    if len > PEM_MAX_BYTES {
        return Err(format!("{what} {}: larger than {PEM_MAX_BYTES} bytes", path.display()));
    }
    std::fs::read(path).map_err(|e| format!("{what} {}: {e}", path.display()))
}

impl Access {
    /// From the environment: `TOLLGATE_TOKEN`, `TOLLGATE_CA`, and `TOLLGATE_CERT` with
    /// `TOLLGATE_KEY`.
    pub fn from_env() -> Access {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Access {
            token: var("TOLLGATE_TOKEN"),
            ca_file: var("TOLLGATE_CA").map(PathBuf::from),
            identity: var("TOLLGATE_CERT").zip(var("TOLLGATE_KEY")).map(|(c, k)| (c.into(), k.into())),
        }
    }

    /// The endpoint for `url`, with TLS for `https://`; an error says what is wrong.
    pub fn endpoint(&self, url: &str) -> Result<Endpoint, String> {
        let endpoint = Channel::from_shared(url.to_string()).map_err(|e| format!("{url:?}: {e}"))?;
        if !url.starts_with("https://") {
            if self.ca_file.is_some() || self.identity.is_some() {
                return Err(format!("{url:?}: a CA file or client certificate needs an https:// address"));
            }
            return Ok(endpoint);
        }
        let mut tls = ClientTlsConfig::new();
        tls = match &self.ca_file {
            Some(ca) => tls.ca_certificate(Certificate::from_pem(read_pem(ca, "CA file")?)),
            None => tls.with_native_roots(),
        };
        if let Some((cert, key)) = &self.identity {
            tls = tls.identity(Identity::from_pem(read_pem(cert, "certificate")?, read_pem(key, "key")?));
        }
        endpoint.tls_config(tls).map_err(|e| format!("{url:?}: TLS: {e}"))
    }

    /// The interceptor that puts the token on every call.
    pub fn bearer(&self) -> Result<Bearer, String> {
        match &self.token {
            None => Ok(Bearer(None)),
            Some(t) => {
                let t = t.trim();
                if t.is_empty() || t.len() > 256 || !t.bytes().all(|b| b.is_ascii_graphic()) {
                    return Err(
                        "token: 1 to 256 printable ASCII characters, as `tollgate token create` prints"
                            .into(),
                    );
                }
                let value: MetadataValue<Ascii> = format!("Bearer {t}")
                    .parse()
                    .map_err(|_| "token: not a valid header value".to_string())?;
                Ok(Bearer(Some(value)))
            }
        }
    }

    /// A lazily connected channel to `url` carrying the token.
    pub fn channel(&self, url: &str, connect_timeout: std::time::Duration) -> Result<Rpc, String> {
        let channel = self.endpoint(url)?.connect_timeout(connect_timeout).connect_lazy();
        Ok(InterceptedService::new(EndKnownCalls(channel), self.bearer()?))
    }
}

impl Access {
    /// A Redis client for store mode at `url`: with TLS for `rediss://` (the CA file and the
    /// client certificate, when given). A token is refused: Redis takes its password in the
    /// URL.
    pub fn redis_client(&self, url: &str) -> Result<redis::Client, String> {
        if self.token.is_some() {
            return Err("token: store mode talks to Redis, which takes its password in the URL \
                        (rediss://:PASSWORD@HOST:PORT), not a token"
                .into());
        }
        if !url.starts_with("rediss://") {
            if self.ca_file.is_some() || self.identity.is_some() {
                return Err(format!("{url:?}: a CA file or client certificate needs a rediss:// address"));
            }
            return redis::Client::open(url).map_err(|e| format!("url: {e}"));
        }
        let client_tls = match &self.identity {
            None => None,
            Some((cert, key)) => Some(redis::ClientTlsConfig {
                client_cert: read_pem(cert, "certificate")?,
                client_key: read_pem(key, "key")?,
            }),
        };
        let root_cert = self.ca_file.as_ref().map(|ca| read_pem(ca, "CA file")).transpose()?;
        redis::Client::build_with_tls(url, redis::TlsCertificates { client_tls, root_cert })
            .map_err(|e| format!("url: {e}"))
    }
}

/// Puts `authorization: Bearer TOKEN` on every call (nothing without a token).
#[derive(Debug, Clone, Default)]
pub struct Bearer(Option<MetadataValue<Ascii>>);

impl Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

/// A channel to a controller with the token on every call, each call's data frame ending its
/// stream ([`EndKnownCalls`]).
pub type Rpc = InterceptedService<EndKnownCalls<Channel>, Bearer>;

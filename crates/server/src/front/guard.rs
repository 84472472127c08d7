//! The check every call passes before it reaches a handler, over gRPC and HTTP alike: the
//! connection's request rate, the client certificate's name against the allow-list, and,
//! with authentication on, the caller's token and whether its role covers the call. The
//! credential goes on to the handler (as [`Caller`]) for its own checks and the audit log.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::extract::{ConnectInfo, Request, State};
use axum::http;
use axum::middleware::Next;
use axum::response::IntoResponse;

use crate::access::auth::{Caller, Refused, Role, grpc_role, http_role};
use crate::access::credentials::Access;
use crate::front::listen::Peer;

/// What the front ends check beyond the controller's credentials, and how much they show.
#[derive(Debug, Clone, Default)]
pub struct Front {
    /// Client certificate common names allowed (empty: any the client authority signed).
    pub allowed_names: Arc<Vec<String>>,
    /// gRPC calls open at once on one connection (0: tonic's default).
    pub max_streams: u32,
    /// Groups `/metrics` names one by one.
    pub metrics_groups: crate::observe::series::MetricsGroups,
    /// The most one charge may take.
    pub charge_bound: crate::front::charges::ChargeBound,
}

/// Checks one call; see the [module documentation](self). `Ok(None)`: allowed with no
/// credential (authentication off, or an open endpoint).
pub(crate) fn check(
    access: &Access,
    front: &Front,
    peer: Option<&Peer>,
    needed: Option<Role>,
    authorization: Option<&[u8]>,
    call: &dyn Fn() -> String,
) -> Result<Option<Caller>, Refused> {
    if let Some(p) = peer
        && !p.budget.take()
    {
        return Err(Refused::ConnRate(p.budget.rate()));
    }
    if !front.allowed_names.is_empty() {
        match peer.and_then(|p| p.cert_name.as_deref()) {
            Some(name) if front.allowed_names.iter().any(|a| a == name) => {}
            Some(name) => return Err(Refused::CertName(format!("{name:?}"))),
            None => return Err(Refused::CertName("(no common name)".into())),
        }
    }
    let Some(needed) = needed else { return Ok(None) };
    if !access.auth_required() {
        return Ok(None);
    }
    let credential = access.authenticate(authorization)?;
    match credential.role {
        Ok(role) if role.covers(needed) => Ok(Some(Caller(credential))),
        _ => Err(Refused::Forbidden { who: credential.label(), call: call(), needed: needed.name() }),
    }
}

/// The gRPC side: a tower layer over tonic's routes.
#[derive(Clone)]
pub struct GrpcGuardLayer {
    pub(crate) access: Arc<Access>,
    pub(crate) front: Front,
}

impl<S> tower::Layer<S> for GrpcGuardLayer {
    type Service = GrpcGuard<S>;

    fn layer(&self, inner: S) -> GrpcGuard<S> {
        GrpcGuard { inner, access: self.access.clone(), front: self.front.clone() }
    }
}

/// See [`GrpcGuardLayer`].
#[derive(Clone)]
pub struct GrpcGuard<S> {
    inner: S,
    access: Arc<Access>,
    front: Front,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> tower::Service<http::Request<B>> for GrpcGuard<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        let path = req.uri().path();
        let checked = check(
            &self.access,
            &self.front,
            req.extensions().get::<Peer>(),
            Some(grpc_role(path)),
            req.headers().get(http::header::AUTHORIZATION).map(|v| v.as_bytes()),
            &|| path.to_string(),
        );
        match checked {
            Ok(caller) => {
                if let Some(c) = caller {
                    req.extensions_mut().insert(c);
                }
                // The clone is ready in turn (tonic's routes always are).
                let clone = self.inner.clone();
                let mut inner = std::mem::replace(&mut self.inner, clone);
                Box::pin(inner.call(req))
            }
            Err(refused) => {
                let response = refused.status().into_http();
                Box::pin(std::future::ready(Ok(response)))
            }
        }
    }
}

/// The HTTP side, as axum middleware.
pub(crate) async fn http_guard(
    State((access, front)): State<(Arc<Access>, Front)>,
    mut req: Request,
    next: Next,
) -> axum::response::Response {
    let peer = req.extensions().get::<ConnectInfo<Peer>>().map(|c| &c.0);
    if peer.is_some_and(|p| p.health_only) && !matches!(req.uri().path(), "/healthz" | "/readyz") {
        let body = serde_json::json!({
            "error": "the HTTP port is at its connection limit (--max-connections); this connection may ask for /healthz and /readyz only"
        })
        .to_string();
        return (
            http::StatusCode::SERVICE_UNAVAILABLE,
            [(http::header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response();
    }
    let checked = check(
        &access,
        &front,
        peer,
        http_role(req.method(), req.uri().path()),
        req.headers().get(http::header::AUTHORIZATION).map(|v| v.as_bytes()),
        &|| format!("{} {}", req.method(), req.uri().path()),
    );
    match checked {
        Ok(caller) => {
            if let Some(c) = caller {
                req.extensions_mut().insert(c);
            }
            next.run(req).await
        }
        Err(refused) => {
            let status =
                http::StatusCode::from_u16(refused.http_status()).unwrap_or(http::StatusCode::FORBIDDEN);
            let body = serde_json::json!({ "error": refused.to_string() }).to_string();
            let mut response =
                (status, [(http::header::CONTENT_TYPE, "application/json")], body).into_response();
            if refused.http_status() == 401 {
                response
                    .headers_mut()
                    .insert(http::header::WWW_AUTHENTICATE, http::HeaderValue::from_static("Bearer"));
            }
            response
        }
    }
}

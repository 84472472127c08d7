//! A `tower` layer: admission control in front of any service.
//!
//! [`TollgateLayer`] takes a function that maps a request to its group and cost. Each call
//! waits for admission (up to the limiter's `max_wait`) before reaching the inner service;
//! a request that cannot be admitted fails with the [`AcquireError`](crate::AcquireError),
//! boxed, which the caller can downcast to answer "429 Too Many Requests" with its
//! retry-after.
//!
//! With [`TollgateLayer::with_adaptive_throttle`], the layer also throttles itself when the
//! inner service sheds: an error from the inner service counts as a refusal, and while it
//! refuses much of what it is sent, a share of requests fail at once with
//! [`RefusedLocally`] instead of being sent ([`ClientThrottle`]).
//!
//! ```
//! use tower::{Service, ServiceBuilder, ServiceExt};
//! use tollgate_limiter::{Tollgate, TollgateLayer};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let gate = Tollgate::from_toml("[groups.alice]\nlimit = 100\n")?;
//! // Requests are (tenant, payload) here; the cost is the payload's length.
//! let mut svc = ServiceBuilder::new()
//!     .layer(TollgateLayer::new(gate, |req: &(String, Vec<u8>)| (req.0.clone(), req.1.len() as f64)))
//!     .service_fn(|req: (String, Vec<u8>)| async move { Ok::<_, std::convert::Infallible>(req.1.len()) });
//! let n = svc.ready().await?.call(("alice".to_string(), vec![0; 10])).await?;
//! assert_eq!(n, 10);
//! # Ok(())
//! # }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tower::{BoxError, Layer, Service};

use crate::handle::Tollgate;
use crate::throttle::{ClientThrottle, RefusedLocally, ThrottleOptions};

/// Wraps services with admission control. See the [module documentation](self).
#[derive(Clone)]
pub struct TollgateLayer<F> {
    gate: Tollgate,
    classify: F,
    throttle: Option<ClientThrottle>,
}

impl<F> TollgateLayer<F> {
    /// A layer admitting each request for the group and cost `classify` gives it.
    pub fn new(gate: Tollgate, classify: F) -> Self {
        Self { gate, classify, throttle: None }
    }

    /// The same layer, throttling itself when the inner service sheds (Google's client-side
    /// adaptive throttling with `opts`): the inner service's errors count as refusals. Every
    /// service the layer makes shares the one throttle. Must be called inside a tokio runtime;
    /// an option out of range is named.
    pub fn with_adaptive_throttle(mut self, opts: ThrottleOptions) -> Result<Self, String> {
        self.throttle = Some(ClientThrottle::new(opts)?);
        Ok(self)
    }

    /// The layer's adaptive throttle, if it has one.
    pub fn throttle(&self) -> Option<&ClientThrottle> {
        self.throttle.as_ref()
    }
}

impl<S, F: Clone> Layer<S> for TollgateLayer<F> {
    type Service = TollgateService<S, F>;

    fn layer(&self, inner: S) -> Self::Service {
        TollgateService {
            inner,
            gate: self.gate.clone(),
            classify: self.classify.clone(),
            throttle: self.throttle.clone(),
        }
    }
}

/// A service behind admission control; made by [`TollgateLayer`].
#[derive(Clone)]
pub struct TollgateService<S, F> {
    inner: S,
    gate: Tollgate,
    classify: F,
    throttle: Option<ClientThrottle>,
}

impl<S, F, G, Req> Service<Req> for TollgateService<S, F>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send,
    F: Fn(&Req) -> (G, f64),
    G: AsRef<str> + Send + 'static,
    Req: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let (group, cost) = (self.classify)(&req);
        let gate = self.gate.clone();
        let throttle = self.throttle.clone();
        let refused = throttle.as_ref().is_some_and(|t| !t.allow());
        // The inner service was made ready by `poll_ready`: take it, leave a clone behind.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            if refused {
                return Err(RefusedLocally.into());
            }
            let permit = gate.acquire(group.as_ref(), cost).await?;
            let response = inner.call(req).await.map_err(Into::into);
            drop(permit);
            if let Some(t) = throttle {
                t.record(response.is_ok());
            }
            response
        })
    }
}

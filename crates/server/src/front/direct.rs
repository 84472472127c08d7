//! Envoy's rate-limit calls read and answered by hand, in front of the generated services.
//!
//! A decision is a small unary call made at the rate of the requests Envoy serves, so the
//! machinery around it costs more than the decision itself. [`DirectRls`] takes
//! `ShouldRateLimit` before the router: it reads the request's one message straight from the
//! body, decodes it, asks [`Rls`] and answers with one data frame and the `grpc-status`
//! trailer ([`OneMessage`]). The answers are those the generated service would give, errors
//! included: like every service of the server, it takes no compressed call.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use futures_util::future::Either;
use http_body::Frame;
use prost::bytes::BytesMut;
use tonic::Status;
use tonic::codegen::{Body, Bytes, http};

use crate::access::auth::Caller;
use crate::front::rls::Rls;

/// The rate-limit decision's path: `/` the service `/` the method.
pub const RLS_PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// The largest request message taken, as for every generated service: 4 MiB.
pub const MESSAGE_MAX_BYTES: usize = 4 * 1024 * 1024;

/// The gRPC message's head: a compression flag and the message's length (big-endian).
const HEAD_BYTES: usize = 5;

/// A service that answers [`RLS_PATH`] itself and passes every other call to `inner`.
#[derive(Clone)]
pub struct DirectRls<S> {
    inner: S,
    rls: Arc<Rls>,
}

impl<S> DirectRls<S> {
    /// `rls` in front of `inner`.
    pub fn new(inner: S, rls: Arc<Rls>) -> Self {
        DirectRls { inner, rls }
    }

    /// The layer putting `rls` in front of a service.
    pub fn layer(rls: Rls) -> impl tower::Layer<S, Service = DirectRls<S>> + Clone {
        let rls = Arc::new(rls);
        tower::layer::layer_fn(move |inner| DirectRls::new(inner, rls.clone()))
    }
}

/// The answer of a call taken here.
type Answered<E> = Pin<Box<dyn Future<Output = Result<http::Response<tonic::body::Body>, E>> + Send>>;

impl<S, B> tower::Service<http::Request<B>> for DirectRls<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    // The inner service's future (tonic's router: kilobytes) is boxed on its own, so that a
    // decision's future, boxed again by the layers around this one, is a pointer: one
    // allocation of kilobytes a call took a thousand instructions to make and free.
    type Future = Either<Pin<Box<S::Future>>, Answered<S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() != RLS_PATH {
            return Either::Left(Box::pin(self.inner.call(req)));
        }
        if let Some(e) = req.headers().get("grpc-encoding").filter(|e| e.as_bytes() != b"identity") {
            let status = Status::unimplemented(format!(
                "the call is compressed ({}), which this server does not take: send it uncompressed",
                String::from_utf8_lossy(e.as_bytes())
            ));
            return Either::Right(Box::pin(std::future::ready(Ok(status.into_http()))));
        }
        // The future boxed carries the body and the caller alone, not the request's head: a
        // few hundred bytes, which the allocator hands out from its per-thread cache, where
        // the whole request made it over a kilobyte (a thousand instructions a call to
        // allocate and free).
        let caller = req.extensions().get::<Caller>().cloned();
        Either::Right(Box::pin(decide(self.rls.clone(), caller, req.into_body())))
    }
}

/// Reads the decision asked in `body`, has `rls` take it for `caller` and makes the answer.
async fn decide<B: Body<Data = Bytes>, E>(
    rls: Arc<Rls>,
    caller: Option<Caller>,
    body: B,
) -> Result<http::Response<tonic::body::Body>, E> {
    use prost::Message;
    let message = match read_message(body).await {
        Ok(m) => m,
        Err(status) => return Ok(status.into_http()),
    };
    let asked = match RateLimitRequest::decode(message) {
        Ok(r) => r,
        Err(e) => {
            return Ok(Status::internal(format!("the RateLimitRequest does not decode: {e}")).into_http());
        }
    };
    Ok(match rls.decide(caller.as_ref(), &asked).await {
        Ok(answer) => {
            let mut response = http::Response::new(tonic::body::Body::new(OneMessage::new(framed(&answer))));
            *response.version_mut() = http::Version::HTTP_2;
            response
                .headers_mut()
                .insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/grpc"));
            response
        }
        Err(status) => status.into_http(),
    })
}

/// `message` as a gRPC message: its head (not compressed, its length), then its bytes.
fn framed(message: &impl prost::Message) -> Bytes {
    let len = message.encoded_len();
    let mut framed = Vec::with_capacity(HEAD_BYTES + len);
    framed.push(0);
    framed.extend_from_slice(&u32::try_from(len).expect("an answer is far below 4 GiB").to_be_bytes());
    message.encode_raw(&mut framed);
    Bytes::from(framed)
}

/// The one message of a unary call's body, without its head; what is wrong with it as the
/// generated services would say.
async fn read_message<B: Body<Data = Bytes>>(body: B) -> Result<Bytes, Status> {
    let mut body = std::pin::pin!(body);
    let mut first: Option<Bytes> = None;
    let mut more = BytesMut::new();
    while let Some(frame) = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
        let frame = frame.map_err(|_| Status::internal("the request's body failed while it was read"))?;
        let Ok(data) = frame.into_data() else { continue };
        let read = first.as_ref().map_or(0, Bytes::len) + more.len() + data.len();
        if read > HEAD_BYTES + MESSAGE_MAX_BYTES {
            return Err(too_large(read - HEAD_BYTES));
        }
        match &first {
            None => first = Some(data),
            Some(f) => {
                if more.is_empty() {
                    more.extend_from_slice(f);
                }
                more.extend_from_slice(&data);
            }
        }
    }
    let read = if more.is_empty() { first.unwrap_or_default() } else { more.freeze() };
    framed_message(read)
}

/// The message inside `read`, the whole of a unary call's body: its head, then exactly the
/// length it gives.
fn framed_message(mut read: Bytes) -> Result<Bytes, Status> {
    if read.is_empty() {
        return Err(Status::internal("the call carries no request message"));
    }
    if read.len() < HEAD_BYTES {
        return Err(Status::internal("the request message's head is cut short"));
    }
    if read[0] != 0 {
        return Err(Status::internal(
            "the request message is compressed but the call names no grpc-encoding",
        ));
    }
    let len = u32::from_be_bytes([read[1], read[2], read[3], read[4]]) as usize;
    if len > MESSAGE_MAX_BYTES {
        return Err(too_large(len));
    }
    let message = read.split_off(HEAD_BYTES);
    match message.len().cmp(&len) {
        std::cmp::Ordering::Equal => Ok(message),
        std::cmp::Ordering::Less => Err(Status::internal(format!(
            "the request message is cut short: {} of its {len} bytes",
            message.len()
        ))),
        std::cmp::Ordering::Greater => {
            Err(Status::internal("a unary call carries one request message, not more"))
        }
    }
}

fn too_large(len: usize) -> Status {
    Status::out_of_range(format!(
        "the request message is {len} bytes, above the limit of {MESSAGE_MAX_BYTES}"
    ))
}

/// A body of one data frame and the trailers of a call that succeeded (`grpc-status: 0`).
pub struct OneMessage {
    data: Option<Bytes>,
    done: bool,
}

impl OneMessage {
    /// The body carrying `data` (a framed message).
    pub fn new(data: Bytes) -> Self {
        OneMessage { data: Some(data), done: false }
    }
}

impl Body for OneMessage {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        if let Some(data) = this.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if this.done {
            return Poll::Ready(None);
        }
        this.done = true;
        let mut trailers = http::HeaderMap::with_capacity(1);
        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
        Poll::Ready(Some(Ok(Frame::trailers(trailers))))
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.data.as_ref().map_or(0, |d| d.len() as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(flag: u8, declared: u32, message: &[u8]) -> Bytes {
        let mut b = vec![flag];
        b.extend_from_slice(&declared.to_be_bytes());
        b.extend_from_slice(message);
        Bytes::from(b)
    }

    #[test]
    fn a_unary_body_gives_its_one_message_and_names_what_is_wrong_otherwise() {
        assert_eq!(framed_message(framed(0, 3, b"abc")).unwrap(), Bytes::from_static(b"abc"));
        assert_eq!(framed_message(framed(0, 0, b"")).unwrap(), Bytes::new());
        let refused = |b: Bytes| framed_message(b).unwrap_err();
        assert_eq!(refused(Bytes::new()).code(), tonic::Code::Internal);
        assert!(refused(Bytes::from_static(b"\0\0")).message().contains("head is cut short"));
        assert!(refused(framed(1, 3, b"abc")).message().contains("compressed"));
        assert!(refused(framed(0, 4, b"abc")).message().contains("3 of its 4 bytes"));
        assert!(refused(framed(0, 2, b"abc")).message().contains("one request message"));
        let big = refused(framed(0, MESSAGE_MAX_BYTES as u32 + 1, b""));
        assert_eq!(big.code(), tonic::Code::OutOfRange);
        assert!(big.message().contains("above the limit"), "{}", big.message());
    }

    #[test]
    fn the_answer_body_is_one_data_frame_then_the_ok_trailer() {
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let mut body = OneMessage::new(Bytes::from_static(b"\0\0\0\0\x01x"));
        assert_eq!(body.size_hint().exact(), Some(6));
        let mut body = Pin::new(&mut body);
        let Poll::Ready(Some(Ok(first))) = body.as_mut().poll_frame(&mut cx) else { panic!("no data") };
        assert_eq!(first.into_data().unwrap(), Bytes::from_static(b"\0\0\0\0\x01x"));
        assert!(!body.is_end_stream());
        let Poll::Ready(Some(Ok(second))) = body.as_mut().poll_frame(&mut cx) else { panic!("no trailers") };
        assert_eq!(second.into_trailers().unwrap()["grpc-status"], "0");
        assert!(body.is_end_stream());
        assert!(matches!(body.as_mut().poll_frame(&mut cx), Poll::Ready(None)));
    }
}

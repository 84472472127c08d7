//! A gRPC answer in one write to the socket, and a call in two instead of three.
//!
//! The HTTP/2 library under gRPC (the `h2` crate) copies a frame into its write buffer, except
//! a data frame of 256 bytes or more (1,024 on a stream without vectored writes), which it
//! keeps aside and writes out before it takes the next frame. And a request body that cannot
//! tell it has ended gets an empty data frame of its own to end the stream, sent later. So:
//!
//! - an answer of a few kilobytes (a head, one data frame, trailers) went out in two writes:
//!   the head and the data, then the trailers;
//! - a call went out in three: the head, the data, then the empty frame that ends it.
//!
//! Each write over TCP costs a system call, and the receiver a wake-up and a read: measured on
//! the controller at half a million grants a second, its writes were 15 % of its time.
//!
//! Two shapes fix that, without touching the bytes of any message:
//!
//! - [`Slices`] cuts an answer's data into frames below [`SLICE_BYTES`], so that `h2` copies
//!   them all, with the head and trailers, into its buffer and writes them at once. The
//!   server's connections then say they take no vectored writes, which raises `h2`'s limit
//!   to 1,024 bytes (see `tollgate-controller`'s listener).
//! - [`EndKnown`] looks one frame ahead in a call's body, so that the last data frame itself
//!   says the stream ends and no empty frame follows it ([`EndKnownCalls`] does this to every
//!   call of a channel). A call still goes out in two writes, its head and then its data:
//!   `h2` gives a new stream no room to send data until its head has been written (a stream
//!   waiting to open holds no share of the connection's window), so the data is queued only
//!   after the connection has flushed the head.
//!
//! ```
//! use std::pin::Pin;
//! use std::task::{Context, Poll, Waker};
//!
//! use http_body::Body;
//! use tollgate_proto::frames::{SLICE_BYTES, Slices};
//!
//! let mut answer = Slices::new("x".repeat(3000));
//! let mut cx = Context::from_waker(Waker::noop());
//! let mut sizes = Vec::new();
//! while let Poll::Ready(Some(frame)) = Pin::new(&mut answer).poll_frame(&mut cx) {
//!     sizes.push(frame.unwrap().into_data().unwrap().len());
//! }
//! assert_eq!(sizes, [SLICE_BYTES, SLICE_BYTES, 3000 - 2 * SLICE_BYTES]);
//! ```

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http_body::{Body, Frame, SizeHint};
use tonic::codegen::{Bytes, Service, http};

/// The largest data frame [`Slices`] sends: below the 1,024 bytes from which `h2` writes a
/// frame on its own (a frame's head is 9 bytes more).
pub const SLICE_BYTES: usize = 1008;

/// A body whose data frames are at most [`SLICE_BYTES`] long; trailers and the bytes
/// themselves unchanged. See the [module](self).
#[derive(Debug)]
pub struct Slices<B> {
    inner: B,
    /// The rest of a data frame cut short.
    rest: Bytes,
}

impl<B> Slices<B> {
    /// Slices `inner`'s data.
    pub fn new(inner: B) -> Self {
        Self { inner, rest: Bytes::new() }
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for Slices<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        if this.rest.is_empty() {
            match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => this.rest = data,
                    Err(other) => return Poll::Ready(Some(Ok(other))),
                },
                other => return Poll::Ready(other),
            }
        }
        let n = this.rest.len().min(SLICE_BYTES);
        Poll::Ready(Some(Ok(Frame::data(this.rest.split_to(n)))))
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let inner = self.inner.size_hint();
        let rest = self.rest.len() as u64;
        let mut hint = SizeHint::new();
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper + rest);
        }
        hint.set_lower(inner.lower() + rest);
        hint
    }
}

/// What a body's `poll_frame` gives when ready.
type Next<B> = Option<Result<Frame<<B as Body>::Data>, <B as Body>::Error>>;

/// A body that knows it has ended as soon as its last frame is taken: it asks for the next
/// frame before handing one on. See the [module](self).
pub struct EndKnown<B: Body> {
    inner: B,
    /// The frame asked for ahead (or the error met there).
    ahead: Next<B>,
    /// The inner body has no more frames.
    ended: bool,
}

impl<B: Body> std::fmt::Debug for EndKnown<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EndKnown").field("ahead", &self.ahead.is_some()).field("ended", &self.ended).finish()
    }
}

impl<B: Body> EndKnown<B> {
    /// Looks ahead in `inner`.
    pub fn new(inner: B) -> Self {
        let ended = inner.is_end_stream();
        Self { inner, ahead: None, ended }
    }
}

impl<B: Body + Unpin> EndKnown<B> {
    /// The inner body's next frame, unless it has none.
    fn poll_inner(&mut self, cx: &mut Context<'_>) -> Poll<Next<B>> {
        if self.ended {
            return Poll::Ready(None);
        }
        let next = ready!(Pin::new(&mut self.inner).poll_frame(cx));
        if next.is_none() {
            self.ended = true;
        }
        Poll::Ready(next)
    }
}

impl<B: Body + Unpin> Body for EndKnown<B>
where
    B::Data: Unpin,
    B::Error: Unpin,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Next<B>> {
        let this = self.get_mut();
        let frame = match this.ahead.take() {
            Some(frame) => frame,
            None => match ready!(this.poll_inner(cx)) {
                Some(frame) => frame,
                None => return Poll::Ready(None),
            },
        };
        // The next one now if it is there already (a unary call's is: the end); if not,
        // the inner body wakes this task when it is.
        if frame.is_ok()
            && let Poll::Ready(Some(next)) = this.poll_inner(cx)
        {
            this.ahead = Some(next);
        }
        Poll::Ready(Some(frame))
    }

    fn is_end_stream(&self) -> bool {
        self.ended && self.ahead.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A channel whose every call's body is [`EndKnown`]: a unary call goes out in two writes (its
/// head, then its data ending the stream) rather than three. See the [module](self).
#[derive(Debug, Clone)]
pub struct EndKnownCalls<S>(pub S);

impl<S> Service<http::Request<tonic::body::Body>> for EndKnownCalls<S>
where
    S: Service<http::Request<tonic::body::Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> S::Future {
        self.0.call(req.map(|body| tonic::body::Body::new(EndKnown::new(body))))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::convert::Infallible;
    use std::task::Waker;

    use super::*;

    /// A body of given frames, of which only the first `ready` are there yet.
    struct Parts {
        frames: VecDeque<Frame<Bytes>>,
        ready: usize,
    }

    impl Parts {
        fn new(frames: Vec<Frame<Bytes>>) -> Self {
            Self { ready: frames.len(), frames: frames.into() }
        }
    }

    impl Body for Parts {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            let this = self.get_mut();
            if this.ready == 0 && !this.frames.is_empty() {
                return Poll::Pending;
            }
            this.ready = this.ready.saturating_sub(1);
            Poll::Ready(this.frames.pop_front().map(Ok))
        }

        fn is_end_stream(&self) -> bool {
            // As tonic's bodies: the end is known only once asked for.
            false
        }
    }

    fn trailers() -> Frame<Bytes> {
        let mut t = http::HeaderMap::new();
        t.insert("grpc-status", http::HeaderValue::from_static("0"));
        Frame::trailers(t)
    }

    fn next<B: Body<Data = Bytes> + Unpin>(body: &mut B) -> Poll<Option<Frame<Bytes>>>
    where
        B::Error: std::fmt::Debug,
    {
        let mut cx = Context::from_waker(Waker::noop());
        Pin::new(body).poll_frame(&mut cx).map(|f| f.map(|f| f.expect("no error")))
    }

    #[test]
    fn an_answer_is_sliced_below_the_copy_limit_and_keeps_its_bytes_and_trailers() {
        let message: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
        let small = Bytes::from_static(b"tiny");
        let mut body = Slices::new(Parts::new(vec![
            Frame::data(Bytes::from(message.clone())),
            Frame::data(small.clone()),
            trailers(),
        ]));
        let mut data = Vec::new();
        let mut sizes = Vec::new();
        let mut got_trailers = None;
        while let Poll::Ready(Some(frame)) = next(&mut body) {
            match frame.into_data() {
                Ok(d) => {
                    sizes.push(d.len());
                    data.extend_from_slice(&d);
                }
                Err(frame) => got_trailers = frame.into_trailers().ok(),
            }
        }
        assert!(sizes.iter().all(|&n| n <= SLICE_BYTES && n + 9 < 1024), "{sizes:?}");
        assert_eq!(sizes, [1008, 1008, 1008, 1008, 968, 4]);
        assert_eq!(data[..5000], message[..]);
        assert_eq!(&data[5000..], b"tiny");
        assert_eq!(got_trailers.expect("trailers")["grpc-status"], "0");
    }

    #[test]
    fn a_sliced_body_ends_only_with_its_last_slice() {
        // `String` is a body of one data frame that knows its size and its end.
        let mut body = Slices::new("x".repeat(1500));
        assert!(!body.is_end_stream());
        assert_eq!(body.size_hint().exact(), Some(1500));
        assert!(matches!(next(&mut body), Poll::Ready(Some(_))));
        assert!(!body.is_end_stream(), "492 bytes still to come");
        assert_eq!(body.size_hint().exact(), Some(492));
        assert!(matches!(next(&mut body), Poll::Ready(Some(_))));
        assert!(body.is_end_stream());
    }

    #[test]
    fn a_call_body_says_it_has_ended_with_its_last_data_frame() {
        let mut plain = Parts::new(vec![Frame::data(Bytes::from_static(b"call"))]);
        assert!(matches!(next(&mut plain), Poll::Ready(Some(_))));
        assert!(!plain.is_end_stream(), "without looking ahead, the end needs a frame of its own");

        let mut body = EndKnown::new(Parts::new(vec![Frame::data(Bytes::from_static(b"call"))]));
        assert!(!body.is_end_stream());
        let frame = next(&mut body);
        assert!(matches!(frame, Poll::Ready(Some(ref f)) if f.data_ref().is_some_and(|d| &d[..] == b"call")));
        assert!(body.is_end_stream(), "known with the data frame");
        assert!(matches!(next(&mut body), Poll::Ready(None)));
    }

    #[test]
    fn a_frame_looked_ahead_is_kept_in_order_and_a_late_one_is_waited_for() {
        let mut body = EndKnown::new(Parts::new(vec![
            Frame::data(Bytes::from_static(b"one")),
            Frame::data(Bytes::from_static(b"two")),
            trailers(),
        ]));
        let mut seen = Vec::new();
        while let Poll::Ready(Some(frame)) = next(&mut body) {
            let ended = body.is_end_stream();
            seen.push((frame.data_ref().map(|d| d.to_vec()), frame.is_trailers(), ended));
        }
        assert_eq!(
            seen,
            [
                (Some(b"one".to_vec()), false, false),
                (Some(b"two".to_vec()), false, false),
                (None, true, true)
            ]
        );

        // A body whose next frame is not there yet: the frame in hand goes on, the end is
        // not claimed, and the next one comes when it is ready.
        let mut parts = Parts::new(vec![
            Frame::data(Bytes::from_static(b"now")),
            Frame::data(Bytes::from_static(b"later")),
        ]);
        parts.ready = 1;
        let mut body = EndKnown::new(parts);
        let now = next(&mut body);
        assert!(matches!(now, Poll::Ready(Some(ref f)) if f.data_ref().is_some_and(|d| &d[..] == b"now")));
        assert!(!body.is_end_stream());
        assert!(next(&mut body).is_pending());
        assert!(!body.is_end_stream());
        body.inner.ready = 1;
        let later = next(&mut body);
        assert!(
            matches!(later, Poll::Ready(Some(ref f)) if f.data_ref().is_some_and(|d| &d[..] == b"later"))
        );
        assert!(body.is_end_stream());
    }
}

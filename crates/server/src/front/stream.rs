//! Large answers written a chunk at a time: `/status`, `/v1/status`, `/v1/groups` and
//! `/metrics` at 100,000 groups are tens of megabytes of text. Made whole, each scrape held
//! the text and (for JSON) a tree of values many times its size, about a gigabyte at once;
//! written a chunk at a time on the blocking pool, an answer holds a few chunks whatever its
//! length, and a client that goes away stops the writing.

use axum::body::{Body, Bytes};
use tokio::sync::mpsc;

/// The size a chunk is sent at.
pub(crate) const CHUNK_BYTES: usize = 64 * 1024;
/// Chunks written but not yet sent, at most.
const CHUNKS_AHEAD: usize = 4;

/// The client went away: writing stops.
#[derive(Debug)]
pub(crate) struct Gone;

/// Where a streamed answer is written.
pub(crate) struct Chunks {
    buf: Vec<u8>,
    tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
}

impl Chunks {
    /// Sends what is written once it makes a chunk.
    pub(crate) fn flush_if_full(&mut self) -> Result<(), Gone> {
        if self.buf.len() >= CHUNK_BYTES { self.send() } else { Ok(()) }
    }

    fn send(&mut self) -> Result<(), Gone> {
        let chunk = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK_BYTES + 4096)));
        self.tx.blocking_send(Ok(chunk)).map_err(|_| Gone)
    }

    /// Writes `bytes`.
    pub(crate) fn put(&mut self, bytes: &[u8]) -> Result<(), Gone> {
        self.buf.extend_from_slice(bytes);
        self.flush_if_full()
    }

    /// Writes `value` as JSON.
    pub(crate) fn json(&mut self, value: &serde_json::Value) -> Result<(), Gone> {
        serde_json::to_writer(&mut self.buf, value).map_err(|_| Gone)?;
        self.flush_if_full()
    }

    /// Writes the object `head` with the array `key` added at its end, its items written one
    /// after the other as `items` makes them.
    pub(crate) fn object_with_array(
        &mut self,
        head: serde_json::Value,
        key: &str,
        items: impl Iterator<Item = serde_json::Value>,
    ) -> Result<(), Gone> {
        let mut open = serde_json::to_vec(&head).map_err(|_| Gone)?;
        // `{…}` without its closing brace, then the array.
        open.pop();
        if open.len() > 1 {
            open.push(b',');
        }
        self.put(&open)?;
        self.json(&serde_json::Value::from(key))?;
        self.put(b":[")?;
        for (i, item) in items.enumerate() {
            if i > 0 {
                self.put(b",")?;
            }
            self.json(&item)?;
        }
        self.put(b"]}")
    }
}

impl std::fmt::Write for Chunks {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.put(s.as_bytes()).map_err(|_| std::fmt::Error)
    }
}

/// A body written by `produce` on the blocking pool, at most a few chunks ahead of the client.
/// An answer that fits in one chunk goes whole, with its length; a longer one in chunks.
pub(crate) async fn body(produce: impl FnOnce(&mut Chunks) -> Result<(), Gone> + Send + 'static) -> Body {
    let (tx, mut rx) = mpsc::channel(CHUNKS_AHEAD);
    crate::blocking::spawn(move || {
        let mut chunks = Chunks { buf: Vec::with_capacity(CHUNK_BYTES + 4096), tx };
        if produce(&mut chunks).is_ok() && !chunks.buf.is_empty() {
            let _ = chunks.send();
        }
    });
    let Some(first) = rx.recv().await else { return Body::empty() };
    let Some(second) = rx.recv().await else {
        return match first {
            Ok(bytes) => Body::from(bytes),
            Err(e) => Body::from_stream(tokio_stream::once(Err::<Bytes, _>(e))),
        };
    };
    let head = tokio_stream::iter([first, second]);
    Body::from_stream(tokio_stream::StreamExt::chain(head, tokio_stream::wrappers::ReceiverStream::new(rx)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_streamed_object_is_the_object_whole() {
        let items = (0..20_000).map(|i| serde_json::json!({ "name": format!("g{i}"), "n": i }));
        let streamed =
            body(move |c| c.object_with_array(serde_json::json!({ "role": "leader" }), "groups", items))
                .await;
        let bytes = axum::body::to_bytes(streamed, usize::MAX).await.unwrap();
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["role"], "leader");
        assert_eq!(v["groups"].as_array().unwrap().len(), 20_000);
        assert_eq!(v["groups"][19_999]["name"], "g19999");
        let empty = body(|c| c.object_with_array(serde_json::json!({}), "groups", std::iter::empty())).await;
        let bytes = axum::body::to_bytes(empty, usize::MAX).await.unwrap();
        assert_eq!(&bytes[..], b"{\"groups\":[]}");
    }
}

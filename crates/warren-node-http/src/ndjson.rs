//! NDJSON both ways: values to lines for a response body, and a body's
//! chunks back to whole lines, which may arrive split across chunks or
//! several to a chunk.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use futures_util::{Stream, StreamExt};
use serde::Serialize;
use warren_node_api::{NodeError, NodeResult};

/// The longest line a client accepts: far above any real event, and a
/// bound on what a broken peer can make it buffer.
pub(crate) const MAX_LINE: usize = 16 << 20;

/// Each value as one JSON line.
pub(crate) fn encode<S>(items: S) -> impl Stream<Item = Result<Bytes, serde_json::Error>>
where
    S: Stream,
    S::Item: Serialize,
{
    items.map(|item| {
        let mut line = serde_json::to_vec(&item)?;
        line.push(b'\n');
        Ok(Bytes::from(line))
    })
}

/// The lines of a byte stream, without their `\n` (or `\r\n`). Blank lines
/// are skipped (the event feed's heartbeats); a last line without its
/// newline is still a line. It ends after the first error.
pub(crate) struct Lines<S> {
    inner: S,
    buf: BytesMut,
    /// How much of `buf` is known to hold no newline.
    scanned: usize,
    done: bool,
}

impl<S> Lines<S> {
    pub(crate) fn new(inner: S) -> Lines<S> {
        Lines {
            inner,
            buf: BytesMut::new(),
            scanned: 0,
            done: false,
        }
    }

    fn next_line(&mut self) -> Option<Bytes> {
        while let Some(at) = self.buf[self.scanned..].iter().position(|b| *b == b'\n') {
            let mut line = self.buf.split_to(self.scanned + at + 1);
            self.scanned = 0;
            line.truncate(line.len() - 1);
            if line.last() == Some(&b'\r') {
                line.truncate(line.len() - 1);
            }
            if !is_blank(&line) {
                return Some(line.freeze());
            }
        }
        self.scanned = self.buf.len();
        None
    }

    fn fail(&mut self, e: NodeError) -> Poll<Option<NodeResult<Bytes>>> {
        self.done = true;
        self.buf.clear();
        self.scanned = 0;
        Poll::Ready(Some(Err(e)))
    }
}

fn is_blank(line: &[u8]) -> bool {
    line.iter().all(u8::is_ascii_whitespace)
}

impl<S> Stream for Lines<S>
where
    S: Stream<Item = NodeResult<Bytes>> + Unpin,
{
    type Item = NodeResult<Bytes>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(line) = this.next_line() {
                return Poll::Ready(Some(Ok(line)));
            }
            if this.done {
                let rest = this.buf.split().freeze();
                this.scanned = 0;
                if is_blank(&rest) {
                    return Poll::Ready(None);
                }
                return Poll::Ready(Some(Ok(rest)));
            }
            if this.buf.len() > MAX_LINE {
                return this.fail(NodeError::internal(format!(
                    "the node sent a line longer than {MAX_LINE} bytes"
                )));
            }
            match this.inner.poll_next_unpin(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(chunk))) => this.buf.extend_from_slice(&chunk),
                Poll::Ready(Some(Err(e))) => return this.fail(e),
                Poll::Ready(None) => this.done = true,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::stream;

    fn chunks(parts: &[&'static [u8]]) -> impl Stream<Item = NodeResult<Bytes>> + Unpin {
        stream::iter(
            parts
                .iter()
                .map(|p| Ok(Bytes::from_static(p)))
                .collect::<Vec<_>>(),
        )
    }

    async fn all(s: impl Stream<Item = NodeResult<Bytes>> + Unpin) -> Vec<NodeResult<Bytes>> {
        Lines::new(s).collect().await
    }

    #[tokio::test]
    async fn lines_split_across_chunks_and_several_to_a_chunk() {
        let got = all(chunks(&[b"{\"a\"", b":1}\n{\"b\":2}\n{\"c\"", b":3}\r\n"])).await;
        let got: Vec<Bytes> = got.into_iter().map(|r| r.unwrap()).collect();
        assert_eq!(got, vec![&b"{\"a\":1}"[..], b"{\"b\":2}", b"{\"c\":3}"]);
    }

    #[tokio::test]
    async fn blank_lines_are_heartbeats_and_a_last_line_needs_no_newline() {
        let got = all(chunks(&[b"\n\n1\n", b"\n", b" \n2"])).await;
        let got: Vec<Bytes> = got.into_iter().map(|r| r.unwrap()).collect();
        assert_eq!(got, vec![&b"1"[..], b"2"]);
    }

    #[tokio::test]
    async fn one_byte_chunks() {
        let text: &'static [u8] = b"alpha\nbeta\ngamma\n";
        let parts: Vec<&'static [u8]> = text.chunks(1).collect();
        let got: Vec<Bytes> = all(chunks(&parts))
            .await
            .into_iter()
            .map(|r| r.unwrap())
            .collect();
        assert_eq!(got, vec![&b"alpha"[..], b"beta", b"gamma"]);
    }

    #[tokio::test]
    async fn ends_after_an_error_and_keeps_lines_before_it() {
        let s = stream::iter(vec![
            Ok(Bytes::from_static(b"1\n2")),
            Err(NodeError::unavailable("reset")),
            Ok(Bytes::from_static(b"\n3\n")),
        ]);
        let got = all(s).await;
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].as_ref().unwrap(), &Bytes::from_static(b"1"));
        assert_eq!(got[1].as_ref().unwrap_err().message, "reset");
    }

    #[tokio::test]
    async fn refuses_an_endless_line() {
        let big = Bytes::from(vec![b'x'; MAX_LINE / 4]);
        let s = stream::iter((0..8).map(move |_| Ok(big.clone())));
        let got = all(s).await;
        let last = got.last().unwrap().as_ref().unwrap_err();
        assert!(last.message.contains("longer than"), "{last:?}");
    }

    #[tokio::test]
    async fn encode_writes_one_line_per_value() {
        let body: Vec<Bytes> = encode(stream::iter(vec![1u32, 2]))
            .map(|r| r.unwrap())
            .collect()
            .await;
        assert_eq!(body, vec![&b"1\n"[..], b"2\n"]);
    }
}

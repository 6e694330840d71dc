//! Copying both ways between a sandbox's connection and its upstream, under
//! the sandbox's byte budget, until either side closes, the connection is
//! revoked, or nothing has moved either way for [`IDLE_TIMEOUT`].

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio_util::sync::CancellationToken;

use crate::limits::Bucket;

const CHUNK: usize = 64 * 1024;

/// A proxied connection with no traffic either way for this long is
/// closed: each holds two of the node's descriptors, and a sandbox that
/// opens connections and leaves them idle must not hold them forever.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(600);

pub(crate) async fn splice<A, B>(
    a: A,
    b: B,
    budget: Option<&Bucket>,
    cancel: &CancellationToken,
) -> std::io::Result<(u64, u64)>
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    splice_idle(a, b, budget, cancel, IDLE_TIMEOUT).await
}

pub(crate) async fn splice_idle<A, B>(
    a: A,
    b: B,
    budget: Option<&Bucket>,
    cancel: &CancellationToken,
    idle: Duration,
) -> std::io::Result<(u64, u64)>
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let clock = Activity::new();
    let (mut a, mut b) = (clock.watch(a), clock.watch(b));
    let Some(budget) = budget else {
        return tokio::select! {
            r = tokio::io::copy_bidirectional_with_sizes(&mut a, &mut b, CHUNK, CHUNK) => r,
            _ = cancel.cancelled() => Ok((0, 0)),
            _ = clock.idle_for(idle) => Ok((0, 0)),
        };
    };
    let (mut ar, mut aw) = tokio::io::split(a);
    let (mut br, mut bw) = tokio::io::split(b);
    let up = copy_limited(&mut ar, &mut bw, budget);
    let down = copy_limited(&mut br, &mut aw, budget);
    tokio::select! {
        r = async { tokio::try_join!(up, down) } => r,
        _ = cancel.cancelled() => Ok((0, 0)),
        _ = clock.idle_for(idle) => Ok((0, 0)),
    }
}

/// When bytes last moved on a connection, in ms since it opened.
#[derive(Clone)]
struct Activity {
    opened: Instant,
    last_ms: Arc<AtomicU64>,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            opened: Instant::now(),
            last_ms: Arc::new(AtomicU64::new(0)),
        }
    }

    fn touch(&self) {
        let now = self.opened.elapsed().as_millis() as u64;
        self.last_ms.store(now, Ordering::Relaxed);
    }

    fn watch<T>(&self, inner: T) -> Watched<T> {
        Watched {
            inner,
            activity: self.clone(),
        }
    }

    /// Completes once nothing has moved for `idle`.
    async fn idle_for(&self, idle: Duration) {
        loop {
            let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
            let quiet = self.opened.elapsed().saturating_sub(last);
            if quiet >= idle {
                return;
            }
            tokio::time::sleep(idle - quiet).await;
        }
    }
}

/// A stream that records when bytes move through it.
struct Watched<T> {
    inner: T,
    activity: Activity,
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.touch();
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

async fn copy_limited<R, W>(r: &mut R, w: &mut W, budget: &Bucket) -> std::io::Result<u64>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; CHUNK];
    let mut total = 0u64;
    loop {
        let n = r.read(&mut buf).await?;
        if n == 0 {
            w.shutdown().await.ok();
            return Ok(total);
        }
        budget.take(n).await;
        w.write_all(&buf[..n]).await?;
        total += n as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Found by a hostile run: two sandboxes holding ~530 idle connections
    // each through the proxy kept them (and the node's descriptors) forever.
    #[tokio::test]
    async fn an_idle_connection_is_closed_and_a_busy_one_is_not() {
        let (client, mut sandbox_end) = tokio::io::duplex(1024);
        let (upstream, mut far_end) = tokio::io::duplex(1024);
        let cancel = CancellationToken::new();
        let idle = Duration::from_millis(300);
        let task =
            tokio::spawn(async move { splice_idle(client, upstream, None, &cancel, idle).await });
        // Traffic every 100 ms keeps it open past the idle time.
        for _ in 0..6 {
            sandbox_end.write_all(b"x").await.expect("write");
            let mut b = [0u8; 1];
            far_end.read_exact(&mut b).await.expect("read");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(!task.is_finished());
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(task.is_finished(), "an idle connection is closed");
    }
}

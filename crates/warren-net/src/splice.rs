//! Copying both ways between a sandbox's connection and its upstream, under
//! the sandbox's byte budget, until either side closes or the connection is
//! revoked.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use crate::limits::Bucket;

const CHUNK: usize = 64 * 1024;

pub(crate) async fn splice<A, B>(
    mut a: A,
    mut b: B,
    budget: Option<&Bucket>,
    cancel: &CancellationToken,
) -> std::io::Result<(u64, u64)>
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let Some(budget) = budget else {
        return tokio::select! {
            r = tokio::io::copy_bidirectional_with_sizes(&mut a, &mut b, CHUNK, CHUNK) => r,
            _ = cancel.cancelled() => Ok((0, 0)),
        };
    };
    let (mut ar, mut aw) = tokio::io::split(a);
    let (mut br, mut bw) = tokio::io::split(b);
    let up = copy_limited(&mut ar, &mut bw, budget);
    let down = copy_limited(&mut br, &mut aw, budget);
    tokio::select! {
        r = async { tokio::try_join!(up, down) } => r,
        _ = cancel.cancelled() => Ok((0, 0)),
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

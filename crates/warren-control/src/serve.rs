//! The HTTP server loop. axum's own `serve` has no read timeouts and no
//! connection limit; a daemon that lends a thousand sandboxes must not be
//! taken down by clients that open connections and send nothing. Each
//! connection gets a deadline for its request head (which is also how long
//! an idle keep-alive connection is kept), and the number of connections is
//! bounded below the daemon's descriptor limit.

use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// A request head must arrive within this; an idle keep-alive connection
/// is closed after it.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// Connections served at once, from the daemon's descriptor limit: a
/// quarter of it, the rest being for sandboxes (pidfds, logs, exec pipes,
/// proxy sockets) and the store.
pub fn connection_limit(nofile: u64) -> usize {
    (nofile / 4).clamp(64, 8192) as usize
}

/// Serves `router` until `stop` completes, then asks every connection to
/// finish its request and close, and returns once they have (streams end
/// on their own when the daemon stops; see lifecycle). A connection that
/// does not finish within `drain` is dropped.
pub async fn serve(
    listener: TcpListener,
    router: axum::Router,
    max_connections: usize,
    stop: impl std::future::Future<Output = ()>,
    drain: Duration,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(max_connections));
    let closing = tokio_util::sync::CancellationToken::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .keep_alive(true);
    tokio::pin!(stop);
    loop {
        // At the limit, stop accepting until a connection ends; the kernel
        // holds new ones in the listen backlog meanwhile.
        let slot = tokio::select! {
            s = slots.clone().acquire_owned() => match s {
                Ok(s) => s,
                Err(_) => break,
            },
            _ = &mut stop => break,
        };
        let (tcp, _) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(error = %e, "accepting a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut stop => break,
        };
        // Exec streams are many small writes; without TCP_NODELAY each one
        // can wait for a delayed ACK (~40 ms).
        let _ = tcp.set_nodelay(true);
        let service = TowerToHyperService::new(router.clone());
        let conn = builder
            .serve_connection(TokioIo::new(tcp), service)
            .with_upgrades();
        let closing = closing.clone();
        tokio::spawn(async move {
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = closing.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
            drop(slot);
        });
    }
    drop(listener);
    closing.cancel();
    // Every connection task holds a slot; all slots back means all done.
    let all = slots.acquire_many(max_connections as u32);
    let _ = tokio::time::timeout(drain, all).await;
    Ok(())
}

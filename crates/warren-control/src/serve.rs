//! The HTTP server loop. axum's own `serve` has no read timeouts and no
//! connection limit; a daemon that lends a thousand sandboxes must not be
//! taken down by clients that open connections and send nothing. Each
//! connection gets a deadline for its request head (which is also how long
//! an idle keep-alive connection is kept), the number of connections is
//! bounded below the daemon's descriptor limit, and when the bound comes
//! near, the oldest connections are asked to close (at once when idle,
//! after their request otherwise), as nginx does with idle keep-alive
//! connections when it runs short.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use warren_core::sync::lock;

/// A request head must arrive within this; an idle keep-alive connection
/// is closed after it.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// How long Warren's own clients keep an idle connection for the next
/// request. A client that reuses a connection just as the daemon closes it
/// for idleness sees the request fail with nothing read back (the daemon
/// never got it), and a create or exec cannot be retried blindly; keeping
/// well under [`HEADER_TIMEOUT`] means the daemon never closes a connection
/// a client may still pick. The Python SDK's `keepalive_expiry` is the same.
pub const CLIENT_IDLE_LIMIT: Duration = Duration::from_secs(10);

/// Connections asked to close per connection accepted while crowded.
const EVICT_PER_ACCEPT: usize = 2;

/// Connections served at once, from the daemon's descriptor limit: a
/// quarter of it, the rest being for sandboxes (pidfds, logs, exec pipes,
/// proxy sockets) and the store.
pub fn connection_limit(nofile: u64) -> usize {
    (nofile / 4).clamp(64, 8192) as usize
}

/// Open connections by accept order, each with the token that asks it to
/// close.
#[derive(Default)]
struct Open {
    next: u64,
    conns: BTreeMap<u64, CancellationToken>,
}

impl Open {
    fn add(&mut self) -> (u64, CancellationToken) {
        let seq = self.next;
        self.next += 1;
        let token = CancellationToken::new();
        self.conns.insert(seq, token.clone());
        (seq, token)
    }

    /// Asks the `n` oldest connections to close.
    fn evict_oldest(&mut self, n: usize) {
        let oldest: Vec<u64> = self.conns.keys().take(n).copied().collect();
        for seq in oldest {
            if let Some(t) = self.conns.remove(&seq) {
                t.cancel();
            }
        }
    }
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
    let open = Arc::new(Mutex::new(Open::default()));
    let closing = CancellationToken::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .keep_alive(true);
    tokio::pin!(stop);
    loop {
        if slots.available_permits() < max_connections / 4 {
            {
                let mut o = lock(&open);
                o.evict_oldest(EVICT_PER_ACCEPT);
            }
        }
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
        let (seq, evicted) = lock(&open).add();
        let (closing, open) = (closing.clone(), open.clone());
        tokio::spawn(async move {
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = closing.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
                _ = evicted.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
            {
                let mut o = lock(&open);
                o.conns.remove(&seq);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_connections_are_asked_to_close_first() {
        let mut o = Open::default();
        let tokens: Vec<_> = (0..5).map(|_| o.add().1).collect();
        o.evict_oldest(2);
        let closed: Vec<bool> = tokens.iter().map(|t| t.is_cancelled()).collect();
        assert_eq!(closed, [true, true, false, false, false]);
        assert_eq!(o.conns.len(), 3);
    }
}

//! Serving the node API on a socket: plain TCP, or TLS with each
//! handshake in a task of its own.

use std::time::Duration;

use axum::Router;
use hyper_util::rt::TokioIo;

/// Serves `router` on `listener` until the listener fails. Every
/// connection gets TCP_NODELAY: exec output, events and the last chunk of
/// a stream are small writes that Nagle's algorithm would hold back until
/// the peer's delayed ACK (40 ms a round trip, measured).
pub async fn serve(listener: tokio::net::TcpListener, router: Router) -> std::io::Result<()> {
    use axum::serve::ListenerExt;
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY on a node API connection");
        }
    });
    axum::serve(listener, router).await
}

/// A client that has not finished its TLS handshake by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// As [`serve`], over TLS. Each connection's handshake runs in its own
/// task, so a slow or silent client holds up no other.
pub async fn serve_tls(
    listener: tokio::net::TcpListener,
    router: Router,
    tls: tokio_rustls::TlsAcceptor,
) -> std::io::Result<()> {
    loop {
        let tcp = match listener.accept().await {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                // Out of descriptors and the like: back off, do not spin.
                tracing::warn!(error = %e, "accepting a node API connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY on a node API connection");
        }
        let (tls, router) = (tls.clone(), router.clone());
        tokio::spawn(async move {
            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(tcp)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "TLS handshake on the node API");
                    return;
                }
                Err(_) => return,
            };
            let service = hyper_util::service::TowerToHyperService::new(router);
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .with_upgrades();
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "a node API connection");
            }
        });
    }
}

//! The transparent path: a client that ignores the proxy settings connects
//! straight to an address, which the sandbox's local route delivers to the
//! node's listener for that port. What it may reach is decided, in order,
//! by an address or CIDR rule for the address it dialled (the internal data
//! plane), by the name behind an address the DNS stub handed out, or by
//! the TLS server name or HTTP Host it sends. Otherwise it is refused: the
//! dialled address alone never opens a path to a name.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use warren_core::network::{normalize_host, Target};

use crate::sandbox::{Refusal, SandboxNet};
use crate::sniff::{sniff, split_authority, Sniffed, MAX_SNIFF};

/// How long a client may take to say where it is going.
const SNIFF_TIMEOUT: Duration = Duration::from_secs(5);

pub(crate) async fn serve(
    net: Arc<SandboxNet>,
    port: u16,
    listener: TcpListener,
    cancel: CancellationToken,
) {
    loop {
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(_) => continue,
            },
            _ = cancel.cancelled() => return,
        };
        tokio::spawn(handle(net.clone(), port, stream));
    }
}

enum Kind {
    Http,
    Other,
}

async fn handle(net: Arc<SandboxNet>, port: u16, mut client: TcpStream) {
    let Ok(dialled) = client.local_addr().map(|a| a.ip()) else {
        return;
    };
    let mut head = Vec::new();
    if let Err(r) = net.rate_ok() {
        net.log(serde_json::json!({
            "decision": "deny", "via": "transparent", "dialled": dialled.to_string(),
            "port": port, "reason": r.reason, "rule": r.rule, "status": r.status,
        }));
        // The protocol is unknown before sniffing; a reset is the answer.
        return refuse(client, &r, Kind::Other).await;
    }
    let (target, kind) = match decide(&net, dialled, port, &mut client, &mut head).await {
        Ok(t) => t,
        Err((refusal, kind)) => {
            net.log(serde_json::json!({
                "decision": "deny", "via": "transparent", "dialled": dialled.to_string(),
                "port": port, "reason": refusal.reason, "rule": refusal.rule, "status": refusal.status,
            }));
            refuse(client, &refusal, kind).await;
            return;
        }
    };
    let opened = match net.open(&target, port, "transparent").await {
        Ok(o) => o,
        Err(r) => return refuse(client, &r, kind).await,
    };
    let mut upstream = opened.stream;
    if upstream.write_all(&head).await.is_err() {
        return;
    }
    let _guard = opened.guard;
    let _ = crate::splice::splice(client, upstream, net.bytes.as_ref(), &opened.cancel).await;
}

async fn decide(
    net: &SandboxNet,
    dialled: IpAddr,
    port: u16,
    client: &mut TcpStream,
    head: &mut Vec<u8>,
) -> Result<(Target, Kind), (Refusal, Kind)> {
    if let Some(name) = net.fake_name(dialled) {
        return Ok((Target::Name(name), Kind::Other));
    }
    let dialled_target = Target::Ip(dialled);
    if net.policy().check(&dialled_target, port).allowed {
        return Ok((dialled_target, Kind::Other));
    }
    let deadline = tokio::time::Instant::now() + SNIFF_TIMEOUT;
    let mut buf = [0u8; 4096];
    let sniffed = loop {
        match sniff(head) {
            Sniffed::NeedMore if head.len() < MAX_SNIFF => {}
            other => break other,
        }
        let n = match tokio::time::timeout_at(deadline, client.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => n,
            _ => break Sniffed::Unknown,
        };
        head.extend_from_slice(&buf[..n]);
    };
    let refusal = |reason: String| Refusal {
        status: 403,
        reason,
        rule: None,
    };
    let (host, kind) = match sniffed {
        Sniffed::Tls(Some(sni)) => (sni, Kind::Other),
        Sniffed::Tls(None) => {
            return Err((refusal(format!("TLS to {dialled}:{port} without a server name (SNI): refused")), Kind::Other))
        }
        Sniffed::Http(Some(host)) => (split_authority(&host).0.to_string(), Kind::Http),
        Sniffed::Http(None) => return Err((refusal("HTTP request without a Host header: refused".into()), Kind::Http)),
        Sniffed::NeedMore | Sniffed::Unknown => {
            return Err((
                refusal(format!(
                    "{dialled}:{port}: cannot tell the destination (no TLS server name, no HTTP Host, not a name from the sandbox's DNS)"
                )),
                Kind::Other,
            ))
        }
    };
    match normalize_host(&host) {
        Ok(t) => Ok((t, kind)),
        Err(e) => Err((refusal(e.to_string()), kind)),
    }
}

/// HTTP clients get a 403/429 they can read; anything else is reset.
async fn refuse(mut client: TcpStream, r: &Refusal, kind: Kind) {
    if let Kind::Http = kind {
        let _ = client.write_all(&crate::explicit::refusal_bytes(r)).await;
        let _ = client.shutdown().await;
        return;
    }
    let _ = nix::sys::socket::setsockopt(
        &client,
        nix::sys::socket::sockopt::Linger,
        &libc::linger {
            l_onoff: 1,
            l_linger: 0,
        },
    );
}

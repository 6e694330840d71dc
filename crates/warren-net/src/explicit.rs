//! The explicit proxy at 127.0.0.1:3128 inside a sandbox: HTTP CONNECT
//! tunnels and plain-HTTP forwarding (absolute-form requests), with
//! upstream keep-alive reuse for plain HTTP. Refusals answer 403/429/502
//! with `X-Warren-Proxy-Error` (the reason) and `X-Warren-Rule` (the rule or
//! limit that decided).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, Uri};
use http_body_util::{combinators::BoxBody, BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use warren_core::network::{normalize_host, Target};

use crate::conns::ConnGuard;
use crate::sandbox::{Refusal, SandboxNet};
use crate::sniff::split_authority;

type Body = BoxBody<Bytes, hyper::Error>;

pub(crate) type Client = hyper_util::client::legacy::Client<Connector, Incoming>;

/// A sandbox's own upstream pool: pooled connections were checked for this
/// sandbox and only ever carry its requests.
pub(crate) fn client(net: Weak<SandboxNet>) -> Client {
    hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .pool_idle_timeout(std::time::Duration::from_secs(30))
        .build(Connector { net })
}

/// The pool of a sandbox's plain-HTTP upstream connections, with the
/// policy they were checked under: a new policy starts a new pool (the
/// old one's idle connections are dropped with it).
struct Pool {
    policy: Arc<warren_core::network::Policy>,
    client: Client,
}

type SharedPool = Arc<std::sync::Mutex<Pool>>;

/// The client for `net`'s current policy.
fn pooled(net: &Arc<SandboxNet>, pool: &SharedPool) -> Client {
    let policy = net.policy();
    let mut p = warren_core::sync::lock(pool);
    if !Arc::ptr_eq(&p.policy, &policy) {
        *p = Pool {
            policy,
            client: client(Arc::downgrade(net)),
        };
    }
    p.client.clone()
}

pub(crate) fn serve(net: Arc<SandboxNet>, listener: tokio::net::TcpListener) {
    let pool: SharedPool = Arc::new(std::sync::Mutex::new(Pool {
        policy: net.policy(),
        client: client(Arc::downgrade(&net)),
    }));
    tokio::spawn(async move {
        loop {
            let stream = tokio::select! {
                r = listener.accept() => match r {
                    Ok((s, _)) => s,
                    Err(_) => continue,
                },
                _ = net.cancel.cancelled() => return,
            };
            let (net, pool) = (net.clone(), pool.clone());
            tokio::spawn(async move {
                if let Err(r) = net.rate_ok() {
                    net.log(serde_json::json!({
                        "decision": "deny", "via": "proxy", "reason": r.reason, "rule": r.rule, "status": r.status,
                    }));
                    let mut stream = stream;
                    let _ = stream.write_all(&refusal_bytes(&r)).await;
                    return;
                }
                let cancel = net.cancel.clone();
                let pool = pool.clone();
                let svc =
                    hyper::service::service_fn(move |req| handle(net.clone(), pool.clone(), req));
                // busybox wget shuts down its write side after an https
                // request; without half-close hyper would sometimes drop
                // the connection before answering it.
                let conn = hyper::server::conn::http1::Builder::new()
                    .half_close(true)
                    .serve_connection(TokioIo::new(stream), svc)
                    .with_upgrades();
                tokio::select! {
                    _ = conn => {}
                    _ = cancel.cancelled() => {}
                }
            });
        }
    });
}

fn refuse(r: &Refusal) -> Response<Body> {
    let mut resp = Response::new(full(format!("{}\n", r.reason)));
    *resp.status_mut() = StatusCode::from_u16(r.status).unwrap_or(StatusCode::FORBIDDEN);
    let h = resp.headers_mut();
    // Header values must be visible ASCII; reasons are built from
    // normalised hosts, but never let one break the response.
    if let Ok(v) = http::HeaderValue::from_str(
        &r.reason
            .replace(|c: char| !c.is_ascii() || c.is_control(), "?"),
    ) {
        h.insert("x-warren-proxy-error", v);
    }
    if let Some(rule) = r
        .rule
        .as_deref()
        .and_then(|r| http::HeaderValue::from_str(r).ok())
    {
        h.insert("x-warren-rule", rule);
    }
    resp
}

/// A refusal written straight to a connection that is never served.
pub(crate) fn refusal_bytes(r: &Refusal) -> Vec<u8> {
    let reason: String = r
        .reason
        .chars()
        .filter(|c| c.is_ascii() && !c.is_control())
        .collect();
    let status = match r.status {
        429 => "429 Too Many Requests",
        400 => "400 Bad Request",
        502 => "502 Bad Gateway",
        _ => "403 Forbidden",
    };
    format!(
        "HTTP/1.1 {status}\r\nX-Warren-Proxy-Error: {reason}\r\nX-Warren-Rule: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{reason}\n",
        r.rule.as_deref().unwrap_or(""),
        reason.len() + 1
    )
    .into_bytes()
}

fn full(s: String) -> Body {
    Full::new(Bytes::from(s))
        .map_err(|never| match never {})
        .boxed()
}

/// A request the proxy cannot act on, answered 400 and logged like any
/// other refusal (`via` says which path refused it).
fn bad_request(net: &SandboxNet, via: &str, why: String) -> Response<Body> {
    let r = Refusal {
        status: 400,
        reason: why,
        rule: None,
    };
    net.log(serde_json::json!({
        "decision": "deny", "via": via, "reason": r.reason, "rule": null, "status": r.status,
    }));
    refuse(&r)
}

/// Why a request names no host and port the proxy can open.
#[derive(Debug, thiserror::Error)]
enum TargetError {
    /// The host is no host name or address.
    #[error(transparent)]
    Host(#[from] warren_core::network::HostError),
    #[error("{0}: a port is required")]
    NoPort(String),
}

/// Host and port of a CONNECT authority or an absolute URL.
fn target_of(host: &str, port: Option<u16>) -> Result<(Target, u16), TargetError> {
    let target = normalize_host(host)?;
    let port = port.ok_or_else(|| TargetError::NoPort(host.to_string()))?;
    Ok((target, port))
}

async fn handle(
    net: Arc<SandboxNet>,
    pool: SharedPool,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    if req.method() == Method::CONNECT {
        let auth = req
            .uri()
            .authority()
            .map(|a| a.as_str().to_string())
            .unwrap_or_default();
        let (host, port) = split_authority(&auth);
        let port = port.and_then(|p| p.parse::<u16>().ok());
        let (target, port) = match target_of(host, port) {
            Ok(t) => t,
            Err(e) => {
                return Ok(bad_request(
                    &net,
                    "connect",
                    format!("CONNECT {auth:?}: {e}"),
                ))
            }
        };
        return Ok(match net.open(&target, port, "connect").await {
            Err(r) => refuse(&r),
            Ok(opened) => {
                let net = net.clone();
                tokio::spawn(async move {
                    if let Ok(up) = hyper::upgrade::on(req).await {
                        let _guard = opened.guard;
                        let _ = crate::splice::splice(
                            TokioIo::new(up),
                            opened.stream,
                            net.bytes.as_ref(),
                            &opened.cancel,
                        )
                        .await;
                    }
                });
                Response::new(Empty::new().map_err(|never| match never {}).boxed())
            }
        });
    }
    forward(net, pool, req).await
}

/// Plain HTTP: the request names its destination in absolute form; it is
/// checked per request and sent over a pooled upstream connection.
async fn forward(
    net: Arc<SandboxNet>,
    pool: SharedPool,
    mut req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let uri = req.uri().clone();
    let default_port = match uri.scheme_str() {
        Some("http") => 80,
        // Some clients (busybox wget) send an https URL to the proxy as a
        // plain request and expect the proxy to speak TLS upstream. The
        // proxy carries TLS only end to end, so it refuses, saying what
        // works instead; the policy is checked first, so a destination the
        // rules refuse anyway gets the usual 403.
        Some("https") => 443,
        _ => {
            return Ok(bad_request(
                &net,
                "http",
                format!("{uri}: a proxy request names an absolute http:// URL (or is a CONNECT)"),
            ))
        }
    };
    let host = uri.host().unwrap_or_default();
    let (target, port) = match target_of(host, Some(uri.port_u16().unwrap_or(default_port))) {
        Ok(t) => t,
        Err(e) => return Ok(bad_request(&net, "http", e.to_string())),
    };
    let policy = net.policy();
    let verdict = policy.check(&target, port);
    let mut line = serde_json::json!({
        "decision": if verdict.allowed { "allow" } else { "deny" },
        "via": "http", "host": target.to_string(), "port": port,
        "method": req.method().as_str(), "rule": verdict.rule, "reason": verdict.reason,
    });
    if !verdict.allowed {
        line["status"] = 403.into();
        net.log(line);
        return Ok(refuse(&Refusal {
            status: 403,
            reason: verdict.reason,
            rule: verdict.rule,
        }));
    }
    if default_port == 443 {
        let reason = format!(
            "{uri}: https was sent to the proxy as a plain request (busybox wget does this); \
             the proxy carries https only through CONNECT tunnels, so use a client that \
             tunnels (curl, python, GNU wget) or bypass the proxy (busybox: wget -Y off) \
             and the transparent path carries the TLS connection"
        );
        line["decision"] = "deny".into();
        line["reason"] = reason.clone().into();
        line["status"] = 400.into();
        net.log(line);
        return Ok(refuse(&Refusal {
            status: 400,
            reason,
            rule: verdict.rule,
        }));
    }
    net.log(line);
    for h in [
        "proxy-authorization",
        "proxy-connection",
        "connection",
        "keep-alive",
        "te",
        "trailer",
        "upgrade",
    ] {
        req.headers_mut().remove(h);
    }
    let client = pooled(&net, &pool);
    let resp = client.request(req).await;
    Ok(match resp {
        Ok(resp) => {
            let (parts, body) = resp.into_parts();
            Response::from_parts(parts, throttled(net, body))
        }
        Err(e) => {
            // A refusal from the connector (policy, limits) keeps its status.
            let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
            while let Some(err) = source {
                // io::Error hides its payload from `source()`.
                let inner = err
                    .downcast_ref::<std::io::Error>()
                    .and_then(|io| io.get_ref())
                    .and_then(|e| e.downcast_ref::<Refused>());
                if let Some(r) = err.downcast_ref::<Refused>().or(inner) {
                    return Ok(refuse(&r.0));
                }
                source = err.source();
            }
            let reason = std::error::Error::source(&e)
                .map(|s| s.to_string())
                .unwrap_or_else(|| e.to_string());
            let r = Refusal {
                status: 502,
                reason: format!("{host}:{port}: {reason}"),
                rule: None,
            };
            // The connection was allowed and logged; the exchange on it
            // failed, which the log says too.
            net.log(serde_json::json!({
                "decision": "error", "via": "http", "host": target.to_string(), "port": port,
                "reason": r.reason, "status": r.status,
            }));
            refuse(&r)
        }
    })
}

/// Applies the sandbox's byte budget to a response body.
fn throttled(net: Arc<SandboxNet>, body: Incoming) -> Body {
    if net.bytes.is_none() {
        return body.boxed();
    }
    let stream = futures_util::stream::unfold((body, net), |(mut body, net)| async move {
        let frame = body.frame().await?;
        if let Ok(f) = &frame {
            if let (Some(data), Some(b)) = (f.data_ref(), net.bytes.as_ref()) {
                b.take(data.len()).await;
            }
        }
        Some((frame, (body, net)))
    });
    http_body_util::StreamBody::new(stream).boxed()
}

/// Opens upstream connections for plain HTTP through `SandboxNet::open`,
/// so they are resolved, checked, limited, logged and revocable like any
/// other.
#[derive(Clone)]
pub(crate) struct Connector {
    net: Weak<SandboxNet>,
}

impl tower_service::Service<Uri> for Connector {
    type Response = Upstream;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Upstream, std::io::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let net = self.net.upgrade();
        Box::pin(async move {
            let net = net.ok_or_else(|| std::io::Error::other("the sandbox's network is gone"))?;
            let host = uri.host().unwrap_or_default();
            let (target, port) = target_of(host, Some(uri.port_u16().unwrap_or(80)))
                .map_err(std::io::Error::other)?;
            let opened = net
                .open(&target, port, "http-upstream")
                .await
                .map_err(|r| std::io::Error::other(Refused(r)))?;
            Ok(Upstream {
                io: TokioIo::new(opened.stream),
                _guard: opened.guard,
                revoked: Box::pin(opened.cancel.cancelled_owned()),
            })
        })
    }
}

/// A refusal carried through the HTTP client's error chain.
#[derive(Debug)]
struct Refused(Refusal);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.reason)
    }
}

impl std::error::Error for Refused {}

/// A pooled upstream connection; closed when its policy is revoked.
pub(crate) struct Upstream {
    io: TokioIo<TcpStream>,
    _guard: ConnGuard,
    /// Polled with every read and write, so a revocation wakes an idle
    /// pooled connection and fails it at once.
    revoked: Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>,
}

impl Upstream {
    fn is_revoked(&mut self, cx: &mut Context<'_>) -> bool {
        self.revoked.as_mut().poll(cx).is_ready()
    }
}

impl Connection for Upstream {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

impl hyper::rt::Read for Upstream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.is_revoked(cx) {
            return Poll::Ready(Err(std::io::ErrorKind::ConnectionAborted.into()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for Upstream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.is_revoked(cx) {
            return Poll::Ready(Err(std::io::ErrorKind::ConnectionAborted.into()));
        }
        Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

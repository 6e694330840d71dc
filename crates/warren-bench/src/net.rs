//! `warren-bench net`: what the `allowlist` network mode costs. Create
//! latency against mode `none`; one request's latency through the proxy
//! against the same request sent directly; throughput through one CONNECT
//! tunnel against a direct connection; and many sandboxes with live
//! policies at once. The upstream servers run in this process on loopback;
//! the bench enters each sandbox's network namespace to talk to its proxy
//! (so it runs as root on the node).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use warren_core::spec::{NetworkMode, NetworkSpec};
use warren_core::SandboxSpec;

use crate::cli::NetArgs;
use crate::lifecycle::{print_results, rss_kib, Samples};
use warren_cli::client::Client;

const RESPONSE: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";

/// A keep-alive HTTP server that answers every request with `ok`.
async fn serve_ok(listener: TcpListener) {
    while let Ok((mut s, _)) = listener.accept().await {
        tokio::spawn(async move {
            let _ = s.set_nodelay(true);
            let mut buf = Vec::with_capacity(1024);
            let mut chunk = [0u8; 1024];
            loop {
                let Ok(n) = s.read(&mut chunk).await else {
                    return;
                };
                if n == 0 {
                    return;
                }
                buf.extend_from_slice(&chunk[..n]);
                while let Some(end) = find(&buf, b"\r\n\r\n") {
                    buf.drain(..end + 4);
                    if s.write_all(RESPONSE).await.is_err() {
                        return;
                    }
                }
            }
        });
    }
}

/// Reads and counts everything sent to it.
async fn serve_sink(listener: TcpListener, total: Arc<AtomicU64>) {
    while let Ok((mut s, _)) = listener.accept().await {
        let total = total.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 256 * 1024];
            while let Ok(n) = s.read(&mut buf).await {
                if n == 0 {
                    return;
                }
                total.fetch_add(n as u64, Ordering::Relaxed);
            }
        });
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Sends one request and reads the response head and its 2-byte body.
async fn request(s: &mut TcpStream, target: &str) -> Result<()> {
    let req = format!("GET {target} HTTP/1.1\r\nHost: bench\r\n\r\n");
    s.write_all(req.as_bytes()).await?;
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 512];
    loop {
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            bail!("connection closed mid-response");
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = find(&buf, b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_string();
            if !head.starts_with("HTTP/1.1 200") {
                bail!("proxy answered {head:?}");
            }
            let len: usize = head
                .lines()
                .find_map(|l| {
                    l.strip_prefix("Content-Length: ")
                        .or_else(|| l.strip_prefix("content-length: "))
                })
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            while buf.len() < end + 4 + len {
                let n = s.read(&mut chunk).await?;
                if n == 0 {
                    bail!("connection closed mid-body");
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            return Ok(());
        }
    }
}

fn allowlist(image: &str, allow: Vec<String>) -> SandboxSpec {
    SandboxSpec {
        image: image.to_string(),
        network: NetworkSpec {
            mode: NetworkMode::Allowlist,
            allow,
            deny: vec![],
        },
        ..Default::default()
    }
}

async fn proxy(client: &Client, id: &str) -> Result<TcpStream> {
    let pid = client
        .get_sandbox(id)
        .await?
        .pid
        .context("the sandbox reports no init pid")?;
    let s = warren_net::connect_in(pid, warren_net::PROXY_PORT)
        .await
        .context("connecting to the sandbox's proxy (run as root on the node)")?;
    s.set_nodelay(true)?;
    Ok(s)
}

pub async fn run(client: &Client, args: NetArgs) -> Result<i32> {
    let n = args.iterations.max(1);
    let ok_listener = TcpListener::bind("127.0.0.1:0").await?;
    let ok_port = ok_listener.local_addr()?.port();
    tokio::spawn(serve_ok(ok_listener));
    let sunk = Arc::new(AtomicU64::new(0));
    let sink_listener = TcpListener::bind("127.0.0.1:0").await?;
    let sink_port = sink_listener.local_addr()?.port();
    tokio::spawn(serve_sink(sink_listener, sunk.clone()));
    let rules = vec![
        format!("127.0.0.1/32:{ok_port}"),
        format!("127.0.0.1/32:{sink_port}"),
    ];
    let none = SandboxSpec {
        image: args.image.clone(),
        ..Default::default()
    };
    let mut results = Vec::new();

    // Create latency, the two modes interleaved so drift hits both alike.
    let (mut c_none, mut c_allow) = (Samples::default(), Samples::default());
    for i in 0..n + 5 {
        for (spec, samples) in [
            (&none, &mut c_none),
            (&allowlist(&args.image, rules.clone()), &mut c_allow),
        ] {
            let t = Instant::now();
            let id = client.create_sandbox(spec).await?.id;
            if i >= 5 {
                samples.0.push(t.elapsed());
            }
            client.delete_sandbox(&id).await?;
        }
    }
    results.push(c_none.summary("create_none", None));
    results.push(c_allow.summary("create_allowlist", None));

    // One request: directly, and through the sandbox's proxy (both over a
    // kept-alive connection, as a client with keep-alive would).
    let id = client
        .create_sandbox(&allowlist(&args.image, rules.clone()))
        .await?
        .id;
    let target = format!("http://127.0.0.1:{ok_port}/");
    let mut direct = TcpStream::connect(("127.0.0.1", ok_port)).await?;
    direct.set_nodelay(true)?;
    let mut via = proxy(client, &id).await?;
    let (mut d, mut p) = (Samples::default(), Samples::default());
    for i in 0..n * 5 + 20 {
        let t = Instant::now();
        request(&mut direct, "/").await?;
        let e = t.elapsed();
        let t = Instant::now();
        request(&mut via, &target).await?;
        if i >= 20 {
            d.0.push(e);
            p.0.push(t.elapsed());
        }
    }
    results.push(d.summary("request_direct", None));
    results.push(p.summary("request_via_proxy", None));

    // Throughput through one CONNECT tunnel, and directly.
    let bytes = args.tunnel_mib << 20;
    let chunk = vec![0x5au8; 1 << 20];
    let mut direct_gbps = 0.0;
    let mut tunnel_gbps = 0.0;
    for through_proxy in [false, true] {
        let mut s = if through_proxy {
            let mut s = proxy(client, &id).await?;
            s.write_all(
                format!(
                    "CONNECT 127.0.0.1:{sink_port} HTTP/1.1\r\nHost: 127.0.0.1:{sink_port}\r\n\r\n"
                )
                .as_bytes(),
            )
            .await?;
            let mut head = [0u8; 256];
            let n = s.read(&mut head).await?;
            if !head[..n].starts_with(b"HTTP/1.1 200") {
                bail!("CONNECT refused: {}", String::from_utf8_lossy(&head[..n]));
            }
            s
        } else {
            TcpStream::connect(("127.0.0.1", sink_port)).await?
        };
        let before = sunk.load(Ordering::Relaxed);
        let t = Instant::now();
        let mut sent = 0u64;
        while sent < bytes {
            s.write_all(&chunk).await?;
            sent += chunk.len() as u64;
        }
        s.shutdown().await?;
        while sunk.load(Ordering::Relaxed) - before < sent {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let gbps = sent as f64 * 8.0 / t.elapsed().as_secs_f64() / 1e9;
        if through_proxy {
            tunnel_gbps = gbps;
        } else {
            direct_gbps = gbps;
        }
    }
    results.push(json!({ "name": "tunnel_throughput", "mib": args.tunnel_mib, "direct_gbit_s": direct_gbps, "connect_tunnel_gbit_s": tunnel_gbps }));
    client.delete_sandbox(&id).await?;

    // Many sandboxes with live policies: each its own rules, each answering.
    if args.sandboxes > 0 {
        let rss_before = args.daemon_pid.and_then(rss_kib);
        let sem = Arc::new(Semaphore::new(8));
        let t = Instant::now();
        let mut tasks = Vec::new();
        for i in 0..args.sandboxes {
            let permit = sem.clone().acquire_owned().await?;
            let (client, mut rules, image) = (client.clone(), rules.clone(), args.image.clone());
            rules.push(format!("s{i}.bench.test:443"));
            tasks.push(tokio::spawn(async move {
                // Small requests (20m, 32M), so the node's allocatable CPU and memory
                // are not what limits the count.
                let spec = SandboxSpec {
                    cpu: Some(warren_core::spec::Cpu(20)),
                    memory: Some(warren_core::spec::ByteSize(32 << 20)),
                    ..allowlist(&image, rules)
                };
                let r = client.create_sandbox(&spec).await.map(|s| s.id);
                drop(permit);
                r
            }));
        }
        let mut ids = Vec::new();
        for task in tasks {
            ids.push(task.await??);
        }
        let created = t.elapsed();
        let mut answered = 0;
        let mut latency = Samples::default();
        for id in &ids {
            let mut s = proxy(client, id).await?;
            let t = Instant::now();
            if request(&mut s, &target).await.is_ok() {
                answered += 1;
                latency.0.push(t.elapsed());
            }
        }
        let rss_after = args.daemon_pid.and_then(rss_kib);
        for id in &ids {
            client.delete_sandbox(id).await?;
        }
        results.push(json!({
            "name": "live_policies",
            "sandboxes": ids.len(),
            "answered": answered,
            "create_all_s": created.as_secs_f64(),
            "request_p50_ms": latency.pct(50.0),
            "daemon_rss_before_mib": rss_before.map(|k| k as f64 / 1024.0),
            "daemon_rss_after_mib": rss_after.map(|k| k as f64 / 1024.0),
        }));
    }

    print_results(&results, args.json)
}

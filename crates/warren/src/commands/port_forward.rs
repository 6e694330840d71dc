//! `warren port-forward ID LOCAL:REMOTE`: listens locally and carries each
//! connection to the sandbox's port through an API tunnel (`Upgrade: tcp`),
//! so it works wherever the API is reachable, with the API's token.

use anyhow::{Context, Result};

use warren_cli::client::Client;

fn parse_ports(spec: &str) -> Result<(u16, u16)> {
    let port = |p: &str| -> Result<u16> {
        p.parse::<u16>().ok().filter(|p| *p != 0).with_context(|| {
            format!(
                "port-forward {spec:?}: {p:?} is not a port (1-65535); write LOCAL:REMOTE or PORT"
            )
        })
    };
    match spec.split_once(':') {
        Some((l, r)) => Ok((port(l)?, port(r)?)),
        None => Ok((port(spec)?, port(spec)?)),
    }
}

pub async fn run(client: &Client, id: &str, spec: &str, address: std::net::IpAddr) -> Result<i32> {
    let (local, remote) = parse_ports(spec)?;
    // Fail now, not at the first connection, if the sandbox is not there.
    client.get_sandbox(id).await?;
    let listener = tokio::net::TcpListener::bind((address, local))
        .await
        .with_context(|| format!("listen on {address}:{local}"))?;
    let bound = listener.local_addr()?;
    say!("forwarding {bound} -> sandbox {id} port {remote} (Ctrl-C to stop)");
    // Watched every second: once the sandbox has ended, nothing can be
    // forwarded to it any more.
    let mut watch = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        let (mut conn, peer) = tokio::select! {
            accepted = listener.accept() => accepted?,
            _ = watch.tick() => {
                match client.get_sandbox(id).await {
                    Ok(info) if info.state.is_final() => {
                        say!("sandbox {id} is {} ({}); port-forward stops", info.state, info.reason);
                        return Ok(1);
                    }
                    Err(e) if format!("{e:#}").contains("not found") => {
                        say!("sandbox {id} is gone; port-forward stops");
                        return Ok(1);
                    }
                    _ => continue,
                }
            }
        };
        let client = client.clone();
        let id = id.to_string();
        tokio::spawn(async move {
            match client.open_port_tunnel(&id, remote).await {
                Ok(mut up) => {
                    let _ = tokio::io::copy_bidirectional(&mut conn, &mut up).await;
                }
                Err(e) => say!("{peer}: {e:#}"),
            }
        });
    }
}

//! Resolving a name the way the proxy trusts (its static map first, then the
//! host's resolver) and connecting to an address it checked.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::net::TcpStream;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Returns the addresses and whether they are the operator's pins (the
/// node's `--net-resolve`), which are trusted like /etc/hosts entries for
/// internal services, rather than answers from DNS.
pub(crate) async fn resolve(
    fixed: &HashMap<String, Vec<IpAddr>>,
    name: &str,
    port: u16,
) -> std::io::Result<(Vec<IpAddr>, bool)> {
    if let Some(ips) = fixed.get(name) {
        return Ok((ips.clone(), true));
    }
    // Only names reach the resolver: `normalize_host` turned every address
    // spelling into an address before this point.
    let addrs = tokio::net::lookup_host((name, port)).await?;
    let mut ips: Vec<IpAddr> = addrs.map(|a| a.ip()).collect();
    ips.dedup();
    Ok((ips, false))
}

pub(crate) async fn connect(ip: IpAddr, port: u16) -> std::io::Result<TcpStream> {
    let stream = tokio::time::timeout(
        CONNECT_TIMEOUT,
        TcpStream::connect(SocketAddr::new(ip, port)),
    )
    .await
    .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"))??;
    stream.set_nodelay(true)?;
    Ok(stream)
}

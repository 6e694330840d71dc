//! The door for the web pages sandboxes serve (`--ports-listen`): bound
//! before the control plane starts, since the links the API hands out name
//! its address; served once the daemon runs a control plane (see
//! `warren_control::api::port_door`).

use anyhow::{Context, Result};

use crate::cli::ControlOpts;

pub struct PortDoor {
    listener: tokio::net::TcpListener,
    /// Where browsers reach it (`--ports-url`, or http://localhost:PORT).
    pub url: String,
}

pub fn bind(opts: &ControlOpts) -> Result<PortDoor> {
    let addr = opts.ports_listen;
    let listener =
        super::listen(addr).with_context(|| format!("listen on {addr} (--ports-listen)"))?;
    let port = listener.local_addr().context("listener address")?.port();
    let url = opts
        .ports_url
        .clone()
        .unwrap_or_else(|| format!("http://localhost:{port}"));
    Ok(PortDoor { listener, url })
}

/// Serves the door in the background for the control plane in `running`.
pub fn serve(
    who: &str,
    door: PortDoor,
    home: &std::path::Path,
    running: super::Running,
    nofile: u64,
) -> Result<()> {
    let token = warren_control::ensure_token(home).context("API token")?;
    let links = warren_control::api::port_door::PortLinks::new(&door.url, &token)?;
    let router = warren_control::api::port_door::router(running, links, token);
    say!("{who}: sandbox ports for browsers on {} (PORT-ID.HOST; links from GET /v1/sandboxes/ID/ports/PORT)", door.url);
    super::compat::serve_on(door.listener, router, "--ports-listen", nofile);
    Ok(())
}

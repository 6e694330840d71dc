//! Other clients' protocols, each on a listener of its own, answering
//! through the control plane the daemon runs (see `CompatOpts`).

use std::net::SocketAddr;

use anyhow::{Context, Result};

use crate::cli::CompatOpts;

/// Binds every listener asked for and serves it in the background.
pub async fn start(
    who: &str,
    home: &std::path::Path,
    opts: &CompatOpts,
    control: warren_control::ControlCell,
    nofile: u64,
) -> Result<()> {
    if opts.e2b_api.is_some() || opts.e2b_sandbox.is_some() {
        let token = warren_control::ensure_token(home).context("API token")?;
        let door = warren_e2b::SandboxDoor {
            domain: opts.e2b_domain.clone(),
            public_traffic: opts.e2b_public_traffic,
        };
        let e2b =
            warren_e2b::E2b::new(control.clone(), token, home, door).map_err(anyhow::Error::new)?;
        if let Some(addr) = opts.e2b_api {
            let at = serve(addr, warren_e2b::router(e2b.clone()), "--e2b-api", nofile).await?;
            say!("{who}: E2B API on http://{at} (E2B_API_URL; the API key is Warren's token)");
        }
        if let Some(addr) = opts.e2b_sandbox {
            let at = serve(addr, warren_e2b::envd::router(e2b), "--e2b-sandbox", nofile).await?;
            say!("{who}: E2B sandbox traffic on http://{at} (E2B_SANDBOX_URL)");
        }
    }
    if let Some(addr) = opts.sandbox_fusion {
        let image = opts.sandbox_fusion_image.clone();
        let token = opts.sandbox_fusion_token.clone().filter(|t| !t.is_empty());
        if token.is_none() && !addr.ip().is_loopback() {
            tracing::warn!(%addr, "the SandboxFusion door listens beyond loopback and takes no token: anyone who reaches it runs code; set --sandbox-fusion-token");
            say!("{who}: warning: SandboxFusion on {addr} takes no token; anyone who reaches it runs code (--sandbox-fusion-token sets one)");
        }
        let guard = warren_fusion::guard::Guard { token };
        let tenant = opts.sandbox_fusion_tenant.clone();
        let router = warren_fusion::router(control.clone(), image.clone(), guard, tenant);
        let at = serve(addr, router, "--sandbox-fusion", nofile).await?;
        say!("{who}: SandboxFusion /run_code on http://{at} (image {image})");
        tokio::spawn(warn_if_missing(who.to_string(), control, image));
    }
    Ok(())
}

/// Says at start when the image `/run_code` needs is in no node's store:
/// the first call would then pull it (a short name through the search
/// registries), which fails on a machine that reaches no registry.
async fn warn_if_missing(who: String, control: warren_control::ControlCell, image: String) {
    // A server replica runs a control plane only once it leads.
    let control = loop {
        if let Some(c) = control.get() {
            break c.clone();
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    };
    if control.lifecycle().wait_ready().await.is_err() {
        return;
    }
    let Ok(images) = control
        .images()
        .list(&warren_core::tenant::Principal::Operator)
        .await
    else {
        return;
    };
    let names = [
        image.clone(),
        warren_core::image_ref::qualify(&image, "docker.io"),
    ];
    let held = images.iter().any(|i| {
        names
            .iter()
            .any(|n| i.name == *n || i.name == format!("{n}:latest"))
    });
    if !held {
        tracing::warn!(%image, "the SandboxFusion image is in no node's image store");
        say!("{who}: warning: the SandboxFusion image {image} is not in the image store; the first /run_code pulls it (registries.toml: unqualified-search-registries, mirrors) or fails where no registry is reachable: `warren image pull {image}` or `warren image import FILE --name {image}` first");
    }
}

/// Serves `router` on `addr` until the process ends, as the API is served
/// (no Nagle delay on streamed answers, a connection limit); answers the
/// address bound (a port 0 gets one).
async fn serve(
    addr: SocketAddr,
    router: axum::Router,
    flag: &'static str,
    nofile: u64,
) -> Result<SocketAddr> {
    let listener = super::listen(addr).with_context(|| format!("listen on {addr} ({flag})"))?;
    let at = listener.local_addr().context("listener address")?;
    serve_on(listener, router, flag, nofile);
    Ok(at)
}

/// Serves `router` on a listener already bound, in the background.
pub(super) fn serve_on(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    flag: &'static str,
    nofile: u64,
) {
    tokio::spawn(async move {
        let limit = warren_control::serve::connection_limit(nofile);
        let forever = std::future::pending::<()>();
        if let Err(e) =
            warren_control::serve::serve(listener, router, limit, forever, Default::default()).await
        {
            tracing::error!(error = %e, flag, "a front door stopped");
        }
    });
}

//! `warren up`: control plane, node agent and SQLite store in one process;
//! the control plane drives the node through the node contract, in-process.

use anyhow::{Context, Result};
use warren_control::{NodeSource, UpConfig};

use std::sync::Arc;

use warren_node_api::NodeApi;

use crate::cli::{NodeTransport, UpArgs};

pub async fn run(home: &std::path::Path, args: UpArgs) -> Result<i32> {
    let (log_path, _traces) =
        super::init_logging(home, "warren-up.log", &args.traces, "warren-up")?;
    let policy = super::policy(&args.control)?;
    let (node, nofile) =
        super::start_node(home, super::hostname(), Default::default(), &args.node)?;
    let listen = args.listen;
    let local = node_transport(home, &args, warren_node::LocalNode::new(node.clone())).await?;
    let ports = super::port_door::bind(&args.control)?;
    let cfg = UpConfig {
        home: home.to_path_buf(),
        listen,
        queue_limit: args.control.queue_limit,
        public_url: args.control.public_url.clone(),
        ports_url: Some(ports.url.clone()),
        alert_webhooks: args.control.alert_webhooks.clone(),
        log_limits: super::log_limits(
            &args.node.log_retention,
            args.control.log_max_total.as_deref(),
        )?,
        policy,
        destroy_on_stop: true,
        database: None,
        nodes: NodeSource::Local(local),
    };
    // The message carries its causes already: as anyhow's source chain
    // they would be printed twice.
    let (up, router) = warren_control::start(cfg)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let listener = super::listen(listen)
        .with_context(|| format!("listen on {listen} (is another warren up running?)"))?;
    let running: super::Running = Default::default();
    let _ = running.set(up.control.clone());
    super::compat::start("warren up", home, &args.compat, running.clone(), nofile).await?;
    super::port_door::serve("warren up", ports, home, running.clone(), nofile)?;
    say!(
        "warren up: listening on http://{listen} (home {}, token in {}, log in {})",
        home.display(),
        home.join("token").display(),
        log_path.display()
    );
    // The one line a restart deserves on the terminal (the details are in
    // the log).
    let control = up.control.clone();
    tokio::spawn(async move {
        let n = control.lifecycle().recovered().await;
        if n > 0 {
            say!("warren up: ready; {n} sandboxes from before the restart reconciled (details in the log)");
        }
    });
    super::serve_until_signal("warren up", listener, router, nofile, running).await?;
    say!("warren up: destroying live sandboxes");
    up.control.shutdown(super::SHUTDOWN_GRACE).await;
    node.release_host();
    say!("warren up: stopped");
    Ok(0)
}

/// The control plane's way to its node: the node itself, or a client of
/// the node's HTTP API served on `--node-listen` (what a cluster does over
/// the network), guarded by the node credential in `<home>/node-credential`.
async fn node_transport(
    home: &std::path::Path,
    args: &UpArgs,
    node: warren_node::LocalNode,
) -> Result<Arc<dyn NodeApi>> {
    match args.node_transport {
        NodeTransport::InProcess => Ok(Arc::new(node)),
        NodeTransport::Http => {
            let credential = warren_control::ensure_secret(&home.join("node-credential"))
                .context("node credential")?;
            let listener = super::listen(args.node_listen).with_context(|| {
                format!("node API: listen on {} (--node-listen)", args.node_listen)
            })?;
            let addr = listener.local_addr().context("node API address")?;
            // Its one control plane is in this process: nothing to fence.
            let fence = warren_node_http::Fence::default();
            let router = warren_node_http::router(Arc::new(node), credential.clone(), fence);
            tokio::spawn(async move {
                if let Err(e) = warren_node_http::serve(listener, router).await {
                    tracing::error!(error = %e, "the node API stopped");
                }
            });
            say!(
                "warren up: node API on http://{addr} (credential in {})",
                home.join("node-credential").display()
            );
            let client = warren_node_http::HttpNode::new(&format!("http://{addr}"), &credential)
                .map_err(|e| anyhow::anyhow!("node API client: {e}"))?;
            Ok(Arc::new(client))
        }
    }
}

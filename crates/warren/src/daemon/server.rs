//! `warren server`: a cluster's control plane. It serves the public API,
//! places sandboxes on the nodes that joined it (through their node API)
//! and keeps its state in its store; a clean stop or a crash leaves every
//! node and sandbox as it is.

use std::sync::Arc;

use anyhow::{Context, Result};
use tokio::net::TcpListener;
use warren_control::nodes::{Connector, Liveness};
use warren_control::{NodeSource, UpConfig};
use warren_node_api::NodeApi;

use crate::cli::{ServerArgs, ServerCmd};

/// Where the token nodes join with is kept.
fn join_token_path(home: &std::path::Path) -> std::path::PathBuf {
    home.join("join-token")
}

pub async fn run(home: &std::path::Path, args: ServerArgs) -> Result<i32> {
    if let Some(ServerCmd::JoinToken { rotate }) = args.command {
        return join_token(home, rotate);
    }
    let log_path = super::init_logging(home, "warren-server.log")?;
    let policy = super::policy(&args.control)?;
    std::fs::create_dir_all(home).with_context(|| format!("create home {}", home.display()))?;
    let join_token = warren_control::ensure_secret(&join_token_path(home))
        .with_context(|| format!("join token {}", join_token_path(home).display()))?;
    let nofile = warren_runtime::host_tables::raise_nofile();
    let connect: Connector = Arc::new(|url: &str, credential: &str| {
        warren_node_http::HttpNode::new(url, credential)
            .map(|n| Arc::new(n) as Arc<dyn NodeApi>)
            .map_err(|e| e.to_string())
    });
    let cfg = UpConfig {
        home: home.to_path_buf(),
        listen: args.listen,
        queue_limit: args.control.queue_limit,
        policy,
        database: args.database.clone(),
        destroy_on_stop: false,
        nodes: NodeSource::Cluster {
            join_token,
            connect,
            liveness: Liveness::default(),
        },
    };
    let (up, router) = warren_control::start(cfg)
        .await
        .map_err(anyhow::Error::msg)?;
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listen on {} (--listen)", args.listen))?;
    eprintln!(
        "warren server: listening on http://{} (home {}, API token in {}, join token in {}, log in {})",
        args.listen,
        home.display(),
        home.join("token").display(),
        join_token_path(home).display(),
        log_path.display()
    );
    super::serve_until_signal("warren server", listener, router, nofile, &up.control).await?;
    // Stops without touching a node: sandboxes run on, and a restarted
    // control plane reconciles with them.
    up.control.shutdown(super::SHUTDOWN_GRACE).await;
    eprintln!("warren server: stopped (nodes and their sandboxes keep running)");
    Ok(0)
}

/// Prints the join token, making it first (or anew with `rotate`).
fn join_token(home: &std::path::Path, rotate: bool) -> Result<i32> {
    std::fs::create_dir_all(home).with_context(|| format!("create home {}", home.display()))?;
    let path = join_token_path(home);
    let token = if rotate {
        warren_control::write_secret(&path, &warren_control::new_secret())
    } else {
        warren_control::ensure_secret(&path)
    }
    .with_context(|| format!("join token {}", path.display()))?;
    println!("{token}");
    if rotate {
        eprintln!("rotated: a running `warren server` takes the new token after a restart; nodes already joined stay joined");
    }
    Ok(0)
}

//! `warren node`: a node agent that joins a `warren server`. It runs this
//! host's sandboxes, serves the node API to the control plane only (with
//! the credential it received at join) and reports itself every second.
//! Without the control plane it keeps its sandboxes and keeps enforcing
//! their TTLs and leases; when the control plane answers again it is
//! reconciled.

use std::sync::Arc;

use anyhow::{Context, Result};
use warren_cli::agent::Agent;
use warren_node_api::NodeApi;

use crate::cli::NodeArgs;

pub async fn run(home: &std::path::Path, args: NodeArgs) -> Result<i32> {
    let (Some(server), Some(token_file)) = (args.server.clone(), args.join_token.clone()) else {
        anyhow::bail!("a node agent needs --server URL and --join-token FILE");
    };
    let token = std::fs::read_to_string(&token_file)
        .with_context(|| {
            format!(
                "read the join token {} (--join-token)",
                token_file.display()
            )
        })?
        .trim()
        .to_string();
    if token.is_empty() {
        anyhow::bail!(
            "{} is empty: put the output of `warren server join-token` in it",
            token_file.display()
        );
    }
    let labels = parse_labels(&args.labels)?;
    let name = args.name.clone().unwrap_or_else(super::hostname);
    let (log_path, _traces) =
        super::init_logging(home, "warren-node.log", &args.traces, "warren-node")?;
    let (node, _nofile) = super::start_node(home, name.clone(), labels, &args.node)?;
    let local: Arc<dyn NodeApi> = Arc::new(warren_node::LocalNode::new(node.clone()));
    let fence = warren_node_http::Fence::open(home.join("leader-epoch"))?;
    let identity = warren_node_http::tls::Identity::load_or_create(&home.join("node-tls"))?;
    let mut agent = Agent::serve(
        local,
        fence,
        Some(identity),
        &name,
        args.listen,
        args.advertise.clone(),
        &server,
        &token,
    )
    .await?;
    agent.puller = Some(node.clone());
    say!(
        "warren node: {name} serves the node API on {} (advertised as {}); joining {server}; log in {}",
        agent.listening,
        agent.advertise,
        log_path.display()
    );
    tokio::select! {
        _ = agent.run() => {}
        _ = super::first_signal() => {}
    }
    node.release_host();
    say!("warren node: stopped; its sandboxes keep running and are taken over at the next start");
    Ok(0)
}

fn parse_labels(given: &[String]) -> Result<warren_core::Labels> {
    given
        .iter()
        .map(|l| {
            warren_core::labels::parse_pair(l)
                .with_context(|| format!("--label {l:?}: write KEY=VALUE, e.g. gpu=h200"))
        })
        .collect()
}

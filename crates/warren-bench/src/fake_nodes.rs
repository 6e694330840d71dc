//! `warren-bench fake-nodes`: in-memory nodes (no kernel work) that join a
//! `warren server` through the real node API and agent loop, for
//! benchmarks of the control plane alone (scripts/bench-cluster.sh). The
//! one user of the node contract's `fake` feature outside tests, which is
//! why it lives here and not in the product binary.

use std::sync::Arc;

use anyhow::{Context, Result};
use warren_cli::agent::Agent;
use warren_node_api::NodeApi;

use crate::cli::FakeNodesArgs;

/// Runs `args.count` fake nodes until SIGINT or SIGTERM.
pub async fn run(args: FakeNodesArgs) -> Result<i32> {
    let token = std::fs::read_to_string(&args.join_token)
        .with_context(|| {
            format!(
                "read the join token {} (--join-token)",
                args.join_token.display()
            )
        })?
        .trim()
        .to_string();
    let lends = warren_node_api::Resources {
        cpu_millis: args.cpu * 1000,
        memory: args.memory_gib << 30,
        slots: 4096,
        gpus: 0,
    };
    let mut agents = Vec::new();
    for i in 0..args.count {
        let name = format!("fake-{i:03}");
        let node: Arc<dyn NodeApi> = warren_node_api::fake::FakeNode::new(&name, lends);
        let listen = "127.0.0.1:0".parse().context("loopback address")?;
        let fence = warren_node_http::Fence::default();
        // Plain HTTP: a benchmark of the control plane, on loopback.
        agents.push(
            Agent::serve(node, fence, None, &name, listen, None, &args.server, &token).await?,
        );
    }
    say!("{} fake nodes joining {}", agents.len(), args.server);
    let runs = futures_util::future::join_all(agents.iter().map(Agent::run));
    tokio::select! {
        _ = runs => {}
        _ = warren_cli::serving::first_signal() => {}
    }
    Ok(0)
}

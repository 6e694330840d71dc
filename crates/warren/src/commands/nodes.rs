//! `warren node ls|cordon|uncordon|rm`: the cluster's nodes.

use anyhow::Result;
use serde_json::Value;

use crate::cli::NodeCmd;
use warren_cli::client::{Client, SandboxQuery};

pub(super) async fn run(client: &Client, cmd: NodeCmd) -> Result<i32> {
    match cmd {
        NodeCmd::Ls { json } => {
            let nodes = client.nodes().await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&nodes)?);
                return Ok(0);
            }
            println!(
                "{:<20} {:<12} {:>15} {:>21} {:>7} {:>5} {:>6}  {:<17} LABELS",
                "NAME",
                "STATE",
                "CPU (ALLOC/CAP)",
                "MEMORY (ALLOC/CAP)",
                "GPU",
                "SBX",
                "CPU%",
                "ISOLATION"
            );
            for n in &nodes {
                let num = |v: &Value, k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
                let (alloc, cap) = (&n["allocated"], &n["allocatable"]);
                let mut state = n["state"].as_str().unwrap_or("?").to_string();
                if n["cordoned"].as_bool() == Some(true) {
                    state.push_str(",cordon");
                }
                let labels: Vec<String> = n["labels"]
                    .as_object()
                    .map(|m| {
                        m.iter()
                            .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                            .collect()
                    })
                    .unwrap_or_default();
                // Its classes, its default first (an older control plane
                // sends none: containers).
                let classes: Vec<&str> = n["isolation"]
                    .as_array()
                    .map(|a| a.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                let classes = if classes.is_empty() {
                    "container".to_string()
                } else {
                    classes.join(",")
                };
                // GPUs (allocated/capacity), "-" on a node with none.
                let gpus = match num(cap, "gpus") {
                    0 => "-".to_string(),
                    total => format!("{}/{total}", num(alloc, "gpus")),
                };
                println!(
                    "{:<20} {:<12} {:>15} {:>21} {:>7} {:>5} {:>5.0}%  {:<17} {}",
                    n["name"].as_str().unwrap_or("?"),
                    state,
                    format!(
                        "{:.1}/{:.1}",
                        num(alloc, "cpu_millis") as f64 / 1000.0,
                        num(cap, "cpu_millis") as f64 / 1000.0
                    ),
                    format!(
                        "{}/{}",
                        warren_core::quantity::format_size(num(alloc, "memory")),
                        warren_core::quantity::format_size(num(cap, "memory"))
                    ),
                    gpus,
                    num(n, "sandboxes"),
                    n["load"]["cpu_busy"].as_f64().unwrap_or(0.0) * 100.0,
                    classes,
                    labels.join(",")
                );
            }
        }
        NodeCmd::Cordon { name } => {
            client.cordon_node(&name, true).await?;
            println!("{name} cordoned: it takes no new sandboxes");
        }
        NodeCmd::Uncordon { name } => {
            client.cordon_node(&name, false).await?;
            println!("{name} uncordoned");
        }
        NodeCmd::Drain { name, deadline } => {
            warren_core::quantity::parse_duration(&deadline)
                .map_err(|e| anyhow::anyhow!("--deadline {deadline:?}: {e}"))?;
            client.drain_node(&name, &deadline).await?;
            say!("{name} cordoned; waiting for its sandboxes to end (at most {deadline}, then they are destroyed)");
            loop {
                let nodes = client.nodes().await?;
                let Some(n) = nodes.iter().find(|n| n["name"] == name.as_str()) else {
                    anyhow::bail!("node {name} is no longer part of the cluster");
                };
                // The control plane's own count (what holds capacity there),
                // not the node's last report, which lags up to a second.
                let mut left = n["allocated"]["slots"].as_u64().unwrap_or(0);
                if left == 0 {
                    // Capacity comes back as the node answers the destroy,
                    // a moment before the record is final: "drained" waits
                    // for the records too.
                    let open = client.list_sandboxes(&SandboxQuery::default()).await?;
                    left = open.iter().filter(|s| s.node == name).count() as u64;
                    if left == 0 {
                        break;
                    }
                }
                say_partial!("\r  {left} sandboxes left   ");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
            say!();
            println!("{name} drained");
        }
        NodeCmd::Rm { name } => {
            client.remove_node(&name).await?;
            println!("{name} removed");
        }
    }
    Ok(0)
}

//! `warren batch`: N sandboxes from one spec.

use anyhow::Result;
use warren_core::labels;

use super::spec::spec_from;
use crate::cli::BatchCmd;
use warren_cli::client::Client;

pub(super) async fn run(client: &Client, cmd: BatchCmd) -> Result<i32> {
    match cmd {
        BatchCmd::Create {
            count,
            batch_labels,
            retry_on_oom,
            retry_on_lost,
            create,
            cmd,
        } => {
            let labels: std::collections::BTreeMap<String, String> = batch_labels
                .iter()
                .map(|l| labels::parse_pair(l).map_err(anyhow::Error::from))
                .collect::<Result<_>>()?;
            let spec = spec_from(&create, (!cmd.is_empty()).then_some(cmd))?;
            let req = warren_core::BatchRequest {
                count,
                spec,
                labels,
                retry_on_oom,
                retry_on_lost,
            };
            let info = client.create_batch(&req).await?;
            let id = info.id.clone();
            let start = std::time::Instant::now();
            loop {
                let b = client.get_batch(&id).await?;
                let creating = b.states.get("creating").copied().unwrap_or(0)
                    + b.states.get("queued").copied().unwrap_or(0);
                let states: Vec<String> =
                    b.states.iter().map(|(k, v)| format!("{k} {v}")).collect();
                say_partial!(
                    "\r  {id}: submitted {}/{} ({})   ",
                    b.submitted,
                    b.count,
                    states.join(", ")
                );
                if b.submitted >= b.count && creating == 0 {
                    say!(
                        "\n  done in {:.2} s, {} failed",
                        start.elapsed().as_secs_f64(),
                        b.failures.len()
                    );
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            println!("{id}");
        }
        BatchCmd::Ls => {
            let list = client.list_batches().await?;
            println!(
                "{:<18} {:>6} {:>9} {:>6} {:>8} {:>9} {:>9} {:>9} {:<22} STATES",
                "ID", "COUNT", "SUBMITTED", "OK", "FAILED", "CPU-S", "GB-S", "GPU-S", "CREATED"
            );
            for b in list {
                let states: Vec<String> =
                    b.states.iter().map(|(k, v)| format!("{k}={v}")).collect();
                println!(
                    "{:<18} {:>6} {:>9} {:>6} {:>8} {:>9.3} {:>9.3} {:>9.3} {:<22} {}",
                    b.id,
                    b.count,
                    b.submitted,
                    b.succeeded,
                    b.failures.len(),
                    b.cost.cpu_seconds,
                    b.cost.memory_gb_seconds,
                    b.cost.gpu_seconds,
                    b.created_at.get(..19).unwrap_or(&b.created_at),
                    states.join(",")
                );
            }
        }
        BatchCmd::Inspect { id } => {
            let b = client.get_batch_json(&id).await?;
            println!("{}", serde_json::to_string_pretty(&b)?);
        }
        BatchCmd::Rm { id } => {
            let b = client.delete_batch(&id).await?;
            println!("{} deleted ({} sandboxes)", b.id, b.submitted);
        }
    }
    Ok(0)
}

//! `warren profile`: the learned resource profiles.

use anyhow::{Context, Result};
use warren_core::quantity;

use crate::cli::ProfileCmd;
use warren_cli::client::Client;

pub(super) async fn run(client: &Client, cmd: ProfileCmd) -> Result<i32> {
    match cmd {
        ProfileCmd::Ls => {
            let list = client.list_profiles().await?;
            println!(
                "{:<24} {:>8} {:>10} {:>13} {:>15} {:>10} {:>6}  FLAG",
                "PROFILE", "CPU", "MEMORY", "ORIGINAL CPU", "ORIGINAL MEMORY", "GPU MEMORY", "RUNS"
            );
            for p in list {
                println!(
                    "{:<24} {:>8.2} {:>10} {:>13.2} {:>15} {:>10} {:>6}  {}",
                    p.name,
                    p.current.cpu_millis as f64 / 1000.0,
                    quantity::format_size(p.current.memory),
                    p.original.cpu_millis as f64 / 1000.0,
                    quantity::format_size(p.original.memory),
                    if p.current.gpu_memory > 0 {
                        quantity::format_size(p.current.gpu_memory)
                    } else {
                        "-".into()
                    },
                    p.runs,
                    if p.anomalous {
                        format!("ANOMALOUS: {}", p.anomaly)
                    } else {
                        String::new()
                    }
                );
            }
        }
        ProfileCmd::Show { name } => {
            let v = client.get_profile_json(&name).await?;
            println!("{}", serde_json::to_string_pretty(&v)?);
        }
        ProfileCmd::Export => {
            let text = client.export_profiles().await?;
            print!("{text}");
        }
        ProfileCmd::Import { file } => {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("reading {}", file.display()))?;
            let list = client.import_profiles(text).await?;
            println!("imported {} profiles", list.len());
        }
        ProfileCmd::Reset { name } => {
            let p = client.reset_profile(&name).await?;
            println!(
                "{} reset to cpu {} memory {}",
                p.name,
                p.current.cpu_millis as f64 / 1000.0,
                quantity::format_size(p.current.memory)
            );
        }
    }
    Ok(0)
}

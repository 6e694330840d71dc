//! `warren volume`: named storage kept across sandboxes.

use anyhow::{Context, Result};
use warren_core::volume::{VolumeName, VolumeRequest, VolumeSize};
use warren_core::{labels, quantity};

use super::images::human;
use crate::cli::VolumeCmd;
use warren_cli::client::Client;

pub(super) async fn run(client: &Client, cmd: VolumeCmd) -> Result<i32> {
    match cmd {
        VolumeCmd::Create {
            name,
            size,
            node_selector,
        } => {
            let bytes = quantity::parse_size(&size).with_context(|| format!("--size {size:?}"))?;
            let req = VolumeRequest {
                name: VolumeName::try_from(name)?,
                size: VolumeSize::try_from(warren_core::spec::ByteSize(bytes))?,
                node_selector: node_selector
                    .iter()
                    .map(|l| {
                        labels::parse_pair(l).map_err(|e| {
                            anyhow::anyhow!("--node-selector {l:?}: {e}; write KEY=VALUE")
                        })
                    })
                    .collect::<Result<_>>()?,
            };
            let v = client.create_volume(&req).await?;
            println!("{} {} on {}", v.name, human(v.size), v.node);
        }
        VolumeCmd::Ls { json } => {
            let volumes = client.volumes().await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&volumes)?);
                return Ok(0);
            }
            println!(
                "{:<24} {:<12} {:>10} {:>10}  MOUNTED BY",
                "NAME", "NODE", "SIZE", "USED"
            );
            for v in volumes {
                println!(
                    "{:<24} {:<12} {:>10} {:>10}  {}",
                    v.name,
                    v.node,
                    human(v.size),
                    human(v.used),
                    v.mounted_by.join(",")
                );
            }
        }
        VolumeCmd::Rm { names } => {
            for name in names {
                let v = client.remove_volume(&name).await?;
                println!("{} removed", v.name);
            }
        }
    }
    Ok(0)
}

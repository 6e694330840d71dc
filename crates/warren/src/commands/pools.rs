//! `warren pool`: warm pools of ready sandboxes.

use anyhow::Result;
use warren_core::pool::PoolSpec;
use warren_core::quantity;
use warren_core::spec::{ByteSize, Cpu};

use crate::cli::PoolCmd;
use warren_cli::client::Client;

pub(super) async fn run(client: &Client, cmd: PoolCmd) -> Result<i32> {
    match cmd {
        PoolCmd::Set {
            name,
            image,
            cpu,
            memory,
            cpu_request,
            memory_request,
            pids,
            size,
            isolation,
            cmd,
        } => {
            let cpu_of = |c: Option<String>| -> Result<Option<Cpu>> {
                Ok(c.as_deref().map(quantity::parse_cpu).transpose()?.map(Cpu))
            };
            let size_of = |m: Option<String>| -> Result<Option<ByteSize>> {
                Ok(m.as_deref()
                    .map(quantity::parse_size)
                    .transpose()?
                    .map(ByteSize))
            };
            let spec = PoolSpec {
                image,
                cpu: cpu_of(cpu)?,
                memory: size_of(memory)?,
                cpu_request: cpu_of(cpu_request)?,
                memory_request: size_of(memory_request)?,
                pids,
                cmd: (!cmd.is_empty()).then_some(cmd),
                isolation,
                size,
            };
            let p = client.set_pool(&name, &spec).await?;
            println!("{} size {} ready {}", p.name, p.spec.size, p.ready);
        }
        PoolCmd::Ls { json } => {
            let pools = client.pools().await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&pools)?);
                return Ok(0);
            }
            println!(
                "{:<16} {:<28} {:>6} {:>6} {:>8}",
                "NAME", "IMAGE", "SIZE", "READY", "CLAIMED"
            );
            for p in pools {
                println!(
                    "{:<16} {:<28} {:>6} {:>6} {:>8}",
                    p.name, p.spec.image, p.spec.size, p.ready, p.claimed
                );
            }
        }
        PoolCmd::Rm { name } => {
            let p = client.delete_pool(&name).await?;
            println!("{} removed ({} ready sandboxes destroyed)", p.name, p.ready);
        }
    }
    Ok(0)
}

//! `warren fork ID --count N`: children of a sandbox from its filesystem
//! as it is now (and, `--with-processes`, its memory and processes).

use anyhow::{Context, Result};
use warren_core::spec::{ByteSize, Cpu, Dur, ForkRequest};
use warren_core::{labels, quantity};

use crate::cli::ForkArgs;
use warren_cli::client::Client;

fn request(a: &ForkArgs) -> Result<ForkRequest> {
    let size = |flag: &str, v: &Option<String>| -> Result<Option<ByteSize>> {
        v.as_deref()
            .map(|s| quantity::parse_size(s).map(ByteSize))
            .transpose()
            .with_context(|| format!("--{flag}"))
    };
    let cpu = |flag: &str, v: &Option<String>| -> Result<Option<Cpu>> {
        v.as_deref()
            .map(|s| quantity::parse_cpu(s).map(Cpu))
            .transpose()
            .with_context(|| format!("--{flag}"))
    };
    let dur = |flag: &str, v: &Option<String>| -> Result<Option<Dur>> {
        v.as_deref()
            .map(Dur::parse)
            .transpose()
            .with_context(|| format!("--{flag}"))
    };
    Ok(ForkRequest {
        count: a.count,
        labels: a
            .labels
            .iter()
            .map(|l| labels::parse_pair(l).with_context(|| format!("--label {l:?}")))
            .collect::<Result<_>>()?,
        cpu: cpu("cpu", &a.cpu)?,
        memory: size("memory", &a.memory)?,
        cpu_request: cpu("cpu-request", &a.cpu_request)?,
        memory_request: size("memory-request", &a.memory_request)?,
        pids: a.pids,
        disk: size("disk", &a.disk)?,
        ttl: dur("ttl", &a.ttl)?,
        lease: dur("lease", &a.lease)?,
        with_processes: a.with_processes,
    })
}

pub(super) async fn fork(client: &Client, a: &ForkArgs) -> Result<i32> {
    let req = request(a)?;
    let children = client.fork_sandbox(&a.id, &req).await?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&children)?);
    } else {
        for child in &children {
            println!("{}", child.id);
        }
    }
    Ok(0)
}

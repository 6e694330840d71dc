//! Turning command-line flags into API requests' specs, shared by
//! `create`, `run`, `exec` and `batch create`.

use std::collections::BTreeMap;

use anyhow::{bail, Context, Result};
use warren_core::spec::{ByteSize, Cpu, Dur, NetworkMode, NetworkSpec, Placement, ReclaimPolicy};
use warren_core::{labels, quantity, SandboxSpec};

use crate::cli::CreateArgs;

pub(super) fn parse_env(pairs: &[String]) -> Result<BTreeMap<String, String>> {
    pairs
        .iter()
        .map(|p| {
            p.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .with_context(|| format!("--env {p:?}: write it as KEY=VALUE"))
        })
        .collect()
}

pub(super) fn spec_from(a: &CreateArgs, cmd: Option<Vec<String>>) -> Result<SandboxSpec> {
    let labels = a
        .labels
        .iter()
        .map(|l| labels::parse_pair(l).map_err(anyhow::Error::from))
        .collect::<Result<_>>()?;
    let node_selector = a
        .node_selector
        .iter()
        .map(|l| {
            labels::parse_pair(l)
                .map_err(|e| anyhow::anyhow!("--node-selector {l:?}: {e}; write KEY=VALUE"))
        })
        .collect::<Result<_>>()?;
    let placement = match a.placement.as_deref() {
        None | Some("spread") => Placement::Spread,
        Some("pack") => Placement::Pack,
        Some(other) => bail!("--placement {other:?}: use spread or pack"),
    };
    let network = match a.network.as_deref() {
        None if !a.allow.is_empty() || !a.deny.is_empty() => NetworkMode::Allowlist,
        None => NetworkMode::None,
        Some(mode) => mode
            .parse()
            .map_err(|e| anyhow::anyhow!("--network: {e}"))?,
    };
    let reclaim = match a.reclaim.as_deref() {
        None | Some("destroy") => ReclaimPolicy::Destroy,
        Some("delay") => ReclaimPolicy::Delay,
        Some("keep") => ReclaimPolicy::Keep,
        Some("keep_on_failure") => ReclaimPolicy::KeepOnFailure,
        Some("pause") => ReclaimPolicy::Pause,
        Some(other) => {
            bail!("--reclaim {other:?}: use destroy, delay, keep, keep_on_failure or pause")
        }
    };
    let size = |s: &Option<String>| -> Result<Option<ByteSize>> {
        s.as_deref()
            .map(|v| quantity::parse_size(v).map(ByteSize))
            .transpose()
            .map_err(Into::into)
    };
    let cpu = |s: &Option<String>| -> Result<Option<Cpu>> {
        s.as_deref()
            .map(|c| quantity::parse_cpu(c).map(Cpu))
            .transpose()
            .map_err(Into::into)
    };
    let dur = |s: &Option<String>| -> Result<Option<Dur>> {
        s.as_deref().map(Dur::parse).transpose().map_err(Into::into)
    };
    Ok(SandboxSpec {
        image: a.image.clone(),
        name: a.name.clone(),
        cpu: cpu(&a.cpu)?,
        memory: size(&a.memory)?,
        cpu_request: cpu(&a.cpu_request)?,
        memory_request: size(&a.memory_request)?,
        pids: a.pids,
        disk: size(&a.disk)?,
        gpus: a.gpus,
        devices: a.devices.clone(),
        volumes: a.volumes.clone(),
        secrets: a.secrets.clone(),
        env: parse_env(&a.env)?,
        labels,
        ttl: dur(&a.ttl)?,
        lease: dur(&a.lease)?,
        profile: a.profile.clone(),
        network: NetworkSpec {
            mode: network,
            allow: a.allow.clone(),
            deny: a.deny.clone(),
        },
        reclaim,
        keep_for: dur(&a.keep_for)?,
        cmd,
        cwd: a.cwd.clone(),
        user: a.user.clone(),
        request_id: a.request_id.clone(),
        node_selector,
        placement,
        isolation: a.isolation,
        priority: a.priority,
        fork: None,
    })
}

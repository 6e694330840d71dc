//! `warren-bench placement`: the scheduler alone, without sandboxes: how
//! many placement decisions per second one core makes over simulated
//! nodes (admission's real path: the queue check, filter, score and the
//! bookkeeping of what each node holds). With `--tenants N`, each node
//! count is measured twice in one run, without tenants and with N of them
//! (weights 1, 1, 2, ..., each with a quota that is checked but not
//! reached, creates taking turns), so the cost of fair share is read
//! side by side.

use std::time::Instant;

use anyhow::Result;
use warren_control::admission::{Admission, Admit, Need, Request};
use warren_core::tenant::{Quota, TenantName, TenantSpec, Weight};
use warren_core::units::Cpu;

use crate::cli::PlacementArgs;

pub fn run(args: &PlacementArgs) -> Result<i32> {
    println!(
        "{:>8} {:>8} {:>10} {:>14} {:>12} {:>14}",
        "nodes", "tenants", "decisions", "decisions/s", "µs/decision", "vs no tenants"
    );
    for &nodes in &args.nodes {
        let (base, us) = measure(nodes, args.decisions, 0)?;
        println!(
            "{:>8} {:>8} {:>10} {:>14.0} {:>12.2} {:>14}",
            nodes, 0, args.decisions, base, us, "-"
        );
        if args.tenants > 0 {
            let (per_sec, us) = measure(nodes, args.decisions, args.tenants)?;
            println!(
                "{:>8} {:>8} {:>10} {:>14.0} {:>12.2} {:>13.1}%",
                nodes,
                args.tenants,
                args.decisions,
                per_sec,
                us,
                100.0 * per_sec / base
            );
        }
    }
    Ok(0)
}

/// `n` tenants of weights 1, 1, 2, 1, 1, 2, ... with a cpu quota far above
/// what the bench holds (checked on every create, never reached).
fn tenants(admission: &Admission, n: usize) -> Result<Vec<TenantName>> {
    (0..n)
        .map(|i| {
            let name: TenantName = format!("tenant-{i}").parse()?;
            let weight = if i % 3 == 2 { 2 } else { 1 };
            let spec = TenantSpec {
                quota: Quota {
                    cpu: Some(Cpu(u64::MAX / 4)),
                    ..Quota::default()
                },
                weight: Weight::try_from(weight)?,
                ..TenantSpec::default()
            };
            admission.set_tenant(&name, &spec);
            Ok(name)
        })
        .collect()
}

/// Fills `nodes` simulated nodes to about half (varied per node, so scores
/// differ), then times `decisions` admit-and-release pairs, the creates
/// taking turns among `tenants` tenants (none: the default tenant's).
fn measure(nodes: usize, decisions: usize, tenants: usize) -> Result<(f64, f64)> {
    let admission = Admission::new(usize::MAX);
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut rand = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for i in 0..nodes {
        let name = format!("node-{i:06}");
        let labels = if i % 10 == 0 {
            [("gpu".to_string(), "h200".to_string())].into()
        } else {
            Default::default()
        };
        admission.set_node(
            &name,
            Need {
                cpu_millis: 64_000,
                memory: 256 << 30,
                slots: 4096,
                gpus: 0,
            },
            32_768,
            labels,
            &[],
        );
        admission.set_schedulable(&name, true);
        // Half full on average, unevenly.
        let held = Need {
            cpu_millis: rand() % 64_000,
            memory: rand() % (256u64 << 30),
            slots: (rand() % 2048) as u32,
            gpus: 0,
        };
        admission.hold(&format!("held-{i}"), &name, held);
    }
    let request = Request {
        need: Need {
            cpu_millis: 1000,
            memory: 2 << 30,
            slots: 1,
            gpus: 0,
        },
        pids: 1024,
        selector: Default::default(),
        placement: Default::default(),
        image: Some("sha256:bench".into()),
        node: None,
        isolation: None,
        tenant: TenantName::default_tenant(),
        priority: 0,
    };
    let requests: Vec<Request> = if tenants == 0 {
        vec![request]
    } else {
        self::tenants(&admission, tenants)?
            .into_iter()
            .map(|t| request.clone().for_tenant(t, 0))
            .collect()
    };
    let start = Instant::now();
    for i in 0..decisions {
        let id = format!("s{i}");
        let request = &requests[i % requests.len()];
        match admission.admit(&id, request.clone())? {
            Admit::Now(_) => admission.release(&id),
            Admit::Queued { .. } => anyhow::bail!("a half-full cluster queued a create"),
        }
    }
    let took = start.elapsed().as_secs_f64();
    Ok((decisions as f64 / took, took * 1e6 / decisions as f64))
}

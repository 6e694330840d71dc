//! `warren-bench placement`: the scheduler alone, without sandboxes: how
//! many placement decisions per second one core makes over simulated
//! nodes (admission's real path: the queue check, filter, score and the
//! bookkeeping of what each node holds).

use std::time::Instant;

use anyhow::Result;
use warren_control::admission::{Admission, Admit, Need, Request};

use crate::cli::PlacementArgs;

pub fn run(args: &PlacementArgs) -> Result<i32> {
    println!(
        "{:>8} {:>10} {:>14} {:>12}",
        "nodes", "decisions", "decisions/s", "µs/decision"
    );
    for &nodes in &args.nodes {
        let (per_sec, us) = measure(nodes, args.decisions)?;
        println!(
            "{:>8} {:>10} {:>14.0} {:>12.2}",
            nodes, args.decisions, per_sec, us
        );
    }
    Ok(0)
}

/// Fills `nodes` simulated nodes to about half (varied per node, so scores
/// differ), then times `decisions` admit-and-release pairs.
fn measure(nodes: usize, decisions: usize) -> Result<(f64, f64)> {
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
    };
    let start = Instant::now();
    for i in 0..decisions {
        let id = format!("s{i}");
        match admission.admit(&id, request.clone())? {
            Admit::Now(_) => admission.release(&id),
            Admit::Queued { .. } => anyhow::bail!("a half-full cluster queued a create"),
        }
    }
    let took = start.elapsed().as_secs_f64();
    Ok((decisions as f64 / took, took * 1e6 / decisions as f64))
}

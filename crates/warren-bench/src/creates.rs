//! `warren-bench creates`: creates per second through the public API, COUNT
//! sandboxes at a fixed concurrency (all alive at the end), then one delete
//! of them all by label. Against `warren server` with `warren-bench fake-nodes`
//! it measures the control plane alone (scripts/bench-cluster.sh).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use tokio::sync::Semaphore;
use warren_core::SandboxSpec;

use crate::cli::CreatesArgs;
use crate::lifecycle::{removing_on_exit, Progress, Samples};
use warren_cli::client::Client;

pub async fn run(client: &Client, args: &CreatesArgs) -> Result<i32> {
    let run_label = format!("creates-{}", std::process::id());
    let label = format!("bench={run_label}");
    removing_on_exit(client, &label, measure(client, args, run_label)).await
}

async fn measure(client: &Client, args: &CreatesArgs, run_label: String) -> Result<i32> {
    let spec = SandboxSpec {
        image: args.image.clone(),
        cpu: Some(warren_core::spec::Cpu(warren_core::quantity::parse_cpu(
            &args.cpu,
        )?)),
        memory: Some(warren_core::spec::ByteSize(
            warren_core::quantity::parse_size(&args.memory)?,
        )),
        labels: [("bench".to_string(), run_label.clone())].into(),
        ..Default::default()
    };
    let permits = Arc::new(Semaphore::new(args.concurrency.max(1)));
    let client = Arc::new(client.clone());
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(args.count);
    let mut progress = Progress::new("creates", args.count);
    for i in 0..args.count {
        let permit = permits.clone().acquire_owned().await?;
        // Started minus those still holding a permit: the ones finished.
        progress.tick(i.saturating_sub(args.concurrency.max(1) - 1));
        let (client, spec) = (client.clone(), spec.clone());
        tasks.push(tokio::spawn(async move {
            let t = Instant::now();
            let made = client.create_sandbox(&spec).await;
            drop(permit);
            made.map(|_| t.elapsed())
        }));
    }
    let mut samples = Samples::default();
    let mut failed = 0usize;
    let mut first_error = None;
    for t in tasks {
        match t.await? {
            Ok(d) => samples.0.push(d),
            Err(e) => {
                failed += 1;
                first_error.get_or_insert_with(|| format!("{e:#}"));
            }
        }
        progress.tick(samples.0.len() + failed);
    }
    let wall = start.elapsed();
    let created = samples.0.len();
    println!(
        "creates: {created} in {:.2} s = {:.0}/s at concurrency {} (p50 {:.1} ms, p99 {:.1} ms), {failed} failed",
        wall.as_secs_f64(),
        created as f64 / wall.as_secs_f64().max(f64::EPSILON),
        args.concurrency,
        samples.pct(50.0),
        samples.pct(99.0),
    );
    if let Some(e) = first_error {
        say!("first failure: {e}");
    }
    let start = Instant::now();
    let deleted = client
        .delete_sandboxes(&[format!("bench={run_label}")])
        .await?;
    let wall: Duration = start.elapsed();
    println!(
        "deletes: {} in {:.2} s = {:.0}/s (one call, by label)",
        deleted.len(),
        wall.as_secs_f64(),
        deleted.len() as f64 / wall.as_secs_f64().max(f64::EPSILON)
    );
    Ok(if failed == 0 { 0 } else { 1 })
}

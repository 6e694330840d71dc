//! How long one write of the SQLite store takes when it is alone (nothing
//! else writing): the latency a single create, claim or state change pays
//! for its record. Writes to a store in a temporary directory on the file
//! system of `TMPDIR` (put it on the disk whose latency you want), then
//! prints p50/p90/p99 of a state change and of a spec change.
//!
//!     cargo run --release -p warren-control --example store_latency -- 500

use std::time::{Duration, Instant};

use warren_control::store::{SandboxRow, SqliteStore, Store, Transition};
use warren_core::{ResolvedResources, SandboxSpec, SandboxState};

fn percentiles(mut took: Vec<Duration>) -> String {
    took.sort();
    let at = |p: f64| took[((took.len() - 1) as f64 * p) as usize].as_secs_f64() * 1000.0;
    format!(
        "p50 {:.3} ms, p90 {:.3} ms, p99 {:.3} ms",
        at(0.5),
        at(0.9),
        at(0.99)
    )
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(300);
    let dir = tempfile::tempdir()?;
    let store = SqliteStore::open(&dir.path().join("warren.db")).await?;
    let spec: SandboxSpec = serde_json::from_value(serde_json::json!({"image": "busybox:latest"}))?;
    let row = SandboxRow::new(
        "sbx-latency",
        spec.clone(),
        ResolvedResources {
            cpu_millis: 100,
            memory: 64 << 20,
            pids: 128,
            disk: 0,
            gpus: 0,
            cpu_request_millis: None,
            memory_request: None,
        },
        "local".into(),
        "sha256:0".into(),
        SandboxState::Creating,
    );
    store.insert(&row, None).await?;
    let (mut states, mut specs) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        let state = [SandboxState::Running, SandboxState::Paused][i % 2];
        let t = Instant::now();
        store
            .transition("sbx-latency", state, "bench", "t", Transition::default())
            .await?;
        states.push(t.elapsed());
        let t = Instant::now();
        store
            .set_spec("sbx-latency", &spec, "t", "bench", "")
            .await?;
        specs.push(t.elapsed());
    }
    println!("{n} state changes: {}", percentiles(states));
    println!("{n} spec changes:  {}", percentiles(specs));
    Ok(())
}

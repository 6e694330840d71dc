//! `warren-bench lifecycle`: create→ready, exec round trip, destroy and the full
//! create+exec+destroy cycle through the HTTP API, plus an idle-density check.
//! Prints p50/p99 and throughput; scripts/bench.sh runs it beside runc, bwrap
//! and podman and writes the ratios.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::json;
use tokio::sync::Semaphore;
use warren_core::{ExecRequest, SandboxSpec};

use crate::cli::LifecycleArgs;
use warren_cli::client::Client;

#[derive(Default)]
pub(crate) struct Samples(pub(crate) Vec<Duration>);

impl Samples {
    pub(crate) fn pct(&self, p: f64) -> f64 {
        let mut v: Vec<f64> = self.0.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
        if v.is_empty() {
            return 0.0;
        }
        v.sort_by(|a, b| a.total_cmp(b));
        let idx = ((p / 100.0) * (v.len() as f64 - 1.0)).round() as usize;
        v[idx.min(v.len() - 1)]
    }
    pub(crate) fn summary(&self, name: &str, wall: Option<Duration>) -> serde_json::Value {
        let per_sec = wall.map(|w| self.0.len() as f64 / w.as_secs_f64());
        json!({ "name": name, "n": self.0.len(), "p50_ms": self.pct(50.0), "p99_ms": self.pct(99.0), "per_sec": per_sec })
    }
}

/// Default sizes (limits of 1 core and 512M, requests of 10m and 16M), so
/// the hundreds alive at once fit a default node; every sandbox carries the
/// run's label, by which an interrupted or failed run removes them all.
fn spec(image: &str) -> SandboxSpec {
    SandboxSpec {
        image: image.to_string(),
        labels: [("bench".to_string(), run_label())].into(),
        ..Default::default()
    }
}

fn run_label() -> String {
    format!("bench-{}", std::process::id())
}

/// Runs a benchmark and removes every sandbox carrying `label` when it
/// fails or is interrupted (Ctrl-C), so nothing is left running.
pub(crate) async fn removing_on_exit<F>(client: &Client, label: &str, bench: F) -> Result<i32>
where
    F: std::future::Future<Output = Result<i32>>,
{
    let outcome = tokio::select! {
        r = bench => r,
        _ = tokio::signal::ctrl_c() => {
            say!("warren-bench: interrupted; removing its sandboxes (label {label})");
            Err(anyhow::anyhow!("interrupted"))
        }
    };
    if outcome.is_err() {
        match client.delete_sandboxes(&[label.to_string()]).await {
            Ok(gone) => say!("warren-bench: removed {} sandboxes", gone.len()),
            Err(e) => say!(
                "warren-bench: could not remove its sandboxes ({e:#}); run `warren rm --label {label}`"
            ),
        }
    }
    outcome
}

/// Progress on stderr for the people watching: each phase's count, at most
/// every half second (stdout keeps the results only).
pub(crate) struct Progress {
    phase: &'static str,
    total: usize,
    shown: Instant,
}

impl Progress {
    pub(crate) fn new(phase: &'static str, total: usize) -> Progress {
        say!("warren-bench: {phase} 0/{total}");
        Progress {
            phase,
            total,
            shown: Instant::now(),
        }
    }

    pub(crate) fn tick(&mut self, done: usize) {
        if done == self.total || self.shown.elapsed() >= Duration::from_millis(500) {
            self.shown = Instant::now();
            say!("warren-bench: {} {done}/{}", self.phase, self.total);
        }
    }
}

fn true_cmd() -> ExecRequest {
    ExecRequest {
        cmd: vec!["true".into()],
        ..Default::default()
    }
}

async fn exec_ok(client: &Client, id: &str) -> Result<()> {
    let exit = client.exec(id, &true_cmd(), |_| {}).await?;
    match exit {
        warren_core::ExecEvent::Exit { code: 0, .. } => Ok(()),
        other => anyhow::bail!("exec of `true` ended with {other:?}"),
    }
}

async fn cycle(client: &Client, image: &str) -> Result<Duration> {
    let t = Instant::now();
    let info = client.create_sandbox(&spec(image)).await?;
    exec_ok(client, &info.id).await?;
    client.delete_sandbox(&info.id).await?;
    Ok(t.elapsed())
}

pub(crate) fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

pub async fn run(client: &Client, args: LifecycleArgs) -> Result<i32> {
    let label = format!("bench={}", run_label());
    removing_on_exit(client, &label, measure(client, args)).await
}

async fn measure(client: &Client, args: LifecycleArgs) -> Result<i32> {
    let n = args.iterations.max(1);
    let mut results = Vec::new();
    // Warm up caches and connections.
    for _ in 0..5 {
        cycle(client, &args.image).await?;
    }

    let (mut create, mut destroy) = (Samples::default(), Samples::default());
    let mut ids = Vec::with_capacity(n);
    let phases_before = phase_totals(client).await;
    let mut progress = Progress::new("create_to_ready", n);
    for i in 0..n {
        let t = Instant::now();
        ids.push(client.create_sandbox(&spec(&args.image)).await?.id);
        create.0.push(t.elapsed());
        progress.tick(i + 1);
    }
    let phases = phases_before
        .zip(phase_totals(client).await)
        .map(|(before, after)| phase_means(&before, &after));
    let mut exec = Samples::default();
    let target = ids.first().cloned().context("no sandbox created")?;
    let mut progress = Progress::new("exec_true_round_trip", n);
    for i in 0..n {
        let t = Instant::now();
        exec_ok(client, &target).await?;
        exec.0.push(t.elapsed());
        progress.tick(i + 1);
    }
    let mut progress = Progress::new("destroy", n);
    for (i, id) in ids.iter().enumerate() {
        let t = Instant::now();
        client.delete_sandbox(id).await?;
        destroy.0.push(t.elapsed());
        progress.tick(i + 1);
    }
    results.push(create.summary("create_to_ready", None));
    if let Some(phases) = phases.filter(|p| !p.is_empty()) {
        results.push(json!({ "name": "create_phases", "phases": phases }));
    }
    results.push(exec.summary("exec_true_round_trip", None));
    results.push(destroy.summary("destroy", None));

    for conc in args
        .concurrency
        .split(',')
        .filter_map(|c| c.trim().parse::<usize>().ok())
    {
        let sem = Arc::new(Semaphore::new(conc));
        let t = Instant::now();
        let mut tasks = Vec::with_capacity(n);
        let mut progress = Progress::new(if conc == 1 { "cycle_c1" } else { "cycle" }, n);
        for _ in 0..n {
            let permit = sem.clone().acquire_owned().await?;
            let (client, image) = (client.clone(), args.image.clone());
            tasks.push(tokio::spawn(async move {
                let r = cycle(&client, &image).await;
                drop(permit);
                r
            }));
        }
        let mut s = Samples::default();
        for task in tasks {
            s.0.push(task.await??);
            progress.tick(s.0.len());
        }
        results.push(s.summary(&format!("cycle_c{conc}"), Some(t.elapsed())));
    }

    if args.idle > 0 {
        let before = args.daemon_pid.and_then(rss_kib);
        let mut idle = Vec::with_capacity(args.idle);
        let t = Instant::now();
        let mut progress = Progress::new("idle_sandboxes", args.idle);
        for i in 0..args.idle {
            idle.push(client.create_sandbox(&spec(&args.image)).await?.id);
            progress.tick(i + 1);
        }
        let created_in = t.elapsed();
        let after = args.daemon_pid.and_then(rss_kib);
        // Every idle sandbox must still be usable.
        for id in &idle {
            exec_ok(client, id).await?;
        }
        for id in &idle {
            client.delete_sandbox(id).await?;
        }
        results.push(json!({
            "name": "idle_sandboxes",
            "n": args.idle,
            "create_all_s": created_in.as_secs_f64(),
            "daemon_rss_before_mib": before.map(|k| k as f64 / 1024.0),
            "daemon_rss_after_mib": after.map(|k| k as f64 / 1024.0),
            "daemon_rss_growth_mib": before.zip(after).map(|(b, a)| (a as f64 - b as f64) / 1024.0),
        }));
    }

    print_results(&results, args.json)
}

/// Each create phase's (sum of seconds, count) from `/metrics`'
/// `warren_create_phase_seconds`; None when the daemon does not serve it.
async fn phase_totals(client: &Client) -> Option<BTreeMap<String, (f64, f64)>> {
    let text = client.metrics_text().await.ok()?;
    Some(parse_phase_totals(&text))
}

pub(crate) fn parse_phase_totals(text: &str) -> BTreeMap<String, (f64, f64)> {
    let mut totals: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("warren_create_phase_seconds_") else {
            continue;
        };
        let (kind, rest) = match rest.split_once('{') {
            Some(split) => split,
            None => continue,
        };
        let Some((labels, value)) = rest.split_once('}') else {
            continue;
        };
        let Some(phase) = labels
            .split(',')
            .find_map(|l| l.trim().strip_prefix("phase=\""))
            .map(|p| p.trim_end_matches('"'))
        else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let entry = totals.entry(phase.to_string()).or_default();
        match kind {
            "sum" => entry.0 = value,
            "count" => entry.1 = value,
            _ => {}
        }
    }
    totals
}

/// Mean milliseconds per create of each phase between two scrapes, keyed
/// `<phase>_ms`.
pub(crate) fn phase_means(
    before: &BTreeMap<String, (f64, f64)>,
    after: &BTreeMap<String, (f64, f64)>,
) -> serde_json::Map<String, serde_json::Value> {
    let mut means = serde_json::Map::new();
    for (phase, (sum, count)) in after {
        let (sum0, count0) = before.get(phase).copied().unwrap_or_default();
        let n = count - count0;
        if n > 0.0 {
            means.insert(format!("{phase}_ms"), json!((sum - sum0) / n * 1000.0));
        }
    }
    means
}

/// JSON for scripts, one line per measurement for people.
pub(crate) fn print_results(results: &[serde_json::Value], as_json: bool) -> Result<i32> {
    if as_json {
        println!("{}", serde_json::to_string_pretty(results)?);
    } else {
        for r in results {
            println!("{r}");
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phase_means_are_deltas_per_create() {
        let before = parse_phase_totals(
            "warren_create_phase_seconds_sum{phase=\"admission\"} 1.0\n\
             warren_create_phase_seconds_count{phase=\"admission\"} 10\n",
        );
        let after = parse_phase_totals(
            "# HELP x\n\
             warren_create_phase_seconds_sum{phase=\"admission\"} 1.5\n\
             warren_create_phase_seconds_count{phase=\"admission\"} 15\n\
             warren_create_phase_seconds_bucket{le=\"0.1\",phase=\"admission\"} 15\n\
             warren_create_phase_seconds_sum{phase=\"answer\"} 0.02\n\
             warren_create_phase_seconds_count{phase=\"answer\"} 2\n",
        );
        let means = phase_means(&before, &after);
        let admission = means["admission_ms"].as_f64().unwrap_or_default();
        assert!((admission - 100.0).abs() < 1e-6, "{admission}");
        let answer = means["answer_ms"].as_f64().unwrap_or_default();
        assert!((answer - 10.0).abs() < 1e-6, "{answer}");
    }
}

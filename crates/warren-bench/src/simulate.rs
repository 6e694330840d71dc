//! `warren-bench simulate`: replays a synthetic training workload shaped like
//! DSec's (exploration phases that want CPU, update phases that want memory,
//! varied peaks) against simulated nodes, using the node's own admission
//! queue and the control plane's own profile learning. Compares fixed
//! requests, learned profiles and an oracle that knows every run's peak.

use std::collections::HashMap;

use anyhow::Result;
use warren_control::admission::{Admission, Admit, Need};
use warren_core::profile::{Policy, Profile, Request, Run};

use crate::cli::SimulateArgs;

const GIB: f64 = (1u64 << 30) as f64;

/// A small deterministic generator (xorshift), so runs are reproducible
/// from a seed without another dependency (`tenants` uses it too).
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
    pub(crate) fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.next()
    }
}

struct Task {
    explore_cpu: f64,
    explore_mem: f64,
    update_mem: f64,
    runtime_s: f64,
}

struct Instance {
    task: usize,
    cpu_peak_millis: u64,
    mem_peak: u64,
    runtime_s: f64,
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Fixed,
    Learned,
    Oracle,
}

struct Outcome {
    mean_concurrency: f64,
    cpu_demand: f64,
    ooms: usize,
    flagged: usize,
    cpu_slack: Vec<f64>,
    mem_slack: Vec<f64>,
    cpu_rel: Vec<f64>,
    mem_rel: Vec<f64>,
}

fn workload(args: &SimulateArgs) -> (Vec<Task>, Vec<Instance>) {
    let mut rng = Rng(args.seed.max(1));
    let tasks: Vec<Task> = (0..args.tasks)
        .map(|_| {
            // Around the seed's example: explores at ~2 cores and ~1.8 GB,
            // updates at ~3.2 GB.
            let explore_mem = rng.uniform(1.0, 2.5);
            Task {
                explore_cpu: rng.uniform(1.0, 2.5),
                explore_mem,
                update_mem: explore_mem * rng.uniform(1.3, 2.0),
                runtime_s: rng.uniform(300.0, 3600.0),
            }
        })
        .collect();
    let mut runs = Vec::with_capacity(args.sandboxes);
    for _ in 0..args.sandboxes {
        let task = (rng.next() * tasks.len() as f64) as usize % tasks.len();
        let t = &tasks[task];
        // Run-to-run jitter, and a rare spike (1%) well above the usual peak.
        let spike = if rng.next() < 0.01 {
            rng.uniform(1.1, 1.4)
        } else {
            1.0
        };
        let mem = t.explore_mem.max(t.update_mem) * rng.uniform(0.9, 1.08) * spike;
        runs.push(Instance {
            task,
            cpu_peak_millis: (t.explore_cpu * rng.uniform(0.9, 1.1) * 1000.0) as u64,
            mem_peak: (mem * GIB) as u64,
            runtime_s: t.runtime_s * rng.uniform(0.8, 1.2),
        });
    }
    (tasks, runs)
}

fn simulate(mode: Mode, runs: &[Instance], tasks: usize, args: &SimulateArgs) -> Outcome {
    let fixed = Request {
        cpu_millis: 4000,
        memory: 8 << 30,
        gpu_memory: 0,
    };
    let policy = Policy {
        cpu_margin: args.cpu_margin,
        memory_margin: args.memory_margin,
        ..Policy::default()
    };
    // The node's own capacity rule (overcommit and reserves), as `warren up`.
    let settings = warren_node::NodeSettings {
        cpu_overcommit: args.cpu_overcommit,
        max_sandboxes: u32::MAX,
        ..Default::default()
    };
    let node = settings.allocatable(args.node_cores * 1000, args.node_memory_gib << 30);
    let admission = Admission::new(usize::MAX);
    admission.set_node("sim", node, u32::MAX, Default::default(), &[]);
    admission.set_schedulable("sim", true);
    let mut profiles: Vec<Profile> = (0..tasks)
        .map(|i| Profile::new(&format!("task-{i}"), fixed))
        .collect();
    let mut history: HashMap<usize, Vec<Run>> = HashMap::new();
    // Concurrency is averaged while work is still queued, i.e. while the
    // node is full: that is how many sandboxes fit on it.
    let (mut clock, mut full_area, mut full_time, mut ooms) = (0.0f64, 0.0f64, 0.0f64, 0usize);
    // Sum of the running sandboxes' CPU peaks over the cores, while full:
    // above 1 the peaks would contend if they all came at once.
    let mut demand_area = 0.0f64;
    let mut running: Vec<(f64, String, usize, Request)> = Vec::new();
    let mut out = Outcome {
        mean_concurrency: 0.0,
        cpu_demand: 0.0,
        ooms: 0,
        flagged: 0,
        cpu_slack: vec![],
        mem_slack: vec![],
        cpu_rel: vec![],
        mem_rel: vec![],
    };
    let mut next = 0;
    while next < runs.len() || !running.is_empty() {
        // Admit in FIFO order while the head fits.
        while next < runs.len() {
            let r = &runs[next];
            let req = match mode {
                Mode::Fixed => fixed,
                Mode::Learned => profiles[r.task].current,
                Mode::Oracle => Request {
                    cpu_millis: r.cpu_peak_millis,
                    memory: r.mem_peak,
                    gpu_memory: 0,
                },
            };
            let id = format!("s{next}");
            let need = Need {
                cpu_millis: req.cpu_millis,
                memory: req.memory,
                slots: 1,
                gpus: 0,
            };
            let ask = warren_control::admission::Request {
                need,
                pids: warren_core::spec::MIN_PIDS,
                selector: Default::default(),
                placement: Default::default(),
                image: None,
                node: None,
                isolation: None,
                tenant: Default::default(),
                priority: 0,
            };
            match admission.admit(&id, ask) {
                Ok(Admit::Now(_)) => {
                    running.push((clock + r.runtime_s, id, next, req));
                    next += 1;
                }
                _ => {
                    admission.release(&id);
                    break;
                }
            }
        }
        // Advance to the next finish.
        running.sort_by(|a, b| b.0.total_cmp(&a.0));
        let concurrent = running.len() as f64;
        let Some((end, id, idx, req)) = running.pop() else {
            break;
        };
        if next < runs.len() {
            let peaks: u64 = running
                .iter()
                .map(|s| runs[s.2].cpu_peak_millis)
                .sum::<u64>()
                + runs[idx].cpu_peak_millis;
            full_area += concurrent * (end - clock);
            demand_area += peaks as f64 / (args.node_cores * 1000) as f64 * (end - clock);
            full_time += end - clock;
        }
        let r = &runs[idx];
        admission.release(&id);
        let oom = r.mem_peak > req.memory;
        let cpu_used = r.cpu_peak_millis.min(req.cpu_millis);
        if oom {
            ooms += 1;
        }
        out.cpu_slack
            .push(req.cpu_millis as f64 / 1000.0 - cpu_used as f64 / 1000.0);
        out.mem_slack
            .push((req.memory as f64 - r.mem_peak.min(req.memory) as f64) / GIB);
        out.cpu_rel
            .push(1.0 - cpu_used as f64 / req.cpu_millis as f64);
        out.mem_rel
            .push(1.0 - r.mem_peak.min(req.memory) as f64 / req.memory as f64);
        clock = clock.max(end);
        if mode == Mode::Learned {
            let run = Run {
                cpu_millis_peak: cpu_used,
                memory_peak: r.mem_peak.min(req.memory),
                runtime_ms: (r.runtime_s * 1000.0) as u64,
                oom_killed: oom,
                throttled_ratio: if r.cpu_peak_millis > req.cpu_millis {
                    0.5
                } else {
                    0.0
                },
                requested: req,
                gpu_memory_peak: 0,
            };
            let h = history.entry(r.task).or_default();
            h.push(run);
            if h.len() > policy.window {
                h.remove(0);
            }
            profiles[r.task].learn(h, &policy);
        }
    }
    out.mean_concurrency = if full_time > 0.0 {
        full_area / full_time
    } else {
        0.0
    };
    out.cpu_demand = if full_time > 0.0 {
        demand_area / full_time
    } else {
        0.0
    };
    out.ooms = ooms;
    out.flagged = profiles.iter().filter(|p| p.anomalous).count();
    out
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[((p / 100.0) * (v.len() - 1) as f64).round() as usize]
}

pub fn run(args: SimulateArgs) -> Result<i32> {
    let (tasks, runs) = workload(&args);
    println!(
        "workload: {} sandboxes of {} tasks (seed {}), node {} cores / {} GiB, CPU overcommit {}; \
         fixed request 4 cores / 8 GiB; learned margins cpu {} memory {}",
        runs.len(),
        tasks.len(),
        args.seed,
        args.node_cores,
        args.node_memory_gib,
        args.cpu_overcommit,
        args.cpu_margin,
        args.memory_margin
    );
    println!();
    println!("| policy | sandboxes per node (mean concurrent) | vs fixed | OOM rate | profiles flagged | cpu slack p50 / p90 (cores) | memory slack p50 / p90 (GiB) | relative cpu slack p50 | relative memory slack p50 | CPU peaks / cores |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut fixed_conc = 0.0;
    for (name, mode) in [
        ("fixed", Mode::Fixed),
        ("learned", Mode::Learned),
        ("oracle", Mode::Oracle),
    ] {
        let mut o = simulate(mode, &runs, tasks.len(), &args);
        if mode == Mode::Fixed {
            fixed_conc = o.mean_concurrency;
        }
        println!(
            "| {name} | {:.1} | {:.2}x | {:.2}% | {} of {} ({:.1}%) | {:.2} / {:.2} | {:.2} / {:.2} | {:.0}% | {:.0}% | {:.2} |",
            o.mean_concurrency,
            o.mean_concurrency / fixed_conc.max(f64::MIN_POSITIVE),
            100.0 * o.ooms as f64 / runs.len() as f64,
            if mode == Mode::Learned { o.flagged } else { 0 },
            tasks.len(),
            if mode == Mode::Learned { 100.0 * o.flagged as f64 / tasks.len() as f64 } else { 0.0 },
            pct(&mut o.cpu_slack, 50.0),
            pct(&mut o.cpu_slack, 90.0),
            pct(&mut o.mem_slack, 50.0),
            pct(&mut o.mem_slack, 90.0),
            100.0 * pct(&mut o.cpu_rel, 50.0),
            100.0 * pct(&mut o.mem_rel, 50.0),
            o.cpu_demand,
        );
    }
    Ok(0)
}

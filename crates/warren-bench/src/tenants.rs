//! `warren-bench tenants`: fair share between tenants (issue 43), measured
//! with admission's own code over simulated nodes and a simulated clock,
//! as `simulate` does. Three tenants (weights 1:1:2 by default) keep
//! creates waiting, so the cluster stays full; their sandboxes ask random
//! sizes and run random times. The run has three phases of `--phase-s`:
//!
//! 1. all busy: each tenant's share of the cluster, averaged;
//! 2. the last tenant goes idle (stops creating, its waiting creates are
//!    withdrawn): how much of what its ending sandboxes free the others take
//!    in the same release (one scheduling round), and their shares after;
//! 3. it comes back: how long until it holds its share again.
//!
//! Run once without preemption and once with it (preempted sandboxes end
//! `--destroy-ms` after admission names them, as the control plane would).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use anyhow::Result;
use tokio::sync::oneshot;
use warren_control::admission::{Admission, Admit, AdmitError, Need, Request};
use warren_core::tenant::{TenantName, TenantSpec, TenantUsage, Weight};

use crate::cli::TenantsArgs;
use crate::simulate::Rng;

const GIB: u64 = 1 << 30;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    /// A sandbox ran its time.
    End,
    /// A preempted sandbox is gone.
    Destroyed,
    /// The last tenant stops creating.
    Idle,
    /// It creates again.
    Return,
    Stop,
}

enum Life {
    Waiting(oneshot::Receiver<String>),
    Running,
    Done,
}

struct Sandbox {
    id: String,
    tenant: usize,
    runtime_ms: u64,
    life: Life,
}

/// What one run measured.
#[derive(Default)]
struct Outcome {
    /// Phase 1: each tenant's mean share of the cluster (dominant
    /// resource), and of what was held.
    busy_abs: Vec<f64>,
    busy_norm: Vec<f64>,
    busy_used: f64,
    /// Phase 2: cpu the idle tenant's ends freed while the others waited,
    /// and what of it they took in the same release.
    freed_cpu: u64,
    taken_cpu: u64,
    releases: usize,
    releases_taken: usize,
    idle_abs: Vec<f64>,
    idle_used: f64,
    /// Phase 3: seconds from the return until the tenant held 95% of its
    /// fair share of the cluster; its share at the end.
    back_s: Option<f64>,
    back_abs: Vec<f64>,
    back_norm: Vec<f64>,
    /// Sandboxes preempted while the cluster first fills, then in each
    /// phase.
    preempted: [usize; 4],
}

struct Sim<'a> {
    args: &'a TenantsArgs,
    admission: Admission,
    names: Vec<TenantName>,
    rng: Rng,
    now: u64,
    seq: u64,
    events: BinaryHeap<Reverse<(u64, u64, Kind, usize)>>,
    sandboxes: Vec<Sandbox>,
    /// Per tenant: its waiting sandboxes (indices).
    waiting: Vec<Vec<usize>>,
    active: Vec<bool>,
    total_cpu: u64,
    total_memory: u64,
    preempted: [usize; 4],
}

impl Sim<'_> {
    fn at(&mut self, when: u64, kind: Kind, idx: usize) {
        self.seq += 1;
        self.events.push(Reverse((when, self.seq, kind, idx)));
    }

    fn start(&mut self, idx: usize) {
        let Some(sb) = self.sandboxes.get_mut(idx) else {
            return;
        };
        sb.life = Life::Running;
        let end = self.now + sb.runtime_ms;
        self.at(end, Kind::End, idx);
    }

    /// Keeps `backlog` creates of each active tenant waiting, one tenant's
    /// create after another's (a tenant filling an empty cluster alone
    /// would borrow all of it first).
    fn top_up(&mut self) -> Result<()> {
        let mut open: Vec<usize> = (0..self.names.len()).collect();
        while !open.is_empty() {
            let mut still = Vec::with_capacity(open.len());
            for t in open {
                if self.active[t] && self.waiting[t].len() < self.args.backlog && self.create(t)? {
                    still.push(t);
                }
            }
            open = still;
        }
        Ok(())
    }

    /// One create of tenant `t`; false when its queue is full.
    fn create(&mut self, t: usize) -> Result<bool> {
        let idx = self.sandboxes.len();
        let cores = 1 + (self.rng.next() * 4.0) as u64 % 4;
        let gib = self.rng.uniform(2.0, 8.0);
        let runtime_s = self
            .rng
            .uniform(self.args.min_runtime_s, self.args.max_runtime_s);
        let req = Request {
            need: Need {
                cpu_millis: cores * 1000,
                memory: (gib * GIB as f64) as u64,
                slots: 1,
                gpus: 0,
            },
            pids: 1024,
            selector: Default::default(),
            placement: Default::default(),
            image: None,
            node: None,
            isolation: None,
            tenant: TenantName::default_tenant(),
            priority: 0,
        }
        .for_tenant(self.names[t].clone(), 0);
        let id = format!("{}-{idx}", self.names[t]);
        let life = match self.admission.admit(&id, req) {
            Ok(Admit::Now(_)) => Life::Running,
            Ok(Admit::Queued { ready, .. }) => Life::Waiting(ready),
            Err(AdmitError::QueueFull(_)) => return Ok(false),
            Err(e) => return Err(e.into()),
        };
        let running = matches!(life, Life::Running);
        self.sandboxes.push(Sandbox {
            id,
            tenant: t,
            runtime_ms: (runtime_s * 1000.0) as u64,
            life,
        });
        if running {
            self.start(idx);
        } else {
            self.waiting[t].push(idx);
        }
        Ok(true)
    }

    /// Starts what admission started, and schedules the end of what it
    /// preempted.
    fn collect(&mut self) {
        for t in 0..self.waiting.len() {
            let mut still = Vec::with_capacity(self.waiting[t].len());
            for idx in std::mem::take(&mut self.waiting[t]) {
                let Some(Sandbox {
                    life: Life::Waiting(rx),
                    ..
                }) = self.sandboxes.get_mut(idx)
                else {
                    continue;
                };
                match rx.try_recv() {
                    Ok(_) => self.start(idx),
                    Err(oneshot::error::TryRecvError::Empty) => still.push(idx),
                    Err(oneshot::error::TryRecvError::Closed) => {
                        self.sandboxes[idx].life = Life::Done;
                    }
                }
            }
            self.waiting[t] = still;
        }
        for p in self.admission.preemptions() {
            if let Some(idx) = self.sandboxes.iter().rposition(|s| s.id == p.id) {
                let when = self.now + self.args.destroy_ms;
                self.at(when, Kind::Destroyed, idx);
            }
        }
    }

    fn end(&mut self, idx: usize) -> bool {
        let Some(sb) = self.sandboxes.get_mut(idx) else {
            return false;
        };
        if !matches!(sb.life, Life::Running) {
            return false;
        }
        sb.life = Life::Done;
        let id = sb.id.clone();
        self.admission.release(&id);
        true
    }

    fn usage(&self) -> Vec<TenantUsage> {
        let all = self.admission.tenants();
        self.names
            .iter()
            .map(|n| {
                all.iter()
                    .find(|(m, _, _)| m == n)
                    .map(|(_, u, _)| *u)
                    .unwrap_or_default()
            })
            .collect()
    }

    /// Each tenant's dominant share of the cluster, and the cpu used.
    fn shares(&self) -> (Vec<f64>, f64) {
        let u = self.usage();
        let cpu: u64 = u.iter().map(|u| u.cpu_millis).sum();
        let abs = u
            .iter()
            .map(|u| {
                (u.cpu_millis as f64 / self.total_cpu as f64)
                    .max(u.memory as f64 / self.total_memory as f64)
            })
            .collect();
        (abs, cpu as f64 / self.total_cpu as f64)
    }
}

/// Time-weighted means over a window.
#[derive(Default)]
struct Mean {
    time: f64,
    abs: Vec<f64>,
    norm: Vec<f64>,
    used: f64,
}

impl Mean {
    fn add(&mut self, dt: f64, abs: &[f64], used: f64) {
        if self.abs.is_empty() {
            self.abs = vec![0.0; abs.len()];
            self.norm = vec![0.0; abs.len()];
        }
        let sum: f64 = abs.iter().sum::<f64>().max(f64::MIN_POSITIVE);
        for (i, a) in abs.iter().enumerate() {
            self.abs[i] += a * dt;
            self.norm[i] += a / sum * dt;
        }
        self.used += used * dt;
        self.time += dt;
    }

    fn get(&self) -> (Vec<f64>, Vec<f64>, f64) {
        let t = self.time.max(f64::MIN_POSITIVE);
        (
            self.abs.iter().map(|x| x / t).collect(),
            self.norm.iter().map(|x| x / t).collect(),
            self.used / t,
        )
    }
}

fn simulate(args: &TenantsArgs, weights: &[u32], preempt: bool) -> Result<Outcome> {
    let admission = Admission::new(args.backlog);
    let node = Need {
        cpu_millis: args.node_cores * 1000,
        memory: args.node_memory_gib * GIB,
        slots: 4096,
        gpus: 0,
    };
    for i in 0..args.nodes {
        let n = format!("node-{i:04}");
        admission.set_node(&n, node, u32::MAX, Default::default(), &[]);
        admission.set_schedulable(&n, true);
    }
    let names: Vec<TenantName> = (0..weights.len())
        .map(|i| format!("t{}", i + 1).parse())
        .collect::<Result<_, _>>()?;
    for (n, &w) in names.iter().zip(weights) {
        let spec = TenantSpec {
            weight: Weight::try_from(w)?,
            preempt,
            ..TenantSpec::default()
        };
        admission.set_tenant(n, &spec);
    }
    let phase = (args.phase_s * 1000.0) as u64;
    let max_run = (args.max_runtime_s * 1000.0) as u64;
    let last = names.len() - 1;
    let mut sim = Sim {
        args,
        admission,
        rng: Rng(args.seed.max(1)),
        now: 0,
        seq: 0,
        events: BinaryHeap::new(),
        sandboxes: Vec::new(),
        waiting: vec![Vec::new(); names.len()],
        active: vec![true; names.len()],
        total_cpu: node.cpu_millis * args.nodes as u64,
        total_memory: node.memory * args.nodes as u64,
        preempted: [0; 4],
        names,
    };
    sim.at(phase, Kind::Idle, 0);
    sim.at(2 * phase, Kind::Return, 0);
    sim.at(3 * phase, Kind::Stop, 0);
    sim.top_up()?;
    sim.collect();
    let wsum: u32 = weights.iter().sum();
    let fair_last = f64::from(weights[last]) / f64::from(wsum);
    let (mut busy, mut idle, mut back) = (Mean::default(), Mean::default(), Mean::default());
    let mut out = Outcome::default();
    while let Some(Reverse((when, _, kind, idx))) = sim.events.pop() {
        let (abs, used) = sim.shares();
        let dt = (when - sim.now) as f64 / 1000.0;
        // Each window skips its first `max_run`: the shares settle.
        if sim.now >= max_run && sim.now < phase {
            busy.add(dt, &abs, used);
        } else if sim.now >= phase + max_run && sim.now < 2 * phase {
            idle.add(dt, &abs, used);
        } else if sim.now >= 2 * phase + max_run {
            back.add(dt, &abs, used);
        }
        if sim.now >= 2 * phase && out.back_s.is_none() && abs[last] >= 0.95 * fair_last {
            out.back_s = Some((sim.now - 2 * phase) as f64 / 1000.0);
        }
        sim.now = when;
        match kind {
            Kind::Stop => break,
            Kind::Idle => {
                sim.active[last] = false;
                for idx in std::mem::take(&mut sim.waiting[last]) {
                    sim.sandboxes[idx].life = Life::Done;
                    let id = sim.sandboxes[idx].id.clone();
                    sim.admission.release(&id);
                }
            }
            Kind::Return => sim.active[last] = true,
            Kind::Destroyed => {
                if sim.end(idx) {
                    let when = if sim.now < max_run {
                        0
                    } else {
                        1 + (sim.now / phase).min(2) as usize
                    };
                    sim.preempted[when] += 1;
                }
            }
            Kind::End => {
                let idle_phase = sim.now >= phase && sim.now < 2 * phase;
                let of_last = sim.sandboxes.get(idx).is_some_and(|s| s.tenant == last);
                let before: u64 = sim.usage()[..last].iter().map(|u| u.cpu_millis).sum();
                let freed = sim.usage()[last].cpu_millis;
                if !sim.end(idx) {
                    continue;
                }
                if idle_phase && of_last {
                    sim.collect();
                    let after: u64 = sim.usage()[..last].iter().map(|u| u.cpu_millis).sum();
                    out.freed_cpu += freed - sim.usage()[last].cpu_millis;
                    out.taken_cpu += after.saturating_sub(before);
                    out.releases += 1;
                    out.releases_taken += usize::from(after > before);
                }
            }
        }
        sim.collect();
        sim.top_up()?;
        sim.collect();
    }
    (out.busy_abs, out.busy_norm, out.busy_used) = busy.get();
    let (idle_abs, _, idle_used) = idle.get();
    (out.idle_abs, out.idle_used) = (idle_abs, idle_used);
    let (back_abs, back_norm, _) = back.get();
    (out.back_abs, out.back_norm) = (back_abs, back_norm);
    out.preempted = sim.preempted;
    Ok(out)
}

fn pcts(v: &[f64]) -> String {
    v.iter()
        .map(|x| format!("{:.1}%", 100.0 * x))
        .collect::<Vec<_>>()
        .join(" / ")
}

pub fn run(args: &TenantsArgs) -> Result<i32> {
    let weights = &args.weights;
    if weights.len() < 2 {
        anyhow::bail!("--weights: at least two tenants");
    }
    let wsum: u32 = weights.iter().sum();
    let target: Vec<f64> = weights
        .iter()
        .map(|&w| f64::from(w) / f64::from(wsum))
        .collect();
    println!(
        "tenants: weights {} over {} nodes of {} cores / {} GiB; sandboxes of 1-4 cores and 2-8 GiB running {}-{} s; \
         each tenant keeps {} creates waiting; phases of {} s; preempted sandboxes end {} ms after admission names them; seed {}",
        weights.iter().map(u32::to_string).collect::<Vec<_>>().join(":"),
        args.nodes,
        args.node_cores,
        args.node_memory_gib,
        args.min_runtime_s,
        args.max_runtime_s,
        args.backlog,
        args.phase_s,
        args.destroy_ms,
        args.seed,
    );
    println!("target shares: {}", pcts(&target));
    println!();
    println!("| preemption | all busy: shares of the cluster (of what is held) | max deviation from target | cluster cpu used | last idle: cores its ends freed / the others started in the same releases | releases that started one | others' shares, idle | cluster cpu used, idle | last back: to 95% of its share | shares once back (of what is held) | sandboxes preempted (first fill / busy / idle / back) |");
    println!("|---|---|---:|---:|---:|---:|---|---:|---:|---|---|");
    for preempt in [false, true] {
        let o = simulate(args, weights, preempt)?;
        let dev = o
            .busy_norm
            .iter()
            .zip(&target)
            .map(|(s, t)| (s - t).abs() / t)
            .fold(0.0, f64::max);
        let last = weights.len() - 1;
        println!(
            "| {} | {} ({}) | {:.2}% | {:.1}% | {:.0} / {:.0} | {} of {} | {} | {:.1}% | {} | {} ({}) | {} |",
            if preempt { "on" } else { "off" },
            pcts(&o.busy_abs),
            pcts(&o.busy_norm),
            100.0 * dev,
            100.0 * o.busy_used,
            o.freed_cpu as f64 / 1000.0,
            o.taken_cpu as f64 / 1000.0,
            o.releases_taken,
            o.releases,
            pcts(&o.idle_abs[..last]),
            100.0 * o.idle_used,
            o.back_s
                .map_or("never".to_string(), |s| format!("{s:.1} s")),
            pcts(&o.back_abs),
            pcts(&o.back_norm),
            o.preempted
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(" / "),
        );
    }
    Ok(0)
}

//! Resource profiles: what finished sandboxes of one task actually used, and
//! the request later sandboxes of that task get. Pure logic, shared by the
//! control plane and the `warren simulate` replay, so both learn the same way.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A CPU and memory request, and the GPU memory a task's runs suggest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
pub struct Request {
    pub cpu_millis: u64,
    pub memory: u64,
    /// Bytes of GPU memory: peak × margin of the runs that used a GPU, 0
    /// for a task that never did. A recommendation (for choosing a GPU or
    /// a MIG slice, or packing), not a limit: a whole GPU's memory is not
    /// divided between sandboxes. Left out of the JSON when 0, so a CPU
    /// task's profile reads as it always did.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub gpu_memory: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// One finished sandbox, as the sampler saw it.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize, ToSchema)]
pub struct Run {
    pub cpu_millis_peak: u64,
    pub memory_peak: u64,
    pub runtime_ms: u64,
    pub oom_killed: bool,
    /// Share of CFS periods in which the sandbox hit its quota.
    pub throttled_ratio: f64,
    pub requested: Request,
    /// Most GPU memory its processes held at once (NVML), 0 without GPUs.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub gpu_memory_peak: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Policy {
    /// Recommendation = peak × margin, per resource. CPU is compressible
    /// (too little means throttling, which grows the request again), memory
    /// is not (too little means an OOM kill).
    pub cpu_margin: f64,
    pub memory_margin: f64,
    /// Runs considered.
    pub window: usize,
    /// A run counts as CPU-starved above this throttled share.
    pub throttle_threshold: f64,
    /// Growth factor after an OOM kill or starvation.
    pub grow_by: f64,
    /// Requests never exceed this multiple of the original request.
    pub max_growth: f64,
    pub cpu_step_millis: u64,
    pub memory_step: u64,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            cpu_margin: 1.5,
            memory_margin: 1.5,
            window: 20,
            throttle_threshold: 0.2,
            grow_by: 1.5,
            max_growth: 2.0,
            cpu_step_millis: 50,
            memory_step: 16 << 20,
        }
    }
}

fn round_up(v: f64, step: u64) -> u64 {
    let step = step.max(1);
    ((v / step as f64).ceil() as u64).max(1) * step
}

/// `peak × margin` over the runs, rounded up to the policy's steps.
pub fn recommend(runs: &[Run], policy: &Policy) -> Option<Request> {
    if runs.is_empty() {
        return None;
    }
    let cpu = runs.iter().map(|r| r.cpu_millis_peak).max().unwrap_or(0) as f64;
    let mem = runs.iter().map(|r| r.memory_peak).max().unwrap_or(0) as f64;
    let gpu = runs.iter().map(|r| r.gpu_memory_peak).max().unwrap_or(0);
    Some(Request {
        cpu_millis: round_up(cpu * policy.cpu_margin, policy.cpu_step_millis),
        memory: round_up(mem * policy.memory_margin, policy.memory_step)
            .max(crate::spec::MIN_MEMORY),
        // Like memory, GPU memory is not compressible: the same margin.
        gpu_memory: if gpu == 0 {
            0
        } else {
            round_up(gpu as f64 * policy.memory_margin, policy.memory_step)
        },
    })
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Profile {
    pub name: String,
    /// The request the profile started from (or was imported with); growth
    /// is capped at `max_growth` times this.
    pub original: Request,
    /// What a create that names the profile without sizes gets now.
    pub current: Request,
    /// Set when growth hit the cap; the profile stops adjusting until reset.
    pub anomalous: bool,
    #[serde(default)]
    pub anomaly: String,
    #[serde(default)]
    pub runs: u64,
}

impl Profile {
    pub fn new(name: &str, original: Request) -> Profile {
        Profile {
            name: name.into(),
            original,
            current: original,
            anomalous: false,
            anomaly: String::new(),
            runs: 0,
        }
    }

    /// Learns from the newest run (`window` ends with it). Returns whether
    /// the profile became anomalous just now.
    pub fn learn(&mut self, window: &[Run], policy: &Policy) -> bool {
        self.runs += 1;
        if self.anomalous {
            return false;
        }
        let (Some(last), Some(rec)) = (window.last(), recommend(window, policy)) else {
            return false;
        };
        // Growth answers a run made at the current request; a run made at an
        // older, smaller request (runs finishing after a change) is stale:
        // it keeps the request where it is rather than growing it again.
        let fresh_mem = last.requested.memory >= self.current.memory;
        let fresh_cpu = last.requested.cpu_millis >= self.current.cpu_millis;
        let starved_mem = last.oom_killed;
        let starved_cpu = last.throttled_ratio > policy.throttle_threshold;
        let adjust = |current: u64, rec: u64, starved: bool, fresh: bool| -> u64 {
            match (starved, fresh) {
                (true, true) => rec.max((current as f64 * policy.grow_by).round() as u64),
                (true, false) => rec.max(current),
                // Otherwise the request follows the recommendation, down or up.
                (false, _) => rec,
            }
        };
        let mut next = Request {
            cpu_millis: adjust(
                self.current.cpu_millis,
                rec.cpu_millis,
                starved_cpu,
                fresh_cpu,
            ),
            memory: adjust(self.current.memory, rec.memory, starved_mem, fresh_mem),
            gpu_memory: rec.gpu_memory,
        };
        // No request names GPU memory: the first recommendation is the
        // baseline its growth is measured against.
        if self.original.gpu_memory == 0 {
            self.original.gpu_memory = next.gpu_memory;
        }
        let cap = |orig: u64| (orig as f64 * policy.max_growth).round() as u64;
        let mut why = Vec::new();
        if next.cpu_millis > cap(self.original.cpu_millis) {
            next.cpu_millis = cap(self.original.cpu_millis);
            why.push(format!(
                "cpu would exceed {}× the original request",
                policy.max_growth
            ));
        }
        if next.memory > cap(self.original.memory) {
            next.memory = cap(self.original.memory);
            why.push(format!(
                "memory would exceed {}× the original request",
                policy.max_growth
            ));
        }
        if next.gpu_memory > cap(self.original.gpu_memory) {
            next.gpu_memory = cap(self.original.gpu_memory);
            why.push(format!(
                "GPU memory would exceed {}× its first recommendation",
                policy.max_growth
            ));
        }
        self.current = next;
        if why.is_empty() {
            return false;
        }
        self.anomalous = true;
        self.anomaly = why.join("; ");
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn run(cpu: u64, mem_mib: u64, oom: bool, req: Request) -> Run {
        Run {
            cpu_millis_peak: cpu,
            memory_peak: mem_mib * MIB,
            runtime_ms: 1000,
            oom_killed: oom,
            throttled_ratio: 0.0,
            requested: req,
            gpu_memory_peak: 0,
        }
    }

    #[test]
    fn recommendation_is_peak_times_margin_rounded() {
        let req = Request {
            cpu_millis: 4000,
            memory: 8192 * MIB,
            gpu_memory: 0,
        };
        // The seed's example: peaks of 2 cores and 3.2 GB give 3 cores and 4.8 GB.
        let runs = [run(2000, 1800, false, req), run(1900, 3277, false, req)];
        let rec = recommend(&runs, &Policy::default()).expect("runs");
        assert_eq!(rec.cpu_millis, 3000);
        assert_eq!(rec.memory, 4928 * MIB);
    }

    #[test]
    fn shrinks_when_well_below_and_grows_after_oom_up_to_the_cap() {
        let p = Policy::default();
        let orig = Request {
            cpu_millis: 1000,
            memory: 512 * MIB,
            gpu_memory: 0,
        };
        let mut prof = Profile::new("t", orig);
        let mut window = vec![run(200, 100, false, orig)];
        prof.learn(&window, &p);
        assert_eq!(
            prof.current,
            Request {
                cpu_millis: 300,
                memory: 160 * MIB,
                gpu_memory: 0,
            }
        );
        // An OOM kill at the shrunk size grows memory by 1.5×.
        window.push(run(200, 160, true, prof.current));
        prof.learn(&window, &p);
        assert_eq!(prof.current.memory, 240 * MIB);
        assert!(!prof.anomalous);
        // Repeated OOMs hit the 2× cap and flag the profile.
        for _ in 0..6 {
            window.push(run(200, prof.current.memory / MIB, true, prof.current));
            prof.learn(&window, &p);
        }
        assert!(prof.anomalous, "{prof:?}");
        assert_eq!(prof.current.memory, 1024 * MIB);
        let before = prof.current;
        window.push(run(10, 10, false, before));
        prof.learn(&window, &p);
        assert_eq!(prof.current, before, "an anomalous profile stops adjusting");
    }

    #[test]
    fn gpu_memory_is_recommended_from_its_peak_and_its_growth_flagged() {
        let p = Policy::default();
        let orig = Request {
            cpu_millis: 1000,
            memory: 512 * MIB,
            gpu_memory: 0,
        };
        let gpu_run = |gib: u64| Run {
            gpu_memory_peak: gib << 30,
            ..run(500, 200, false, orig)
        };
        let mut prof = Profile::new("infer", orig);
        // CPU-only runs recommend no GPU memory.
        let mut window = vec![run(500, 200, false, orig)];
        prof.learn(&window, &p);
        assert_eq!(prof.current.gpu_memory, 0);
        // 10 GiB at peak: 15 GiB recommended, the baseline for growth.
        window.push(gpu_run(10));
        prof.learn(&window, &p);
        assert_eq!(prof.current.gpu_memory, 15 << 30);
        assert_eq!(prof.original.gpu_memory, 15 << 30);
        assert!(!prof.anomalous);
        // Runs that hold ever more: past 2× the baseline it is capped and
        // flagged, like memory.
        window.push(gpu_run(19));
        prof.learn(&window, &p);
        assert!(!prof.anomalous, "28.5 GiB is within 30");
        window.push(gpu_run(25));
        assert!(prof.learn(&window, &p));
        assert_eq!(prof.current.gpu_memory, 30 << 30);
        assert!(prof.anomaly.contains("GPU memory"), "{}", prof.anomaly);
        // Old profiles (JSON without the field) still read, and a CPU
        // task's request is written as before.
        let old: Request = serde_json::from_str(r#"{"cpu_millis":1,"memory":2}"#).unwrap();
        assert_eq!(old.gpu_memory, 0);
        assert_eq!(
            serde_json::to_string(&old).unwrap(),
            r#"{"cpu_millis":1,"memory":2}"#
        );
    }
}

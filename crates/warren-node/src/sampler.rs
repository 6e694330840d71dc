//! Usage sampling: every sandbox's cgroup is read once per interval; rates
//! and peaks accumulate in the sandbox's record (inspect shows them), the
//! log gets the summary at the end, and profiles learn from it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use warren_core::Usage;
use warren_runtime::cgroups::Sample;

/// Disk use is a directory walk, so it is read every this many samples
/// (of a sandbox without a disk limit to enforce: see `sample_periodic`).
const DISK_EVERY: u64 = 10;

/// How many periodic readings in a row an idle sandbox may repeat its last
/// one (see [`UsageTracker::repeat_if_idle`]) before its files are read
/// again: what the kernel changes without the sandbox running (memory it
/// reclaims) shows within this many rounds.
const REPEATS_AT_MOST: u32 = 9;

/// The shortest window a CPU rate is measured over. Over a few milliseconds
/// a rate means nothing: CFS lets a sandbox run on several CPUs at once
/// within one quota period, so two readings close together (the periodic
/// sample and destroy's last one) showed a one-core sandbox using three,
/// which profiles then learned from.
const MIN_RATE_WINDOW: Duration = Duration::from_millis(250);

#[derive(Debug)]
pub struct UsageTracker {
    started: Instant,
    /// The reading the next CPU rate is measured from.
    anchor: Option<(Instant, Sample)>,
    /// The newest reading, which `usage` reports.
    last: Option<(Instant, Sample)>,
    samples: u64,
    /// Readings repeated in a row by `repeat_if_idle`.
    repeated: u32,
    cpu_rate_sum: f64,
    cpu_peak_millis: u64,
    /// The newest CPU rate (what `docker stats` shows).
    cpu_last_millis: u64,
    /// Memory over time so far (byte-milliseconds).
    memory_byte_ms: u128,
    memory_peak: u64,
    disk_bytes: u64,
    /// The latest GPU reading (see crate::gpu) and the most memory seen.
    gpu: crate::gpu::SandboxGpu,
    gpu_memory_peak: u64,
}

impl UsageTracker {
    pub fn new() -> UsageTracker {
        UsageTracker {
            started: Instant::now(),
            anchor: None,
            last: None,
            samples: 0,
            repeated: 0,
            cpu_rate_sum: 0.0,
            cpu_peak_millis: 0,
            cpu_last_millis: 0,
            memory_byte_ms: 0,
            memory_peak: 0,
            disk_bytes: 0,
            gpu: Default::default(),
            gpu_memory_peak: 0,
        }
    }

    /// Adds a GPU reading of the sandbox (nothing of it on any GPU: the
    /// default, all zero).
    pub fn add_gpu(&mut self, g: crate::gpu::SandboxGpu) {
        self.gpu_memory_peak = self.gpu_memory_peak.max(g.memory);
        self.gpu = g;
    }

    /// Adds one reading, taken at `at` (read the clock before the cgroup:
    /// readers run concurrently, and one that finishes later may have read
    /// earlier). A reading older than the newest is dropped. The CPU rate
    /// is measured from the anchor once at least MIN_RATE_WINDOW has passed.
    pub fn add(&mut self, at: Instant, s: Sample, disk: Option<u64>) {
        if self.last.is_some_and(|(t, _)| at <= t) {
            return;
        }
        // The last reading's memory held until this one.
        if let Some((t, prev)) = self.last {
            self.memory_byte_ms += prev.memory_bytes as u128 * at.duration_since(t).as_millis();
        }
        match self.anchor {
            Some((t, prev)) if at.duration_since(t) >= MIN_RATE_WINDOW => {
                let dt = at.duration_since(t).as_secs_f64();
                let used = s.cpu_usage_ns.saturating_sub(prev.cpu_usage_ns) as f64;
                let millis = used / 1e6 / dt;
                self.cpu_rate_sum += millis;
                self.cpu_peak_millis = self.cpu_peak_millis.max(millis.round() as u64);
                self.cpu_last_millis = millis.round() as u64;
                self.samples += 1;
                self.anchor = Some((at, s));
            }
            Some(_) => {}
            None => self.anchor = Some((at, s)),
        }
        self.memory_peak = self
            .memory_peak
            .max(s.memory_peak_bytes)
            .max(s.memory_bytes);
        if let Some(d) = disk {
            self.disk_bytes = d;
        }
        self.last = Some((at, s));
        self.repeated = 0;
    }

    /// Takes the newest reading again, as of `at`, when the sandbox's CPU
    /// counter still reads `cpu_usage_ns`: a sandbox that has not run has
    /// not forked, allocated or been OOM-killed either, so the other five
    /// files need not be read (thousands of idle sandboxes made the
    /// sampler a tenth of a core). False when it ran, or when it repeated
    /// REPEATS_AT_MOST times in a row: then the caller reads everything.
    pub fn repeat_if_idle(&mut self, at: Instant, cpu_usage_ns: u64) -> bool {
        let Some((_, last)) = self.last else {
            return false;
        };
        if last.cpu_usage_ns != cpu_usage_ns || self.repeated >= REPEATS_AT_MOST {
            return false;
        }
        let repeated = self.repeated + 1;
        self.add(at, last, None);
        self.repeated = repeated;
        true
    }

    pub fn wants_disk(&self) -> bool {
        self.samples.is_multiple_of(DISK_EVERY)
    }

    /// Whether the last `repeat_if_idle` was the first in a row: the
    /// sandbox has just stopped running.
    pub fn first_idle_repeat(&self) -> bool {
        self.repeated == 1
    }

    /// A measurement of the writable layer taken apart from a reading.
    pub fn set_disk(&mut self, bytes: u64) {
        self.disk_bytes = bytes;
    }

    /// The writable layer's size at its last measurement.
    pub fn disk_bytes(&self) -> u64 {
        self.disk_bytes
    }

    pub fn usage(&self) -> Usage {
        let s = self.last.map(|(_, s)| s).unwrap_or_default();
        Usage {
            cpu_usage_ns: s.cpu_usage_ns,
            memory_bytes: s.memory_bytes,
            memory_peak_bytes: self.memory_peak.max(s.memory_peak_bytes),
            pids: s.pids,
            oom_kills: s.oom_kills,
            cpu_millis_mean: if self.samples > 0 {
                (self.cpu_rate_sum / self.samples as f64).round() as u64
            } else {
                0
            },
            cpu_millis_peak: self.cpu_peak_millis,
            cpu_millis_last: self.cpu_last_millis,
            cpu_periods: s.cpu_periods,
            cpu_throttled_periods: s.cpu_throttled_periods,
            disk_bytes: self.disk_bytes,
            samples: self.samples,
            runtime_ms: self.started.elapsed().as_millis() as u64,
            memory_byte_seconds: (self.memory_byte_ms / 1000).min(u64::MAX as u128) as u64,
            gpu_memory_bytes: self.gpu.memory,
            gpu_memory_peak_bytes: self.gpu_memory_peak,
            gpu_utilization_percent: self.gpu.utilization_percent,
        }
    }
}

impl Default for UsageTracker {
    fn default() -> Self {
        Self::new()
    }
}

/// Bytes used by the sandbox's writable layer: the allocated blocks of its
/// own disk image when it has one, else a walk of its upper directory.
pub fn disk_bytes(sandbox_dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let img = sandbox_dir.join("disk.img");
    if let Ok(m) = std::fs::metadata(&img) {
        return m.blocks() * 512;
    }
    let mut total = 0;
    let mut stack: Vec<PathBuf> = vec![sandbox_dir.join("upper")];
    while let Some(dir) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.filter_map(|e| e.ok()) {
            // lstat: a symlink is counted, never followed.
            let Ok(m) = e.metadata() else { continue };
            if m.is_dir() {
                stack.push(e.path());
            }
            total += m.blocks() * 512;
        }
    }
    total
}

pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_sandbox_repeats_its_reading_for_a_while_then_is_read_again() {
        let mut t = UsageTracker::new();
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        assert!(!t.repeat_if_idle(at(0), 0), "nothing to repeat yet");
        let reading = Sample {
            cpu_usage_ns: 5_000_000,
            memory_bytes: 4 << 20,
            pids: 1,
            ..Default::default()
        };
        t.add(at(0), reading, None);
        assert!(!t.repeat_if_idle(at(1000), 6_000_000), "it ran: read it");
        for round in 1..=REPEATS_AT_MOST as u64 {
            assert!(
                t.repeat_if_idle(at(1000 * round), 5_000_000),
                "round {round}"
            );
        }
        assert!(
            !t.repeat_if_idle(at(100_000), 5_000_000),
            "read in full after {REPEATS_AT_MOST} repeats"
        );
        let u = t.usage();
        assert_eq!((u.memory_bytes, u.pids), (4 << 20, 1));
        // Idle over the repeated rounds: the rate measured is zero.
        assert_eq!(u.cpu_millis_mean, 0);
        t.add(at(101_000), reading, None);
        assert!(
            t.repeat_if_idle(at(102_000), 5_000_000),
            "a full reading starts over"
        );
    }

    #[test]
    fn gpu_readings_show_the_latest_and_keep_the_peak() {
        let mut t = UsageTracker::new();
        assert_eq!(t.usage().gpu_memory_bytes, 0);
        let reading = |mib: u64, util: u32| crate::gpu::SandboxGpu {
            memory: mib << 20,
            utilization_percent: util,
            gpus: vec![0],
        };
        t.add_gpu(reading(900, 80));
        t.add_gpu(reading(300, 15));
        let u = t.usage();
        assert_eq!(u.gpu_memory_bytes, 300 << 20);
        assert_eq!(u.gpu_memory_peak_bytes, 900 << 20);
        assert_eq!(u.gpu_utilization_percent, 15);
        // Its processes left the GPU: a reading without it is all zero.
        t.add_gpu(Default::default());
        let u = t.usage();
        assert_eq!(
            (u.gpu_memory_bytes, u.gpu_memory_peak_bytes),
            (0, 900 << 20)
        );
    }

    #[test]
    fn rates_and_peaks() {
        let mut t = UsageTracker::new();
        let t0 = Instant::now();
        let s = |cpu_ms: u64, mem: u64| Sample {
            cpu_usage_ns: cpu_ms * 1_000_000,
            memory_bytes: mem,
            ..Default::default()
        };
        t.add(t0, s(0, 10), None);
        t.add(t0 + Duration::from_secs(1), s(1000, 30), None);
        t.add(t0 + Duration::from_secs(2), s(1500, 20), None);
        let u = t.usage();
        assert_eq!(u.cpu_millis_peak, 1000);
        assert_eq!(u.cpu_millis_mean, 750);
        assert_eq!(u.memory_peak_bytes, 30);
        assert_eq!(u.samples, 2);
    }

    #[test]
    fn close_and_out_of_order_readings_make_no_rate() {
        let mut t = UsageTracker::new();
        let t0 = Instant::now();
        let s = |cpu_ms: u64| Sample {
            cpu_usage_ns: cpu_ms * 1_000_000,
            ..Default::default()
        };
        t.add(t0, s(0), None);
        t.add(t0 + Duration::from_secs(1), s(1000), None);
        // 20 ms of CPU in the next 10 ms (two CPUs at once within one quota
        // period) is no 2-core peak.
        t.add(t0 + Duration::from_millis(1010), s(1020), None);
        assert_eq!(t.usage().cpu_millis_peak, 1000);
        assert_eq!(t.usage().cpu_usage_ns, 1_020_000_000);
        // A reading that was taken before the newest one is ignored.
        t.add(t0 + Duration::from_millis(1005), s(1010), None);
        assert_eq!(t.usage().cpu_usage_ns, 1_020_000_000);
        // The next rate is measured from the last anchor, over 1 s.
        t.add(t0 + Duration::from_secs(2), s(1500), None);
        assert_eq!(t.usage().cpu_millis_peak, 1000);
        assert_eq!(t.usage().samples, 2);
        assert_eq!(t.usage().cpu_millis_mean, 750);
    }
}

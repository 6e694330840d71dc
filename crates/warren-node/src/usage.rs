//! What sandboxes use: cgroup samples, the disk guard (per sandbox, and
//! the largest writer when the node's disk floor is crossed), and the
//! sandbox stopped when host memory is below its floor.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::feed::Feed;
use crate::gpu::GpuReader;
use crate::pressure::Pressure;
use crate::ship_journal::ShipJournal;
use crate::{sampler, Live, Node};
use warren_core::sync::lock;
use warren_core::Usage;
use warren_node_api::NodeEvent;
use warren_runtime::Runtime;

/// Cgroup readings per second the sampler allows itself: each is a few
/// file reads, so sampling every sandbox each second would cost a node
/// with thousands of them a good part of a core.
pub const MAX_SAMPLES_PER_SECOND: f64 = 1000.0;

/// How long one round over `live` sandboxes takes at most: `interval`, or
/// longer where the budget of readings per second says so.
pub(crate) fn round_interval(interval: std::time::Duration, live: usize) -> std::time::Duration {
    interval.max(std::time::Duration::from_secs_f64(
        live as f64 / MAX_SAMPLES_PER_SECOND,
    ))
}

/// Samples every live sandbox's cgroup once per `interval` (less often
/// beyond `MAX_SAMPLES_PER_SECOND`; the disk and memory guards run each
/// round).
pub(crate) async fn sample_usage(node: std::sync::Weak<Node>, interval: std::time::Duration) {
    let mut wait = interval;
    let mut shipped = Shipped::default();
    loop {
        tokio::time::sleep(wait).await;
        let Some(n) = node.upgrade() else { return };
        let live: Vec<(String, Arc<Live>)> = lock(&n.live)
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        wait = round_interval(interval, live.len());
        let round = tokio::task::spawn_blocking(move || {
            let journal = n.logs.journal().map(|j| j.as_ref());
            n.meter.round(&n.runtime, journal, &live, &mut shipped);
            shipped
        })
        .await;
        match round {
            Ok(s) => shipped = s,
            Err(_) => shipped = Shipped::default(),
        }
    }
}

/// How often each sandbox's usage goes to the shipping journal (its first
/// sample at once): the control plane's history of a sandbox whose node is
/// gone.
pub const SHIP_USAGE_EVERY: std::time::Duration = std::time::Duration::from_secs(15);

/// When each live sandbox's usage was last shipped.
#[derive(Default)]
pub(crate) struct Shipped(std::collections::HashMap<String, std::time::Instant>);

/// Writes the usage of each sandbox not shipped for [`SHIP_USAGE_EVERY`]
/// to the shipping journal.
fn ship_usage(journal: &ShipJournal, live: &[(String, Arc<Live>)], shipped: &mut Shipped) {
    shipped.0.retain(|id, _| live.iter().any(|(l, _)| l == id));
    let now = std::time::Instant::now();
    for (id, l) in live {
        let due = shipped
            .0
            .get(id)
            .is_none_or(|at| now.duration_since(*at) >= SHIP_USAGE_EVERY);
        if !due || l.destroying.load(Ordering::Acquire) {
            continue;
        }
        let usage = lock(&l.usage).usage();
        let time = crate::ship_journal::now_ms();
        journal.append(warren_node_api::ShippedKind::Usage, id, time, |_| {
            serde_json::to_vec(&usage).ok()
        });
        shipped.0.insert(id.clone(), now);
    }
}

/// The node's meter: cgroup samples of each sandbox, the disk and memory
/// guards, and the usage it ships. Its own state is the host's pressure
/// and the GPU reader; the live sandboxes are handed to it each round.
pub(crate) struct Meter {
    /// The host's CPU, disk and memory against their floors (read by
    /// creates, forks and reports too).
    pub(crate) pressure: Pressure,
    /// NVML, where it loads: GPU use per sandbox.
    gpu_reader: Option<Box<dyn GpuReader>>,
    feed: Arc<Feed>,
}

impl Meter {
    pub(crate) fn new(
        pressure: Pressure,
        gpu_reader: Option<Box<dyn GpuReader>>,
        feed: Arc<Feed>,
    ) -> Meter {
        Meter {
            pressure,
            gpu_reader,
            feed,
        }
    }

    /// One round over the live sandboxes: each one's sample, the GPUs, the
    /// disk and memory floors, and the usage due to be shipped.
    fn round(
        &self,
        rt: &Runtime,
        journal: Option<&ShipJournal>,
        live: &[(String, Arc<Live>)],
        shipped: &mut Shipped,
    ) {
        self.pressure.sample_cpu();
        for (id, l) in live {
            if !l.destroying.load(Ordering::Acquire) {
                self.sample_periodic(rt, id, l);
            }
        }
        self.sample_gpus(live);
        self.check_disk_floor(rt, live);
        self.check_memory_floor(live);
        if let Some(journal) = journal {
            ship_usage(journal, live, shipped);
        }
    }

    /// One NVML reading per round, split by sandbox, for the sandboxes
    /// holding devices (only they can have processes on a GPU). Nothing is
    /// read on a node without NVML or without such sandboxes.
    fn sample_gpus(&self, live: &[(String, Arc<Live>)]) {
        let Some(reader) = self.gpu_reader.as_deref() else {
            return;
        };
        let holders: Vec<&(String, Arc<Live>)> = live
            .iter()
            .filter(|(_, l)| !lock(&l.create).devices.is_empty())
            .collect();
        if holders.is_empty() {
            return;
        }
        let readings = match reader.read() {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(error = %e, "NVML reading failed");
                return;
            }
        };
        let mut by = crate::gpu::attribute(&readings, crate::gpu::sandbox_of_pid);
        for (id, l) in holders {
            lock(&l.usage).add_gpu(by.remove(id).unwrap_or_default());
        }
    }

    /// The sampler's reading of one sandbox: an idle one's last reading is
    /// repeated from its CPU counter alone (see `repeat_if_idle`).
    ///
    /// A sandbox under a measured disk limit (`--default-disk`: no file
    /// system of its own) has its writable layer measured at every reading
    /// in which it ran, and once more at the first one in which it did not:
    /// a sandbox that wrote fast and then went idle was never measured
    /// again (issue 38), and one that does not run writes nothing.
    fn sample_periodic(&self, rt: &Runtime, id: &str, live: &Live) {
        let at = std::time::Instant::now();
        if let Some(cpu) = warren_runtime::cgroups::cpu_usage_ns(&live.cgroup_path) {
            let mut u = lock(&live.usage);
            if u.repeat_if_idle(at, cpu) {
                let settle = live.disk_limit > 0 && u.first_idle_repeat();
                drop(u);
                if settle {
                    self.measure_disk(rt, id, live);
                }
                return;
            }
        }
        self.sample_one(rt, id, live, true);
    }

    /// Measures the writable layer now and stops the sandbox past its
    /// measured limit.
    pub(crate) fn measure_disk(&self, rt: &Runtime, id: &str, live: &Live) {
        let used = sampler::disk_bytes(&rt.sandbox_dir(id));
        lock(&live.usage).set_disk(used);
        if used > live.disk_limit {
            self.report_disk(id, live, used, live.disk_limit, false);
        }
    }

    pub(crate) fn sample_one(&self, rt: &Runtime, id: &str, live: &Live, with_disk: bool) {
        let at = std::time::Instant::now();
        let Ok(sample) = warren_runtime::cgroups::sample(&live.cgroup_path) else {
            return;
        };
        let mut u = lock(&live.usage);
        let disk = (with_disk && (live.disk_limit > 0 || u.wants_disk()))
            .then(|| sampler::disk_bytes(&rt.sandbox_dir(id)));
        u.add(at, sample, disk);
        drop(u);
        if let Some(used) = disk {
            if live.disk_limit > 0 && used > live.disk_limit {
                self.report_disk(id, live, used, live.disk_limit, false);
            }
        }
    }

    fn report_disk(&self, id: &str, live: &Live, used: u64, limit: u64, node_full: bool) {
        if live.disk_reported.swap(true, Ordering::AcqRel) {
            return;
        }
        self.feed.push(NodeEvent::DiskExceeded {
            id: id.to_string(),
            used,
            limit,
            node_full,
        });
    }

    /// Checks free space under the home; below the floor, measures every
    /// sandbox's writable layer and reports the largest (one per check: its
    /// removal may be enough).
    fn check_disk_floor(&self, rt: &Runtime, live: &[(String, Arc<Live>)]) {
        let Some(pressure) = self.pressure.check_disk() else {
            return;
        };
        if !pressure {
            return;
        }
        // One at a time: the one stopped last may free enough once its
        // removal is done: its destroy, then its files' deletion (behind
        // the destroy, by the runtime's trash).
        let ids: Vec<&str> = live.iter().map(|(id, _)| id.as_str()).collect();
        if self.pressure.disk_victim_leaving(&ids) || rt.freeing_disk() {
            return;
        }
        let largest = live
            .iter()
            .filter(|(_, l)| {
                !l.destroying.load(Ordering::Acquire) && !l.disk_reported.load(Ordering::Acquire)
            })
            .map(|(id, l)| (sampler::disk_bytes(&rt.sandbox_dir(id)), id, l))
            .max_by_key(|(used, _, _)| *used);
        if let Some((used, id, l)) = largest {
            self.pressure.disk_victim(id);
            self.report_disk(id, l, used, l.disk_limit, true);
        }
    }

    /// Requests are what admission counts, so the limits of the sandboxes
    /// on a node may add up to more than its memory. When their real use
    /// drains the host's available memory below the floor, the sandbox
    /// using the most above its own request is stopped (one per check);
    /// a sandbox within its request is never chosen, so a request is a
    /// guarantee and the limit a ceiling.
    fn check_memory_floor(&self, live: &[(String, Arc<Live>)]) {
        let Some((pressure, available)) = self.pressure.check_memory() else {
            return;
        };
        if !pressure {
            return;
        }
        let furthest = live
            .iter()
            .filter(|(_, l)| {
                !l.destroying.load(Ordering::Acquire) && !l.memory_reported.load(Ordering::Acquire)
            })
            .filter_map(|(id, l)| {
                let used = lock(&l.usage).usage().memory_bytes;
                let over = used.checked_sub(l.memory_request).filter(|o| *o > 0)?;
                Some((over, used, id, l))
            })
            .max_by_key(|(over, ..)| *over);
        if let Some((_, used, id, l)) = furthest {
            if !l.memory_reported.swap(true, Ordering::AcqRel) {
                self.feed.push(NodeEvent::MemoryPressure {
                    id: id.clone(),
                    used,
                    request: l.memory_request,
                    available,
                });
            }
        }
    }
}

impl Node {
    /// Usage as sampled, refreshed with a reading taken now.
    pub fn usage(&self, id: &str) -> Option<Usage> {
        let live = self.get(id).ok()?;
        self.meter.sample_one(&self.runtime, id, &live, false);
        let usage = lock(&live.usage).usage();
        Some(usage)
    }

    /// After a write into the sandbox from outside (an upload), which its
    /// own CPU counter does not show: measures its writable layer if it
    /// has a measured limit.
    pub(crate) fn written_into(&self, id: &str) {
        if let Ok(live) = self.get(id) {
            if live.disk_limit > 0 {
                self.meter.measure_disk(&self.runtime, id, &live);
            }
        }
    }

    pub fn oom_kills(&self, id: &str) -> u64 {
        self.get(id)
            .map(|l| warren_runtime::cgroups::oom_kills(&l.cgroup_path))
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn sampling_slows_down_past_its_budget() {
        let second = Duration::from_secs(1);
        assert_eq!(round_interval(second, 0), second);
        assert_eq!(round_interval(second, 1000), second);
        assert_eq!(round_interval(second, 5000), Duration::from_secs(5));
    }
}

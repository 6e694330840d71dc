//! How hard the host is pressed: the CPU's busy share (reported once when
//! it stays saturated), free disk under the node's home and available
//! memory against their floors. Creates are refused while either floor is
//! crossed; choosing which sandbox to stop is the sampler's business.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use warren_core::sync::lock;
use warren_node_api::NodeEvent;

use crate::feed::Feed;

pub const SATURATION: f64 = 0.85;
pub const SATURATION_AFTER: std::time::Duration = std::time::Duration::from_secs(30);

/// The node's CPU busy share between samples, from /proc/stat.
#[derive(Debug, Default)]
struct CpuBusy {
    last: Option<(u64, u64)>,
    busy: f64,
    high_since: Option<std::time::Instant>,
    reported: bool,
}

fn proc_stat_cpu() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let fields: Vec<u64> = text
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    let total: u64 = fields.iter().sum();
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    Some((total, idle))
}

pub(crate) struct Pressure {
    cpu: Mutex<CpuBusy>,
    /// Where the disk floor is measured (the node's home).
    home: PathBuf,
    disk_floor: Option<u64>,
    /// Free space under the home is below the floor: no new sandboxes.
    disk: AtomicBool,
    /// Host memory the node keeps available (see NodeSettings).
    memory_floor: u64,
    memory: AtomicBool,
    /// CPU saturation is reported on the node's feed.
    feed: Arc<Feed>,
    /// The sandbox stopped last for the disk floor, and when: no other is
    /// stopped while it is still being removed (its space may be enough).
    disk_victim: Mutex<Option<(String, std::time::Instant)>>,
}

/// How long a sandbox stopped for the disk floor may take to be removed
/// before another is chosen (a control plane that does not act on the
/// report must not stall the node for ever).
const VICTIM_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

impl Pressure {
    /// Whether the sandbox stopped last for the disk floor is still being
    /// removed (among `live`), and not for longer than [`VICTIM_PATIENCE`].
    pub(crate) fn disk_victim_leaving(&self, live: &[&str]) -> bool {
        let victim = lock(&self.disk_victim);
        victim
            .as_ref()
            .is_some_and(|(id, at)| at.elapsed() < VICTIM_PATIENCE && live.contains(&id.as_str()))
    }

    /// Records the sandbox now stopped for the disk floor.
    pub(crate) fn disk_victim(&self, id: &str) {
        *lock(&self.disk_victim) = Some((id.to_string(), std::time::Instant::now()));
    }

    pub(crate) fn new(
        home: PathBuf,
        disk_floor: Option<u64>,
        memory_floor: u64,
        feed: Arc<Feed>,
    ) -> Pressure {
        Pressure {
            cpu: Mutex::new(CpuBusy::default()),
            home,
            disk_floor,
            disk: AtomicBool::new(false),
            memory_floor,
            memory: AtomicBool::new(false),
            feed,
            disk_victim: Mutex::new(None),
        }
    }

    /// Whether free space under the home is below the floor (creates are
    /// refused meanwhile).
    pub(crate) fn disk(&self) -> bool {
        self.disk.load(Ordering::Acquire)
    }

    /// Checks free space under the home and records whether it is below
    /// the floor; None if it cannot be read (the last verdict stands).
    pub(crate) fn check_disk(&self) -> Option<bool> {
        let (free, floor) = crate::settings::disk_headroom(&self.home, self.disk_floor)?;
        let pressure = free < floor;
        if self.disk.swap(pressure, Ordering::AcqRel) != pressure {
            if pressure {
                tracing::warn!(free, floor, "disk under the home is below its floor: creates refused, the largest writer is stopped");
            } else {
                tracing::info!(free, floor, "disk under the home is above its floor again");
            }
        }
        Some(pressure)
    }

    /// Bytes free under the home above the disk floor (as the disk guard
    /// computes it); unbounded where it cannot be read.
    pub(crate) fn disk_headroom(&self) -> u64 {
        crate::settings::disk_headroom(&self.home, self.disk_floor)
            .map_or(u64::MAX, |(free, floor)| free.saturating_sub(floor))
    }

    /// Whether the host's available memory is below the node's floor
    /// (creates are refused meanwhile). While the last sample said so,
    /// memory is read again: a create that comes right after the stopped
    /// sandbox freed its memory must not be refused on the old sample.
    pub(crate) fn memory(&self) -> bool {
        self.memory.load(Ordering::Acquire)
            && self.check_memory().is_none_or(|(pressure, _)| pressure)
    }

    /// Reads the host's available memory and records whether it is below
    /// the floor; None if it cannot be read (the last verdict stands).
    pub(crate) fn check_memory(&self) -> Option<(bool, u64)> {
        let available = crate::settings::available_memory()?;
        let pressure = available < self.memory_floor;
        if self.memory.swap(pressure, Ordering::AcqRel) != pressure {
            if pressure {
                tracing::warn!(available, floor = self.memory_floor, "host memory is below the node's floor: creates refused, the sandbox furthest above its request is stopped");
            } else {
                tracing::info!(
                    available,
                    floor = self.memory_floor,
                    "host memory is above the node's floor again"
                );
            }
        }
        Some((pressure, available))
    }

    /// Share of the node's CPU time spent busy over the last sample interval.
    pub(crate) fn cpu_busy(&self) -> f64 {
        lock(&self.cpu).busy
    }

    pub(crate) fn sample_cpu(&self) {
        let Some((total, idle)) = proc_stat_cpu() else {
            return;
        };
        let mut c = lock(&self.cpu);
        if let Some((t0, i0)) = c.last {
            let dt = total.saturating_sub(t0);
            if dt > 0 {
                c.busy = 1.0 - idle.saturating_sub(i0) as f64 / dt as f64;
            }
        }
        c.last = Some((total, idle));
        if c.busy > SATURATION {
            let since = *c.high_since.get_or_insert_with(std::time::Instant::now);
            if since.elapsed() >= SATURATION_AFTER && !c.reported {
                c.reported = true;
                self.feed.push(NodeEvent::CpuSaturated { busy: c.busy });
            }
        } else {
            c.high_since = None;
            c.reported = false;
        }
    }
}

//! Cgroup access outside libcontainer's lifecycle: usage sampling, freezing,
//! and the last-resort kill-and-remove used when a crash left a cgroup behind
//! without libcontainer state. libcgroups handles v1, hybrid and v2 alike.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use libcgroups::common::{
    create_cgroup_manager, AnyCgroupManager, CgroupConfig, CgroupManager, FreezerState,
};
use nix::sys::signal::{kill, Signal};
use warren_core::Usage;

use crate::RuntimeError;

fn manager(cgroup_path: &str) -> Result<AnyCgroupManager, RuntimeError> {
    let name = cgroup_path
        .rsplit('/')
        .next()
        .unwrap_or(cgroup_path)
        .to_string();
    create_cgroup_manager(CgroupConfig {
        cgroup_path: PathBuf::from(cgroup_path),
        systemd_cgroup: false,
        container_name: name,
    })
    .map_err(|e| RuntimeError::Destroy(format!("cgroup {cgroup_path}: {e}")))
}

/// Whether any hierarchy still has a cgroup directory at `cgroup_path`.
pub fn exists(cgroup_path: &str) -> bool {
    let rel = cgroup_path.trim_start_matches('/');
    let root = std::path::Path::new("/sys/fs/cgroup");
    if root.join(rel).exists() {
        return true;
    }
    std::fs::read_dir(root)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .any(|e| e.path().join(rel).exists())
        })
        .unwrap_or(false)
}

pub fn kill_and_remove(cgroup_path: &str) -> Result<(), RuntimeError> {
    if !exists(cgroup_path) {
        return Ok(());
    }
    unthrottle(cgroup_path);
    let m = manager(cgroup_path)?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let pids = m.get_all_pids().unwrap_or_default();
        if pids.is_empty() {
            break;
        }
        for p in pids {
            let _ = kill(p, Signal::SIGKILL);
        }
        if Instant::now() > deadline {
            return Err(RuntimeError::Destroy(format!(
                "processes in cgroup {cgroup_path} did not die within 10s"
            )));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    // A cgroup whose last processes are still exiting refuses rmdir for a
    // moment (libcgroups gives up after about a third of a second).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match m.remove() {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() > deadline => {
                return Err(RuntimeError::Destroy(format!(
                    "remove cgroup {cgroup_path}: {e}"
                )))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Lifts the sandbox's CPU quota, when it is about to be destroyed: dying
/// processes still need CPU time to exit, and a sandbox throttled at a
/// fraction of a core (and busy reclaiming at its memory limit) takes
/// seconds to empty its cgroup otherwise.
pub fn unthrottle(cgroup_path: &str) {
    let rel = cgroup_path.trim_start_matches('/');
    let v2 = format!("/sys/fs/cgroup/{rel}/cpu.max");
    if std::path::Path::new(&v2).exists() {
        let _ = std::fs::write(v2, "max");
    } else {
        let _ = std::fs::write(format!("/sys/fs/cgroup/cpu/{rel}/cpu.cfs_quota_us"), "-1");
    }
}

/// One cheap reading of a sandbox's cgroup: a handful of small files,
/// not libcgroups' full stats, so a node can sample every sandbox each second.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sample {
    pub cpu_usage_ns: u64,
    pub cpu_periods: u64,
    pub cpu_throttled_periods: u64,
    pub memory_bytes: u64,
    pub memory_peak_bytes: u64,
    pub pids: u64,
    pub oom_kills: u64,
}

fn read_u64(path: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// `key value` lines (cpu.stat, memory.events, memory.oom_control).
fn read_keyed(path: &str, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
}

pub fn sample(cgroup_path: &str) -> Result<Sample, RuntimeError> {
    let rel = cgroup_path.trim_start_matches('/');
    let v2 = format!("/sys/fs/cgroup/{rel}");
    if std::path::Path::new(&format!("{v2}/cgroup.controllers")).exists() {
        return Ok(Sample {
            cpu_usage_ns: read_keyed(&format!("{v2}/cpu.stat"), "usage_usec").unwrap_or(0) * 1000,
            cpu_periods: read_keyed(&format!("{v2}/cpu.stat"), "nr_periods").unwrap_or(0),
            cpu_throttled_periods: read_keyed(&format!("{v2}/cpu.stat"), "nr_throttled")
                .unwrap_or(0),
            memory_bytes: read_u64(&format!("{v2}/memory.current")).unwrap_or(0),
            memory_peak_bytes: read_u64(&format!("{v2}/memory.peak")).unwrap_or(0),
            pids: read_u64(&format!("{v2}/pids.current")).unwrap_or(0),
            oom_kills: read_keyed(&format!("{v2}/memory.events"), "oom_kill").unwrap_or(0),
        });
    }
    let v1 = |ctrl: &str, file: &str| format!("/sys/fs/cgroup/{ctrl}/{rel}/{file}");
    let cpu_ns = read_u64(&v1("cpuacct", "cpuacct.usage"))
        .ok_or_else(|| RuntimeError::NotFound(format!("no cgroup {cgroup_path}")))?;
    Ok(Sample {
        cpu_usage_ns: cpu_ns,
        cpu_periods: read_keyed(&v1("cpu", "cpu.stat"), "nr_periods").unwrap_or(0),
        cpu_throttled_periods: read_keyed(&v1("cpu", "cpu.stat"), "nr_throttled").unwrap_or(0),
        memory_bytes: read_u64(&v1("memory", "memory.usage_in_bytes")).unwrap_or(0),
        memory_peak_bytes: read_u64(&v1("memory", "memory.max_usage_in_bytes")).unwrap_or(0),
        pids: read_u64(&v1("pids", "pids.current")).unwrap_or(0),
        oom_kills: read_keyed(&v1("memory", "memory.oom_control"), "oom_kill").unwrap_or(0),
    })
}

pub fn usage(cgroup_path: &str) -> Result<Usage, RuntimeError> {
    let s = sample(cgroup_path)?;
    Ok(Usage {
        cpu_usage_ns: s.cpu_usage_ns,
        memory_bytes: s.memory_bytes,
        memory_peak_bytes: s.memory_peak_bytes,
        pids: s.pids,
        oom_kills: s.oom_kills,
        ..Default::default()
    })
}

/// OOM kills recorded for the cgroup.
pub fn oom_kills(cgroup_path: &str) -> u64 {
    sample(cgroup_path).map(|s| s.oom_kills).unwrap_or(0)
}

/// Whether the sandbox's cgroup is frozen (or freezing).
pub fn is_frozen(cgroup_path: &str) -> bool {
    let rel = cgroup_path.trim_start_matches('/');
    let v2 = format!("/sys/fs/cgroup/{rel}/cgroup.freeze");
    if let Ok(text) = std::fs::read_to_string(&v2) {
        return text.trim() == "1";
    }
    std::fs::read_to_string(format!("/sys/fs/cgroup/freezer/{rel}/freezer.state"))
        .is_ok_and(|s| s.trim() != "THAWED")
}

pub fn freeze(cgroup_path: &str, frozen: bool) -> Result<(), RuntimeError> {
    let state = if frozen {
        FreezerState::Frozen
    } else {
        FreezerState::Thawed
    };
    manager(cgroup_path)?
        .freeze(state)
        .map_err(|e| RuntimeError::Files(format!("freeze {cgroup_path}: {e}")))
}

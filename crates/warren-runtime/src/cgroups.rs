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
    m.remove()
        .map_err(|e| RuntimeError::Destroy(format!("remove cgroup {cgroup_path}: {e}")))
}

pub fn usage(cgroup_path: &str) -> Result<Usage, RuntimeError> {
    let s = manager(cgroup_path)?
        .stats()
        .map_err(|e| RuntimeError::Files(format!("cgroup stats {cgroup_path}: {e}")))?;
    Ok(Usage {
        cpu_usage_ns: s.cpu.usage.usage_total,
        memory_bytes: s.memory.memory.usage,
        memory_peak_bytes: s.memory.memory.max_usage,
        pids: s.pids.current,
        oom_kills: oom_kills(cgroup_path),
    })
}

/// OOM kills recorded for the cgroup: `oom_kill` in v1 `memory.oom_control`
/// or in v2 `memory.events`.
pub fn oom_kills(cgroup_path: &str) -> u64 {
    let rel = cgroup_path.trim_start_matches('/');
    let candidates = [
        format!("/sys/fs/cgroup/memory/{rel}/memory.oom_control"),
        format!("/sys/fs/cgroup/{rel}/memory.events"),
    ];
    for c in candidates {
        if let Ok(text) = std::fs::read_to_string(&c) {
            return text
                .lines()
                .find_map(|l| {
                    l.strip_prefix("oom_kill ")
                        .and_then(|v| v.trim().parse().ok())
                })
                .unwrap_or(0);
        }
    }
    0
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

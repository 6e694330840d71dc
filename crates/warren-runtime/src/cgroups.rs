//! Cgroup access outside a sandbox's set-up: usage sampling, freezing
//! (through libcgroups, which handles v1, hybrid and v2 alike), and the
//! kill-and-remove every destroy ends with (straight through the cgroup file
//! system, see `kill_and_remove`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use libcgroups::common::{
    create_cgroup_manager, AnyCgroupManager, CgroupConfig, CgroupManager, FreezerState,
};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use warren_core::Usage;

use crate::RuntimeError;

pub(crate) const ROOT: &str = "/sys/fs/cgroup";

/// Whether this host has the cgroup v2 unified hierarchy at `ROOT`.
pub(crate) fn unified() -> bool {
    // The host's cgroup mode does not change under a running daemon, and
    // the sampler asks for every sandbox each second.
    static UNIFIED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *UNIFIED.get_or_init(|| Path::new(ROOT).join("cgroup.controllers").exists())
}

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

/// The sandbox cgroup's directory in each hierarchy that has one: the
/// unified one on cgroup v2, every mounted controller's on v1 and hybrid
/// (links to a shared mount, such as `cpu` to `cpu,cpuacct`, counted once).
fn hierarchy_dirs(cgroup_path: &str) -> Vec<PathBuf> {
    let rel = cgroup_path.trim_start_matches('/');
    let root = Path::new(ROOT);
    if unified() {
        let dir = root.join(rel);
        return if dir.exists() { vec![dir] } else { Vec::new() };
    }
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path().join(rel))
                .filter(|d| d.exists())
                .collect()
        })
        .unwrap_or_default();
    dirs.sort();
    dirs
}

/// Whether any hierarchy still has a cgroup directory at `cgroup_path`.
pub fn exists(cgroup_path: &str) -> bool {
    !hierarchy_dirs(cgroup_path).is_empty()
}

/// `dir` and every cgroup below it, children before their parents (the
/// order they can be removed in).
fn subtree(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.filter_map(|e| e.ok()) {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                out.extend(subtree(&e.path()));
            }
        }
    }
    out.push(dir.to_path_buf());
    out
}

/// Removes the cgroup at `cgroup_path` in every hierarchy where it holds
/// no process and no cgroup (the kernel refuses the rest, which stay).
pub fn remove_empty(cgroup_path: &str) {
    for dir in hierarchy_dirs(cgroup_path) {
        let _ = std::fs::remove_dir(dir);
    }
}

/// The processes in the cgroup `dir` (not in the cgroups below it).
pub(crate) fn pids_in(dir: &Path) -> Vec<i32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// Kills every process left in the sandbox's cgroups and removes them, in
/// every hierarchy. Read straight from the cgroup file system rather than
/// through a libcgroups manager: building one reads the mount table once
/// per v1 controller, which was 1.3 ms of each 7 ms destroy.
pub fn kill_and_remove(cgroup_path: &str) -> Result<(), RuntimeError> {
    let tops = hierarchy_dirs(cgroup_path);
    let dirs: Vec<PathBuf> = tops.iter().flat_map(|d| subtree(d)).collect();
    if dirs.is_empty() {
        return Ok(());
    }
    unthrottle(cgroup_path);
    // v2: one write kills the whole subtree, forks racing it included.
    for dir in &tops {
        let kill_file = dir.join("cgroup.kill");
        if kill_file.exists() {
            let _ = std::fs::write(kill_file, "1");
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let pids: Vec<i32> = dirs.iter().flat_map(|d| pids_in(d)).collect();
        if pids.is_empty() {
            break;
        }
        for p in pids {
            let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
        }
        if Instant::now() > deadline {
            return Err(RuntimeError::Destroy(format!(
                "processes in cgroup {cgroup_path} did not die within 10s"
            )));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    // A cgroup whose last processes are still exiting refuses rmdir for a
    // moment.
    let deadline = Instant::now() + Duration::from_secs(10);
    for dir in &dirs {
        loop {
            match std::fs::remove_dir(dir) {
                Ok(()) => break,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                Err(e) if Instant::now() > deadline => {
                    return Err(RuntimeError::destroy_os(
                        format!("remove cgroup {}", dir.display()),
                        e,
                    ))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }
    Ok(())
}

/// Lifts the sandbox's CPU quota, when it is about to be destroyed: dying
/// processes still need CPU time to exit, and a sandbox throttled at a
/// fraction of a core (and busy reclaiming at its memory limit) takes
/// seconds to empty its cgroup otherwise. Only a sandbox that was ever
/// throttled: each quota write walks every CPU cgroup on the host under
/// the scheduler's bandwidth mutex (4.5 ms per write with 3,000 sandboxes
/// alive), which creates wait on.
pub fn unthrottle(cgroup_path: &str) {
    let rel = cgroup_path.trim_start_matches('/');
    let (dir, file, unlimited) = if unified() {
        (format!("{ROOT}/{rel}"), "cpu.max", "max")
    } else {
        (format!("{ROOT}/cpu/{rel}"), "cpu.cfs_quota_us", "-1")
    };
    if read_keyed(&format!("{dir}/cpu.stat"), "nr_throttled") == Some(0) {
        return;
    }
    let _ = std::fs::write(format!("{dir}/{file}"), unlimited);
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
    keyed(&std::fs::read_to_string(path).ok()?, key)
}

fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The CPU time the sandbox's cgroup has used: one file, where a whole
/// [`sample`] reads six; None when the cgroup is gone.
pub fn cpu_usage_ns(cgroup_path: &str) -> Option<u64> {
    let rel = cgroup_path.trim_start_matches('/');
    if unified() {
        read_keyed(&format!("{ROOT}/{rel}/cpu.stat"), "usage_usec").map(|us| us * 1000)
    } else {
        read_u64(&format!("{ROOT}/cpuacct/{rel}/cpuacct.usage"))
    }
}

pub fn sample(cgroup_path: &str) -> Result<Sample, RuntimeError> {
    let rel = cgroup_path.trim_start_matches('/');
    let gone = || RuntimeError::NotFound(format!("no cgroup {cgroup_path}"));
    if unified() {
        let v2 = format!("{ROOT}/{rel}");
        let cpu = std::fs::read_to_string(format!("{v2}/cpu.stat")).map_err(|_| gone())?;
        return Ok(Sample {
            cpu_usage_ns: keyed(&cpu, "usage_usec").unwrap_or(0) * 1000,
            cpu_periods: keyed(&cpu, "nr_periods").unwrap_or(0),
            cpu_throttled_periods: keyed(&cpu, "nr_throttled").unwrap_or(0),
            memory_bytes: read_u64(&format!("{v2}/memory.current")).unwrap_or(0),
            memory_peak_bytes: read_u64(&format!("{v2}/memory.peak")).unwrap_or(0),
            pids: read_u64(&format!("{v2}/pids.current")).unwrap_or(0),
            oom_kills: read_keyed(&format!("{v2}/memory.events"), "oom_kill").unwrap_or(0),
        });
    }
    let v1 = |ctrl: &str, file: &str| format!("{ROOT}/{ctrl}/{rel}/{file}");
    let cpu_ns = cpu_usage_ns(cgroup_path).ok_or_else(gone)?;
    let cpu = std::fs::read_to_string(v1("cpu", "cpu.stat")).unwrap_or_default();
    Ok(Sample {
        cpu_usage_ns: cpu_ns,
        cpu_periods: keyed(&cpu, "nr_periods").unwrap_or(0),
        cpu_throttled_periods: keyed(&cpu, "nr_throttled").unwrap_or(0),
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
    // libcgroups' freezer makes the directory it is given: a freeze that
    // comes after the sandbox's destroy (a pause or hold racing it) made a
    // FROZEN, empty freezer cgroup that nothing removed again (found as
    // leftovers below test daemons' own cgroup parents).
    if !exists(cgroup_path) {
        return Err(RuntimeError::NotFound(format!("no cgroup {cgroup_path}")));
    }
    let state = if frozen {
        FreezerState::Frozen
    } else {
        FreezerState::Thawed
    };
    manager(cgroup_path)?
        .freeze(state)
        .map_err(|e| RuntimeError::Files(format!("freeze {cgroup_path}: {e}")))
}

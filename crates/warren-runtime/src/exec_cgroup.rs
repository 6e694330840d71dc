//! Each exec's own cgroup, below its sandbox's.
//!
//! The shim an exec runs under (see warren-init's exec_tree) can be killed from inside
//! the sandbox (`kill -9 $PPID`), and a process that keeps sending
//! `SIGCONT` defeats a stop-then-kill walk of the process tree. A cgroup is
//! out of the sandbox's reach: its cgroup file system is read-only, and a
//! process cannot leave a cgroup by forking, detaching or killing its
//! parent. So the daemon makes one per exec (in the freezer hierarchy on
//! cgroup v1, in the unified one on v2; no controllers are enabled in it,
//! so the sandbox's limits still apply as before), hands its `cgroup.procs`
//! to init with the request, and the shim moves itself there before it
//! forks the command. Killing an exec is then freezing its cgroup and
//! killing everything in it (v2: `cgroup.kill`).

use std::fs::OpenOptions;
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::cgroups::{pids_in, unified, ROOT};
use crate::RuntimeError;

/// The sandbox's cgroup directory in the hierarchy execs are tracked in.
fn tracking_dir(sandbox_cgroup: &str) -> PathBuf {
    let rel = sandbox_cgroup.trim_start_matches('/');
    if unified() {
        Path::new(ROOT).join(rel)
    } else {
        Path::new(ROOT).join("freezer").join(rel)
    }
}

/// One exec's cgroup.
#[derive(Debug, Clone)]
pub struct ExecCgroup {
    dir: PathBuf,
}

impl ExecCgroup {
    /// Creates the cgroup `name` below the sandbox's and opens its
    /// `cgroup.procs` for the shim to write itself into.
    pub fn create(sandbox_cgroup: &str, name: &str) -> Result<(ExecCgroup, OwnedFd), RuntimeError> {
        let dir = tracking_dir(sandbox_cgroup).join(name);
        // Never an existing one: it may hold another exec's processes, or be
        // frozen by a kill a crash interrupted (the shim would freeze in it).
        std::fs::create_dir(&dir).map_err(|e| {
            RuntimeError::Exec(format!("create the exec's cgroup {}: {e}", dir.display()))
        })?;
        let procs = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(dir.join("cgroup.procs"))
            .map_err(|e| RuntimeError::Exec(format!("open {}: {e}", dir.display())))?;
        Ok((ExecCgroup { dir }, OwnedFd::from(procs)))
    }

    /// The cgroup of an exec recorded before (after a restart, say).
    pub fn existing(sandbox_cgroup: &str, name: &str) -> Option<ExecCgroup> {
        let dir = tracking_dir(sandbox_cgroup).join(name);
        dir.is_dir().then_some(ExecCgroup { dir })
    }

    /// Host pids of the processes in it.
    pub fn pids(&self) -> Vec<i32> {
        pids_in(&self.dir)
    }

    /// Whether the process that is `pid` in the sandbox's own PID namespace
    /// is in this cgroup.
    pub fn holds_sandbox_pid(&self, pid: i32) -> bool {
        self.pids().into_iter().any(|host| {
            std::fs::read_to_string(format!("/proc/{host}/status")).is_ok_and(|status| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix("NSpid:"))
                    .and_then(|ids| ids.split_whitespace().last())
                    .and_then(|inner| inner.parse::<i32>().ok())
                    == Some(pid)
            })
        })
    }

    /// Kills everything in the cgroup and waits (up to `wait`) until it is
    /// empty. Processes in a paused sandbox die when it is resumed.
    pub fn kill(&self, wait: Duration) {
        kill_dir(&self.dir, wait)
    }

    /// Removes the cgroup if nothing is left in it; false if something is
    /// (a background job of an exec that ended normally keeps running).
    pub fn remove(&self) -> bool {
        match std::fs::remove_dir(&self.dir) {
            Ok(()) => true,
            Err(e) => e.kind() == std::io::ErrorKind::NotFound,
        }
    }
}

fn kill_dir(dir: &Path, wait: Duration) {
    let deadline = Instant::now() + wait;
    if unified() {
        // Atomic in the kernel: forks racing the kill are caught too.
        let _ = std::fs::write(dir.join("cgroup.kill"), "1");
    } else {
        // Frozen first, so nothing forks or resumes another process while
        // the members are listed and killed; a SIGKILL takes effect as the
        // cgroup thaws.
        let _ = std::fs::write(dir.join("freezer.state"), "FROZEN");
        while Instant::now() < deadline {
            match std::fs::read_to_string(dir.join("freezer.state")) {
                Ok(s) if s.trim() == "FROZEN" => break,
                Ok(_) => std::thread::sleep(Duration::from_millis(1)),
                Err(_) => break,
            }
        }
        for pid in pids_in(dir) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        let _ = std::fs::write(dir.join("freezer.state"), "THAWED");
    }
    while Instant::now() < deadline && !pids_in(dir).is_empty() {
        if !unified() {
            for pid in pids_in(dir) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Kills and removes every exec cgroup of a sandbox (before the sandbox's
/// own cgroups go: a cgroup with children cannot be removed).
pub fn remove_all(sandbox_cgroup: &str) {
    let Ok(entries) = std::fs::read_dir(tracking_dir(sandbox_cgroup)) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            let dir = e.path();
            kill_dir(&dir, Duration::from_secs(5));
            let _ = std::fs::remove_dir(&dir);
        }
    }
}

/// After a restart: finishes the kills a crash interrupted (an exec cgroup
/// left frozen was being killed), and removes the exec cgroups nothing runs
/// in any more (the execs that were running died with their streams).
pub fn settle(sandbox_cgroup: &str) {
    let Ok(entries) = std::fs::read_dir(tracking_dir(sandbox_cgroup)) else {
        return;
    };
    for e in entries.flatten() {
        if !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let dir = e.path();
        if !self_frozen(&dir) {
            let _ = std::fs::remove_dir(&dir);
            continue;
        }
        // A shim the old daemon's last request started may join the
        // cgroup while it is being emptied (init forks it on its own):
        // emptied and removed again until it is gone, for a short while.
        let deadline = Instant::now() + SETTLE_FOR;
        loop {
            kill_dir(&dir, Duration::from_secs(5));
            match std::fs::remove_dir(&dir) {
                Ok(()) => break,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Err(e) => {
                    tracing::warn!(cgroup = %dir.display(), error = %e, "an interrupted exec's cgroup could not be removed; it goes with its sandbox");
                    break;
                }
            }
        }
    }
}

/// How long `settle` keeps emptying one interrupted exec's cgroup.
const SETTLE_FOR: Duration = Duration::from_millis(500);

/// Whether the cgroup itself was asked to freeze (not only its parent).
fn self_frozen(dir: &Path) -> bool {
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).map(|s| s.trim().to_string());
    match read("cgroup.freeze") {
        Ok(v) => v == "1",
        Err(_) => read("freezer.self_freezing").is_ok_and(|v| v == "1"),
    }
}

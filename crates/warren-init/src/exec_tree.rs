//! An exec's whole process tree, kept together and killed together.
//!
//! Each exec runs under a shim: a child of init that makes itself a child
//! subreaper and then forks the command. While the command runs, every
//! process it starts stays below the shim, even one that calls `setsid()`
//! or double-forks to detach: orphans are reparented to the nearest
//! subreaper, the shim, not to init. Killing the exec (its timeout, a
//! cancelled stream, a `SIGKILL` from the API) stops the whole tree and then
//! kills it, so nothing of it keeps running. The shim reaps what it adopts
//! and exits as the command did; what the command leaves running after it
//! exits normally (a background job) goes on as before, under init.

use nix::errno::Errno;
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::Pid;

use crate::exec_cgroups::ExecCgroup;

/// Moves the calling process (the shim, right after init forked it) into
/// the exec's own cgroup, through the `cgroup.procs` the daemon opened (the
/// kernel checks the opener's rights, not the sandbox's), before it forks
/// the command: the command and everything it starts are born there.
pub(crate) fn enter_cgroup(cgroup: Option<&std::os::fd::OwnedFd>) {
    if let Some(fd) = cgroup {
        // Without it the exec is still killed by walking its tree.
        let _ = nix::unistd::write(fd, b"0");
    }
}

/// Raises the calling process's OOM score above init's, in the command
/// right before its execve (everything it starts inherits the score).
///
/// On cgroup v1 the OOM killer picks one process of the sandbox by its
/// resident memory; memory the kernel holds for a process (open files,
/// sockets) is not counted there, so init could be picked before the
/// process that used the memory, and a dead init is a dead sandbox.
/// Lowering init's score needs CAP_SYS_RESOURCE, which hosts may withhold;
/// raising one's own needs nothing, and the sandbox cannot lower it below
/// init's again. The process must be dumpable to own its /proc entries
/// (init and its forks are not: they run the host's binary); execve makes
/// it dumpable a moment later anyway, and no sandbox process can ptrace
/// (seccomp) in between.
pub(crate) fn raise_oom_score() {
    // SAFETY: prctl(PR_SET_DUMPABLE) takes plain integers.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) };
    let _ = std::fs::write("/proc/self/oom_score_adj", EXEC_OOM_SCORE_ADJ);
}

/// What every exec's processes start with (init keeps 0).
pub const EXEC_OOM_SCORE_ADJ: &[u8] = b"500";

/// Makes the calling process (the shim, right after init forked it) the
/// subreaper of everything it forks from now on.
pub(crate) fn become_subreaper() {
    // SAFETY: prctl(PR_SET_CHILD_SUBREAPER) takes plain integers, and
    // PR_SET_NAME reads a NUL-terminated name we own (`ps` shows it).
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
        libc::prctl(libc::PR_SET_NAME, c"warren-shim".as_ptr(), 0, 0, 0);
    }
}

/// The shim's life after forking `command`: reap everything, and exit as
/// the command did once it has.
pub(crate) fn shim_wait(command: i32) -> ! {
    loop {
        match waitpid(Pid::from_raw(-1), None) {
            Ok(WaitStatus::Exited(pid, code)) if pid.as_raw() == command => exit(code),
            Ok(WaitStatus::Signaled(pid, sig, _)) if pid.as_raw() == command => die_of(sig),
            Ok(_) | Err(Errno::EINTR) => continue,
            Err(_) => exit(127),
        }
    }
}

fn exit(code: i32) -> ! {
    // SAFETY: _exit ends the shim without running init's destructors.
    unsafe { libc::_exit(code) }
}

/// Ends the shim by the signal that ended the command, so init reads the
/// same status it would have read from the command itself.
fn die_of(sig: Signal) -> ! {
    // SAFETY: signal() installs the default disposition (no handler code),
    // and raise() sends the signal to this process; the shim is
    // single-threaded and does nothing else.
    unsafe {
        libc::signal(sig as libc::c_int, libc::SIG_DFL);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig as libc::c_int);
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::raise(sig as libc::c_int);
    }
    exit(128 + sig as i32)
}

/// One process as /proc shows it: pid, parent, session and state letter.
struct Proc {
    pid: i32,
    ppid: i32,
    sid: i32,
    state: char,
}

fn processes() -> Vec<Proc> {
    crate::procstat::pids()
        .into_iter()
        .filter_map(|pid| {
            let stat = crate::procstat::read(&pid.to_string())?;
            let state = stat.field(3)?.chars().next()?;
            let ppid = stat.field(4)?.parse().ok()?;
            let sid = stat.field(6)?.parse().ok()?;
            Some(Proc {
                pid,
                ppid,
                sid,
                state,
            })
        })
        .collect()
}

/// Everything below `root` (not `root` itself).
fn descendants(root: i32, procs: &[Proc]) -> Vec<&Proc> {
    let mut found: Vec<&Proc> = Vec::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for p in procs.iter().filter(|p| p.ppid == parent) {
            frontier.push(p.pid);
            found.push(p);
        }
    }
    found
}

/// Whether `pid` is a process that has not ended (not a zombie).
pub(crate) fn alive(pid: i32) -> bool {
    crate::procstat::read(&pid.to_string())
        .and_then(|s| s.field(3).and_then(|f| f.chars().next()))
        .is_some_and(|state| !matches!(state, 'Z' | 'X'))
}

/// The exec's processes: everything below its shim, and everything in its
/// session (the command's pid; the command calls setsid). The session
/// finds what was orphaned where the shim cannot be a child subreaper
/// (gVisor refuses PR_SET_CHILD_SUBREAPER, and orphans go to init); what
/// calls setsid itself there escapes both.
fn members(shim: i32, session: Option<i32>, procs: &[Proc]) -> Vec<i32> {
    let mut found: Vec<i32> = descendants(shim, procs).iter().map(|p| p.pid).collect();
    if let Some(sid) = session.filter(|s| *s > 1) {
        let in_session: Vec<i32> = procs
            .iter()
            .filter(|p| p.sid == sid && p.pid != shim && !found.contains(&p.pid))
            .map(|p| p.pid)
            .collect();
        found.extend(in_session);
    }
    found
}

/// Kills every process of the exec whose shim is `shim` (see [`members`]),
/// and every process in its own cgroup where init keeps one (see
/// exec_cgroups). They are stopped first, round after round until none is
/// left running (a stopped process cannot fork, so the tree stops growing),
/// and then killed at once: killed one by one, the command could die first
/// and the shim exit, and the rest would be reparented to init and escape.
pub(crate) fn kill_tree(shim: i32, session: Option<i32>, cgroup: Option<&ExecCgroup>) {
    // The exec's processes in none of the states `past`, as /proc shows
    // them now.
    let members_but = |past: &[char]| {
        let procs = processes();
        let mut found = members(shim, session, &procs);
        for pid in cgroup.map(ExecCgroup::members).unwrap_or_default() {
            if !found.contains(&pid) {
                found.push(pid);
            }
        }
        found.retain(|pid| {
            procs
                .iter()
                .find(|p| p.pid == *pid)
                .is_some_and(|p| !past.contains(&p.state))
        });
        found
    };
    // Stopped, round after round, until none runs; then killed until none
    // is left: a process killed in the middle of a fork can leave a child
    // born after the list was read (gVisor finishes such a clone), which
    // only the next look finds.
    let rounds = [
        (
            Signal::SIGSTOP,
            &['T', 't', 'Z', 'X'][..],
            std::time::Duration::from_micros(200),
        ),
        (
            Signal::SIGKILL,
            &['Z', 'X'][..],
            std::time::Duration::from_millis(1),
        ),
    ];
    for (signal, past, pause) in rounds {
        for _ in 0..200 {
            let left = members_but(past);
            if left.is_empty() {
                break;
            }
            for pid in left {
                let _ = kill(Pid::from_raw(pid), signal);
            }
            std::thread::sleep(pause);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descendants_follow_parent_links_only() {
        let procs = [
            Proc {
                pid: 10,
                ppid: 1,
                sid: 0,
                state: 'S',
            },
            Proc {
                pid: 11,
                ppid: 10,
                sid: 0,
                state: 'S',
            },
            Proc {
                pid: 12,
                ppid: 11,
                sid: 0,
                state: 'R',
            },
            Proc {
                pid: 13,
                ppid: 10,
                sid: 0,
                state: 'T',
            },
            Proc {
                pid: 20,
                ppid: 1,
                sid: 0,
                state: 'S',
            },
            Proc {
                pid: 21,
                ppid: 20,
                sid: 0,
                state: 'S',
            },
        ];
        let mut below: Vec<i32> = descendants(10, &procs).iter().map(|p| p.pid).collect();
        below.sort();
        assert_eq!(below, [11, 12, 13]);
        assert!(descendants(12, &procs).is_empty());
    }

    #[test]
    fn members_are_below_the_shim_or_in_the_commands_session() {
        let p = |pid, ppid, sid| Proc {
            pid,
            ppid,
            sid,
            state: 'S',
        };
        // Shim 10, command 11 (its own session), a child 12; 13 orphaned to
        // init but still in the session; 14 orphaned after a setsid; 20 is
        // another exec's.
        let procs = [
            p(10, 1, 1),
            p(11, 10, 11),
            p(12, 11, 11),
            p(13, 1, 11),
            p(14, 1, 14),
            p(20, 1, 20),
        ];
        let mut found = members(10, Some(11), &procs);
        found.sort();
        assert_eq!(found, [11, 12, 13]);
        // Before the command is known, only the tree; init's own session
        // never counts.
        assert_eq!(members(10, None, &procs).len(), 2);
        assert_eq!(members(10, Some(1), &procs).len(), 2);
    }
}

//! Host-wide tables every sandbox draws from: the process table, the
//! open-file table and the daemon's own descriptor limit. A sandbox's cgroup
//! bounds its memory, CPU and processes, but these tables are shared by the
//! whole host, so the node budgets them when it starts.

use std::path::Path;

use crate::os_error::OsError;

/// Share of the kernel's process table lent to sandboxes together; the rest
/// stays for the host (the daemon, sshd, the kubelet...).
const PID_SHARE_PERCENT: u64 = 75;

/// Bytes of sandbox memory one open file costs at least (the kernel charges
/// a `struct file`, about 200-250 bytes, to the opener's memory cgroup).
const MEMORY_PER_FILE: u64 = 128;

fn read_u64(path: &str) -> Option<u64> {
    read_number(path).ok()
}

/// The number in the file at `path`; text that is no number is invalid data.
fn read_number(path: &str) -> std::io::Result<u64> {
    std::fs::read_to_string(path)?
        .trim()
        .parse()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// How many processes all sandboxes together, and any one of them, may
/// have: a share of `kernel.pid_max`.
pub fn pid_budget() -> u32 {
    let pid_max = read_u64("/proc/sys/kernel/pid_max").unwrap_or(32768);
    (pid_max * PID_SHARE_PERCENT / 100).clamp(64, u32::MAX as u64) as u32
}

/// Caps the processes of every sandbox together at `budget`, on the cgroup
/// all sandbox cgroups live below (`pids.max` is hierarchical), so sandboxes
/// that each stay within their own limit still cannot fill the host's
/// process table.
pub fn cap_pids(cgroup_parent: &str, budget: u32) -> Result<(), OsError> {
    let rel = cgroup_parent.trim_start_matches('/');
    let root = Path::new("/sys/fs/cgroup");
    let dir = if root.join("cgroup.controllers").exists() {
        // cgroup v2: the parent needs the pids controller from the root,
        // through every cgroup above it (a parent may be nested).
        let mut at = root.to_path_buf();
        for name in rel.split('/') {
            let _ = std::fs::write(at.join("cgroup.subtree_control"), "+pids");
            at.push(name);
            std::fs::create_dir_all(&at)
                .map_err(|e| OsError::new(format!("create {}", at.display()), e))?;
        }
        at
    } else {
        root.join("pids").join(rel)
    };
    std::fs::create_dir_all(&dir)
        .map_err(|e| OsError::new(format!("create {}", dir.display()), e))?;
    std::fs::write(dir.join("pids.max"), budget.to_string())
        .map_err(|e| OsError::new(format!("write {}/pids.max", dir.display()), e))
}

/// Makes sure the host's open-file table (`fs.file-max`) outlasts the
/// memory sandboxes may use: every open file is charged to the opener's
/// memory cgroup, so with the table at least this large, a sandbox runs
/// out of its own memory long before the host runs out of files. Returns
/// the old and new sizes when it raised the table.
pub fn size_file_table(sandbox_memory: u64) -> Result<Option<(u64, u64)>, OsError> {
    const PATH: &str = "/proc/sys/fs/file-max";
    let current = read_number(PATH).map_err(|e| OsError::new(format!("read {PATH}"), e))?;
    let wanted = sandbox_memory / MEMORY_PER_FILE;
    if current >= wanted {
        return Ok(None);
    }
    std::fs::write(PATH, wanted.to_string())
        .map_err(|e| OsError::new(format!("write {PATH}"), e))?;
    Ok(Some((current, wanted)))
}

/// Raises the daemon's soft limit on open descriptors to its hard limit:
/// it holds a few per sandbox and per connection, and the usual soft limit
/// of 1024 is far below what a node with a thousand sandboxes needs.
/// Returns the limit in force.
pub fn raise_nofile() -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => {
            if setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
                hard
            } else {
                soft
            }
        }
        Ok((soft, _)) => soft,
        Err(_) => 1024,
    }
}

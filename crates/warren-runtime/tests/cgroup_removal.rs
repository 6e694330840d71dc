//! `cgroups::kill_and_remove` on this host's real cgroup hierarchies: a
//! sandbox-like cgroup in every hierarchy (v1 and hybrid: each mounted
//! controller; v2: the unified one), with a process in it and a child
//! cgroup (as an exec's) holding another, is emptied and removed
//! everywhere. Needs root.

// A test's helpers fail the test on any error, as the test itself does.
#![allow(clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use warren_runtime::cgroups;

const ROOT: &str = "/sys/fs/cgroup";

/// Where a cgroup named `rel` goes: the unified root on v2, each mounted
/// v1 hierarchy (not the links to them) otherwise.
fn hierarchies() -> Vec<PathBuf> {
    let root = Path::new(ROOT);
    if root.join("cgroup.controllers").exists() {
        return vec![root.to_path_buf()];
    }
    let mut out: Vec<PathBuf> = std::fs::read_dir(root)
        .expect("list /sys/fs/cgroup")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .filter(|p| p.join("cgroup.procs").exists())
        .collect();
    out.sort();
    out
}

/// Creates the cgroup `dir`; a v1 cpuset cgroup takes no task until it
/// has CPUs and memory nodes, so those are its parent's.
fn create(dir: &Path) {
    std::fs::create_dir(dir).expect("create a cgroup");
    for file in ["cpuset.cpus", "cpuset.mems"] {
        if let (Some(parent), true) = (dir.parent(), dir.join(file).exists()) {
            let value =
                std::fs::read_to_string(parent.join(file)).expect("read the parent's cpuset");
            std::fs::write(dir.join(file), value.trim()).expect("set the cpuset");
        }
    }
}

/// What the test made, undone however it ends: its processes killed, its
/// cgroups removed (deepest first).
struct Made {
    children: Vec<Child>,
    dirs: Vec<PathBuf>,
}

impl Drop for Made {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for d in self.dirs.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
    }
}

fn sleeper() -> Child {
    Command::new("sleep")
        .arg("600")
        .spawn()
        .expect("start sleep")
}

fn join(dir: &Path, child: &Child) {
    std::fs::write(dir.join("cgroup.procs"), child.id().to_string()).expect("join the cgroup");
}

/// Whether the process ended by SIGKILL within a few seconds.
fn killed(child: &mut Child) -> bool {
    use std::os::unix::process::ExitStatusExt;
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().expect("wait") {
            return status.signal() == Some(9);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    false
}

#[test]
fn kill_and_remove_empties_and_removes_every_hierarchy() {
    let rel = format!("warren-cgtest-{}", std::process::id());
    let places = hierarchies();
    assert!(!places.is_empty(), "no cgroup hierarchy is mounted");
    let mut made = Made {
        children: Vec::new(),
        dirs: Vec::new(),
    };
    for h in &places {
        create(&h.join(&rel));
        made.dirs.push(h.join(&rel));
    }
    // An exec's cgroup below the sandbox's, in one of the hierarchies.
    let exec_dir = places[places.len() - 1].join(&rel).join("exec-1");
    create(&exec_dir);
    made.dirs.push(exec_dir.clone());

    made.children.push(sleeper());
    made.children.push(sleeper());
    for h in &places {
        join(&h.join(&rel), &made.children[0]);
    }
    join(&exec_dir, &made.children[1]);
    assert!(cgroups::exists(&format!("/{rel}")));

    cgroups::kill_and_remove(&format!("/{rel}")).expect("kill and remove");

    assert!(
        killed(&mut made.children[0]),
        "the sandbox's process was not killed"
    );
    assert!(
        killed(&mut made.children[1]),
        "the exec cgroup's process was not killed"
    );
    for h in &places {
        assert!(!h.join(&rel).exists(), "{} is left", h.join(&rel).display());
    }
    assert!(!cgroups::exists(&format!("/{rel}")));
    // Nothing left to do is not an error.
    cgroups::kill_and_remove(&format!("/{rel}")).expect("a second call");
}

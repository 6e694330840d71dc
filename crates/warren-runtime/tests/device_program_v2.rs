//! The device rules of a sandbox's config, compiled into an eBPF program
//! and attached the way libcontainer does on a cgroup v2 host, on this
//! host's cgroup2 hierarchy, then tried with real opens. On a hybrid host the unified hierarchy holds no
//! controllers, but the kernel still runs the device program of a task's
//! cgroup2 cgroup on every open of a device node, so this is the same check
//! a v2 host makes. Needs root; skips where there is no cgroup2 mount or
//! the temporary directory is mounted nodev.

// A test's helpers fail the test on any error, as the test itself does.
#![allow(clippy::expect_used)]

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use warren_runtime::cdi::{Injection, NodeEdit};

/// A character device node at `path` with the numbers of `like`.
fn mknod_like(path: &Path, like: &str) {
    use std::os::unix::fs::MetadataExt;
    let rdev = std::fs::metadata(like).expect("stat device").rdev();
    nix::sys::stat::mknod(
        path,
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        rdev,
    )
    .expect("mknod");
    assert!(std::fs::metadata(path)
        .expect("stat node")
        .file_type()
        .is_char_device());
}

fn node(path: &Path, like: &str, access: &str) -> NodeEdit {
    use std::os::unix::fs::MetadataExt;
    let rdev = std::fs::metadata(like).expect("stat device").rdev();
    NodeEdit {
        path: "/dev/test".into(),
        host_path: path.display().to_string(),
        kind: "c".into(),
        major: nix::sys::stat::major(rdev) as i64,
        minor: nix::sys::stat::minor(rdev) as i64,
        access: access.into(),
    }
}

/// A cgroup2 cgroup with the device program for `devices`, removed on drop.
struct Cgroup(PathBuf);

impl Cgroup {
    fn new(root: &Path, name: &str, devices: &Injection) -> Cgroup {
        let dir = root.join(format!("warren-devtest-{}-{name}", std::process::id()));
        std::fs::create_dir(&dir).expect("create cgroup");
        let cg = Cgroup(dir);
        warren_runtime::device_program::attach(&cg.0, devices).expect("attach the device program");
        cg
    }

    /// Opens `node` from a shell moved into this cgroup: Ok, or the
    /// shell's error message.
    fn open(&self, node: &Path, redirect: &str) -> Result<(), String> {
        let out = Command::new("/bin/sh")
            .arg("-c")
            .arg(format!(
                "echo $$ > \"$1/cgroup.procs\" && exec 3{redirect} \"$2\""
            ))
            .arg("sh")
            .arg(&self.0)
            .arg(node)
            .output()
            .expect("run sh");
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // The shells have exited; an empty cgroup goes, and its program with it.
        let _ = std::fs::remove_dir(&self.0);
    }
}

fn denied(r: Result<(), String>) {
    match r {
        Err(msg) if msg.contains("Operation not permitted") => {}
        other => panic!("expected EPERM from the device program, got {other:?}"),
    }
}

#[test]
fn only_the_sandboxs_devices_open_under_the_v2_device_program() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let Some(root) = warren_runtime::cgroup_tuning::cgroup2_mount_point() else {
        eprintln!("skipped: no cgroup2 mount");
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let flags = nix::sys::statvfs::statvfs(dir.path())
        .expect("statvfs")
        .flags();
    if flags.contains(nix::sys::statvfs::FsFlags::ST_NODEV) {
        eprintln!("skipped: {} is mounted nodev", dir.path().display());
        return;
    }
    let null = dir.path().join("null");
    let fuse = dir.path().join("fuse");
    mknod_like(&null, "/dev/null");
    // 10:229, in no default rule: it stands for a GPU.
    mknod_like(&fuse, "/dev/fuse");

    let plain = Cgroup::new(&root, "plain", &Injection::default());
    plain.open(&null, "<>").expect("a default device opens");
    denied(plain.open(&fuse, "<"));
    denied(plain.open(&fuse, ">"));

    // A sandbox holding the fuse copy as a CDI device, with `access`.
    let holding = |access| Injection {
        nodes: vec![node(&fuse, "/dev/fuse", access)],
        ..Injection::default()
    };
    let held = Cgroup::new(&root, "held", &holding("rwm"));
    held.open(&fuse, "<>")
        .expect("the sandbox's own device opens");
    held.open(&null, "<>").expect("defaults still open");

    let read_only = Cgroup::new(&root, "ro", &holding("r"));
    read_only.open(&fuse, "<").expect("opens for reading");
    denied(read_only.open(&fuse, ">"));
    denied(read_only.open(&fuse, "<>"));

    // Without the program the same opens succeed: the denials above are its.
    let bare = root.join(format!("warren-devtest-{}-bare", std::process::id()));
    std::fs::create_dir(&bare).expect("create cgroup");
    let bare = Cgroup(bare);
    bare.open(&fuse, "<>").expect("no program, no denial");
}

//! Disk limits. This kernel family may lack quota support (CONFIG_QUOTA and
//! XFS quotas are often compiled out), so a sandbox that asks for a disk
//! limit gets its own small file system: a sparse ext4 image, loop-mounted
//! `nodev,nosuid`, that holds the overlay's upper and work directories. Its
//! size bounds both bytes and inodes. Sandboxes without a limit keep their
//! upper directory on the node's file system.

use std::path::{Path, PathBuf};
use std::process::Command;

use nix::mount::{umount2, MntFlags};

use crate::RuntimeError;

/// Creates `<dir>/disk.img` of `bytes` and mounts it at `<dir>/fs`.
pub fn create(dir: &Path, bytes: u64) -> Result<PathBuf, RuntimeError> {
    // A sandbox's changes go with it: no journal to write.
    make(dir, bytes, Journal::Without)?;
    mount(dir)
}

/// Whether a file system keeps a journal: a volume's must survive a crash
/// of the host; a sandbox's scratch disk need not.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Journal {
    With,
    Without,
}

/// Makes `<dir>/disk.img`, an ext4 file system of `bytes` (sparse), and its
/// mount point `<dir>/fs`.
pub fn make(dir: &Path, bytes: u64, journal: Journal) -> Result<(), RuntimeError> {
    let img = dir.join("disk.img");
    std::fs::create_dir(dir.join("fs")).map_err(RuntimeError::io("create disk mount point"))?;
    let file = std::fs::File::create(&img).map_err(RuntimeError::io("create disk image"))?;
    file.set_len(bytes)
        .map_err(RuntimeError::io("size disk image"))?;
    drop(file);
    let mut mkfs = Command::new("mkfs.ext4");
    mkfs.args(["-q", "-F", "-m", "0"]);
    if journal == Journal::Without {
        mkfs.args(["-O", "^has_journal"]);
    }
    run(mkfs
        .args(["-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard"])
        .arg(&img))
}

/// Mounts `<dir>/disk.img` at `<dir>/fs` (`nodev,nosuid`, on a loop device
/// released with the last mount).
pub fn mount(dir: &Path) -> Result<PathBuf, RuntimeError> {
    let mnt = dir.join("fs");
    run(Command::new("mount")
        .args(["-o", "loop,nodev,nosuid"])
        .arg(dir.join("disk.img"))
        .arg(&mnt))?;
    Ok(mnt)
}

/// The block device mounted at `<dir>/fs` in this mount namespace, if one
/// is (from `/proc/self/mountinfo`).
pub fn device(dir: &Path) -> Option<PathBuf> {
    let mnt = std::fs::canonicalize(dir.join("fs")).ok()?;
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    // The last mount at a path is the one seen there.
    info.lines().rev().find_map(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        let sep = fields.iter().position(|f| *f == "-")?;
        if fields.get(4).map(|p| crate::cgroup_tuning::unescape(p))
            != Some(mnt.display().to_string())
        {
            return None;
        }
        fields.get(sep + 2).map(PathBuf::from)
    })
}

/// Unmounts the sandbox's file system if it has one; the loop device is
/// released with the last reference (mount's autoclear).
pub fn remove(dir: &Path) -> Result<(), RuntimeError> {
    let mnt = dir.join("fs");
    if !mnt.exists() {
        return Ok(());
    }
    match umount2(&mnt, MntFlags::MNT_DETACH) {
        Ok(()) | Err(nix::Error::EINVAL) | Err(nix::Error::ENOENT) => Ok(()),
        Err(e) => Err(RuntimeError::Destroy(format!(
            "unmount {}: {e}",
            mnt.display()
        ))),
    }
}

fn run(cmd: &mut Command) -> Result<(), RuntimeError> {
    let out = cmd.output().map_err(|e| {
        RuntimeError::Create(format!(
            "{:?}: {e} (disk limits need e2fsprogs and util-linux)",
            cmd.get_program()
        ))
    })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(RuntimeError::Create(format!(
            "{:?} failed: {}",
            cmd.get_program(),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

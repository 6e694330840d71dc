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
    let img = dir.join("disk.img");
    let mnt = dir.join("fs");
    std::fs::create_dir(&mnt).map_err(RuntimeError::io("create disk mount point"))?;
    let file = std::fs::File::create(&img).map_err(RuntimeError::io("create disk image"))?;
    file.set_len(bytes)
        .map_err(RuntimeError::io("size disk image"))?;
    drop(file);
    run(Command::new("mkfs.ext4")
        .args(["-q", "-F", "-m", "0", "-O", "^has_journal"])
        .args(["-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard"])
        .arg(&img))?;
    run(Command::new("mount")
        .args(["-o", "loop,nodev,nosuid"])
        .arg(&img)
        .arg(&mnt))?;
    Ok(mnt)
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

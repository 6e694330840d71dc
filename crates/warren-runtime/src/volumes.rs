//! Volumes in a sandbox's root: each volume's file system, mounted by the
//! node on the host, is mounted again from its block device in the
//! spawner's namespace (the kernel shares the one superblock), copied as a
//! detached tree with the sandbox's ids mapped (and read-only if asked),
//! and moved onto its path inside the root. The path is made and opened
//! inside the root (`openat2` in-root resolution), so a symlink in the image
//! cannot send the mount elsewhere on the host.

use std::path::{Path, PathBuf};

use nix::mount::{umount2, MntFlags, MsFlags};
use rustix::fs::{Mode, OFlags};

use crate::{userns, RuntimeError, VolumeBind, ROOTS_DIR};

/// Where the spawner mounts volume devices before copying them.
fn staging(id: &str) -> PathBuf {
    Path::new(ROOTS_DIR).join(format!("{id}.vol"))
}

/// Mounts every volume into the root mounted at `root`.
pub(crate) fn mount_all(
    id: &str,
    root: &Path,
    volumes: &[VolumeBind],
    ids: Option<userns::IdRange>,
) -> Result<(), RuntimeError> {
    if volumes.is_empty() {
        return Ok(());
    }
    let userns_fd = ids.map(userns::namespace_fd).transpose()?;
    let root_fd = rustix::fs::open(
        root,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| RuntimeError::create_os("open the sandbox root", e))?;
    let stage = staging(id);
    std::fs::create_dir(&stage).map_err(RuntimeError::io("create volume mount points"))?;
    for (i, v) in volumes.iter().enumerate() {
        let at = stage.join(i.to_string());
        std::fs::create_dir(&at).map_err(RuntimeError::io("create volume mount points"))?;
        nix::mount::mount(
            Some(&v.device),
            &at,
            Some("ext4"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            None::<&str>,
        )
        .map_err(|e| {
            RuntimeError::create_os(
                format!("volume for {}: mount {}", v.target, v.device.display()),
                e,
            )
        })?;
        let tree = userns::mapped_tree(&at, userns_fd.as_ref(), v.read_only);
        // The copy holds the file system; the staging mount is not needed.
        let _ = umount2(&at, MntFlags::MNT_DETACH);
        let tree = tree?;
        let target = crate::files::mkdir_all(&root_fd, &v.target)?;
        use rustix::mount::{move_mount, MoveMountFlags};
        move_mount(
            &tree,
            "",
            &target,
            "",
            MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH | MoveMountFlags::MOVE_MOUNT_T_EMPTY_PATH,
        )
        .map_err(|e| RuntimeError::create_os(format!("mount the volume at {}", v.target), e))?;
    }
    Ok(())
}

/// Removes what [`mount_all`] left in the spawner's namespace.
pub(crate) fn unmount_staging(id: &str) {
    let stage = staging(id);
    if let Ok(entries) = std::fs::read_dir(&stage) {
        for e in entries.flatten() {
            let _ = umount2(&e.path(), MntFlags::MNT_DETACH);
            let _ = std::fs::remove_dir(e.path());
        }
    }
    let _ = std::fs::remove_dir(&stage);
}

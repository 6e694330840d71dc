//! Secret files in a sandbox: a small memory file system of the sandbox's
//! own at `/run/secrets`, filled before anything in the sandbox runs. Its
//! files are in no layer: a commit, a fork's layer or the node's disk never
//! hold them, and they are gone with the sandbox's last process.

use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::Path;

use rustix::fs::{Mode, OFlags};
use rustix::mount::{
    fsconfig_create, fsconfig_set_string, fsmount, fsopen, move_mount, FsMountFlags, FsOpenFlags,
    MountAttrFlags, MoveMountFlags,
};

use crate::{userns, RuntimeError};

/// One file under `/run/secrets`.
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SecretFileData {
    /// Its name in the directory (checked by `warren_core::secret`).
    pub name: String,
    pub data: String,
}

impl std::fmt::Debug for SecretFileData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretFileData")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// The file system's size: the values (at most 64 KiB each, 64 of them)
/// with room to spare; the sandbox cannot grow it past this.
const SIZE: &str = "8m";

/// Mounts the secret files at `/run/secrets` in the root mounted at `root`.
pub(crate) fn mount(
    root: &Path,
    files: &[SecretFileData],
    ids: Option<userns::IdRange>,
) -> Result<(), RuntimeError> {
    if files.is_empty() {
        return Ok(());
    }
    let fail = |what: &str, e: &dyn std::fmt::Display| {
        RuntimeError::Create(format!(
            "secrets at {}: {what}: {e}",
            warren_core::secret::SECRETS_DIR
        ))
    };
    let owner = ids.map_or(0, |r| r.base);
    let fs = fsopen("tmpfs", FsOpenFlags::FSOPEN_CLOEXEC).map_err(|e| fail("fsopen", &e))?;
    for (key, value) in [("size", SIZE), ("mode", "0755")] {
        fsconfig_set_string(&fs, key, value).map_err(|e| fail(key, &e))?;
    }
    fsconfig_create(&fs).map_err(|e| fail("create", &e))?;
    let mnt = fsmount(
        &fs,
        FsMountFlags::FSMOUNT_CLOEXEC,
        MountAttrFlags::MOUNT_ATTR_NOSUID
            | MountAttrFlags::MOUNT_ATTR_NODEV
            | MountAttrFlags::MOUNT_ATTR_NOEXEC,
    )
    .map_err(|e| fail("fsmount", &e))?;
    // Owned by the sandbox's root. (Not by mount options, which the
    // sandbox would read in /proc/mounts as the host's ids.)
    chown(&mnt, owner).map_err(|e| fail("chown", &e))?;
    for f in files {
        write(&mnt, f, owner).map_err(|e| fail(&f.name, &e))?;
    }
    let root_fd = rustix::fs::open(
        root,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| fail("open the sandbox root", &e))?;
    let target = crate::files::mkdir_all(&root_fd, warren_core::secret::SECRETS_DIR)?;
    move_mount(
        &mnt,
        "",
        &target,
        "",
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH | MoveMountFlags::MOVE_MOUNT_T_EMPTY_PATH,
    )
    .map_err(|e| fail("move_mount", &e))
}

/// One file, readable by every user of the sandbox (as Docker's secrets
/// are: an image's own user, E2B's `user`, must read its key), owned by the
/// sandbox's root.
fn write(dir: &OwnedFd, f: &SecretFileData, owner: u32) -> std::io::Result<()> {
    let fd = rustix::fs::openat(
        dir,
        f.name.as_str(),
        OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o444),
    )?;
    chown(&fd, owner)?;
    let mut file = std::fs::File::from(fd);
    file.write_all(f.data.as_bytes())
}

/// `fchownat(fd, "", AT_EMPTY_PATH)`: also for the mount's descriptor,
/// which fchown refuses.
fn chown(fd: &OwnedFd, owner: u32) -> rustix::io::Result<()> {
    rustix::fs::chownat(
        fd,
        "",
        Some(rustix::fs::Uid::from_raw(owner)),
        Some(rustix::fs::Gid::from_raw(owner)),
        rustix::fs::AtFlags::EMPTY_PATH,
    )
}

//! The sandbox's root filesystem: an overlay of the image's cached layers
//! with a fresh upper directory, mounted `nodev,nosuid` and `volatile`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use nix::mount::{mount, umount2, MntFlags, MsFlags};

use crate::os_error::OsError;
use crate::RuntimeError;

/// Overlay mount data must fit in one page.
const MAX_MOUNT_DATA: usize = 4000;

pub fn mount_overlay(
    lower: &[PathBuf],
    upper: &Path,
    work: &Path,
    target: &Path,
) -> Result<(), RuntimeError> {
    if lower.is_empty() {
        return Err(RuntimeError::Create("image has no layers".into()));
    }
    let lowerdir: Vec<String> = lower.iter().map(|p| p.display().to_string()).collect();
    let mut data = format!(
        "lowerdir={},upperdir={},workdir={}",
        lowerdir.join(":"),
        upper.display(),
        work.display()
    );
    if Path::new("/sys/module/overlay/parameters/index").exists() {
        data.push_str(",index=off");
    }
    if data.len() > MAX_MOUNT_DATA {
        return Err(RuntimeError::Create(format!(
            "overlay options are {} bytes, over the {MAX_MOUNT_DATA}-byte limit: the image has too many layers for this Warren home path; use a shorter --home",
            data.len()
        )));
    }
    let mount_with = |data: &str| {
        mount(
            Some("overlay"),
            target,
            Some("overlay"),
            MsFlags::MS_NODEV | MsFlags::MS_NOSUID,
            Some(data),
        )
    };
    // `volatile` (Linux 5.10): the overlay never syncs its upper file
    // system. Without it the last process of a sandbox, as its mount
    // namespace goes, waits for a sync of the whole host file system that
    // holds the upper directory (ext4: a journal commit and a disk flush)
    // before it can exit, and every sync(2) or syncfs(2) in a sandbox
    // flushes the host's disk. A sandbox does not outlive its host (see
    // docs/reliability.md), so its writes need no flush; its upper and
    // work directories are never mounted again.
    let result = if VOLATILE_REFUSED.load(Ordering::Relaxed) {
        mount_with(&data)
    } else {
        match mount_with(&format!("{data},volatile")) {
            Err(nix::Error::EINVAL) => {
                let plain = mount_with(&data);
                if plain.is_ok() {
                    VOLATILE_REFUSED.store(true, Ordering::Relaxed);
                }
                plain
            }
            other => other,
        }
    };
    result.map_err(|e| RuntimeError::Create(format!("mount overlay at {}: {e}", target.display())))
}

/// Set once this kernel has refused `volatile` where a mount without it
/// worked (kernels before 5.10).
static VOLATILE_REFUSED: AtomicBool = AtomicBool::new(false);

/// Lazily detaches the rootfs; a missing mount is not an error.
pub fn unmount(target: &Path) -> Result<(), RuntimeError> {
    match umount2(target, MntFlags::MNT_DETACH) {
        Ok(()) | Err(nix::Error::EINVAL) | Err(nix::Error::ENOENT) => Ok(()),
        Err(e) => Err(RuntimeError::Destroy(format!(
            "unmount {}: {e}",
            target.display()
        ))),
    }
}

/// Binds `path` (and every mount below it) onto itself: a mount of the
/// calling namespace at that place, which `pivot_root` needs of a new root
/// and a remount needs to change one directory's flags alone.
pub(crate) fn bind_in_place(path: &Path) -> nix::Result<()> {
    mount(
        Some(path),
        path,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
}

/// Makes `root` the calling process's `/` and detaches the old root, which
/// `pivot_root(".", ".")` leaves stacked on the new one.
pub(crate) fn pivot_into(root: &Path) -> Result<(), OsError> {
    nix::unistd::chdir(root).map_err(|e| OsError::new("enter the root", e))?;
    nix::unistd::pivot_root(".", ".").map_err(|e| OsError::new("pivot_root", e))?;
    umount2(".", MntFlags::MNT_DETACH).map_err(|e| OsError::new("detach the old root", e))?;
    nix::unistd::chdir("/").map_err(|e| OsError::new("chdir /", e))
}

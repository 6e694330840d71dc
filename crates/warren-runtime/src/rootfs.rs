//! The sandbox's root filesystem: an overlay of the image's cached layers
//! with a fresh upper directory, mounted `nodev,nosuid`.

use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};

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
    mount(
        Some("overlay"),
        target,
        Some("overlay"),
        MsFlags::MS_NODEV | MsFlags::MS_NOSUID,
        Some(data.as_str()),
    )
    .map_err(|e| RuntimeError::Create(format!("mount overlay at {}: {e}", target.display())))
}

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
pub(crate) fn pivot_into(root: &Path) -> Result<(), String> {
    nix::unistd::chdir(root).map_err(|e| format!("enter the root: {e}"))?;
    nix::unistd::pivot_root(".", ".").map_err(|e| format!("pivot_root: {e}"))?;
    umount2(".", MntFlags::MNT_DETACH).map_err(|e| format!("detach the old root: {e}"))?;
    nix::unistd::chdir("/").map_err(|e| format!("chdir /: {e}"))
}

//! Filesystem operations confined to one directory tree.
//!
//! Layer contents are hostile: an earlier entry may plant a symlink
//! (`etc -> /etc`) that a later entry writes through (`etc/passwd`). Every
//! parent directory is therefore opened with `openat2(RESOLVE_IN_ROOT)`, so
//! the kernel resolves symlinks as if the layer directory were `/`, and the
//! last component is handled with `*at` calls that never follow it.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

const RESOLVE: ResolveFlags = ResolveFlags::IN_ROOT.union(ResolveFlags::NO_MAGICLINKS);

/// `openat2` fails with EAGAIN when a concurrent rename might have let a
/// lookup escape; retrying is the documented answer.
const EAGAIN_RETRIES: usize = 16;

/// A path inside the confined tree as its components (never `.`, `..` or
/// empty).
pub(crate) type Parts = [Vec<u8>];

pub(crate) fn join(parts: &Parts) -> PathBuf {
    if parts.is_empty() {
        return PathBuf::from(".");
    }
    let mut bytes = Vec::new();
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            bytes.push(b'/');
        }
        bytes.extend_from_slice(p);
    }
    PathBuf::from(OsStr::from_bytes(&bytes))
}

/// Opens `path` as the root of a confined tree (`O_PATH`, not following a
/// final symlink).
pub(crate) fn open_root(path: &Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        path,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Opens directory `parts` of the tree. `readable` gives an fd usable for
/// `fsetxattr`/`futimens`; otherwise an `O_PATH` fd for `*at` calls.
pub(crate) fn open_dir(root: BorrowedFd<'_>, parts: &Parts, readable: bool) -> io::Result<OwnedFd> {
    let access = if readable {
        OFlags::RDONLY
    } else {
        OFlags::PATH
    };
    let flags = access | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let path = join(parts);
    let mut tries = 0;
    loop {
        match rustix::fs::openat2(root, &path, flags, Mode::empty(), RESOLVE) {
            Err(Errno::AGAIN) if tries < EAGAIN_RETRIES => tries += 1,
            other => return Ok(other?),
        }
    }
}

/// Opens directory `parts`, creating missing components (mode 0755, owned by
/// us) the way `mkdir -p` would, without ever leaving the tree.
pub(crate) fn mkdir_all(root: BorrowedFd<'_>, parts: &Parts) -> io::Result<OwnedFd> {
    match open_dir(root, parts, false) {
        Err(e) if e.raw_os_error() == Some(Errno::NOENT.raw_os_error()) => {}
        other => return other,
    }
    let mut current = open_dir(root, &[], false)?;
    for i in 0..parts.len() {
        let prefix = &parts[..=i];
        match open_dir(root, prefix, false) {
            Ok(fd) => current = fd,
            Err(e) if e.raw_os_error() == Some(Errno::NOENT.raw_os_error()) => {
                // `current` is the resolved parent, so creating the last
                // component there is exactly what the lookup missed.
                let existed = match rustix::fs::mkdirat(
                    &current,
                    OsStr::from_bytes(&parts[i]),
                    Mode::from(0o755),
                ) {
                    Ok(()) => false,
                    Err(Errno::EXIST) => true,
                    Err(e) => return Err(e.into()),
                };
                current = match open_dir(root, prefix, false) {
                    // Something that is not a directory is in the way, e.g.
                    // a dangling symlink; `mkdir -p` fails the same way.
                    Err(e) if existed && e.raw_os_error() == Some(Errno::NOENT.raw_os_error()) => {
                        return Err(Errno::NOTDIR.into())
                    }
                    other => other?,
                };
            }
            Err(e) => return Err(e),
        }
    }
    Ok(current)
}

/// What a path held before we cleared it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Cleared {
    Nothing,
    Removed,
    /// A directory that was left in place because the caller wants one.
    KeptDir,
}

/// Makes room for a new entry `name` in `dir`, the way tar does when a later
/// entry replaces an earlier one. A directory is kept when `keep_dir`, else
/// removed with its contents.
pub(crate) fn clear(dir: BorrowedFd<'_>, name: &OsStr, keep_dir: bool) -> io::Result<Cleared> {
    let stat = match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(s) => s,
        Err(Errno::NOENT) => return Ok(Cleared::Nothing),
        Err(e) => return Err(e.into()),
    };
    if FileType::from_raw_mode(stat.st_mode) == FileType::Directory {
        if keep_dir {
            return Ok(Cleared::KeptDir);
        }
        remove_tree(dir, name)?;
    } else {
        rustix::fs::unlinkat(dir, name, AtFlags::empty())?;
    }
    Ok(Cleared::Removed)
}

/// `rm -rf dir/name` using only fd-relative calls, never following symlinks.
pub(crate) fn remove_tree(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut children = Vec::new();
    let mut listing = Dir::read_from(&fd)?;
    while let Some(entry) = listing.read() {
        let entry = entry?;
        let child = entry.file_name().to_bytes();
        if child == b"." || child == b".." {
            continue;
        }
        children.push((child.to_vec(), entry.file_type()));
    }
    for (child, kind) in children {
        let child = OsStr::from_bytes(&child);
        if kind == FileType::Directory {
            remove_tree(fd.as_fd(), child)?;
        } else {
            rustix::fs::unlinkat(&fd, child, AtFlags::empty())?;
        }
    }
    rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(s: &str) -> Vec<Vec<u8>> {
        s.split('/').map(|p| p.as_bytes().to_vec()).collect()
    }

    #[test]
    fn symlinks_resolve_inside_the_root() {
        let outside = tempfile::tempdir().unwrap();
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("target")).unwrap();
        std::os::unix::fs::symlink("/target", root.path().join("abs")).unwrap();
        std::os::unix::fs::symlink("../../../..", root.path().join("up")).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("host")).unwrap();
        let fd = open_root(root.path()).unwrap();

        mkdir_all(fd.as_fd(), &parts("abs/sub")).unwrap();
        mkdir_all(fd.as_fd(), &parts("up/other")).unwrap();
        // The host path does not exist inside the root: a dangling link.
        let err = mkdir_all(fd.as_fd(), &parts("host/sub")).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(Errno::NOTDIR.raw_os_error()));

        assert!(root.path().join("target/sub").is_dir());
        assert!(root.path().join("other").is_dir());
        assert!(std::fs::read_dir(outside.path()).unwrap().next().is_none());
    }

    #[test]
    fn clear_and_remove_tree() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("d/e/f")).unwrap();
        std::fs::write(root.path().join("d/e/f/x"), b"x").unwrap();
        std::os::unix::fs::symlink("/", root.path().join("d/link")).unwrap();
        std::fs::write(root.path().join("file"), b"x").unwrap();
        let fd = open_root(root.path()).unwrap();
        let d = OsStr::new("d");
        assert_eq!(clear(fd.as_fd(), d, true).unwrap(), Cleared::KeptDir);
        assert_eq!(clear(fd.as_fd(), d, false).unwrap(), Cleared::Removed);
        assert!(!root.path().join("d").exists());
        assert_eq!(
            clear(fd.as_fd(), OsStr::new("file"), true).unwrap(),
            Cleared::Removed
        );
        assert_eq!(
            clear(fd.as_fd(), OsStr::new("none"), false).unwrap(),
            Cleared::Nothing
        );
    }

    #[test]
    fn mkdir_all_refuses_non_directories() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("f"), b"x").unwrap();
        let fd = open_root(root.path()).unwrap();
        let err = mkdir_all(fd.as_fd(), &parts("f/sub")).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(Errno::NOTDIR.raw_os_error()));
    }
}

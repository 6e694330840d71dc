//! OCI/AUFS whiteouts converted to overlayfs form, as containerd's
//! `OverlayConvertWhiteout` does: the layer directory can then be used as an
//! overlay `lowerdir` directly.

use std::ffi::OsStr;
use std::io;
use std::os::fd::BorrowedFd;

use rustix::fs::{AtFlags, FileType, Gid, Mode, Uid, XattrFlags};

const PREFIX: &[u8] = b".wh.";
const META_PREFIX: &[u8] = b".wh..wh.";
const OPAQUE: &[u8] = b".wh..wh..opq";

/// The overlayfs xattr that makes a directory hide lower layers' contents.
/// It is `trusted.*`, which is why layers may never set it themselves.
pub(crate) const OPAQUE_XATTR: &str = "trusted.overlay.opaque";

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Whiteout<'a> {
    /// Not a whiteout: write the entry normally.
    None,
    /// `.wh..wh..opq`: the containing directory is opaque.
    Opaque,
    /// Other `.wh..wh.*` names are AUFS bookkeeping (hardlink dirs); Docker's
    /// overlay2 driver skips them too.
    Meta,
    /// `.wh.<name>`: `<name>` from lower layers is deleted.
    Delete(&'a [u8]),
}

pub(crate) fn classify(base: &[u8]) -> Whiteout<'_> {
    if base == OPAQUE {
        Whiteout::Opaque
    } else if base.starts_with(META_PREFIX) {
        Whiteout::Meta
    } else if let Some(name) = base.strip_prefix(PREFIX) {
        Whiteout::Delete(name)
    } else {
        Whiteout::None
    }
}

/// Marks the directory open as `dir` (a readable fd, `fsetxattr` does not
/// work on `O_PATH`) opaque.
pub(crate) fn mark_opaque(dir: BorrowedFd<'_>) -> io::Result<()> {
    rustix::fs::fsetxattr(dir, OPAQUE_XATTR, b"y", XattrFlags::empty())?;
    Ok(())
}

/// Creates overlayfs's whiteout, a 0:0 character device, named `name` in
/// `parent`, owned like the tar entry. The chown does not follow symlinks so
/// a racing symlink swap cannot redirect it.
pub(crate) fn make_whiteout(
    parent: BorrowedFd<'_>,
    name: &OsStr,
    uid: u32,
    gid: u32,
) -> io::Result<()> {
    rustix::fs::mknodat(
        parent,
        name,
        FileType::CharacterDevice,
        Mode::empty(),
        rustix::fs::makedev(0, 0),
    )?;
    rustix::fs::chownat(
        parent,
        name,
        Some(Uid::from_raw(uid)),
        Some(Gid::from_raw(gid)),
        AtFlags::SYMLINK_NOFOLLOW,
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_names() {
        assert_eq!(classify(b"file"), Whiteout::None);
        assert_eq!(classify(b".wh..wh..opq"), Whiteout::Opaque);
        assert_eq!(classify(b".wh..wh.plnk"), Whiteout::Meta);
        assert_eq!(classify(b".wh.passwd"), Whiteout::Delete(b"passwd"));
        assert_eq!(classify(b".wh."), Whiteout::Delete(b""));
        assert_eq!(classify(b"x.wh.y"), Whiteout::None);
    }
}

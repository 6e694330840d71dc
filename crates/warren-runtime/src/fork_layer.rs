//! Fork layers: a sandbox's overlay upper directory (its filesystem
//! changes) copied once into a read-only layer that other sandboxes' roots
//! are built on, between their own fresh upper directory and the image.
//!
//! The copy is in overlayfs' own format, so it can be a `lowerdir` as it
//! is: whiteouts (0:0 character devices) and opaque directories
//! (`trusted.overlay.opaque`) are kept. Owners are stored as the image's
//! layers store them, in the sandbox's own ids (its root is uid 0): the
//! upper directory holds the source's host ids, and each child sees the
//! layer through an id-mapped mount of its own range (see [`crate::userns`]).
//! An id outside the source's range, which the source saw as the overflow
//! id, is stored as that id (65534).
//!
//! Kept besides: modes (setuid and setgid included), times, hard links
//! within the layer, holes in sparse files, `user.*` extended attributes.
//! Not kept: other extended attributes (file capabilities, ACLs), sockets
//! and device nodes (a sandbox cannot make the latter). Nothing is
//! followed: the tree is walked with directory descriptors and every open
//! refuses symlinks.

use std::collections::HashMap;
use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Gid, Mode, OFlags, SeekFrom, Stat, Timestamps, Uid};
use rustix::io::Errno;

use crate::userns::IdRange;
use crate::RuntimeError;

/// The overlayfs xattr of a directory that hides the lower layers' entries.
const OPAQUE_XATTR: &[u8] = b"trusted.overlay.opaque";
/// Overlay features that put part of a file's meaning in the layers below
/// (a renamed directory, a metadata-only copy-up): an upper that uses them
/// cannot be moved onto another stack. Warren's mounts never turn them on.
const UNMOVABLE_XATTRS: &[&[u8]] = &[b"trusted.overlay.redirect", b"trusted.overlay.metacopy"];
/// Directory levels a layer may have; deeper trees are refused rather than
/// walked with a descriptor per level.
const MAX_DEPTH: usize = 1024;
/// The overflow id: what a sandbox sees for an id outside its range.
const NOBODY: u32 = 65534;

/// What a copy made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LayerCopy {
    /// Bytes of regular-file data copied (holes not counted; data is
    /// found by the block).
    pub bytes: u64,
    /// Files, directories, links and whiteouts.
    pub entries: u64,
}

struct Ctx<'a> {
    ids: Option<IdRange>,
    /// The layer's root, for hard links to entries made earlier.
    dest_root: BorrowedFd<'a>,
    /// Files with several links: the first copy's path in the layer.
    links: HashMap<(u64, u64), PathBuf>,
    copied: LayerCopy,
    /// Bytes the copy may still write (the node's free disk above its floor).
    budget: u64,
}

impl Ctx<'_> {
    fn owner(&self, st: &Stat) -> (Uid, Gid) {
        let inside = |host: u32| match self.ids {
            None => host,
            Some(r) => r.inside(host).unwrap_or(NOBODY),
        };
        (
            Uid::from_raw(inside(st.st_uid)),
            Gid::from_raw(inside(st.st_gid)),
        )
    }

    fn spend(&mut self, bytes: u64, what: &Path) -> Result<(), RuntimeError> {
        if bytes > self.budget {
            return Err(RuntimeError::NoRoom(format!(
                "the fork layer does not fit on the node's disk above its free-space floor \
                 (at {}); free space, or fork a sandbox with fewer changes",
                what.display()
            )));
        }
        self.budget -= bytes;
        self.copied.bytes += bytes;
        Ok(())
    }
}

/// Copies the upper directory `upper` of a sandbox with id range `ids`
/// (None: it shares the host's ids) into `dest`, which must not exist. The
/// sandbox must not change `upper` meanwhile (freeze it). At most `budget`
/// bytes of file data are written; on any error `dest` is removed again.
pub fn copy_upper(
    upper: &Path,
    ids: Option<IdRange>,
    dest: &Path,
    budget: u64,
) -> Result<LayerCopy, RuntimeError> {
    let result = copy_upper_inner(upper, ids, dest, budget);
    if result.is_err() {
        let _ = std::fs::remove_dir_all(dest);
    }
    result
}

fn copy_upper_inner(
    upper: &Path,
    ids: Option<IdRange>,
    dest: &Path,
    budget: u64,
) -> Result<LayerCopy, RuntimeError> {
    let err = |what: &str, path: &Path| {
        let what = format!("{what} {}", path.display());
        move |e: Errno| RuntimeError::Io {
            what,
            source: e.into(),
        }
    };
    let dir_flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let src = rustix::fs::open(upper, dir_flags, Mode::empty()).map_err(err("open", upper))?;
    rustix::fs::mkdir(dest, Mode::from_raw_mode(0o700)).map_err(err("create", dest))?;
    let dst = rustix::fs::open(dest, dir_flags, Mode::empty()).map_err(err("open", dest))?;
    let mut ctx = Ctx {
        ids,
        dest_root: dst.as_fd(),
        links: HashMap::new(),
        copied: LayerCopy::default(),
        budget,
    };
    copy_dir(&src, &dst, Path::new(""), 0, &mut ctx)?;
    let st = rustix::fs::fstat(&src).map_err(err("stat", upper))?;
    finish_node(&src, &dst, &st, true, &ctx).map_err(err("copy attributes of", upper))?;
    Ok(ctx.copied)
}

fn copy_dir(
    src: &OwnedFd,
    dst: &OwnedFd,
    rel: &Path,
    depth: usize,
    ctx: &mut Ctx<'_>,
) -> Result<(), RuntimeError> {
    if depth > MAX_DEPTH {
        return Err(RuntimeError::Files(format!(
            "{} is more than {MAX_DEPTH} directories deep; such a tree cannot be forked",
            rel.display()
        )));
    }
    let io_err = |what: &str, path: &Path| {
        let what = format!("{what} /{}", path.display());
        move |e: Errno| RuntimeError::Io {
            what,
            source: e.into(),
        }
    };
    let mut names: Vec<CString> = Vec::new();
    for entry in rustix::fs::Dir::read_from(src).map_err(io_err("list", rel))? {
        let entry = entry.map_err(io_err("list", rel))?;
        let name = entry.file_name();
        if name != c"." && name != c".." {
            names.push(name.to_owned());
        }
    }
    for name in names {
        let at = rel.join(OsStr::from_bytes(name.as_bytes()));
        let st = rustix::fs::statat(src, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW)
            .map_err(io_err("stat", &at))?;
        copy_entry(src, dst, &name, &at, &st, depth, ctx)?;
        ctx.copied.entries += 1;
    }
    Ok(())
}

fn copy_entry(
    src: &OwnedFd,
    dst: &OwnedFd,
    name: &CStr,
    at: &Path,
    st: &Stat,
    depth: usize,
    ctx: &mut Ctx<'_>,
) -> Result<(), RuntimeError> {
    let io_err = |what: &str| {
        let what = format!("{what} /{}", at.display());
        move |e: Errno| RuntimeError::Io {
            what,
            source: e.into(),
        }
    };
    let (uid, gid) = ctx.owner(st);
    let mode = Mode::from_raw_mode(st.st_mode & 0o7777);
    match FileType::from_raw_mode(st.st_mode) {
        FileType::Directory => {
            rustix::fs::mkdirat(dst, name, Mode::from_raw_mode(0o700))
                .map_err(io_err("create directory"))?;
            let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
            let s = rustix::fs::openat(src, name, flags, Mode::empty())
                .map_err(io_err("open directory"))?;
            let d = rustix::fs::openat(dst, name, flags, Mode::empty())
                .map_err(io_err("open directory"))?;
            copy_dir(&s, &d, at, depth + 1, ctx)?;
            finish_node(&s, &d, st, true, ctx).map_err(io_err("copy attributes of"))
        }
        FileType::RegularFile => {
            let key = (st.st_dev, st.st_ino);
            if st.st_nlink > 1 {
                if let Some(first) = ctx.links.get(&key) {
                    return rustix::fs::linkat(ctx.dest_root, first, dst, name, AtFlags::empty())
                        .map_err(io_err("link"));
                }
                ctx.links.insert(key, at.to_path_buf());
            }
            let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NOCTTY;
            let s = rustix::fs::openat(src, name, flags, Mode::empty()).map_err(io_err("open"))?;
            let d = rustix::fs::openat(
                dst,
                name,
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            )
            .map_err(io_err("create"))?;
            // Blocks for every byte: no holes to look for.
            let dense = (st.st_blocks as u64).saturating_mul(512) >= st.st_size as u64;
            copy_data(&s, &d, st.st_size as u64, dense, at, ctx)?;
            finish_node(&s, &d, st, false, ctx).map_err(io_err("copy attributes of"))
        }
        FileType::Symlink => {
            let target =
                rustix::fs::readlinkat(src, name, Vec::new()).map_err(io_err("read link"))?;
            rustix::fs::symlinkat(target.as_c_str(), dst, name).map_err(io_err("create link"))?;
            rustix::fs::chownat(dst, name, Some(uid), Some(gid), AtFlags::SYMLINK_NOFOLLOW)
                .map_err(io_err("chown"))?;
            rustix::fs::utimensat(dst, name, &times(st), AtFlags::SYMLINK_NOFOLLOW)
                .map_err(io_err("set times of"))
        }
        FileType::CharacterDevice if st.st_rdev == 0 => {
            // overlayfs' whiteout: the entry below is deleted.
            rustix::fs::mknodat(dst, name, FileType::CharacterDevice, Mode::empty(), 0)
                .map_err(io_err("create whiteout"))?;
            rustix::fs::chownat(dst, name, Some(uid), Some(gid), AtFlags::SYMLINK_NOFOLLOW)
                .map_err(io_err("chown"))
        }
        FileType::Fifo => {
            rustix::fs::mknodat(dst, name, FileType::Fifo, Mode::from_raw_mode(0o600), 0)
                .map_err(io_err("create fifo"))?;
            rustix::fs::chownat(dst, name, Some(uid), Some(gid), AtFlags::SYMLINK_NOFOLLOW)
                .map_err(io_err("chown"))?;
            rustix::fs::chmodat(dst, name, mode, AtFlags::empty()).map_err(io_err("chmod"))?;
            rustix::fs::utimensat(dst, name, &times(st), AtFlags::SYMLINK_NOFOLLOW)
                .map_err(io_err("set times of"))
        }
        _ => {
            tracing::warn!(path = %at.display(), "not forked: sockets and device nodes are not carried into fork layers");
            Ok(())
        }
    }
}

/// Copies a regular file's data range by range, skipping holes, in the
/// kernel (`copy_file_range`); the length is set at the end so a trailing
/// hole stays one.
fn copy_data(
    src: &OwnedFd,
    dst: &OwnedFd,
    size: u64,
    dense: bool,
    at: &Path,
    ctx: &mut Ctx<'_>,
) -> Result<(), RuntimeError> {
    let io_err = |what: &str| {
        let what = format!("{what} /{}", at.display());
        move |e: Errno| RuntimeError::Io {
            what,
            source: e.into(),
        }
    };
    if dense {
        if size > 0 {
            ctx.spend(size, at)?;
            copy_range(src, dst, 0, size, at)?;
        }
        return Ok(());
    }
    let mut pos = 0u64;
    while pos < size {
        let start = match rustix::fs::seek(src, SeekFrom::Data(pos)) {
            Ok(p) => p,
            Err(Errno::NXIO) => break,
            // No hole support: all of it is data.
            Err(Errno::INVAL) => pos,
            Err(e) => return Err(io_err("read")(e)),
        };
        let end = match rustix::fs::seek(src, SeekFrom::Hole(start)) {
            Ok(p) => p.min(size),
            Err(Errno::INVAL) => size,
            Err(e) => return Err(io_err("read")(e)),
        };
        if end <= start {
            break;
        }
        ctx.spend(end - start, at)?;
        copy_range(src, dst, start, end, at)?;
        pos = end;
    }
    rustix::fs::ftruncate(dst, size).map_err(io_err("size"))
}

/// Copies bytes `start..end` to the same offsets, in the kernel where it
/// can (`copy_file_range`).
fn copy_range(
    src: &OwnedFd,
    dst: &OwnedFd,
    start: u64,
    end: u64,
    at: &Path,
) -> Result<(), RuntimeError> {
    let failed = |source: io::Error| RuntimeError::Io {
        what: format!("copy /{}", at.display()),
        source,
    };
    let (mut off_in, mut off_out) = (start, start);
    while off_in < end {
        let len = usize::try_from(end - off_in)
            .unwrap_or(usize::MAX)
            .min(1 << 30);
        match rustix::fs::copy_file_range(src, Some(&mut off_in), dst, Some(&mut off_out), len) {
            // The file shrank under us (the sandbox was not frozen).
            Ok(0) => break,
            Ok(_) => {}
            Err(Errno::XDEV | Errno::NOSYS | Errno::OPNOTSUPP) => {
                return copy_plain(src, dst, &mut off_in, &mut off_out, end).map_err(failed);
            }
            Err(e) => return Err(failed(e.into())),
        }
    }
    Ok(())
}

fn copy_plain(
    src: &OwnedFd,
    dst: &OwnedFd,
    off_in: &mut u64,
    off_out: &mut u64,
    end: u64,
) -> io::Result<()> {
    let mut buf = vec![0u8; 256 << 10];
    while *off_in < end {
        let want = usize::try_from(end - *off_in)
            .unwrap_or(usize::MAX)
            .min(buf.len());
        let n = rustix::io::pread(src, &mut buf[..want], *off_in)?;
        if n == 0 {
            break;
        }
        let mut done = 0;
        while done < n {
            done += rustix::io::pwrite(dst, &buf[done..n], *off_out + done as u64)?;
        }
        *off_in += n as u64;
        *off_out += n as u64;
    }
    Ok(())
}

fn times(st: &Stat) -> Timestamps {
    Timestamps {
        last_access: rustix::fs::Timespec {
            tv_sec: st.st_atime,
            tv_nsec: st.st_atime_nsec as _,
        },
        last_modification: rustix::fs::Timespec {
            tv_sec: st.st_mtime,
            tv_nsec: st.st_mtime_nsec as _,
        },
    }
}

/// Owner, then mode (a chown clears setuid bits), extended attributes and
/// times of a copied file or directory.
fn finish_node(
    src: &OwnedFd,
    dst: &OwnedFd,
    st: &Stat,
    dir: bool,
    ctx: &Ctx<'_>,
) -> Result<(), Errno> {
    let (uid, gid) = ctx.owner(st);
    rustix::fs::fchown(dst, Some(uid), Some(gid))?;
    rustix::fs::fchmod(dst, Mode::from_raw_mode(st.st_mode & 0o7777))?;
    copy_xattrs(src, dst, dir)?;
    rustix::fs::futimens(dst, &times(st))
}

fn copy_xattrs(src: &OwnedFd, dst: &OwnedFd, dir: bool) -> Result<(), Errno> {
    let mut names = vec![0u8; 4096];
    let n = loop {
        match rustix::fs::flistxattr(src, &mut names[..]) {
            Ok(n) => break n,
            Err(Errno::RANGE) if names.len() < 1 << 16 => names.resize(names.len() * 4, 0),
            Err(Errno::NOTSUP) => return Ok(()),
            Err(e) => return Err(e),
        }
    };
    for name in names[..n].split(|b| *b == 0).filter(|n| !n.is_empty()) {
        if UNMOVABLE_XATTRS.contains(&name) {
            // Never made by Warren's overlay mounts (redirect_dir and
            // metacopy stay off); refused rather than copied wrong.
            return Err(Errno::NOTSUP);
        }
        let keep = name.starts_with(b"user.") || (dir && name == OPAQUE_XATTR);
        if !keep {
            continue;
        }
        let Ok(cname) = CString::new(name) else {
            continue;
        };
        let mut value = vec![0u8; 4096];
        let len = loop {
            match rustix::fs::fgetxattr(src, cname.as_c_str(), &mut value[..]) {
                Ok(len) => break len,
                Err(Errno::RANGE) if value.len() < 1 << 16 => value.resize(value.len() * 4, 0),
                Err(e) => return Err(e),
            }
        };
        rustix::fs::fsetxattr(
            dst,
            cname.as_c_str(),
            &value[..len],
            rustix::fs::XattrFlags::empty(),
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn root() -> bool {
        nix::unistd::geteuid().is_root()
    }

    #[test]
    fn copies_files_links_holes_and_overlay_markers_with_shifted_owners() {
        if !root() {
            eprintln!("skipped: whiteouts and owners need root");
            return;
        }
        let tmp = tempfile::tempdir().expect("tempdir");
        let upper = tmp.path().join("upper");
        let base = (1u32 << 30) + 5 * 65536;
        let ids = IdRange { base };
        std::fs::create_dir_all(upper.join("etc/deep")).expect("mkdir");
        std::fs::write(upper.join("etc/deep/f"), b"hello").expect("write");
        std::os::unix::fs::chown(
            upper.join("etc/deep/f"),
            Some(base + 1000),
            Some(base + 1001),
        )
        .expect("chown");
        std::os::unix::fs::chown(upper.join("etc"), Some(base), Some(base)).expect("chown");
        // A file owned outside the range (the sandbox saw it as nobody).
        std::fs::write(upper.join("outside"), b"x").expect("write");
        std::os::unix::fs::chown(upper.join("outside"), Some(7), Some(7)).expect("chown");
        std::fs::write(upper.join("suid"), b"#!").expect("write");
        std::os::unix::fs::chown(upper.join("suid"), Some(base), Some(base)).expect("chown");
        std::fs::set_permissions(upper.join("suid"), std::fs::Permissions::from_mode(0o4755))
            .expect("chmod");
        std::os::unix::fs::symlink("deep/f", upper.join("etc/link")).expect("symlink");
        std::fs::hard_link(upper.join("etc/deep/f"), upper.join("hard")).expect("link");
        // A sparse file: 64 MiB long, 4 bytes of data.
        let sparse = std::fs::File::create(upper.join("sparse")).expect("create");
        sparse.set_len(64 << 20).expect("truncate");
        rustix::io::pwrite(&sparse, b"tail", (64 << 20) - 4).expect("pwrite");
        drop(sparse);
        rustix::fs::mknodat(
            rustix::fs::CWD,
            upper.join("deleted"),
            FileType::CharacterDevice,
            Mode::empty(),
            0,
        )
        .expect("whiteout");
        std::fs::create_dir(upper.join("opaque")).expect("mkdir");
        rustix::fs::setxattr(
            upper.join("opaque"),
            "trusted.overlay.opaque",
            b"y",
            rustix::fs::XattrFlags::empty(),
        )
        .expect("opaque");
        rustix::fs::setxattr(
            upper.join("outside"),
            "user.note",
            b"kept",
            rustix::fs::XattrFlags::empty(),
        )
        .expect("user xattr");

        let dest = tmp.path().join("layer");
        let copied = copy_upper(&upper, Some(ids), &dest, u64::MAX).expect("copy");
        // The sparse file's data is copied by the block it sits in.
        assert!((12..=12 + 4096).contains(&copied.bytes), "{copied:?}");
        let meta = |p: &str| std::fs::symlink_metadata(dest.join(p)).expect(p);
        assert_eq!(
            std::fs::read(dest.join("etc/deep/f")).expect("read"),
            b"hello"
        );
        assert_eq!(
            (meta("etc/deep/f").uid(), meta("etc/deep/f").gid()),
            (1000, 1001)
        );
        assert_eq!(meta("etc").uid(), 0);
        assert_eq!(meta("outside").uid(), NOBODY);
        assert_eq!(meta("suid").mode() & 0o7777, 0o4755);
        assert_eq!(
            std::fs::read_link(dest.join("etc/link")).expect("readlink"),
            Path::new("deep/f")
        );
        assert_eq!(meta("hard").ino(), meta("etc/deep/f").ino());
        assert_eq!(meta("sparse").len(), 64 << 20);
        assert!(meta("sparse").blocks() < 1024, "holes stay holes");
        let wh = meta("deleted");
        assert!(std::os::unix::fs::FileTypeExt::is_char_device(
            &wh.file_type()
        ));
        assert_eq!(wh.rdev(), 0);
        let mut v = [0u8; 4];
        let n = rustix::fs::lgetxattr(dest.join("opaque"), "trusted.overlay.opaque", &mut v)
            .expect("opaque kept");
        assert_eq!(&v[..n], b"y");
        let n = rustix::fs::lgetxattr(dest.join("outside"), "user.note", &mut v)
            .expect("user xattr kept");
        assert_eq!(&v[..n], b"kept");

        // Over budget: refused, and nothing is left.
        let small = tmp.path().join("small");
        let e = copy_upper(&upper, Some(ids), &small, 3).expect_err("over budget");
        assert!(matches!(e, RuntimeError::NoRoom(_)), "{e}");
        assert!(!small.exists());
    }
}

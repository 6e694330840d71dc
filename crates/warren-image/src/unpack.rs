//! Applying one layer tar to an empty directory, safely.
//!
//! The directory becomes an overlayfs lower layer, so whiteouts are converted
//! (see `whiteout`), and everything a hostile layer could use against the
//! host is refused: device nodes, path escapes, writes through planted
//! symlinks, hard links to files outside the layer and privileged xattrs.
//! The diffID is computed over the decompressed stream as it is applied.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read, Seek, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Gid, Mode, OFlags, Timespec, Timestamps, Uid, XattrFlags};
use rustix::io::Errno;

use crate::compress;
use crate::confine::{self, Cleared};
use crate::digest::HashingReader;
use crate::error::{ImageError, IoContext};
use crate::whiteout::{self, Whiteout};

/// Largest file a layer may hold; real images never come near it.
const MAX_FILE_SIZE: u64 = 1 << 40;

/// Largest GNU sparse entry. Such an entry declares its size apart from the
/// bytes it carries, so a few hundred bytes can announce terabytes of
/// zeros, which tar hands over one by one: even written as holes they cost
/// CPU time in proportion. Image builders do not write sparse entries.
const MAX_SPARSE_SIZE: u64 = 1 << 30;

/// Free space unpacking never eats into, so that sandboxes, logs and the
/// state store can still write when a layer is too big for the disk or a
/// few megabytes of gzip decompress to terabytes.
const DISK_RESERVE: u64 = 1 << 30;

/// How often (in bytes written) free space is checked.
const ROOM_CHECK_EVERY: u64 = 64 << 20;

pub(crate) struct LayerStats {
    /// sha256 of the decompressed tar stream.
    pub diff_id: String,
    /// Bytes of regular-file content written.
    pub size: u64,
}

/// Unpacks the (gzip, zstd or plain) layer tar read from `blob` into the
/// empty directory `dest`. `what` names the layer in messages.
pub(crate) fn unpack_layer<R: Read>(
    blob: R,
    dest: &Path,
    what: &str,
) -> Result<LayerStats, ImageError> {
    let root = confine::open_root(dest).ctx(|| format!("opening {}", dest.display()))?;
    let (_, decompressed) = compress::decompress(blob).map_err(|e| corrupt(what, &e))?;
    let mut stream = HashingReader::new(decompressed);
    let mut unpacker = Unpacker {
        root,
        dest,
        what,
        size: 0,
        // Checked at the first byte written: a disk already short of room
        // must not wait 64 MiB to say so.
        unchecked: ROOM_CHECK_EVERY,
        dir_times: Vec::new(),
    };
    {
        let mut tar = tar::Archive::new(&mut stream);
        for entry in tar.entries().map_err(|e| corrupt(what, &e))? {
            let entry = entry.map_err(|e| corrupt(what, &e))?;
            unpacker.apply(entry)?;
        }
    }
    unpacker.restore_dir_times()?;
    // The diffID covers the whole stream, including padding after the tar's
    // end-of-archive blocks.
    let (diff_id, _) = stream.finish().map_err(|e| corrupt(what, &e))?;
    Ok(LayerStats {
        diff_id,
        size: unpacker.size,
    })
}

fn corrupt(what: &str, e: &io::Error) -> ImageError {
    ImageError::InvalidArchive(format!(
        "{what}: the layer data cannot be read ({e}); the archive is corrupt, re-export it"
    ))
}

/// Ownership, permissions, times and xattrs of one entry.
struct Meta {
    uid: u32,
    gid: u32,
    mode: u32,
    times: Timestamps,
    xattrs: Vec<(String, Vec<u8>)>,
}

struct Unpacker<'a> {
    root: OwnedFd,
    dest: &'a Path,
    what: &'a str,
    size: u64,
    /// Bytes written since free space was last checked.
    unchecked: u64,
    /// Directory times are restored last: creating children would otherwise
    /// bump them again.
    dir_times: Vec<(Vec<Vec<u8>>, Timestamps)>,
}

impl Unpacker<'_> {
    fn apply<R: Read>(&mut self, mut entry: tar::Entry<'_, R>) -> Result<(), ImageError> {
        let kind = entry.header().entry_type();
        if kind.is_pax_global_extensions() {
            return Ok(());
        }
        let raw_path = entry.path_bytes().into_owned();
        let shown = String::from_utf8_lossy(&raw_path).into_owned();
        let parts = self.entry_parts(&raw_path, &shown)?;
        let Some((base, parent)) = parts.split_last() else {
            // The layer root itself: like containerd, keep our own.
            return Ok(());
        };
        let meta = self.meta(&mut entry, &shown)?;

        match whiteout::classify(base) {
            Whiteout::None => {}
            Whiteout::Meta => return Ok(()),
            Whiteout::Opaque => {
                self.mkdir_all(parent, &shown)?;
                let dir = confine::open_dir(self.root.as_fd(), parent, true)
                    .ctx(|| self.at(&shown, "opening the opaque directory"))?;
                return whiteout::mark_opaque(dir.as_fd())
                    .ctx(|| self.at(&shown, "setting trusted.overlay.opaque (needs root)"));
            }
            Whiteout::Delete(name) => {
                if name.is_empty() || name == b"." || name == b".." {
                    return Err(self.invalid(&shown, "is a whiteout without a valid file name"));
                }
                let dir = self.mkdir_all(parent, &shown)?;
                let name = OsStr::from_bytes(name);
                confine::clear(dir.as_fd(), name, false)
                    .ctx(|| self.at(&shown, "removing the whited-out entry"))?;
                return whiteout::make_whiteout(dir.as_fd(), name, meta.uid, meta.gid)
                    .ctx(|| self.at(&shown, "creating the overlay whiteout (needs root)"));
            }
        }

        use tar::EntryType as T;
        match kind {
            T::Regular | T::Continuous | T::GNUSparse => {
                let (declared, limit) = match entry.header().as_gnu() {
                    Some(gnu) if kind == T::GNUSparse => {
                        (gnu.real_size().unwrap_or(u64::MAX), MAX_SPARSE_SIZE)
                    }
                    _ => (entry.size(), MAX_FILE_SIZE),
                };
                if declared > limit {
                    return Err(self.too_big(&shown, declared, limit));
                }
                let dir = self.mkdir_all(parent, &shown)?;
                self.write_file(dir, OsStr::from_bytes(base), &mut entry, &meta, &shown)
            }
            T::Directory => {
                let dir = self.mkdir_all(parent, &shown)?;
                self.make_dir(dir, OsStr::from_bytes(base), &parts, meta, &shown)
            }
            T::Symlink => {
                let dir = self.mkdir_all(parent, &shown)?;
                self.make_symlink(dir, OsStr::from_bytes(base), &entry, &meta, &shown)
            }
            T::Link => {
                let dir = self.mkdir_all(parent, &shown)?;
                self.make_hardlink(dir, OsStr::from_bytes(base), &entry, &shown)
            }
            T::Char | T::Block | T::Fifo => Err(ImageError::UnsafeLayer(format!(
                "{}: {shown} is a {}; device nodes and fifos are not allowed in images (the \
                 sandbox runtime provides /dev), rebuild the image without them",
                self.what,
                match kind {
                    T::Char => "character device",
                    T::Block => "block device",
                    _ => "fifo",
                }
            ))),
            other => Err(self.invalid(
                &shown,
                &format!(
                    "has unsupported tar entry type {:?}",
                    other.as_byte() as char
                ),
            )),
        }
    }

    /// Splits an entry name into components, refusing `..` that would climb
    /// out of the layer. A leading `/` means the layer root, as containerd
    /// and tar treat it (ko-built images use such names); the name is then
    /// only ever resolved inside the layer.
    fn entry_parts(&self, raw: &[u8], shown: &str) -> Result<Vec<Vec<u8>>, ImageError> {
        if raw.contains(&0) {
            return Err(self.invalid(shown, "contains a NUL byte in its name"));
        }
        let mut parts: Vec<Vec<u8>> = Vec::new();
        for part in raw.split(|b| *b == b'/') {
            match part {
                b"" | b"." => {}
                b".." => {
                    if parts.pop().is_none() {
                        return Err(ImageError::UnsafeLayer(format!(
                            "{}: entry {shown:?} climbs out of the layer with '..'; the layer \
                             is malicious or broken, do not run it",
                            self.what
                        )));
                    }
                }
                p => parts.push(p.to_vec()),
            }
        }
        Ok(parts)
    }

    fn meta<R: Read>(
        &self,
        entry: &mut tar::Entry<'_, R>,
        shown: &str,
    ) -> Result<Meta, ImageError> {
        let header = entry.header();
        let bad =
            |field: &str, e: io::Error| self.invalid(shown, &format!("has a bad {field} ({e})"));
        let id = |v: u64, field: &str| {
            u32::try_from(v)
                .ok()
                .filter(|v| *v != u32::MAX)
                .ok_or_else(|| self.invalid(shown, &format!("has {field} {v}, outside 0..2^32-1")))
        };
        // tar-rs already applied PAX uid/gid overrides to the header.
        let uid = id(header.uid().map_err(|e| bad("uid", e))?, "uid")?;
        let gid = id(header.gid().map_err(|e| bad("gid", e))?, "gid")?;
        let mode = header.mode().map_err(|e| bad("mode", e))? & 0o7777;
        let secs = header.mtime().map_err(|e| bad("mtime", e))?;
        let mut mtime = Timespec {
            tv_sec: i64::try_from(secs).unwrap_or(i64::MAX),
            tv_nsec: 0,
        };
        let mut atime = None;
        let mut xattrs = Vec::new();

        let pax = entry.pax_extensions().map_err(|e| bad("PAX header", e))?;
        if let Some(pax) = pax {
            for ext in pax {
                let ext = ext.map_err(|e| bad("PAX record", e))?;
                let key = ext.key_bytes();
                if key == b"mtime" {
                    mtime = parse_pax_time(ext.value_bytes()).unwrap_or(mtime);
                } else if key == b"atime" {
                    atime = parse_pax_time(ext.value_bytes());
                } else if let Some(name) = key.strip_prefix(b"SCHILY.xattr.") {
                    let name = String::from_utf8_lossy(name).into_owned();
                    self.check_xattr(&name, shown)?;
                    xattrs.push((name, ext.value_bytes().to_vec()));
                } else if let Some(name) = key.strip_prefix(b"LIBARCHIVE.xattr.") {
                    // bsdtar's form: percent-encoded name, base64 value.
                    // Container tooling does not write it; vet the name so
                    // it cannot smuggle a privileged xattr, then drop it.
                    let name = percent_decode(name);
                    self.check_xattr(&name, shown)?;
                    tracing::warn!(layer = self.what, entry = shown, xattr = %name,
                        "dropping LIBARCHIVE.xattr record (unsupported encoding)");
                }
            }
        }
        Ok(Meta {
            uid,
            gid,
            mode,
            times: Timestamps {
                last_access: atime.unwrap_or(mtime),
                last_modification: mtime,
            },
            xattrs,
        })
    }

    fn check_xattr(&self, name: &str, shown: &str) -> Result<(), ImageError> {
        let allowed = name.starts_with("user.")
            || name == "security.capability"
            || name == "system.posix_acl_access"
            || name == "system.posix_acl_default";
        if allowed {
            return Ok(());
        }
        let why = if name.starts_with("trusted.") {
            "trusted.* xattrs could forge overlayfs metadata (opaque, redirect, origin)"
        } else if name.starts_with("security.") {
            "security.* xattrs other than security.capability carry host security labels"
        } else {
            "only user.*, security.capability and POSIX ACL xattrs are accepted"
        };
        Err(ImageError::UnsafeLayer(format!(
            "{}: entry {shown:?} sets xattr {name}; {why}. Rebuild the image without it",
            self.what
        )))
    }

    fn mkdir_all(&self, parts: &[Vec<u8>], shown: &str) -> Result<OwnedFd, ImageError> {
        confine::mkdir_all(self.root.as_fd(), parts).map_err(|e| {
            let code = e.raw_os_error();
            if code == Some(Errno::NOTDIR.raw_os_error())
                || code == Some(Errno::LOOP.raw_os_error())
                || code == Some(Errno::EXIST.raw_os_error())
            {
                self.invalid(
                    shown,
                    &format!(
                        "has a parent path that is not a directory inside the layer ({e}; \
                         symlinks are resolved within the layer, never on the host)"
                    ),
                )
            } else {
                ImageError::io(self.at(shown, "creating parent directories"), e)
            }
        })
    }

    fn write_file<R: Read>(
        &mut self,
        dir: OwnedFd,
        name: &OsStr,
        entry: &mut tar::Entry<'_, R>,
        meta: &Meta,
        shown: &str,
    ) -> Result<(), ImageError> {
        confine::clear(dir.as_fd(), name, false).ctx(|| self.at(shown, "replacing"))?;
        let fd = rustix::fs::openat(
            &dir,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from(0o600),
        )
        .ctx(|| self.at(shown, "creating"))?;
        let mut file = File::from(fd);
        let mut buf = vec![0u8; 128 * 1024];
        let mut len: u64 = 0;
        loop {
            let n = match entry.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(corrupt(self.what, &e)),
            };
            // Zeros become a hole: a sparse entry's gaps (which tar hands
            // over as zeros) and long zero runs then cost no disk.
            if buf[..n].iter().all(|b| *b == 0) {
                file.seek(io::SeekFrom::Current(n as i64))
                    .ctx(|| self.at(shown, "seeking"))?;
            } else {
                file.write_all(&buf[..n])
                    .ctx(|| self.at(shown, "writing (is the disk full?)"))?;
                self.unchecked += n as u64;
                if self.unchecked >= ROOM_CHECK_EVERY {
                    self.unchecked = 0;
                    self.check_room(&file, shown)?;
                }
            }
            len += n as u64;
            self.size += n as u64;
            if len > MAX_FILE_SIZE {
                return Err(self.too_big(shown, len, MAX_FILE_SIZE));
            }
        }
        // A trailing hole has to be made explicitly.
        file.set_len(len)
            .ctx(|| self.at(shown, "setting the size"))?;
        self.set_attrs(file.as_fd(), meta, shown)?;
        rustix::fs::futimens(&file, &meta.times).ctx(|| self.at(shown, "setting times"))
    }

    fn make_dir(
        &mut self,
        parent: OwnedFd,
        name: &OsStr,
        parts: &[Vec<u8>],
        meta: Meta,
        shown: &str,
    ) -> Result<(), ImageError> {
        let cleared =
            confine::clear(parent.as_fd(), name, true).ctx(|| self.at(shown, "replacing"))?;
        if cleared != Cleared::KeptDir {
            rustix::fs::mkdirat(&parent, name, Mode::from(0o700))
                .ctx(|| self.at(shown, "creating directory"))?;
        }
        let fd = rustix::fs::openat(
            &parent,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .ctx(|| self.at(shown, "opening directory"))?;
        self.set_attrs(fd.as_fd(), &meta, shown)?;
        self.dir_times.push((parts.to_vec(), meta.times));
        Ok(())
    }

    fn make_symlink<R: Read>(
        &mut self,
        parent: OwnedFd,
        name: &OsStr,
        entry: &tar::Entry<'_, R>,
        meta: &Meta,
        shown: &str,
    ) -> Result<(), ImageError> {
        let target = entry.link_name_bytes().unwrap_or_default();
        if target.is_empty() || target.contains(&0) {
            return Err(self.invalid(shown, "is a symlink without a valid target"));
        }
        confine::clear(parent.as_fd(), name, false).ctx(|| self.at(shown, "replacing"))?;
        // The target is stored verbatim; it is only ever resolved inside the
        // layer (RESOLVE_IN_ROOT here, the container's root at run time).
        rustix::fs::symlinkat(OsStr::from_bytes(&target), &parent, name)
            .ctx(|| self.at(shown, "creating symlink"))?;
        rustix::fs::chownat(
            &parent,
            name,
            Some(Uid::from_raw(meta.uid)),
            Some(Gid::from_raw(meta.gid)),
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .ctx(|| self.at(shown, "chowning symlink"))?;
        if meta.xattrs.iter().any(|(n, _)| n.starts_with("user.")) {
            tracing::debug!(
                layer = self.what,
                entry = shown,
                "user.* xattrs on symlinks are not supported by Linux; skipped"
            );
        }
        rustix::fs::utimensat(&parent, name, &meta.times, AtFlags::SYMLINK_NOFOLLOW)
            .ctx(|| self.at(shown, "setting symlink times"))
    }

    fn make_hardlink<R: Read>(
        &mut self,
        parent: OwnedFd,
        name: &OsStr,
        entry: &tar::Entry<'_, R>,
        shown: &str,
    ) -> Result<(), ImageError> {
        let raw_target = entry.link_name_bytes().unwrap_or_default().into_owned();
        let target_shown = String::from_utf8_lossy(&raw_target).into_owned();
        let target = self.entry_parts(&raw_target, &target_shown)?;
        let outside = || {
            ImageError::UnsafeLayer(format!(
                "{}: hard link {shown:?} points to {target_shown:?}, which is not a file of this \
                 layer; hard links may only point to files earlier in the same layer",
                self.what
            ))
        };
        let Some((target_base, target_parent)) = target.split_last() else {
            return Err(outside());
        };
        let target_dir = match confine::open_dir(self.root.as_fd(), target_parent, false) {
            Ok(fd) => fd,
            Err(e)
                if e.raw_os_error() == Some(Errno::NOENT.raw_os_error())
                    || e.raw_os_error() == Some(Errno::NOTDIR.raw_os_error()) =>
            {
                return Err(outside())
            }
            Err(e) => return Err(ImageError::io(self.at(shown, "resolving link target"), e)),
        };
        let target_name = OsStr::from_bytes(target_base);
        match rustix::fs::statat(&target_dir, target_name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {
                return Err(self.invalid(shown, "is a hard link to a directory"))
            }
            Ok(st) => {
                let here = rustix::fs::statat(&parent, name, AtFlags::SYMLINK_NOFOLLOW).ok();
                if here.is_some_and(|h| h.st_ino == st.st_ino && h.st_dev == st.st_dev) {
                    return Ok(());
                }
            }
            Err(Errno::NOENT) => return Err(outside()),
            Err(e) => {
                return Err(ImageError::io(
                    self.at(shown, "checking link target"),
                    e.into(),
                ))
            }
        }
        confine::clear(parent.as_fd(), name, false).ctx(|| self.at(shown, "replacing"))?;
        // No AT_SYMLINK_FOLLOW: a link to a symlink links the symlink itself.
        rustix::fs::linkat(&target_dir, target_name, &parent, name, AtFlags::empty())
            .ctx(|| self.at(shown, "creating hard link"))
    }

    /// Ownership first: chown clears setuid/setgid bits and file
    /// capabilities, so mode and xattrs must come after it.
    fn set_attrs(
        &self,
        fd: std::os::fd::BorrowedFd<'_>,
        meta: &Meta,
        shown: &str,
    ) -> Result<(), ImageError> {
        rustix::fs::fchown(
            fd,
            Some(Uid::from_raw(meta.uid)),
            Some(Gid::from_raw(meta.gid)),
        )
        .ctx(|| self.at(shown, "chowning"))?;
        rustix::fs::fchmod(fd, Mode::from(meta.mode)).ctx(|| self.at(shown, "chmodding"))?;
        for (name, value) in &meta.xattrs {
            match rustix::fs::fsetxattr(fd, name.as_str(), value, XattrFlags::empty()) {
                Ok(()) => {}
                Err(Errno::NOTSUP) => {
                    tracing::warn!(layer = self.what, entry = shown, xattr = %name,
                        "filesystem does not support this xattr; skipped");
                }
                Err(e) => {
                    return Err(ImageError::io(
                        self.at(shown, &format!("setting xattr {name}")),
                        e.into(),
                    ))
                }
            }
        }
        Ok(())
    }

    fn restore_dir_times(&self) -> Result<(), ImageError> {
        for (parts, times) in self.dir_times.iter().rev() {
            let shown = confine::join(parts).display().to_string();
            let fd = confine::open_dir(self.root.as_fd(), parts, true)
                .ctx(|| self.at(&shown, "reopening directory"))?;
            rustix::fs::futimens(&fd, times).ctx(|| self.at(&shown, "setting directory times"))?;
        }
        Ok(())
    }

    fn check_room(&self, file: &File, shown: &str) -> Result<(), ImageError> {
        let st = rustix::fs::fstatvfs(file).ctx(|| self.at(shown, "checking free space"))?;
        let free = st.f_bavail.saturating_mul(st.f_frsize);
        if free < DISK_RESERVE {
            return Err(ImageError::NoRoom(format!(
                "{}: unpacking stopped at entry {shown:?} after {} MiB with {} MiB left on the \
                 node's disk, under the {} MiB kept free for sandboxes and Warren's state; free \
                 space (`warren image gc`, `--image-budget`) or check the image: a layer this \
                 large may be a decompression bomb",
                self.what,
                self.size >> 20,
                free >> 20,
                DISK_RESERVE >> 20
            )));
        }
        Ok(())
    }

    fn too_big(&self, shown: &str, size: u64, limit: u64) -> ImageError {
        ImageError::UnsafeLayer(format!(
            "{}: entry {shown:?} is {size} bytes, over the {limit}-byte limit for one such \
             file (sparse tar entries: 1 GiB, others: 1 TiB); the layer is malicious or \
             broken, do not run it, or rebuild it without `tar --sparse`",
            self.what
        ))
    }

    fn invalid(&self, shown: &str, problem: &str) -> ImageError {
        ImageError::InvalidArchive(format!(
            "{}: entry {shown:?} {problem}; the layer is malformed, rebuild the image",
            self.what
        ))
    }

    fn at(&self, shown: &str, doing: &str) -> String {
        format!(
            "{}: {doing} {shown:?} under {}",
            self.what,
            self.dest.display()
        )
    }
}

/// PAX times are decimal seconds with an optional fraction
/// (`1700000000.123456789`, possibly negative).
fn parse_pax_time(raw: &[u8]) -> Option<Timespec> {
    let text = std::str::from_utf8(raw).ok()?;
    let (negative, text) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (whole, frac) = text.split_once('.').unwrap_or((text, ""));
    let secs: i64 = whole.parse().ok()?;
    if !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut digits: String = frac.chars().take(9).collect();
    while digits.len() < 9 {
        digits.push('0');
    }
    let nanos: i64 = digits.parse().ok()?;
    Some(if negative {
        if nanos == 0 {
            Timespec {
                tv_sec: -secs,
                tv_nsec: 0,
            }
        } else {
            Timespec {
                tv_sec: -secs - 1,
                tv_nsec: 1_000_000_000 - nanos,
            }
        }
    } else {
        Timespec {
            tv_sec: secs,
            tv_nsec: nanos,
        }
    })
}

fn percent_decode(raw: &[u8]) -> String {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'%' && i + 2 < raw.len() {
            if let Ok(b) = u8::from_str_radix(&String::from_utf8_lossy(&raw[i + 1..i + 3]), 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(raw[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pax_times() {
        let t = parse_pax_time(b"1700000000.5").unwrap();
        assert_eq!((t.tv_sec, t.tv_nsec), (1_700_000_000, 500_000_000));
        let t = parse_pax_time(b"12").unwrap();
        assert_eq!((t.tv_sec, t.tv_nsec), (12, 0));
        let t = parse_pax_time(b"-1.25").unwrap();
        assert_eq!((t.tv_sec, t.tv_nsec), (-2, 750_000_000));
        assert!(parse_pax_time(b"abc").is_none());
        assert!(parse_pax_time(b"1.2x").is_none());
    }

    /// A GNU sparse entry of `real` bytes whose only data is 512 `x` at the end.
    fn sparse_layer(real: u64) -> Vec<u8> {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::GNUSparse);
        h.set_path("big").unwrap();
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h.set_size(512);
        let gnu = h.as_gnu_mut().unwrap();
        gnu.set_real_size(real);
        gnu.sparse[0].set_offset(real - 512);
        gnu.sparse[0].set_length(512);
        h.set_cksum();
        let mut out = h.as_bytes().to_vec();
        out.extend_from_slice(&[b'x'; 512]);
        out.extend_from_slice(&[0; 1024]);
        out
    }

    // A 2 KB layer announcing gigabytes of zeros used to fill the node's
    // disk with them (found by hand while fuzzing image_unpack: a 10 KB
    // GNU tar of a 3G sparse file filled a 1G tmpfs; it is now a seed).
    #[test]
    fn sparse_entries_become_holes() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let real = 64 << 20;
        unpack_layer(&sparse_layer(real)[..], dir.path(), "sparse").unwrap();
        let meta = std::fs::metadata(dir.path().join("big")).unwrap();
        assert_eq!(meta.len(), real);
        assert!(meta.blocks() * 512 < 1 << 20, "{} blocks", meta.blocks());
        let data = std::fs::read(dir.path().join("big")).unwrap();
        assert!(data[..data.len() - 512].iter().all(|b| *b == 0));
        assert!(data[data.len() - 512..].iter().all(|b| *b == b'x'));
    }

    /// A tmpfs of `bytes` mounted at a temporary directory while it lives.
    struct SmallDisk(tempfile::TempDir);

    impl SmallDisk {
        fn new(bytes: u64) -> Option<SmallDisk> {
            let dir = tempfile::tempdir().ok()?;
            let opts = format!("size={bytes}");
            let mounted = nix::mount::mount(
                Some("tmpfs"),
                dir.path(),
                Some("tmpfs"),
                nix::mount::MsFlags::empty(),
                Some(opts.as_str()),
            );
            mounted.ok().map(|()| SmallDisk(dir))
        }
    }

    impl Drop for SmallDisk {
        fn drop(&mut self) {
            let _ = nix::mount::umount2(self.0.path(), nix::mount::MntFlags::MNT_DETACH);
        }
    }

    #[test]
    fn unpacking_stops_before_the_disk_fills() {
        // 64 MiB of one file onto a disk with less than the reserve left:
        // refused at the first check, before the disk is full.
        let Some(disk) = SmallDisk::new(80 << 20) else {
            eprintln!("skipped: mounting a small tmpfs needs root");
            return;
        };
        let size: u64 = 70 << 20;
        let mut h = tar::Header::new_gnu();
        h.set_path("filler").unwrap();
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h.set_size(size);
        h.set_cksum();
        let layer = io::Cursor::new(h.as_bytes().to_vec())
            .chain(io::repeat(b'a').take(size))
            .chain(io::repeat(0).take(1024));
        let dest = disk.0.path().join("layer");
        std::fs::create_dir(&dest).unwrap();
        let err = unpack_layer(layer, &dest, "filler").err().expect("refused");
        assert!(matches!(err, ImageError::NoRoom(_)), "{err}");
        assert!(err.to_string().contains("kept free"), "{err}");
    }

    #[test]
    fn sparse_entries_over_the_limit_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let err = unpack_layer(
            &sparse_layer(MAX_SPARSE_SIZE + 4096)[..],
            dir.path(),
            "bomb",
        )
        .err()
        .expect("refused");
        assert!(matches!(err, ImageError::UnsafeLayer(_)), "{err}");
        assert!(!dir.path().join("big").exists());
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(
            percent_decode(b"trusted.overlay%2Eopaque"),
            "trusted.overlay.opaque"
        );
        assert_eq!(percent_decode(b"user.a%"), "user.a%");
        assert_eq!(percent_decode(b"user.%zz"), "user.%zz");
    }
}

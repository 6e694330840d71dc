//! File access inside a sandbox from the host. Every path is resolved with
//! `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)` relative to the
//! sandbox's root directory, and directory walks go descriptor by descriptor,
//! so `..`, absolute symlinks and symlinks swapped in by the sandbox while we
//! work all stay inside the sandbox.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{openat2, Mode, OFlags, ResolveFlags, XattrFlags};

use crate::RuntimeError;

/// How symbolic links on a path inside a sandbox's root are taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Links {
    /// Followed as if the root were `/`, so an image's `/var/run -> /run`
    /// works and still cannot lead out.
    WithinRoot,
    /// Any link on the way is an error: the system directories a new
    /// sandbox's set-up mounts on.
    Refuse,
}

impl Links {
    fn resolve(self) -> ResolveFlags {
        let links = match self {
            Links::WithinRoot => ResolveFlags::IN_ROOT,
            Links::Refuse => ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS,
        };
        links | ResolveFlags::NO_MAGICLINKS
    }
}

/// The sandbox's root as seen by its init (its mount namespace).
pub fn open_root(init_pid: i32) -> Result<OwnedFd, RuntimeError> {
    rustix::fs::open(
        format!("/proc/{init_pid}/root"),
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| RuntimeError::os("open sandbox root", e))
}

fn check_path(path: &str) -> Result<(), RuntimeError> {
    if path.is_empty() || path.contains('\0') {
        return Err(RuntimeError::BadPath(format!(
            "{path:?}: give an absolute path inside the sandbox"
        )));
    }
    Ok(())
}

pub(crate) fn open_in(
    root: &OwnedFd,
    path: &str,
    flags: OFlags,
    mode: u32,
) -> Result<OwnedFd, RuntimeError> {
    open_in_with(root, path, flags, mode, Links::WithinRoot)
}

pub(crate) fn open_in_with(
    root: &OwnedFd,
    path: &str,
    flags: OFlags,
    mode: u32,
    links: Links,
) -> Result<OwnedFd, RuntimeError> {
    check_path(path)?;
    // Relative to the root descriptor: RESOLVE_BENEATH refuses a leading
    // `/`, RESOLVE_IN_ROOT reads both alike.
    let relative = match path.trim_start_matches('/') {
        "" => ".",
        rest => rest,
    };
    openat2(
        root,
        relative,
        flags | OFlags::CLOEXEC,
        Mode::from_raw_mode(mode),
        links.resolve(),
    )
    .map_err(|e| match e {
        rustix::io::Errno::NOENT => {
            RuntimeError::NotFound(format!("{path}: no such file or directory in the sandbox"))
        }
        rustix::io::Errno::XDEV | rustix::io::Errno::LOOP => {
            RuntimeError::BadPath(format!("{path}: path leaves the sandbox or loops"))
        }
        // The caller named a path that cannot exist (through a file, or a
        // file where a directory is needed): its mistake, not the node's.
        rustix::io::Errno::NOTDIR => RuntimeError::BadPath(format!(
            "{path}: not a directory, or a component of it is not"
        )),
        e => RuntimeError::os(path, e),
    })
}

pub enum Entry {
    File(File, u64),
    Dir(OwnedFd),
}

/// Opens a path for reading: a regular file or a directory. Symlinks,
/// including a final one, are followed inside the sandbox's root.
pub fn open_read(root: &OwnedFd, path: &str) -> Result<Entry, RuntimeError> {
    let fd = open_in(
        root,
        path,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY,
        0,
    )?;
    let st = rustix::fs::fstat(&fd).map_err(|e| RuntimeError::os(path, e))?;
    match rustix::fs::FileType::from_raw_mode(st.st_mode) {
        rustix::fs::FileType::RegularFile => Ok(Entry::File(File::from(fd), st.st_size as u64)),
        rustix::fs::FileType::Directory => Ok(Entry::Dir(fd)),
        other => Err(RuntimeError::BadPath(format!(
            "{path}: is a {other:?}, only regular files and directories can be copied"
        ))),
    }
}

/// Splits a sandbox path into its parent directory and final name.
pub(crate) fn split(path: &str) -> Result<(String, String), RuntimeError> {
    let p = Path::new(path);
    let name = p
        .file_name()
        .ok_or_else(|| RuntimeError::BadPath(format!("{path:?}: needs a file name")))?;
    let parent = p
        .parent()
        .map(|x| x.display().to_string())
        .unwrap_or_default();
    let parent = if parent.is_empty() {
        "/".to_string()
    } else {
        parent
    };
    Ok((parent, name.to_string_lossy().into_owned()))
}

/// What one upload created, so that a refused or failed upload can take
/// it back instead of leaving half a tree in the sandbox.
#[derive(Default)]
pub(crate) struct Created(Vec<(OwnedFd, OsString, bool)>);

impl Created {
    /// Records a new entry, and gives it the owner of its directory: in a
    /// sandbox with a user namespace the daemon's uid 0 is unmapped, and
    /// what it wrote would show as `nobody` and be unwritable to the
    /// sandbox's root.
    pub(crate) fn note(&mut self, dir: &OwnedFd, name: &OsStr, is_dir: bool) {
        if let Ok(st) = rustix::fs::fstat(dir) {
            let _ = rustix::fs::chownat(
                dir,
                name,
                Some(rustix::fs::Uid::from_raw(st.st_uid)),
                Some(rustix::fs::Gid::from_raw(st.st_gid)),
                rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
            );
        }
        self.record(dir, name, is_dir);
    }

    /// Records a new entry, leaving its owner as it is.
    pub(crate) fn record(&mut self, dir: &OwnedFd, name: &OsStr, is_dir: bool) {
        // dup fails only when the process is out of descriptors; the entry
        // is then left in place, as it was before this bookkeeping existed.
        if let Ok(fd) = dir.try_clone() {
            self.0.push((fd, name.to_os_string(), is_dir));
        }
    }

    /// Removes what was noted, newest first, by name in the directory it
    /// was made in. A directory goes only if it is empty again: the sandbox
    /// may have put its own files there meanwhile.
    fn undo(self) {
        for (dir, name, is_dir) in self.0.into_iter().rev() {
            let flags = if is_dir {
                rustix::fs::AtFlags::REMOVEDIR
            } else {
                rustix::fs::AtFlags::empty()
            };
            let _ = rustix::fs::unlinkat(&dir, name.as_os_str(), flags);
        }
    }
}

/// Runs one upload; if it fails, removes what it created.
fn all_or_nothing<T>(
    f: impl FnOnce(&mut Created) -> Result<T, RuntimeError>,
) -> Result<T, RuntimeError> {
    let mut created = Created::default();
    let result = f(&mut created);
    if result.is_err() {
        created.undo();
    }
    result
}

/// Creates every missing directory of `path` (like `mkdir -p`) inside the
/// root. Each prefix is resolved from the root with RESOLVE_IN_ROOT, so
/// symlinks in the image (`/var/run -> /run`) work and still cannot leave it.
pub fn mkdir_all(root: &OwnedFd, path: &str) -> Result<OwnedFd, RuntimeError> {
    mkdir_all_noting(root, path, Links::WithinRoot, &mut Created::default())
}

pub(crate) fn mkdir_all_noting(
    root: &OwnedFd,
    path: &str,
    links: Links,
    created: &mut Created,
) -> Result<OwnedFd, RuntimeError> {
    check_path(path)?;
    let dir_flags = OFlags::PATH | OFlags::DIRECTORY;
    let open_in = |root, path: &str, flags, mode| open_in_with(root, path, flags, mode, links);
    // Mostly the whole path is there already: one lookup, not one per
    // part. Otherwise the walk below makes what is missing, or says which
    // part is wrong.
    if !path.split('/').any(|part| part == "..") {
        if let Ok(dir) = open_in(root, path, dir_flags, 0) {
            return Ok(dir);
        }
    }
    let mut dir = open_in(root, "/", dir_flags, 0)?;
    let mut prefix = PathBuf::from("/");
    for comp in Path::new(path).components() {
        let name = match comp {
            Component::Normal(n) => n,
            Component::ParentDir => {
                return Err(RuntimeError::BadPath(format!(
                    "{path}: '..' is not allowed"
                )))
            }
            _ => continue,
        };
        prefix.push(name);
        let prefix_str = prefix.to_string_lossy();
        dir = match open_in(root, &prefix_str, dir_flags, 0) {
            Ok(fd) => fd,
            Err(RuntimeError::NotFound(_)) => {
                match rustix::fs::mkdirat(&dir, name, Mode::from_raw_mode(0o755)) {
                    Ok(()) => created.note(&dir, name, true),
                    Err(rustix::io::Errno::EXIST) => {}
                    Err(e) => return Err(RuntimeError::os(format!("mkdir {prefix_str}"), e)),
                }
                open_in(root, &prefix_str, dir_flags, 0)?
            }
            Err(RuntimeError::Files(m)) => {
                return Err(RuntimeError::BadPath(format!(
                    "{m} (is a component a file?)"
                )))
            }
            Err(e) => return Err(e),
        };
    }
    Ok(dir)
}

/// Opens `name` in `dir` for writing, creating it, and truncates it only
/// once it is known to be a regular file. The sandbox owns the tree: it can
/// put a fifo there (an open for writing would wait for a reader the sandbox
/// controls, holding a daemon thread forever), or a symlink (refused).
fn create_regular(
    dir: &OwnedFd,
    name: &OsStr,
    mode: u32,
    what: &str,
    created: &mut Created,
) -> Result<OwnedFd, RuntimeError> {
    let flags =
        OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
    let mode = Mode::from_raw_mode(mode & 0o1777);
    // O_EXCL first, to know whether this upload made the file.
    let opened = match rustix::fs::openat(dir, name, flags | OFlags::CREATE | OFlags::EXCL, mode) {
        Ok(fd) => {
            created.note(dir, name, false);
            Ok(fd)
        }
        Err(rustix::io::Errno::EXIST) => rustix::fs::openat(dir, name, flags, mode),
        Err(e) => Err(e),
    };
    let fd = opened.map_err(|e| match e {
        rustix::io::Errno::LOOP => RuntimeError::BadPath(format!(
            "{what}: is a symlink; refusing to write through it"
        )),
        // A fifo nobody reads: O_NONBLOCK makes the open fail instead of wait.
        rustix::io::Errno::NXIO => RuntimeError::BadPath(format!(
            "{what}: is a fifo or device; only regular files can be written"
        )),
        e => RuntimeError::os(what, e),
    })?;
    let st = rustix::fs::fstat(&fd).map_err(|e| RuntimeError::os(what, e))?;
    let kind = rustix::fs::FileType::from_raw_mode(st.st_mode);
    if kind != rustix::fs::FileType::RegularFile {
        return Err(RuntimeError::BadPath(format!(
            "{what}: is a {kind:?}; only regular files can be written"
        )));
    }
    rustix::fs::ftruncate(&fd, 0).map_err(|e| RuntimeError::os(what, e))?;
    Ok(fd)
}

/// Writes a regular file, replacing what was there; parents are created.
/// The bytes go to a hidden file in the same directory first, which then
/// takes the name in one rename: a reader (or a crash, or a client that goes
/// away) never sees half a file, and what was there before stays until the
/// new content is complete. If the write fails, the parents it made are
/// removed again.
///
/// `xattrs` (names in the `user.` namespace) are set on the new file; it
/// keeps none of the old file's, as a new inode.
pub fn write_file(
    root: &OwnedFd,
    path: &str,
    mode: u32,
    xattrs: &BTreeMap<String, String>,
    data: &mut dyn Read,
) -> Result<u64, RuntimeError> {
    write_file_with(root, path, mode, xattrs, WriteOptions::default(), data)
}

/// How [`write_file_with`] treats what it finds: the defaults are a
/// sandbox's writes (parents made, a file replaced, the owner its
/// directory's or the old file's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteOptions {
    /// Make missing parent directories; without, a missing parent (or one
    /// that is not a directory) is `NotFound`.
    pub parents: bool,
    /// Replace a regular file at the path; without, anything there is
    /// `Exists` (and the new file takes the name only if it is still free).
    pub replace: bool,
    /// The new file's owner and group, as the host writes them.
    pub owner: Option<(u32, u32)>,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions {
            parents: true,
            replace: true,
            owner: None,
        }
    }
}

/// [`write_file`], with what it does about parents, an existing file and
/// the owner said by `opts` (a volume's writes: E2B's volume API).
pub fn write_file_with(
    root: &OwnedFd,
    path: &str,
    mode: u32,
    xattrs: &BTreeMap<String, String>,
    opts: WriteOptions,
    data: &mut dyn Read,
) -> Result<u64, RuntimeError> {
    for name in xattrs.keys() {
        if !name.starts_with("user.") || name.len() <= 5 || name.len() > 255 || name.contains('\0')
        {
            return Err(RuntimeError::BadPath(format!(
                "extended attribute {name:?}: only names in the user. namespace can be set"
            )));
        }
    }
    all_or_nothing(|created| write_file_noting(root, path, mode, xattrs, opts, data, created))
}

fn write_file_noting(
    root: &OwnedFd,
    path: &str,
    mode: u32,
    xattrs: &BTreeMap<String, String>,
    opts: WriteOptions,
    data: &mut dyn Read,
    created: &mut Created,
) -> Result<u64, RuntimeError> {
    let (parent, name) = split(path)?;
    let dir = if opts.parents {
        mkdir_all_noting(root, &parent, Links::WithinRoot, created)?
    } else {
        open_in(root, &parent, OFlags::PATH | OFlags::DIRECTORY, 0).map_err(|e| match e {
            RuntimeError::NotFound(_) | RuntimeError::BadPath(_) => {
                RuntimeError::NotFound(format!("{parent}: no such directory"))
            }
            e => e,
        })?
    };
    let name = OsStr::new(&name);
    // What is there now decides whether it may be replaced, and whose the
    // new file is (an existing file keeps its owner).
    let existing = match rustix::fs::statat(&dir, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Some(st),
        Err(rustix::io::Errno::NOENT) => None,
        Err(e) => return Err(RuntimeError::os(path, e)),
    };
    if existing.is_some() && !opts.replace {
        return Err(RuntimeError::Exists(format!("{path}: already exists")));
    }
    if let Some(st) = &existing {
        match rustix::fs::FileType::from_raw_mode(st.st_mode) {
            rustix::fs::FileType::RegularFile => {}
            rustix::fs::FileType::Directory => {
                return Err(RuntimeError::BadPath(format!(
                "{path}: is a directory; give the path of the file to write in it (e.g. {}/NAME)",
                path.trim_end_matches('/')
            )))
            }
            rustix::fs::FileType::Symlink => {
                return Err(RuntimeError::BadPath(format!(
                    "{path}: is a symlink; refusing to write through it"
                )))
            }
            other => {
                return Err(RuntimeError::BadPath(format!(
                    "{path}: is a {other:?}; only regular files can be written"
                )))
            }
        }
    }
    let temp = OsString::from(format!(".warren-upload-{:016x}", random_u64()));
    let mut scratch = Created::default();
    let fd = create_regular(&dir, &temp, mode, path, &mut scratch)?;
    let written = (|| {
        if let Some((uid, gid)) = opts.owner {
            rustix::fs::fchown(
                &fd,
                Some(rustix::fs::Uid::from_raw(uid)),
                Some(rustix::fs::Gid::from_raw(gid)),
            )
            .map_err(|e| RuntimeError::os(format!("{path}: owner {uid}:{gid}"), e))?;
        } else if let Some(st) = &existing {
            let _ = rustix::fs::fchown(
                &fd,
                Some(rustix::fs::Uid::from_raw(st.st_uid)),
                Some(rustix::fs::Gid::from_raw(st.st_gid)),
            );
        }
        // The mode given wins over the daemon's umask and the old file's mode.
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode & 0o1777))
            .map_err(|e| RuntimeError::os(path, e))?;
        for (name, value) in xattrs {
            rustix::fs::fsetxattr(&fd, name.as_str(), value.as_bytes(), XattrFlags::empty())
                .map_err(|e| RuntimeError::os(format!("{path}: extended attribute {name}"), e))?;
        }
        let mut file = File::from(fd);
        let n = std::io::copy(data, &mut file).map_err(|e| RuntimeError::os(path, e))?;
        file.flush().map_err(|e| RuntimeError::os(path, e))?;
        // The sandbox can swap a directory or a link in meanwhile: renaming
        // replaces a link itself (never writes through it), and fails on a
        // directory.
        let flags = if opts.replace {
            rustix::fs::RenameFlags::empty()
        } else {
            rustix::fs::RenameFlags::NOREPLACE
        };
        rustix::fs::renameat_with(&dir, &temp, &dir, name, flags).map_err(|e| match e {
            rustix::io::Errno::ISDIR | rustix::io::Errno::NOTEMPTY => {
                RuntimeError::BadPath(format!("{path}: is a directory"))
            }
            rustix::io::Errno::EXIST => RuntimeError::Exists(format!("{path}: already exists")),
            e => RuntimeError::os(path, e),
        })?;
        Ok(n)
    })();
    if written.is_err() {
        scratch.undo();
    } else if existing.is_none() && opts.owner.is_some() {
        // Its owner is the one given, not its directory's.
        created.record(&dir, name, false);
    } else if existing.is_none() {
        created.note(&dir, name, false);
    }
    written
}

/// Random bits for temporary names, from the kernel.
fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    let _ = rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty());
    u64::from_le_bytes(b)
}

/// Streams a directory of the sandbox as a tar archive, walking by descriptor.
pub fn pack_dir(dir: OwnedFd, out: &mut dyn Write) -> Result<(), RuntimeError> {
    let mut builder = tar::Builder::new(out);
    builder.follow_symlinks(false);
    add_dir(&mut builder, &dir, PathBuf::from("."), 0)?;
    builder
        .into_inner()
        .map_err(|e| RuntimeError::os("tar", e))?;
    Ok(())
}

const MAX_DEPTH: usize = 256;

fn add_dir(
    b: &mut tar::Builder<&mut dyn Write>,
    dir: &OwnedFd,
    rel: PathBuf,
    depth: usize,
) -> Result<(), RuntimeError> {
    let ferr = |e: rustix::io::Errno| RuntimeError::os(format!("{}", rel.display()), e);
    if depth > MAX_DEPTH {
        return Err(RuntimeError::Files(format!(
            "{}: directory tree too deep",
            rel.display()
        )));
    }
    let readable = rustix::fs::openat(
        dir,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(ferr)?;
    let st = rustix::fs::fstat(&readable).map_err(ferr)?;
    if rel != Path::new(".") {
        let mut h = header(&st, tar::EntryType::Directory);
        b.append_data(&mut h, &rel, std::io::empty())
            .map_err(|e| RuntimeError::os("tar", e))?;
    }
    let entries = rustix::fs::Dir::read_from(&readable).map_err(ferr)?;
    let mut names = Vec::new();
    for ent in entries {
        let ent = ent.map_err(ferr)?;
        let name = ent.file_name().to_bytes();
        if name != b"." && name != b".." {
            names.push(name.to_vec());
        }
    }
    names.sort();
    for name in names {
        let name_os = OsStr::from_bytes(&name);
        let child_rel = rel.join(name_os);
        let st = rustix::fs::statat(&readable, name_os, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
            .map_err(ferr)?;
        match rustix::fs::FileType::from_raw_mode(st.st_mode) {
            rustix::fs::FileType::Directory => {
                let sub = rustix::fs::openat(
                    &readable,
                    name_os,
                    OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(ferr)?;
                add_dir(b, &sub, child_rel, depth + 1)?;
            }
            rustix::fs::FileType::RegularFile => {
                let fd = rustix::fs::openat(
                    &readable,
                    name_os,
                    OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(ferr)?;
                let file = File::from(fd);
                let st = rustix::fs::fstat(&file).map_err(ferr)?;
                append_file(b, file, &st, &child_rel)?;
            }
            rustix::fs::FileType::Symlink => {
                let target =
                    rustix::fs::readlinkat(&readable, name_os, Vec::new()).map_err(ferr)?;
                let mut h = header(&st, tar::EntryType::Symlink);
                h.set_size(0);
                b.append_link(&mut h, &child_rel, OsStr::from_bytes(target.to_bytes()))
                    .map_err(|e| RuntimeError::os("tar", e))?;
            }
            // Devices, fifos and sockets are not file contents.
            _ => {}
        }
    }
    Ok(())
}

/// Appends one regular file as exactly the size its header announces. The
/// sandbox may change the file while it is read: bytes it adds are left
/// out, and a file that shrank is padded with zeros. Short of that, the
/// bytes of the files after it would be read as tar headers, which the
/// sandbox could forge (names with `..`, uid 0, setuid modes).
fn append_file(
    b: &mut tar::Builder<&mut dyn Write>,
    file: File,
    st: &rustix::fs::Stat,
    rel: &Path,
) -> Result<(), RuntimeError> {
    let size = st.st_size as u64;
    let mut h = header(st, tar::EntryType::Regular);
    let exact = file.take(size).chain(std::io::repeat(0)).take(size);
    b.append_data(&mut h, rel, exact)
        .map_err(|e| RuntimeError::os("tar", e))
}

fn header(st: &rustix::fs::Stat, kind: tar::EntryType) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(st.st_mode & 0o7777);
    h.set_uid(st.st_uid as u64);
    h.set_gid(st.st_gid as u64);
    h.set_mtime(st.st_mtime.max(0) as u64);
    h.set_size(if kind == tar::EntryType::Regular {
        st.st_size as u64
    } else {
        0
    });
    h
}

/// Extracts a tar archive into directory `path` of the sandbox (created if
/// missing). Only regular files, directories and symlinks are accepted;
/// entries with `..` or absolute names are refused.
///
/// All or nothing for what it creates: when an entry is refused or the
/// stream breaks, the files, symlinks and directories this upload made are
/// removed again (files it replaced keep their new content).
pub fn unpack_tar(root: &OwnedFd, path: &str, data: &mut dyn Read) -> Result<u64, RuntimeError> {
    all_or_nothing(|created| unpack_tar_noting(root, path, data, created))
}

fn unpack_tar_noting(
    root: &OwnedFd,
    path: &str,
    data: &mut dyn Read,
    created: &mut Created,
) -> Result<u64, RuntimeError> {
    let base = mkdir_all_noting(root, path, Links::WithinRoot, created)?;
    let mut archive = tar::Archive::new(data);
    let mut count = 0;
    for entry in archive
        .entries()
        .map_err(|e| RuntimeError::BadPath(format!("tar: {e}")))?
    {
        let mut entry = entry.map_err(|e| RuntimeError::BadPath(format!("tar: {e}")))?;
        let name = entry
            .path()
            .map_err(|e| RuntimeError::BadPath(format!("tar entry name: {e}")))?
            .into_owned();
        let mut parts = Vec::new();
        for c in name.components() {
            match c {
                Component::Normal(n) => parts.push(n.to_os_string()),
                Component::CurDir => {}
                _ => {
                    return Err(RuntimeError::BadPath(format!(
                        "tar entry {}: absolute names and '..' are not allowed",
                        name.display()
                    )))
                }
            }
        }
        let Some(last) = parts.pop() else { continue };
        let mut dir = openat2(
            &base,
            ".",
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            Links::WithinRoot.resolve(),
        )
        .map_err(|e| RuntimeError::os(path, e))?;
        for p in &parts {
            match rustix::fs::mkdirat(&dir, p.as_os_str(), Mode::from_raw_mode(0o755)) {
                Ok(()) => created.note(&dir, p, true),
                Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(RuntimeError::os(format!("{}", name.display()), e)),
            }
            dir = rustix::fs::openat(
                &dir,
                p.as_os_str(),
                OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| {
                RuntimeError::BadPath(format!(
                    "{}: {e} (a parent is a symlink or a file)",
                    name.display()
                ))
            })?;
        }
        let mode = entry.header().mode().unwrap_or(0o644) & 0o1777;
        let ferr = |e: rustix::io::Errno| RuntimeError::os(format!("{}", name.display()), e);
        match entry.header().entry_type() {
            tar::EntryType::Directory => match rustix::fs::mkdirat(&dir, last.as_os_str(), Mode::from_raw_mode(mode)) {
                Ok(()) => created.note(&dir, &last, true),
                Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(ferr(e)),
            },
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let shown = name.display().to_string();
                let fd = create_regular(&dir, last.as_os_str(), mode, &shown, created)?;
                let mut f = File::from(fd);
                std::io::copy(&mut entry, &mut f).map_err(|e| RuntimeError::os(format!("{}", name.display()), e))?;
                rustix::fs::fchmod(f.as_fd(), Mode::from_raw_mode(mode)).map_err(ferr)?;
            }
            tar::EntryType::Symlink => {
                let target = entry
                    .link_name()
                    .map_err(|e| RuntimeError::BadPath(format!("tar link: {e}")))?
                    .ok_or_else(|| RuntimeError::BadPath(format!("{}: symlink without target", name.display())))?
                    .into_owned();
                let _ = rustix::fs::unlinkat(&dir, last.as_os_str(), rustix::fs::AtFlags::empty());
                rustix::fs::symlinkat(target.as_os_str(), &dir, last.as_os_str()).map_err(ferr)?;
                created.note(&dir, &last, false);
            }
            other => {
                return Err(RuntimeError::BadPath(format!(
                    "tar entry {}: type {other:?} is not supported (only files, directories and symlinks)",
                    name.display()
                )))
            }
        }
        count += 1;
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    fn root_of(dir: &Path) -> OwnedFd {
        OwnedFd::from(File::open(dir).expect("open the test root"))
    }

    /// Runs `f` on a thread; if it has not returned in 5 s it is stuck in a
    /// fifo open, so open the fifo's read end to free it and fail.
    fn must_return<T: Send + 'static>(fifo: &Path, f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || tx.send(f()));
        match rx.recv_timeout(Duration::from_secs(5)) {
            Ok(v) => v,
            Err(_) => {
                let _reader = std::fs::File::open(fifo);
                panic!("the write waited on a fifo the sandbox planted");
            }
        }
    }

    fn mkfifo(path: &Path) {
        rustix::fs::mknodat(
            rustix::fs::CWD,
            path,
            rustix::fs::FileType::Fifo,
            Mode::from_raw_mode(0o666),
            0,
        )
        .expect("mkfifo");
    }

    // Found while writing the `files` fuzz target (its `fifo` op; seed
    // fuzz/seeds/files/fifo.txt).
    #[test]
    fn writing_onto_a_planted_fifo_is_refused_not_waited_on() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("f");
        mkfifo(&fifo);
        let root = root_of(dir.path());
        let err = must_return(&fifo, move || {
            write_file(&root, "/f", 0o644, &BTreeMap::new(), &mut &b"x"[..])
        })
        .expect_err("a fifo is not a regular file");
        assert!(matches!(err, RuntimeError::BadPath(_)), "{err}");

        let root = root_of(dir.path());
        let mut tar = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(1);
        h.set_mode(0o644);
        h.set_cksum();
        tar.append_data(&mut h, "f", &b"x"[..]).expect("tar");
        let data = tar.into_inner().expect("tar");
        let err = must_return(&fifo, move || unpack_tar(&root, "/", &mut &data[..]))
            .expect_err("a fifo is not a regular file");
        assert!(matches!(err, RuntimeError::BadPath(_)), "{err}");
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .expect("read_dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    fn file_entry(tar: &mut tar::Builder<Vec<u8>>, raw_name: &[u8], data: &[u8]) {
        let mut h = tar::Header::new_gnu();
        h.as_old_mut().name[..raw_name.len()].copy_from_slice(raw_name);
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        tar.append(&h, data).expect("tar");
    }

    // The known gap "a refused tar upload can leave behind the directories
    // it created".
    #[test]
    fn a_refused_tar_upload_takes_back_what_it_created() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("keep/sub")).expect("mkdir");
        std::fs::write(dir.path().join("keep/old"), b"old").expect("write");
        let mut tar = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_mode(0o755);
        h.set_size(0);
        tar.append_data(&mut h, "a", std::io::empty()).expect("tar");
        file_entry(&mut tar, b"a/b/c", b"c");
        file_entry(&mut tar, b"new", b"new");
        file_entry(&mut tar, b"old", b"replaced");
        file_entry(&mut tar, b"sub/x", b"x");
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        tar.append_link(&mut h, "s", "/etc").expect("tar");
        file_entry(&mut tar, b"../evil", b"evil");
        let data = tar.into_inner().expect("tar");

        let root = root_of(dir.path());
        let err =
            unpack_tar(&root, "/keep/deeper/still", &mut &data[..]).expect_err("'..' is refused");
        assert!(matches!(err, RuntimeError::BadPath(_)), "{err}");
        assert_eq!(names(&dir.path().join("keep")), ["old", "sub"]);
        let err = unpack_tar(&root, "/keep", &mut &data[..]).expect_err("'..' is refused");
        assert!(matches!(err, RuntimeError::BadPath(_)), "{err}");
        assert_eq!(names(&dir.path().join("keep")), ["old", "sub"]);
        assert_eq!(names(&dir.path().join("keep/sub")), Vec::<String>::new());
        // Replaced, not created: documented as keeping the new content.
        assert_eq!(
            std::fs::read(dir.path().join("keep/old")).expect("read"),
            b"replaced"
        );
        assert_eq!(names(dir.path()), ["keep"]);
    }

    struct Broken;
    impl Read for Broken {
        fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
            Err(std::io::Error::other("client went away"))
        }
    }

    #[test]
    fn a_failed_write_takes_back_the_file_and_parents_it_made() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("x")).expect("mkdir");
        std::fs::write(dir.path().join("x/kept"), b"old").expect("write");
        let root = root_of(dir.path());
        assert!(write_file(&root, "/x/y/z/f", 0o644, &BTreeMap::new(), &mut Broken).is_err());
        assert!(write_file(&root, "/x/kept", 0o644, &BTreeMap::new(), &mut Broken).is_err());
        assert_eq!(names(&dir.path().join("x")), ["kept"]);
        assert_eq!(names(dir.path()), ["x"]);
    }

    /// (name, contents) of every entry of a tar archive.
    fn entries(archive: &[u8]) -> Vec<(String, Vec<u8>)> {
        let mut archive = tar::Archive::new(archive);
        let mut got = Vec::new();
        for e in archive.entries().expect("entries") {
            let mut e = e.expect("entry");
            let mut data = Vec::new();
            e.read_to_end(&mut data).expect("read");
            got.push((e.path().expect("path").display().to_string(), data));
        }
        got
    }

    // Found by a hostile run: a file that shrank while a directory download
    // read it left its header's size unfilled, and the next file's bytes
    // (forged tar headers) became entries of the archive.
    #[test]
    fn a_file_that_shrinks_while_packed_keeps_its_announced_size() {
        let dir = tempfile::tempdir().expect("tempdir");
        let shrinking = dir.path().join("a");
        std::fs::write(&shrinking, vec![b'a'; 10_000]).expect("write");
        // The next file holds forged tar headers, aligned as if "a" ended early.
        // What the 100 bytes left of "a" need to reach the next 512-byte block.
        let mut forged = tar::Builder::new(vec![0u8; 412]);
        let mut h = tar::Header::new_gnu();
        h.set_size(4);
        h.set_mode(0o4755);
        h.set_cksum();
        forged
            .append_data(&mut h, "ESCAPED", &b"evil"[..])
            .expect("tar");
        std::fs::write(dir.path().join("b"), forged.into_inner().expect("tar")).expect("write");

        let mut out: Vec<u8> = Vec::new();
        {
            let sink: &mut dyn Write = &mut out;
            let mut b = tar::Builder::new(sink);
            let file = File::open(&shrinking).expect("open");
            let st = rustix::fs::fstat(&file).expect("fstat");
            // The sandbox truncates it after its size was read.
            File::options()
                .write(true)
                .open(&shrinking)
                .expect("open")
                .set_len(100)
                .expect("truncate");
            append_file(&mut b, file, &st, Path::new("a")).expect("append");
            let next = File::open(dir.path().join("b")).expect("open");
            let st = rustix::fs::fstat(&next).expect("fstat");
            append_file(&mut b, next, &st, Path::new("b")).expect("append");
            b.finish().expect("finish");
        }
        let got: Vec<(String, usize)> = entries(&out)
            .into_iter()
            .map(|(name, data)| (name, data.len()))
            .collect();
        let b_len = std::fs::metadata(dir.path().join("b")).expect("stat").len() as usize;
        assert_eq!(got, [("a".to_string(), 10_000), ("b".to_string(), b_len)]);
    }

    #[test]
    fn packing_a_directory_gives_each_file_its_own_entry() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("x"), b"xx").expect("write");
        std::fs::write(dir.path().join("y"), b"yyy").expect("write");
        let root = root_of(dir.path());
        let mut out = Vec::new();
        pack_dir(root, &mut out).expect("pack");
        assert_eq!(
            entries(&out),
            [
                ("x".to_string(), b"xx".to_vec()),
                ("y".to_string(), b"yyy".to_vec())
            ]
        );
    }

    #[test]
    fn writing_replaces_a_regular_file_and_keeps_other_kinds() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("f"), b"a longer old content").expect("write");
        std::fs::create_dir(dir.path().join("d")).expect("mkdir");
        let root = root_of(dir.path());
        assert_eq!(
            write_file(&root, "/f", 0o600, &BTreeMap::new(), &mut &b"new"[..]).expect("write"),
            3
        );
        assert_eq!(std::fs::read(dir.path().join("f")).expect("read"), b"new");
        assert!(write_file(&root, "/d", 0o600, &BTreeMap::new(), &mut &b"x"[..]).is_err());
        assert!(dir.path().join("d").is_dir());
    }

    #[test]
    fn a_strict_write_makes_no_parents_replaces_nothing_and_takes_the_owner_given() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let root = root_of(dir.path());
        let strict = |replace| WriteOptions {
            parents: false,
            replace,
            owner: Some((1000, 1001)),
        };
        let none = BTreeMap::new();
        let write = |path: &str, replace, data: &[u8]| {
            write_file_with(&root, path, 0o640, &none, strict(replace), &mut &data[..])
        };
        assert!(matches!(
            write("/no/f", true, b"x"),
            Err(RuntimeError::NotFound(_))
        ));
        assert!(!dir.path().join("no").exists(), "no parent was made");
        assert_eq!(write("/f", false, b"one").expect("new file"), 3);
        let meta = std::fs::metadata(dir.path().join("f")).expect("meta");
        assert_eq!(
            (meta.uid(), meta.gid(), meta.mode() & 0o7777),
            (1000, 1001, 0o640)
        );
        assert!(matches!(
            write("/f", false, b"two"),
            Err(RuntimeError::Exists(_))
        ));
        assert_eq!(std::fs::read(dir.path().join("f")).expect("read"), b"one");
        assert_eq!(write("/f", true, b"three").expect("replaced"), 5);
        assert_eq!(std::fs::read(dir.path().join("f")).expect("read"), b"three");
        // A file as a parent is a missing parent; nothing is left behind.
        assert!(matches!(
            write("/f/g", true, b"x"),
            Err(RuntimeError::NotFound(_))
        ));
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .expect("ls")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, ["f"]);
    }
}

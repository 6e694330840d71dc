//! File access inside a sandbox from the host. Every path is resolved with
//! `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)` relative to the
//! sandbox's root directory, and directory walks go descriptor by descriptor,
//! so `..`, absolute symlinks and symlinks swapped in by the sandbox while we
//! work all stay inside the sandbox.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{openat2, Mode, OFlags, ResolveFlags};

use crate::RuntimeError;

fn resolve_flags() -> ResolveFlags {
    ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS
}

/// The sandbox's root as seen by its init (its mount namespace).
pub fn open_root(init_pid: i32) -> Result<OwnedFd, RuntimeError> {
    rustix::fs::open(
        format!("/proc/{init_pid}/root"),
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| RuntimeError::Files(format!("open sandbox root: {e}")))
}

fn check_path(path: &str) -> Result<(), RuntimeError> {
    if path.is_empty() || path.contains('\0') {
        return Err(RuntimeError::BadPath(format!(
            "{path:?}: give an absolute path inside the sandbox"
        )));
    }
    Ok(())
}

fn open_in(root: &OwnedFd, path: &str, flags: OFlags, mode: u32) -> Result<OwnedFd, RuntimeError> {
    check_path(path)?;
    openat2(
        root,
        path,
        flags | OFlags::CLOEXEC,
        Mode::from_raw_mode(mode),
        resolve_flags(),
    )
    .map_err(|e| match e {
        rustix::io::Errno::NOENT => {
            RuntimeError::NotFound(format!("{path}: no such file or directory in the sandbox"))
        }
        rustix::io::Errno::XDEV | rustix::io::Errno::LOOP => {
            RuntimeError::BadPath(format!("{path}: path leaves the sandbox or loops"))
        }
        e => RuntimeError::Files(format!("{path}: {e}")),
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
    let st = rustix::fs::fstat(&fd).map_err(|e| RuntimeError::Files(format!("{path}: {e}")))?;
    match rustix::fs::FileType::from_raw_mode(st.st_mode) {
        rustix::fs::FileType::RegularFile => Ok(Entry::File(File::from(fd), st.st_size as u64)),
        rustix::fs::FileType::Directory => Ok(Entry::Dir(fd)),
        other => Err(RuntimeError::BadPath(format!(
            "{path}: is a {other:?}, only regular files and directories can be copied"
        ))),
    }
}

/// Splits a sandbox path into its parent directory and final name.
fn split(path: &str) -> Result<(String, String), RuntimeError> {
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

/// Creates every missing directory of `path` (like `mkdir -p`) inside the
/// root. Each prefix is resolved from the root with RESOLVE_IN_ROOT, so
/// symlinks in the image (`/var/run -> /run`) work and still cannot leave it.
pub fn mkdir_all(root: &OwnedFd, path: &str) -> Result<OwnedFd, RuntimeError> {
    check_path(path)?;
    let dir_flags = OFlags::PATH | OFlags::DIRECTORY;
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
                    Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                    Err(e) => return Err(RuntimeError::Files(format!("mkdir {prefix_str}: {e}"))),
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
) -> Result<OwnedFd, RuntimeError> {
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::WRONLY
            | OFlags::CREATE
            | OFlags::NOFOLLOW
            | OFlags::NONBLOCK
            | OFlags::NOCTTY
            | OFlags::CLOEXEC,
        Mode::from_raw_mode(mode & 0o1777),
    )
    .map_err(|e| match e {
        rustix::io::Errno::LOOP => RuntimeError::BadPath(format!(
            "{what}: is a symlink; refusing to write through it"
        )),
        // A fifo nobody reads: O_NONBLOCK makes the open fail instead of wait.
        rustix::io::Errno::NXIO => RuntimeError::BadPath(format!(
            "{what}: is a fifo or device; only regular files can be written"
        )),
        e => RuntimeError::Files(format!("{what}: {e}")),
    })?;
    let st = rustix::fs::fstat(&fd).map_err(|e| RuntimeError::Files(format!("{what}: {e}")))?;
    let kind = rustix::fs::FileType::from_raw_mode(st.st_mode);
    if kind != rustix::fs::FileType::RegularFile {
        return Err(RuntimeError::BadPath(format!(
            "{what}: is a {kind:?}; only regular files can be written"
        )));
    }
    rustix::fs::ftruncate(&fd, 0).map_err(|e| RuntimeError::Files(format!("{what}: {e}")))?;
    Ok(fd)
}

/// Writes a regular file, replacing what was there; parents are created.
pub fn write_file(
    root: &OwnedFd,
    path: &str,
    mode: u32,
    data: &mut dyn Read,
) -> Result<u64, RuntimeError> {
    let (parent, name) = split(path)?;
    let dir = mkdir_all(root, &parent)?;
    let fd = create_regular(&dir, OsStr::new(&name), mode, path)?;
    // The mode given wins over the daemon's umask and over an existing file's mode.
    rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode & 0o1777))
        .map_err(|e| RuntimeError::Files(format!("{path}: {e}")))?;
    let mut file = File::from(fd);
    let n =
        std::io::copy(data, &mut file).map_err(|e| RuntimeError::Files(format!("{path}: {e}")))?;
    file.flush()
        .map_err(|e| RuntimeError::Files(format!("{path}: {e}")))?;
    Ok(n)
}

/// Streams a directory of the sandbox as a tar archive, walking by descriptor.
pub fn pack_dir(dir: OwnedFd, out: &mut dyn Write) -> Result<(), RuntimeError> {
    let mut builder = tar::Builder::new(out);
    builder.follow_symlinks(false);
    add_dir(&mut builder, &dir, PathBuf::from("."), 0)?;
    builder
        .into_inner()
        .map_err(|e| RuntimeError::Files(format!("tar: {e}")))?;
    Ok(())
}

const MAX_DEPTH: usize = 256;

fn add_dir(
    b: &mut tar::Builder<&mut dyn Write>,
    dir: &OwnedFd,
    rel: PathBuf,
    depth: usize,
) -> Result<(), RuntimeError> {
    let ferr = |e: rustix::io::Errno| RuntimeError::Files(format!("{}: {e}", rel.display()));
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
            .map_err(|e| RuntimeError::Files(format!("tar: {e}")))?;
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
                let mut h = header(&st, tar::EntryType::Regular);
                b.append_data(&mut h, &child_rel, file.take(st.st_size as u64))
                    .map_err(|e| RuntimeError::Files(format!("tar: {e}")))?;
            }
            rustix::fs::FileType::Symlink => {
                let target =
                    rustix::fs::readlinkat(&readable, name_os, Vec::new()).map_err(ferr)?;
                let mut h = header(&st, tar::EntryType::Symlink);
                h.set_size(0);
                b.append_link(&mut h, &child_rel, OsStr::from_bytes(target.to_bytes()))
                    .map_err(|e| RuntimeError::Files(format!("tar: {e}")))?;
            }
            // Devices, fifos and sockets are not file contents.
            _ => {}
        }
    }
    Ok(())
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
pub fn unpack_tar(root: &OwnedFd, path: &str, data: &mut dyn Read) -> Result<u64, RuntimeError> {
    let base = mkdir_all(root, path)?;
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
            resolve_flags(),
        )
        .map_err(|e| RuntimeError::Files(format!("{path}: {e}")))?;
        for p in &parts {
            match rustix::fs::mkdirat(&dir, p.as_os_str(), Mode::from_raw_mode(0o755)) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(RuntimeError::Files(format!("{}: {e}", name.display()))),
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
        let ferr = |e: rustix::io::Errno| RuntimeError::Files(format!("{}: {e}", name.display()));
        match entry.header().entry_type() {
            tar::EntryType::Directory => match rustix::fs::mkdirat(&dir, last.as_os_str(), Mode::from_raw_mode(mode)) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(ferr(e)),
            },
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let shown = name.display().to_string();
                let fd = create_regular(&dir, last.as_os_str(), mode, &shown)?;
                let mut f = File::from(fd);
                std::io::copy(&mut entry, &mut f).map_err(|e| RuntimeError::Files(format!("{}: {e}", name.display())))?;
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
            write_file(&root, "/f", 0o644, &mut &b"x"[..])
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

    #[test]
    fn writing_replaces_a_regular_file_and_keeps_other_kinds() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("f"), b"a longer old content").expect("write");
        std::fs::create_dir(dir.path().join("d")).expect("mkdir");
        let root = root_of(dir.path());
        assert_eq!(
            write_file(&root, "/f", 0o600, &mut &b"new"[..]).expect("write"),
            3
        );
        assert_eq!(std::fs::read(dir.path().join("f")).expect("read"), b"new");
        assert!(write_file(&root, "/d", 0o600, &mut &b"x"[..]).is_err());
        assert!(dir.path().join("d").is_dir());
    }
}

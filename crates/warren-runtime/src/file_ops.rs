//! Looking at and changing paths inside a sandbox from the host, beyond
//! reading and writing files: stat, list, make a directory, rename,
//! remove. The same confinement as `files`: every path is resolved with
//! `openat2(RESOLVE_IN_ROOT)`, and a walk goes descriptor by descriptor, so
//! nothing reaches outside the sandbox's root, whatever symlinks it plants.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::fd::OwnedFd;

use rustix::fs::{AtFlags, FileType, OFlags};

use crate::files::{mkdir_all_noting, open_in, split, Created, Links};
use crate::RuntimeError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Other,
}

/// What a path is; `uid`/`gid` as the host sees them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    pub path: String,
    pub kind: Kind,
    pub size: u64,
    /// Permission bits (and setuid/setgid/sticky).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub modified_unix_ns: i128,
    pub accessed_unix_ns: i128,
    /// When its inode last changed (ctime).
    pub changed_unix_ns: i128,
    /// Where a symlink points, as written in it.
    pub symlink_target: Option<String>,
    /// A regular file's extended attributes in the `user.` namespace
    /// (values as UTF-8, lossily).
    pub xattrs: BTreeMap<String, String>,
}

/// Most bytes of extended attribute names, and of one value, read.
const XATTR_BUF: usize = 4096;

/// The `user.*` extended attributes of regular file `name` in `dir`
/// (none when they cannot be read: a file the sandbox swapped for
/// something else, a file system without them).
fn user_xattrs(dir: &OwnedFd, name: &OsStr) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    // NOFOLLOW and NONBLOCK: a link or a FIFO swapped in meanwhile is
    // neither followed nor waited on.
    let Ok(fd) = rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    ) else {
        return out;
    };
    let mut names = [0u8; XATTR_BUF];
    let Ok(len) = rustix::fs::flistxattr(&fd, &mut names[..]) else {
        return out;
    };
    for attr in names[..len].split(|b| *b == 0) {
        let Ok(attr) = std::str::from_utf8(attr) else {
            continue;
        };
        if !attr.starts_with("user.") {
            continue;
        }
        let mut value = [0u8; XATTR_BUF];
        if let Ok(n) = rustix::fs::fgetxattr(&fd, attr, &mut value[..]) {
            out.insert(
                attr.to_string(),
                String::from_utf8_lossy(&value[..n]).into_owned(),
            );
        }
    }
    out
}

fn kind(mode: u32) -> Kind {
    match FileType::from_raw_mode(mode) {
        FileType::RegularFile => Kind::File,
        FileType::Directory => Kind::Dir,
        FileType::Symlink => Kind::Symlink,
        _ => Kind::Other,
    }
}

fn err(path: &str) -> impl Fn(rustix::io::Errno) -> RuntimeError + '_ {
    move |e| match e {
        rustix::io::Errno::NOENT => {
            RuntimeError::NotFound(format!("{path}: no such file or directory in the sandbox"))
        }
        rustix::io::Errno::NOTDIR => {
            RuntimeError::BadPath(format!("{path}: a component is not a directory"))
        }
        e => RuntimeError::os(path, e),
    }
}

/// `name` in `dir`, not following a final symlink.
fn stat_at(dir: &OwnedFd, name: &OsStr, path: String) -> Result<Stat, RuntimeError> {
    let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).map_err(err(&path))?;
    let kind = kind(st.st_mode);
    let symlink_target = if kind == Kind::Symlink {
        rustix::fs::readlinkat(dir, name, Vec::new())
            .ok()
            .map(|t| t.to_string_lossy().into_owned())
    } else {
        None
    };
    let xattrs = if kind == Kind::File {
        user_xattrs(dir, name)
    } else {
        BTreeMap::new()
    };
    Ok(Stat {
        path,
        kind,
        size: st.st_size as u64,
        mode: st.st_mode & 0o7777,
        uid: st.st_uid,
        gid: st.st_gid,
        modified_unix_ns: st.st_mtime as i128 * 1_000_000_000 + st.st_mtime_nsec as i128,
        accessed_unix_ns: st.st_atime as i128 * 1_000_000_000 + st.st_atime_nsec as i128,
        changed_unix_ns: st.st_ctime as i128 * 1_000_000_000 + st.st_ctime_nsec as i128,
        symlink_target,
        xattrs,
    })
}

/// The parent directory of `path` (resolved in the root) and its name.
fn parent_of(root: &OwnedFd, path: &str) -> Result<(OwnedFd, String), RuntimeError> {
    let (parent, name) = split(path)?;
    let dir = open_in(root, &parent, OFlags::PATH | OFlags::DIRECTORY, 0)?;
    Ok((dir, name))
}

/// Joins a directory path and a name without doubling the slash.
fn join(dir: &str, name: &str) -> String {
    format!("{}/{name}", dir.trim_end_matches('/'))
}

/// What `path` is; a final symlink is described, not followed.
pub fn stat(root: &OwnedFd, path: &str) -> Result<Stat, RuntimeError> {
    if path.trim_end_matches('/').is_empty() {
        let fd = open_in(root, "/", OFlags::PATH | OFlags::DIRECTORY, 0)?;
        return stat_at(&fd, OsStr::new("."), "/".into());
    }
    let (dir, name) = parent_of(root, path)?;
    stat_at(
        &dir,
        OsStr::new(&name),
        path.trim_end_matches('/').to_string(),
    )
}

/// The entries of directory `path`, and of its subdirectories down to
/// `depth` levels (1: the directory's own entries), sorted by path.
/// Symlinked directories are listed as links, never entered.
pub fn list(root: &OwnedFd, path: &str, depth: u32) -> Result<Vec<Stat>, RuntimeError> {
    let dir = open_in(root, path, OFlags::RDONLY | OFlags::DIRECTORY, 0)?;
    let mut out = Vec::new();
    walk(dir, path.trim_end_matches('/'), depth.max(1), &mut out)?;
    // As `ls` and E2B's envd answer: by name, each directory's entries
    // right after it (compared component by component, so `a/c` comes
    // before `a-b`).
    out.sort_by(|a, b| a.path.split('/').cmp(b.path.split('/')));
    Ok(out)
}

/// The most entries one listing returns (a recursive listing of `/` must
/// not exhaust the daemon).
const MAX_ENTRIES: usize = 100_000;

fn walk(dir: OwnedFd, path: &str, depth: u32, out: &mut Vec<Stat>) -> Result<(), RuntimeError> {
    let mut subdirs = Vec::new();
    {
        let dup = dir.try_clone().map_err(|e| RuntimeError::os(path, e))?;
        let entries = rustix::fs::Dir::read_from(&dup).map_err(err(path))?;
        for entry in entries {
            let entry = entry.map_err(err(path))?;
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            let name = OsStr::new(std::str::from_utf8(name).unwrap_or_default()).to_os_string();
            if name.is_empty() {
                continue;
            }
            let full = join(
                if path.is_empty() { "/" } else { path },
                &name.to_string_lossy(),
            );
            // The sandbox may remove entries as we list: skip those.
            let Ok(st) = stat_at(&dir, &name, full) else {
                continue;
            };
            if out.len() >= MAX_ENTRIES {
                return Err(RuntimeError::BadPath(format!(
                    "{path}: more than {MAX_ENTRIES} entries; list a smaller tree or a lower depth"
                )));
            }
            if st.kind == Kind::Dir && depth > 1 {
                subdirs.push((name, st.path.clone()));
            }
            out.push(st);
        }
    }
    for (name, full) in subdirs {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        // Opened by name in the directory already open, never by path: a
        // symlink swapped in meanwhile is refused (NOFOLLOW), not entered.
        if let Ok(sub) =
            rustix::fs::openat(&dir, name.as_os_str(), flags, rustix::fs::Mode::empty())
        {
            walk(sub, &full, depth - 1, out)?;
        }
    }
    Ok(())
}

/// Makes directory `path` and any missing parents; an existing entry is
/// `Exists`.
pub fn make_dir(root: &OwnedFd, path: &str) -> Result<Stat, RuntimeError> {
    match stat(root, path) {
        Ok(_) => {
            return Err(RuntimeError::Exists(format!(
                "{path}: already exists in the sandbox"
            )))
        }
        Err(RuntimeError::NotFound(_)) => {}
        Err(e) => return Err(e),
    }
    let mut created = Created::default();
    mkdir_all_noting(root, path, Links::WithinRoot, &mut created)?;
    stat(root, path)
}

/// How [`make_dir_as`] makes a directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirOptions {
    /// Owner and group (as the host writes them) of each directory made.
    pub owner: (u32, u32),
    /// Permission bits of each directory made.
    pub mode: u32,
    /// Make missing parents too (each with `owner` and `mode`); without,
    /// a missing parent is `NotFound`.
    pub parents: bool,
    /// An existing directory is the answer; without, it is `Exists`.
    pub exist_ok: bool,
}

/// Makes directory `path` with an owner and permission bits (E2B's volume
/// `make_dir`). Anything but a directory in the way (at the path, or as a
/// parent) is `Exists`. Each directory made is opened by name, without
/// following links, before its owner and mode are set: a link swapped in
/// meanwhile is refused, never followed.
pub fn make_dir_as(root: &OwnedFd, path: &str, opts: DirOptions) -> Result<Stat, RuntimeError> {
    let in_the_way = |e: RuntimeError| match e {
        RuntimeError::BadPath(m) => RuntimeError::Exists(m),
        e => e,
    };
    match stat(root, path) {
        Ok(st) if st.kind == Kind::Dir && opts.exist_ok => return Ok(st),
        Ok(_) => {
            return Err(RuntimeError::Exists(format!("{path}: already exists")));
        }
        Err(RuntimeError::NotFound(_)) => {}
        Err(e) => return Err(in_the_way(e)),
    }
    let (parent, name) = split(path)?;
    let dir = if opts.parents {
        let mut dir = open_in(root, "/", OFlags::PATH | OFlags::DIRECTORY, 0)?;
        let mut prefix = String::new();
        for part in parent.split('/').filter(|p| !p.is_empty()) {
            if part == ".." {
                return Err(RuntimeError::BadPath(format!(
                    "{path}: '..' is not allowed"
                )));
            }
            prefix.push('/');
            prefix.push_str(part);
            dir = match open_in(root, &prefix, OFlags::PATH | OFlags::DIRECTORY, 0) {
                Ok(fd) => fd,
                Err(RuntimeError::NotFound(_)) => new_dir(&dir, part, &prefix, opts)?,
                Err(e) => return Err(in_the_way(e)),
            };
        }
        dir
    } else {
        open_in(root, &parent, OFlags::PATH | OFlags::DIRECTORY, 0).map_err(in_the_way)?
    };
    new_dir(&dir, &name, path, opts)?;
    stat(root, path)
}

/// Makes directory `name` in `dir` with the owner and mode of `opts`, and
/// answers it open (`O_PATH`).
fn new_dir(
    dir: &OwnedFd,
    name: &str,
    path: &str,
    opts: DirOptions,
) -> Result<OwnedFd, RuntimeError> {
    match rustix::fs::mkdirat(dir, name, rustix::fs::Mode::from_raw_mode(0o700)) {
        Ok(()) => {}
        // Made meanwhile by someone else: theirs, as it is.
        Err(rustix::io::Errno::EXIST) if opts.exist_ok => {}
        Err(rustix::io::Errno::EXIST) => {
            return Err(RuntimeError::Exists(format!("{path}: already exists")))
        }
        Err(e) => return Err(err(path)(e)),
    }
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| match e {
        rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR => {
            RuntimeError::Exists(format!("{path}: not a directory"))
        }
        e => err(path)(e),
    })?;
    let (uid, gid) = opts.owner;
    rustix::fs::fchown(
        &fd,
        Some(rustix::fs::Uid::from_raw(uid)),
        Some(rustix::fs::Gid::from_raw(gid)),
    )
    .map_err(|e| RuntimeError::os(format!("{path}: owner {uid}:{gid}"), e))?;
    rustix::fs::fchmod(&fd, rustix::fs::Mode::from_raw_mode(opts.mode & 0o7777))
        .map_err(|e| RuntimeError::os(format!("{path}: mode {:o}", opts.mode), e))?;
    Ok(fd)
}

/// Changes the owner, group and/or permission bits of `path`; a final
/// symlink's own owner (it has no mode of its own), never what it points
/// to. The path is opened once (`O_PATH`, not following a final link) and
/// changed through that descriptor.
pub fn set_attrs(
    root: &OwnedFd,
    path: &str,
    uid: Option<u32>,
    gid: Option<u32>,
    mode: Option<u32>,
) -> Result<Stat, RuntimeError> {
    let fd = open_in(root, path, OFlags::PATH | OFlags::NOFOLLOW, 0)?;
    let st = rustix::fs::fstat(&fd).map_err(err(path))?;
    if mode.is_some() && kind(st.st_mode) == Kind::Symlink {
        return Err(RuntimeError::BadPath(format!(
            "{path}: is a symlink, which has no permissions of its own"
        )));
    }
    if uid.is_some() || gid.is_some() {
        rustix::fs::chownat(
            &fd,
            "",
            uid.map(rustix::fs::Uid::from_raw),
            gid.map(rustix::fs::Gid::from_raw),
            AtFlags::EMPTY_PATH,
        )
        .map_err(|e| RuntimeError::os(format!("{path}: owner"), e))?;
    }
    if let Some(mode) = mode {
        // chmod has no "this descriptor" form for an O_PATH descriptor;
        // its /proc link is the inode itself, never a path looked up again.
        let link = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd));
        rustix::fs::chmod(
            link.as_str(),
            rustix::fs::Mode::from_raw_mode(mode & 0o7777),
        )
        .map_err(|e| RuntimeError::os(format!("{path}: mode {mode:o}"), e))?;
    }
    stat(root, path)
}

/// Renames `from` to `to` (replacing a file there, as rename(2) does);
/// `to`'s parent directories are made.
pub fn rename(root: &OwnedFd, from: &str, to: &str) -> Result<Stat, RuntimeError> {
    let (from_dir, from_name) = parent_of(root, from)?;
    let (to_parent, to_name) = split(to)?;
    let mut created = Created::default();
    let to_dir = mkdir_all_noting(root, &to_parent, Links::WithinRoot, &mut created)?;
    rustix::fs::renameat(&from_dir, from_name.as_str(), &to_dir, to_name.as_str()).map_err(
        |e| match e {
            rustix::io::Errno::NOENT => {
                RuntimeError::NotFound(format!("{from}: no such file or directory in the sandbox"))
            }
            rustix::io::Errno::ISDIR | rustix::io::Errno::NOTEMPTY | rustix::io::Errno::EXIST => {
                RuntimeError::Exists(format!("{to}: a directory is in the way"))
            }
            // Both names are single components here, so this is a
            // directory moved onto something that is not one.
            rustix::io::Errno::NOTDIR => {
                RuntimeError::Exists(format!("{to}: a file is in the way of directory {from}"))
            }
            rustix::io::Errno::INVAL => {
                RuntimeError::BadPath(format!("{from} cannot move into itself ({to})"))
            }
            e => RuntimeError::os(format!("rename {from} to {to}"), e),
        },
    )?;
    stat(root, to)
}

/// Removes `path`: a file or link, or a directory with everything in it.
pub fn remove(root: &OwnedFd, path: &str) -> Result<(), RuntimeError> {
    if path.trim_end_matches('/').is_empty() {
        return Err(RuntimeError::BadPath(
            "/: the sandbox's root cannot be removed".into(),
        ));
    }
    let (dir, name) = parent_of(root, path)?;
    remove_at(&dir, OsStr::new(&name), path)
}

fn remove_at(dir: &OwnedFd, name: &OsStr, path: &str) -> Result<(), RuntimeError> {
    let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).map_err(err(path))?;
    if kind(st.st_mode) != Kind::Dir {
        return rustix::fs::unlinkat(dir, name, AtFlags::empty()).map_err(err(path));
    }
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let sub = rustix::fs::openat(dir, name, flags, rustix::fs::Mode::empty()).map_err(err(path))?;
    let names: Vec<std::ffi::OsString> = {
        let dup = sub.try_clone().map_err(|e| RuntimeError::os(path, e))?;
        rustix::fs::Dir::read_from(&dup)
            .map_err(err(path))?
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_bytes().to_vec())
            .filter(|n| n != b"." && n != b"..")
            .map(std::os::unix::ffi::OsStringExt::from_vec)
            .collect()
    };
    for n in names {
        let child = join(path, &n.to_string_lossy());
        match remove_at(&sub, &n, &child) {
            Err(RuntimeError::NotFound(_)) | Ok(()) => {}
            Err(e) => return Err(e),
        }
    }
    rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR).map_err(err(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root(dir: &std::path::Path) -> OwnedFd {
        rustix::fs::open(
            dir,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .expect("open root")
    }

    // Here rather than with files' tests: it reads the attributes back with
    // `stat`, and files must not depend on this module.
    #[test]
    fn a_written_file_has_the_extended_attributes_given_and_no_old_ones() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = root(dir.path());
        let given: BTreeMap<String, String> =
            [("user.e2b.author".to_string(), "mish".to_string())].into();
        crate::files::write_file(&root, "/f", 0o644, &given, &mut &b"1"[..]).expect("write");
        let seen = stat(&root, "/f").expect("stat").xattrs;
        assert_eq!(seen, given);
        crate::files::write_file(&root, "/f", 0o644, &BTreeMap::new(), &mut &b"2"[..])
            .expect("rewrite");
        assert!(stat(&root, "/f").expect("stat").xattrs.is_empty());
        let outside: BTreeMap<String, String> = [("trusted.x".to_string(), "y".to_string())].into();
        assert!(crate::files::write_file(&root, "/g", 0o644, &outside, &mut &b"3"[..]).is_err());
        assert!(!dir.path().join("g").exists());
    }

    #[test]
    fn stat_list_mkdir_rename_remove_stay_in_the_root() {
        let t = tempfile::tempdir().expect("tempdir");
        let r = root(t.path());
        std::fs::create_dir_all(t.path().join("a/b")).expect("mkdir");
        std::fs::write(t.path().join("a/f.txt"), b"abc").expect("write");
        std::os::unix::fs::symlink("/etc", t.path().join("a/etc")).expect("symlink");

        let st = stat(&r, "/a/f.txt").expect("stat");
        assert_eq!((st.kind, st.size), (Kind::File, 3));
        let link = stat(&r, "/a/etc").expect("stat link");
        assert_eq!(link.kind, Kind::Symlink);
        assert_eq!(link.symlink_target.as_deref(), Some("/etc"));

        let paths = |depth| -> Vec<String> {
            list(&r, "/a", depth)
                .expect("list")
                .into_iter()
                .map(|s| s.path)
                .collect()
        };
        assert_eq!(paths(1), ["/a/b", "/a/etc", "/a/f.txt"], "sorted by name");
        // Depth 2 enters b/, never the link to /etc; each directory's
        // entries follow it (b/g before b-c, though '-' sorts before '/').
        std::fs::write(t.path().join("a/b/g"), b"").expect("write");
        std::fs::write(t.path().join("a/b-c"), b"").expect("write");
        assert_eq!(paths(2), ["/a/b", "/a/b/g", "/a/b-c", "/a/etc", "/a/f.txt"]);

        assert!(matches!(make_dir(&r, "/a/b"), Err(RuntimeError::Exists(_))));
        assert_eq!(make_dir(&r, "/x/y").expect("mkdir").kind, Kind::Dir);
        assert_eq!(
            rename(&r, "/a/f.txt", "/x/y/z.txt").expect("rename").size,
            3
        );
        assert!(matches!(
            stat(&r, "/a/f.txt"),
            Err(RuntimeError::NotFound(_))
        ));
        remove(&r, "/a").expect("remove tree");
        assert!(!t.path().join("a").exists());
        // The link led out of the root; removing /a removed the link, not /etc.
        assert!(
            std::path::Path::new("/etc/hostname").exists() || std::path::Path::new("/etc").exists()
        );
        assert!(matches!(
            remove(&r, "/nope"),
            Err(RuntimeError::NotFound(_))
        ));
        assert!(matches!(remove(&r, "/"), Err(RuntimeError::BadPath(_))));
    }

    #[test]
    fn a_path_through_a_file_is_a_bad_path() {
        let t = tempfile::tempdir().expect("tempdir");
        let r = root(t.path());
        std::fs::write(t.path().join("f"), b"x").expect("write");
        assert!(matches!(stat(&r, "/f/x"), Err(RuntimeError::BadPath(_))));
        assert!(matches!(list(&r, "/f", 1), Err(RuntimeError::BadPath(_))));
        assert!(matches!(remove(&r, "/f/x"), Err(RuntimeError::BadPath(_))));
        assert!(matches!(
            make_dir(&r, "/f/x"),
            Err(RuntimeError::BadPath(_))
        ));
        assert!(matches!(
            rename(&r, "/f", "/f/x"),
            Err(RuntimeError::BadPath(_))
        ));
        std::fs::create_dir_all(t.path().join("d/e")).expect("mkdir");
        assert!(matches!(
            rename(&r, "/d", "/f"),
            Err(RuntimeError::Exists(_))
        ));
        assert!(matches!(
            rename(&r, "/d", "/d/e/d"),
            Err(RuntimeError::BadPath(_))
        ));
        assert!(matches!(
            rename(&r, "/f", "/d"),
            Err(RuntimeError::Exists(_))
        ));
    }

    #[test]
    fn an_escaping_symlink_is_resolved_inside_the_root() {
        let t = tempfile::tempdir().expect("tempdir");
        let r = root(t.path());
        std::fs::create_dir(t.path().join("etc")).expect("mkdir");
        std::os::unix::fs::symlink("/etc", t.path().join("up")).expect("symlink");
        // /up/ resolves to the sandbox's /etc (empty), not the host's.
        assert!(list(&r, "/up", 1).expect("list").is_empty());
        assert!(matches!(
            stat(&r, "/up/passwd"),
            Err(RuntimeError::NotFound(_))
        ));
    }

    #[test]
    fn make_dir_as_and_set_attrs_give_owners_and_modes_and_stay_in_the_root() {
        use std::os::unix::fs::MetadataExt;
        let t = tempfile::tempdir().expect("tempdir");
        let r = root(t.path());
        let opts = |parents, exist_ok| DirOptions {
            owner: (1000, 1000),
            mode: 0o750,
            parents,
            exist_ok,
        };
        let owner_mode = |p: &str| {
            let m = std::fs::symlink_metadata(t.path().join(p)).expect("meta");
            (m.uid(), m.gid(), m.mode() & 0o7777)
        };
        assert!(matches!(
            make_dir_as(&r, "/a/b", opts(false, false)),
            Err(RuntimeError::NotFound(_))
        ));
        let st = make_dir_as(&r, "/a/b", opts(true, false)).expect("mkdir -p");
        assert_eq!((st.kind, st.path.as_str()), (Kind::Dir, "/a/b"));
        assert_eq!(owner_mode("a"), (1000, 1000, 0o750));
        assert_eq!(owner_mode("a/b"), (1000, 1000, 0o750));
        assert!(matches!(
            make_dir_as(&r, "/a/b", opts(false, false)),
            Err(RuntimeError::Exists(_))
        ));
        assert_eq!(
            make_dir_as(&r, "/a/b", opts(true, true))
                .expect("exists")
                .kind,
            Kind::Dir
        );
        std::fs::write(t.path().join("f"), b"x").expect("write");
        for (path, parents) in [("/f", true), ("/f/x", false), ("/f/x/y", true)] {
            assert!(
                matches!(
                    make_dir_as(&r, path, opts(parents, true)),
                    Err(RuntimeError::Exists(_))
                ),
                "{path}"
            );
        }

        let st = set_attrs(&r, "/f", Some(7), None, Some(0o600)).expect("chown chmod");
        assert_eq!((st.uid, st.gid, st.mode), (7, 0, 0o600));
        assert_eq!(owner_mode("f"), (7, 0, 0o600));
        // A link's own owner changes, never its target's; it has no mode.
        std::os::unix::fs::symlink("/etc/hostname", t.path().join("up")).expect("symlink");
        let host = std::fs::metadata("/etc/hostname").map(|m| (m.uid(), m.mode()));
        assert_eq!(
            set_attrs(&r, "/up", Some(5), Some(5), None)
                .expect("lchown")
                .uid,
            5
        );
        assert!(matches!(
            set_attrs(&r, "/up", None, None, Some(0o777)),
            Err(RuntimeError::BadPath(_))
        ));
        assert_eq!(
            std::fs::metadata("/etc/hostname")
                .map(|m| (m.uid(), m.mode()))
                .ok(),
            host.ok()
        );
        assert!(matches!(
            set_attrs(&r, "/nope", Some(1), None, None),
            Err(RuntimeError::NotFound(_))
        ));
        // A directory link resolves inside the root.
        std::os::unix::fs::symlink("/", t.path().join("top")).expect("symlink");
        std::fs::create_dir(t.path().join("etc")).expect("mkdir");
        let st = set_attrs(&r, "/top/etc", None, None, Some(0o700)).expect("chmod in root");
        assert_eq!(st.mode, 0o700);
        assert_eq!(owner_mode("etc").2, 0o700);
    }
}

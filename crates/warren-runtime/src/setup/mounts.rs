//! Inside a new sandbox, before its init serves anything: the root file
//! system with the mounts of its config, the pivot into it, then the
//! read-only and masked paths. Runs as root of the sandbox's user namespace
//! in its new mount namespace; nothing of the sandbox runs yet, so the only
//! hostile input is the image's own file tree, and every mount target in it
//! is opened without following symbolic links out of the root.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use nix::mount::{mount, MsFlags};
use rustix::fs::{Mode, OFlags};

use super::cgroup_v1::Hierarchy;
use super::error::SetupError;
use super::shared::Shared;
use super::spec::{Config, Mount};
use crate::files::{self, Created, Links};
use crate::RuntimeError;

/// Mounts the sandbox's root and everything its config lists, pivots into
/// it, and applies the read-only and masked paths.
pub fn enter_root(
    config: &Config,
    hierarchies: &[Hierarchy],
    shared: &Shared,
) -> Result<(), SetupError> {
    let root = &config.root.path;
    let propagation = match config.linux.rootfs_propagation.as_str() {
        "private" => MsFlags::MS_PRIVATE,
        "slave" => MsFlags::MS_SLAVE,
        other => {
            return Err(SetupError::Unsupported(format!(
                "root propagation {other:?} is not one Warren sets up"
            )))
        }
    };
    // Nothing mounted from here on reaches the spawner's namespace.
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | propagation,
        None::<&str>,
    )
    .map_err(|e| SetupError::os("make the sandbox's mounts private", e))?;
    // pivot_root needs the new root to be a mount of this namespace.
    crate::rootfs::bind_in_place(root)
        .map_err(|e| SetupError::os(format!("bind the root {} onto itself", root.display()), e))?;
    let root_fd = rustix::fs::open(
        root,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| SetupError::os(format!("open the root {}", root.display()), e))?;
    for m in &config.mounts {
        mount_one(&root_fd, m, hierarchies, shared)
            .map_err(|e| e.within(format!("mount {} at {}", m.kind, m.destination)))?;
    }
    devices(root)?;
    // Before the pivot: the shared empty directory is only reachable from
    // the spawner's mounts, which the pivot detaches.
    for path in &config.linux.masked_paths {
        mask(&root_fd, path, shared).map_err(|e| e.within(format!("mask {path}")))?;
    }
    crate::rootfs::pivot_into(root)?;
    reopen_null()?;
    for path in &config.linux.readonly_paths {
        read_only(Path::new(path)).map_err(|e| e.within(format!("make {path} read-only")))?;
    }
    Ok(())
}

/// A mount's options: the flags the kernel takes as bits and the rest,
/// which go to the file system as its data.
struct Options {
    flags: MsFlags,
    data: Vec<String>,
}

impl Options {
    fn parse(options: &[String]) -> Options {
        let mut flags = MsFlags::empty();
        let mut data = Vec::new();
        for o in options {
            match o.as_str() {
                "ro" => flags |= MsFlags::MS_RDONLY,
                "nosuid" => flags |= MsFlags::MS_NOSUID,
                "nodev" => flags |= MsFlags::MS_NODEV,
                "noexec" => flags |= MsFlags::MS_NOEXEC,
                "strictatime" => flags |= MsFlags::MS_STRICTATIME,
                "relatime" => flags |= MsFlags::MS_RELATIME,
                "noatime" => flags |= MsFlags::MS_NOATIME,
                "nodiratime" => flags |= MsFlags::MS_NODIRATIME,
                "bind" => flags |= MsFlags::MS_BIND,
                "rbind" => flags |= MsFlags::MS_BIND | MsFlags::MS_REC,
                // The defaults, and propagation: every mount of a sandbox
                // is private already (see enter_root).
                "rw" | "suid" | "dev" | "exec" | "private" | "rprivate" | "slave" | "rslave" => {}
                _ => data.push(o.clone()),
            }
        }
        Options { flags, data }
    }

    fn data(&self) -> Option<String> {
        (!self.data.is_empty()).then(|| self.data.join(","))
    }
}

fn mount_one(
    root: &OwnedFd,
    m: &Mount,
    hierarchies: &[Hierarchy],
    shared: &Shared,
) -> Result<(), SetupError> {
    let opts = Options::parse(&m.options);
    match m.kind.as_str() {
        "bind" => bind(root, m, &opts),
        "cgroup" => cgroup_v1(root, m, &opts, hierarchies, shared),
        "proc" | "sysfs" | "tmpfs" | "devpts" | "mqueue" => {
            let at = target(root, &m.destination, Leaf::Dir, Links::Refuse)?;
            mount(
                Some(&m.source),
                fd_path(&at).as_str(),
                Some(m.kind.as_str()),
                opts.flags,
                opts.data().as_deref(),
            )
            .map_err(|e| SetupError::os("mount", e))
        }
        other => Err(SetupError::Unsupported(format!(
            "the mount type {other} is not one Warren sets up"
        ))),
    }
}

/// A bind of a host path (a CDI device node or file). The destination may
/// go through the image's own links (a merged `/usr`), resolved as if the
/// root were `/`; the options other than the bind itself need a second,
/// remounting call, which keeps the flags the kernel locks on the source.
fn bind(root: &OwnedFd, m: &Mount, opts: &Options) -> Result<(), SetupError> {
    let leaf = if m.source.is_dir() {
        Leaf::Dir
    } else {
        Leaf::File
    };
    let at = target(root, &m.destination, leaf, Links::WithinRoot)?;
    let recursive = opts.flags & MsFlags::MS_REC;
    mount(
        Some(&m.source),
        fd_path(&at).as_str(),
        None::<&str>,
        MsFlags::MS_BIND | recursive,
        None::<&str>,
    )
    .map_err(|e| SetupError::os(format!("bind {}", m.source.display()), e))?;
    let extra = opts.flags - (MsFlags::MS_BIND | MsFlags::MS_REC);
    if extra.is_empty() {
        return Ok(());
    }
    // Opened again: the new mount is on top of the first descriptor's file.
    let mounted = target(root, &m.destination, leaf, Links::WithinRoot)?;
    remount(fd_path(&mounted).as_str(), extra)
}

/// cgroup v1: the shared read-only skeleton (see [`super::shared`]) with
/// each hierarchy the sandbox has a cgroup in mounted in it. The sandbox is
/// in a cgroup namespace rooted at its own cgroups, so each shows the
/// sandbox's cgroup as its root. The others (named ones such as
/// `name=systemd`, `cpuset`, `perf_event`, `net_cls`) are left out: the
/// sandbox has no cgroup there, and its root would be the spawner's.
fn cgroup_v1(
    root: &OwnedFd,
    m: &Mount,
    opts: &Options,
    hierarchies: &[Hierarchy],
    shared: &Shared,
) -> Result<(), SetupError> {
    let at = target(root, &m.destination, Leaf::Dir, Links::Refuse)?;
    mount(
        Some(&shared.cgroup),
        fd_path(&at).as_str(),
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(|e| SetupError::os("bind the skeleton", e))?;
    // Opened again: the bind is on top of the first descriptor's directory.
    let base = target(root, &m.destination, Leaf::Dir, Links::Refuse)?;
    for h in hierarchies.iter().filter(|h| h.sandboxed()) {
        let Some(name) = h.mount.file_name() else {
            continue;
        };
        let sub = rustix::fs::openat(
            &base,
            name,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| SetupError::os(format!("open {}", Path::new(name).display()), e))?;
        mount(
            Some("cgroup"),
            fd_path(&sub).as_str(),
            Some("cgroup"),
            opts.flags,
            Some(h.options.as_str()),
        )
        .map_err(|e| SetupError::os(format!("the {} hierarchy", h.options), e))?;
    }
    Ok(())
}

#[derive(Clone, Copy)]
enum Leaf {
    Dir,
    File,
}

/// Opens `dest` under `root` (an `O_PATH` descriptor to mount on through
/// `/proc/self/fd`), creating what is missing: directories on the way and
/// the last component as a `leaf`. Nothing is resolved outside the root.
fn target(root: &OwnedFd, dest: &str, leaf: Leaf, links: Links) -> Result<OwnedFd, SetupError> {
    let rel = relative(dest)?;
    let rel = rel.to_string_lossy();
    let opened = match leaf {
        Leaf::Dir => files::mkdir_all_noting(root, &rel, links, &mut Created::default()),
        Leaf::File => file_target(root, &rel, links),
    };
    opened.map_err(|e| SetupError::InRoot {
        what: format!("mount target {dest} in the root"),
        source: Box::new(e),
    })
}

/// A file to bind a file onto, made empty when it is missing.
fn file_target(root: &OwnedFd, rel: &str, links: Links) -> Result<OwnedFd, RuntimeError> {
    match files::open_in_with(root, rel, OFlags::PATH, 0, links) {
        Err(RuntimeError::NotFound(_)) => {}
        opened => return opened,
    }
    let (parent, name) = files::split(rel)?;
    let dir = files::mkdir_all_noting(root, &parent, links, &mut Created::default())?;
    let made = rustix::fs::openat(
        &dir,
        name.as_str(),
        OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::from_raw_mode(0o644),
    );
    match made {
        Ok(_) | Err(rustix::io::Errno::EXIST) => {}
        Err(e) => return Err(RuntimeError::os(format!("create {rel}"), e)),
    }
    files::open_in_with(root, rel, OFlags::PATH, 0, links)
}

/// `dest` as a path relative to the root, refused when it leaves it.
fn relative(dest: &str) -> Result<PathBuf, SetupError> {
    let mut rel = PathBuf::new();
    for c in Path::new(dest).components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(p) => rel.push(p),
            Component::ParentDir | Component::Prefix(_) => {
                return Err(SetupError::Unsupported(format!(
                    "the destination {dest} climbs out of the root"
                )))
            }
        }
    }
    if rel.as_os_str().is_empty() {
        return Err(SetupError::Unsupported(format!(
            "the destination {dest} is the root itself"
        )));
    }
    Ok(rel)
}

fn fd_path(fd: &OwnedFd) -> String {
    format!("/proc/self/fd/{}", fd.as_fd().as_raw_fd())
}

/// The device nodes a program expects, bound from the host (in a user
/// namespace mknod is refused; the device cgroup limits what they reach),
/// and the usual links. `/dev` is the tmpfs just mounted, so nothing in it
/// comes from the image.
fn devices(root: &Path) -> Result<(), SetupError> {
    let dev = root.join("dev");
    for name in ["null", "zero", "full", "tty", "urandom", "random"] {
        let at = dev.join(name);
        std::fs::File::create(&at).map_err(|e| SetupError::os(format!("create /dev/{name}"), e))?;
        let host = Path::new("/dev").join(name);
        mount(
            Some(&host),
            &at,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|e| SetupError::os(format!("bind /dev/{name}"), e))?;
    }
    for (link, to) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        ("ptmx", "pts/ptmx"),
    ] {
        std::os::unix::fs::symlink(to, dev.join(link))
            .map_err(|e| SetupError::os(format!("link /dev/{link}"), e))?;
    }
    Ok(())
}

/// Standard input and output were the host's /dev/null; now the sandbox's.
fn reopen_null() -> Result<(), SetupError> {
    let null = rustix::fs::open("/dev/null", OFlags::RDWR | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| SetupError::os("open /dev/null", e))?;
    for fd in 0..3 {
        // SAFETY: dup2 onto the standard descriptors, which this process
        // owns and which nothing else refers to.
        if unsafe { libc::dup2(null.as_raw_fd(), fd) } < 0 {
            return Err(SetupError::last_os("dup2 /dev/null"));
        }
    }
    Ok(())
}

/// A mount's flags that a remount must repeat: the kernel refuses to clear
/// the ones it locked on a mount that came from a more privileged namespace.
fn locked_flags(path: &str) -> Result<MsFlags, SetupError> {
    use nix::sys::statvfs::FsFlags;
    let st = nix::sys::statvfs::statvfs(path).map_err(|e| SetupError::os("statvfs", e))?;
    let f = st.flags();
    let mut flags = MsFlags::empty();
    for (fs, ms) in [
        (FsFlags::ST_RDONLY, MsFlags::MS_RDONLY),
        (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
        (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
        (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
        (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
        (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
    ] {
        if f.contains(fs) {
            flags |= ms;
        }
    }
    Ok(flags)
}

fn remount(path: &str, flags: MsFlags) -> Result<(), SetupError> {
    let keep = locked_flags(path)?;
    mount(
        None::<&str>,
        path,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REMOUNT | keep | flags,
        None::<&str>,
    )
    .map_err(|e| SetupError::os("remount", e))
}

fn exists(path: &Path) -> Result<Option<std::fs::Metadata>, SetupError> {
    match std::fs::symlink_metadata(path) {
        Ok(m) => Ok(Some(m)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(SetupError::os("stat", e)),
    }
}

/// Binds `path` onto itself and makes that bind read-only (and nosuid,
/// nodev, noexec, as runc does). A path the kernel does not have, or one
/// on a read-only mount already (the cgroup hierarchies), is skipped.
fn read_only(path: &Path) -> Result<(), SetupError> {
    if exists(path)?.is_none()
        || locked_flags(&path.to_string_lossy())?.contains(MsFlags::MS_RDONLY)
    {
        return Ok(());
    }
    crate::rootfs::bind_in_place(path).map_err(|e| SetupError::os("bind", e))?;
    let flags = MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    remount(&path.to_string_lossy(), flags)
}

/// Hides `path` in the root: the shared empty directory over a directory,
/// the host's /dev/null over a file. A path the root lacks is skipped, and
/// one that goes through a link is refused.
fn mask(root: &OwnedFd, path: &str, shared: &Shared) -> Result<(), SetupError> {
    let rel = relative(path)?;
    let at = match files::open_in_with(root, &rel.to_string_lossy(), OFlags::PATH, 0, Links::Refuse)
    {
        Ok(at) => at,
        Err(RuntimeError::NotFound(_)) => return Ok(()),
        Err(e) => {
            return Err(SetupError::InRoot {
                what: "open it in the root".into(),
                source: Box::new(e),
            })
        }
    };
    let is_dir = rustix::fs::fstat(&at)
        .map(|st| rustix::fs::FileType::from_raw_mode(st.st_mode).is_dir())
        .map_err(|e| SetupError::os("stat", e))?;
    let source = if is_dir {
        shared.empty.as_path()
    } else {
        Path::new("/dev/null")
    };
    mount(
        Some(source),
        fd_path(&at).as_str(),
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(|e| SetupError::os("bind over it", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destinations_stay_in_the_root() {
        assert_eq!(
            relative("/dev/pts").expect("fine"),
            PathBuf::from("dev/pts")
        );
        assert!(relative("/usr/../../etc").is_err());
        assert!(relative("/").is_err());
    }

    #[test]
    fn options_split_into_flags_and_data() {
        let o = Options::parse(&[
            "nosuid".into(),
            "newinstance".into(),
            "ptmxmode=0666".into(),
            "rbind".into(),
        ]);
        assert_eq!(
            o.flags,
            MsFlags::MS_NOSUID | MsFlags::MS_BIND | MsFlags::MS_REC
        );
        assert_eq!(o.data().as_deref(), Some("newinstance,ptmxmode=0666"));
    }
}

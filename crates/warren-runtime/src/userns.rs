//! User namespaces: root in a sandbox is an unprivileged host uid range of
//! its own.
//!
//! Each sandbox gets 65536 host uids and gids starting at a base unique on
//! the host (a slot file under `/run/warren/uids` claims it, whichever Warren
//! home made the sandbox). Its user namespace maps 0..65536 inside to
//! base..base+65536 outside, so a process that breaks out of every other
//! layer is still a uid that owns nothing on the host and differs from every
//! other sandbox's.
//!
//! Image layers stay owned by host uid 0 and are shared by every sandbox:
//! each sandbox's overlay is built on id-mapped bind mounts of the layers
//! (`mount_setattr(MOUNT_ATTR_IDMAP)`), which show the layers' uid 0 as the
//! sandbox's base. Nothing is copied or chowned per sandbox except its own
//! empty upper directory.

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use warren_core::sync::lock;

use crate::os_error::OsError;
use crate::RuntimeError;

/// Ids per sandbox: a full 16-bit range, what images expect (nobody is 65534).
pub const SIZE: u32 = 65536;
/// The first base handed out; far above any distribution's users and the
/// ranges /etc/subuid usually delegates (100000 upwards).
const FIRST: u32 = 1 << 30;
/// Slots up to 2^31, so every mapped id stays a positive signed 32-bit value.
const SLOTS: u32 = 16384;
const SLOT_DIR: &str = "/run/warren/uids";
/// Where a sandbox's base is recorded in its directory.
const RECORD: &str = "uid_base";

/// A sandbox's host id range: `base .. base + SIZE`, for uids and gids alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdRange {
    pub base: u32,
}

impl IdRange {
    /// The id inside the sandbox of host id `host`, if the range holds it.
    pub fn inside(&self, host: u32) -> Option<u32> {
        host.checked_sub(self.base).filter(|id| *id < SIZE)
    }

    fn slot(&self) -> u32 {
        (self.base - FIRST) / SIZE
    }
}

fn slot_file(slot: u32) -> PathBuf {
    Path::new(SLOT_DIR).join(slot.to_string())
}

/// Claims a free range for the sandbox in `dir` and records it there.
pub fn allocate(dir: &Path) -> Result<IdRange, RuntimeError> {
    std::fs::create_dir_all(SLOT_DIR)
        .map_err(|e| RuntimeError::create_os(format!("create {SLOT_DIR}"), e))?;
    // Start where the last allocation stopped (seeded from the clock so
    // concurrent daemons do not all probe the same slots first).
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos() % SLOTS)
            .unwrap_or(0),
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    let owner = dir.as_os_str().as_bytes();
    for _ in 0..SLOTS {
        let slot = NEXT.fetch_add(1, Ordering::Relaxed) % SLOTS;
        let range = IdRange {
            base: FIRST + slot * SIZE,
        };
        if claim(slot, owner)? || (reclaim_if_stale(slot)? && claim(slot, owner)?) {
            warren_crashpoint::hit("create:claimed");
            std::fs::write(dir.join(RECORD), range.base.to_string())
                .map_err(|e| RuntimeError::create_os("record uid range", e))?;
            return Ok(range);
        }
    }
    Err(RuntimeError::Create(format!(
        "all {SLOTS} uid ranges under {SLOT_DIR} are in use: destroy sandboxes first"
    )))
}

/// Creates the slot file; false if someone holds it.
fn claim(slot: u32, owner: &[u8]) -> Result<bool, RuntimeError> {
    match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(slot_file(slot))
    {
        Ok(mut f) => {
            f.write_all(owner)
                .map_err(|e| RuntimeError::create_os(format!("write uid slot {slot}"), e))?;
            Ok(true)
        }
        Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(RuntimeError::create_os(format!("claim uid slot {slot}"), e)),
    }
}

/// Removes a slot whose sandbox directory no longer exists (its owner
/// crashed between removing the directory and the slot). Serialised by a
/// lock so two daemons never both remove and re-claim the same slot.
fn reclaim_if_stale(slot: u32) -> Result<bool, RuntimeError> {
    let lock = File::create(Path::new(SLOT_DIR).join(".lock"))
        .map_err(|e| RuntimeError::create_os("uid slot lock", e))?;
    let _held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| RuntimeError::create_os("uid slot lock", e))?;
    let path = slot_file(slot);
    let mut owner = Vec::new();
    match File::open(&path).and_then(|mut f| f.read_to_end(&mut owner)) {
        Ok(_) => {}
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(true),
        Err(_) => return Ok(false),
    }
    // An empty file is a claim being written right now.
    if owner.is_empty() || Path::new(std::ffi::OsStr::from_bytes(&owner)).exists() {
        return Ok(false);
    }
    Ok(std::fs::remove_file(&path).is_ok())
}

/// The range recorded for the sandbox in `dir`, if it has one.
pub fn recorded(dir: &Path) -> Option<IdRange> {
    let base: u32 = std::fs::read_to_string(dir.join(RECORD))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    (base >= FIRST && (base - FIRST).is_multiple_of(SIZE) && (base - FIRST) / SIZE < SLOTS)
        .then_some(IdRange { base })
}

/// Gives back the range of the sandbox in `dir` (read before the directory
/// goes, released after). Only a slot that still names `dir` is removed.
pub fn release(dir: &Path, range: IdRange) {
    let path = slot_file(range.slot());
    if std::fs::read(&path).is_ok_and(|owner| owner == dir.as_os_str().as_bytes()) {
        let _ = std::fs::remove_file(path);
    }
}

/// Gives back whatever range names `dir`, found by looking at every claim:
/// for a sandbox whose record of its range is gone (a destroy that crashed
/// while removing its directory, or a create that crashed between the
/// claim and the record).
pub fn release_unrecorded(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(SLOT_DIR) else {
        return;
    };
    let owner = dir.as_os_str().as_bytes();
    for e in entries.flatten() {
        if std::fs::read(e.path()).is_ok_and(|o| o == owner) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Removes slots that name a directory under `sandboxes` that is gone:
/// ranges a crashed daemon of this home never gave back.
pub fn sweep(sandboxes: &Path) {
    let Ok(entries) = std::fs::read_dir(SLOT_DIR) else {
        return;
    };
    for e in entries.flatten() {
        let Ok(owner) = std::fs::read(e.path()) else {
            continue;
        };
        let owner = PathBuf::from(std::ffi::OsString::from_vec(owner));
        if owner.parent() == Some(sandboxes) && !owner.exists() {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// A user namespace mapping `range` (0 inside is `range.base` outside),
/// for id-mapped mounts. A short-lived child creates it; the returned
/// descriptor keeps it alive after the child exits. Takes the namespace
/// [`prepare_spare`] made, if there is one.
pub fn namespace_fd(range: IdRange) -> Result<OwnedFd, RuntimeError> {
    let spare = lock(&SPARE).take();
    if let Some(spare) = spare.filter(Unmapped::alive) {
        // Its child exits once mapped; the spawner's loop reaps it.
        if let Ok(fd) = spare.map(range) {
            return Ok(fd);
        }
    }
    let fresh = Unmapped::start()?;
    let child = fresh.child;
    let result = fresh.map(range);
    let _ = nix::sys::wait::waitpid(child, None);
    result
}

/// Makes a user namespace for the next [`namespace_fd`] of this process
/// ahead of time: the fork of a child and its `unshare` (about 0.8 ms of
/// every create on this project's development machine) happen after a
/// create's answer instead of inside the next create. Only for a
/// single-threaded process that reaps its children (the spawner).
pub fn prepare_spare() {
    let mut spare = lock(&SPARE);
    if spare.is_none() {
        *spare = Unmapped::start().ok();
    }
}

static SPARE: std::sync::Mutex<Option<Unmapped>> = std::sync::Mutex::new(None);

/// A child in a user namespace of its own with no ids mapped yet, waiting
/// to be given a range.
struct Unmapped {
    child: nix::unistd::Pid,
    /// Readable once the child is gone: its pid then may name another
    /// process, whose maps must never be written.
    pidfd: OwnedFd,
    ready: OwnedFd,
    /// The child exits when this closes.
    done: OwnedFd,
}

impl Unmapped {
    fn start() -> Result<Unmapped, RuntimeError> {
        let err = |what: &str, e: std::io::Error| {
            RuntimeError::create_os(format!("user namespace: {what}"), e)
        };
        let (ready_r, ready_w) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| err("pipe", e.into()))?;
        let (done_r, done_w) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| err("pipe", e.into()))?;
        // SAFETY: the child only calls async-signal-safe functions (unshare,
        // write, read, _exit) before it exits, so forking a multi-threaded
        // process is sound.
        match unsafe { nix::unistd::fork() }.map_err(|e| err("fork", e.into()))? {
            nix::unistd::ForkResult::Child => {
                // SAFETY: raw syscalls on descriptors this child inherited.
                unsafe {
                    // Its copies of the parent's ends, or `done` never sees EOF.
                    libc::close(ready_r.as_raw_fd());
                    libc::close(done_w.as_raw_fd());
                    let ok: u8 = (libc::unshare(libc::CLONE_NEWUSER) == 0).into();
                    libc::write(ready_w.as_raw_fd(), (&ok as *const u8).cast(), 1);
                    let mut b = 0u8;
                    libc::read(done_r.as_raw_fd(), (&mut b as *mut u8).cast(), 1);
                    libc::_exit(0);
                }
            }
            nix::unistd::ForkResult::Parent { child } => {
                drop((ready_w, done_r));
                let pidfd = rustix::process::Pid::from_raw(child.as_raw())
                    .ok_or_else(|| err("pid", std::io::ErrorKind::InvalidData.into()))
                    .and_then(|pid| {
                        rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())
                            .map_err(|e| err("pidfd_open", e.into()))
                    });
                let pidfd = match pidfd {
                    Ok(fd) => fd,
                    Err(e) => {
                        drop(done_w);
                        let _ = nix::sys::wait::waitpid(child, None);
                        return Err(e);
                    }
                };
                Ok(Unmapped {
                    child,
                    pidfd,
                    ready: ready_r,
                    done: done_w,
                })
            }
        }
    }

    fn alive(&self) -> bool {
        use rustix::event::{poll, PollFd, PollFlags};
        let mut fds = [PollFd::new(&self.pidfd, PollFlags::IN)];
        let now = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        matches!(poll(&mut fds, Some(&now)), Ok(0))
    }

    /// Maps `range` and opens the namespace; the child exits.
    fn map(self, range: IdRange) -> Result<OwnedFd, RuntimeError> {
        let result = map_child(self.child.as_raw(), range, self.ready);
        drop(self.done);
        result
    }
}

fn map_child(pid: i32, range: IdRange, ready: OwnedFd) -> Result<OwnedFd, RuntimeError> {
    let err = |what: &str, e: std::io::Error| {
        RuntimeError::create_os(format!("user namespace: {what}"), e)
    };
    let mut ok = [0u8];
    File::from(ready)
        .read_exact(&mut ok)
        .map_err(|e| err("wait for the child", e))?;
    if ok[0] != 1 {
        return Err(RuntimeError::Create(
            "user namespace: unshare(CLONE_NEWUSER) failed; see `warren doctor`".into(),
        ));
    }
    let map = format!("0 {} {SIZE}\n", range.base);
    for file in ["uid_map", "gid_map"] {
        std::fs::write(format!("/proc/{pid}/{file}"), &map).map_err(|e| err(file, e))?;
    }
    File::open(format!("/proc/{pid}/ns/user"))
        .map(OwnedFd::from)
        .map_err(|e| err("open", e))
}

/// Binds `src` at `target` read-only, with ids mapped through `userns`.
pub fn idmapped_bind(src: &Path, userns: &OwnedFd, target: &Path) -> Result<(), RuntimeError> {
    use rustix::mount::{move_mount, MoveMountFlags};
    let tree = mapped_tree(src, Some(userns), true)?;
    move_mount(
        &tree,
        "",
        rustix::fs::CWD,
        target,
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
    )
    .map_err(|e| {
        RuntimeError::create_os(
            format!("id-mapped mount of {}: move_mount", src.display()),
            e,
        )
    })
}

/// A detached copy of the mount at `src` (`nosuid,nodev`, read-only if
/// asked), with ids mapped through `userns` when given: attached nowhere
/// until moved.
pub(crate) fn mapped_tree(
    src: &Path,
    userns: Option<&OwnedFd>,
    read_only: bool,
) -> Result<OwnedFd, RuntimeError> {
    use rustix::mount::{open_tree, OpenTreeFlags};
    let tree = open_tree(
        rustix::fs::CWD,
        src,
        OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC,
    )
    .map_err(|e| {
        RuntimeError::create_os(
            format!("id-mapped mount of {}: open_tree", src.display()),
            e,
        )
    })?;
    let mut attr_set = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    if userns.is_some() {
        attr_set |= MOUNT_ATTR_IDMAP;
    }
    if read_only {
        attr_set |= MOUNT_ATTR_RDONLY;
    }
    let attr = MountAttr {
        attr_set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.map_or(0, |u| u.as_raw_fd() as u64),
    };
    // SAFETY: mount_setattr reads `attr` (size given) and an empty path
    // relative to the tree descriptor we own.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if rc != 0 {
        return Err(RuntimeError::Create(format!(
            "id-mapped mount of {}: mount_setattr: {} (this kernel or file system may lack id-mapped mounts: \
             `warren doctor` checks; `warren up --no-userns` runs sandboxes without user namespaces)",
            src.display(),
            std::io::Error::last_os_error()
        )));
    }
    Ok(tree)
}

/// Why [`check_idmap`] found no id-mapped mounts.
#[derive(Debug, thiserror::Error)]
pub enum IdmapCheckError {
    #[error(transparent)]
    Os(#[from] OsError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// What the checking child reported: its error crosses the pipe as text.
    #[error("{0}")]
    Child(String),
}

/// Whether sandboxes can get user namespaces with image layers stored
/// under `dir` (or its nearest existing parent): makes a user namespace and
/// an id-mapped mount of `dir`, in a child with a mount namespace of its own
/// so the host sees nothing. Call it only from a single-threaded process.
pub fn check_idmap(dir: &Path) -> Result<PathBuf, IdmapCheckError> {
    let dir = dir
        .ancestors()
        .find(|d| d.is_dir())
        .unwrap_or(Path::new("/"))
        .to_path_buf();
    let (r, w) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| OsError::new("pipe", e))?;
    // SAFETY: called from a single-threaded process (`warren doctor` runs
    // before any runtime thread), so the child may allocate; it reports
    // through the pipe and exits without returning.
    match unsafe { nix::unistd::fork() }.map_err(|e| OsError::new("fork", e))? {
        nix::unistd::ForkResult::Child => {
            drop(r);
            let result = (|| -> Result<(), IdmapCheckError> {
                nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)
                    .map_err(|e| OsError::new("unshare a mount namespace", e))?;
                nix::mount::mount(
                    None::<&str>,
                    "/",
                    None::<&str>,
                    nix::mount::MsFlags::MS_REC | nix::mount::MsFlags::MS_PRIVATE,
                    None::<&str>,
                )
                .map_err(|e| OsError::new("private mounts", e))?;
                let ns = namespace_fd(IdRange { base: FIRST })?;
                idmapped_bind(&dir, &ns, &dir)?;
                Ok(())
            })();
            // The boundary: the parent gets the error's text, or nothing.
            let msg = result.err().map(|e| e.to_string()).unwrap_or_default();
            let _ = File::from(w).write_all(msg.as_bytes());
            // SAFETY: ends the child without running the parent's destructors.
            unsafe { libc::_exit(0) }
        }
        nix::unistd::ForkResult::Parent { child } => {
            drop(w);
            let mut msg = String::new();
            let _ = File::from(r).read_to_string(&mut msg);
            let _ = nix::sys::wait::waitpid(child, None);
            if msg.is_empty() {
                Ok(dir)
            } else {
                Err(IdmapCheckError::Child(msg))
            }
        }
    }
}

const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

/// `struct mount_attr` of linux/mount.h.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The owner, seen through a detached id-mapped copy of `dir`, of the
    /// root-owned file `f` in it.
    fn owner_through(dir: &Path, ns: &OwnedFd) -> u32 {
        let tree = mapped_tree(dir, Some(ns), true).unwrap();
        rustix::fs::statat(&tree, "f", rustix::fs::AtFlags::empty())
            .unwrap()
            .st_uid
    }

    #[test]
    fn a_spare_namespace_serves_the_next_range_and_a_dead_one_fails_nothing() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"x").unwrap();
        let range = IdRange {
            base: FIRST + 7 * SIZE,
        };
        prepare_spare();
        let spare = lock(&SPARE).as_ref().map(|s| s.child);
        assert!(spare.is_some(), "no spare was made");
        let ns = namespace_fd(range).unwrap();
        assert!(lock(&SPARE).is_none(), "the spare was not taken");
        assert_eq!(owner_through(dir.path(), &ns), range.base);
        if let Some(child) = spare {
            let _ = nix::sys::wait::waitpid(child, None);
        }
        // A spare whose child died is not used: a fresh namespace serves.
        prepare_spare();
        let child = lock(&SPARE).as_ref().map(|s| s.child).unwrap();
        nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL).unwrap();
        let _ = nix::sys::wait::waitpid(child, None);
        let ns = namespace_fd(range).unwrap();
        assert_eq!(owner_through(dir.path(), &ns), range.base);
    }

    #[test]
    fn inside_maps_only_the_range() {
        let r = IdRange { base: FIRST + SIZE };
        assert_eq!(r.inside(FIRST + SIZE), Some(0));
        assert_eq!(r.inside(FIRST + SIZE + 1000), Some(1000));
        assert_eq!(r.inside(FIRST + 2 * SIZE), None);
        assert_eq!(r.inside(0), None);
        assert_eq!(r.slot(), 1);
    }

    fn claimed_by(dir: &Path) -> Vec<PathBuf> {
        std::fs::read_dir(SLOT_DIR)
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.path())
                    .filter(|p| std::fs::read(p).is_ok_and(|o| o == dir.as_os_str().as_bytes()))
                    .collect()
            })
            .unwrap_or_default()
    }

    #[test]
    fn ranges_are_claimed_once_recorded_released_and_swept() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: claiming host uid ranges needs root");
            return;
        }
        let home = tempfile::tempdir().expect("tempdir");
        let (a, b) = (home.path().join("sbx-a"), home.path().join("sbx-b"));
        std::fs::create_dir(&a).expect("mkdir");
        std::fs::create_dir(&b).expect("mkdir");
        let ra = allocate(&a).expect("allocate");
        let rb = allocate(&b).expect("allocate");
        assert_ne!(ra, rb);
        assert_eq!(recorded(&a), Some(ra));
        assert_eq!(claimed_by(&a).len(), 1);
        // A sandbox directory that vanished without giving its range back
        // (a crash) is swept; a live one is not.
        std::fs::remove_dir_all(&a).expect("rm");
        sweep(home.path());
        assert!(claimed_by(&a).is_empty());
        assert_eq!(claimed_by(&b).len(), 1);
        // Release removes only a claim that still names the directory.
        release(&a, rb);
        assert_eq!(claimed_by(&b).len(), 1);
        release(&b, rb);
        assert!(claimed_by(&b).is_empty());
    }
}

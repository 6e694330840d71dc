//! The spawner: a single-threaded helper process that creates sandboxes,
//! with Warren's own set-up on cgroup v1 hosts ([`crate::setup`]) and
//! libcontainer on v2. Both clone and then run Rust code in
//! the child, which is only sound when the parent has a single thread (a
//! lock another thread held at the clone stays locked in the child
//! forever), so the multi-threaded daemon never calls it itself: it starts
//! `warren spawner` with a socket on stdin and sends requests.

use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use libcontainer::container::builder::ContainerBuilder;
use libcontainer::syscall::syscall::SyscallType;

use libcontainer::error::LibcontainerError;
use thiserror::Error;

use crate::init::{WarrenInit, LISTEN_FD};
use crate::os_error::OsError;
use crate::proto::{self, SpawnerReply, SpawnerRequest};
use crate::setup::SetupError;
use crate::RuntimeError;

/// Why a spawner could not create a sandbox. Typed up to its main loop,
/// where it crosses to the daemon as the reply's message (the daemon is
/// another process).
#[derive(Debug, Error)]
pub enum SpawnError {
    #[error(transparent)]
    Os(#[from] OsError),
    /// Warren's own set-up (cgroup v1 hosts).
    #[error(transparent)]
    Setup(#[from] SetupError),
    /// libcontainer's (cgroup v2 hosts): the step, and its error.
    #[error("{what}: {source}")]
    Libcontainer {
        what: &'static str,
        // Boxed: libcontainer's error is large, and this one is returned
        // on every path.
        source: Box<LibcontainerError>,
    },
    #[error("created sandbox has no pid")]
    NoPid,
    /// Mounting the sandbox's root (its layers, disk, volumes, secrets).
    #[error("{}", plain_message(.0))]
    Mount(RuntimeError),
    /// runsc's create or start (the gvisor class).
    #[error(transparent)]
    Gvisor(#[from] crate::gvisor::spawn::GvisorStartError),
}

/// A runtime error's message without the "create failed" prefix the daemon
/// adds again.
fn plain_message(e: &RuntimeError) -> String {
    match e {
        RuntimeError::Create(m) => m.clone(),
        other => other.to_string(),
    }
}

/// Entry point of `warren spawner`. Never returns normally: exits when the
/// daemon closes its end of the socket.
pub fn main() -> ! {
    // The request socket arrives on fd 0, which becomes /dev/null below.
    let sock = match crate::init::above_listen_fd(0) {
        Ok(fd) => UnixStream::from(fd),
        Err(_) => std::process::exit(2),
    };
    // Once, for every sandbox this spawner starts: the filter each set-up
    // (a copy of this process) installs, and the init it execs.
    if let Err(e) = crate::syscall_filter::prepare() {
        eprintln!("warren spawner: {e}");
        std::process::exit(2);
    }
    if let Err(e) = crate::init::prepare() {
        eprintln!("warren spawner: {e}");
        std::process::exit(2);
    }
    // A private mount namespace: sandbox roots are mounted here only long
    // enough to be cloned into each sandbox's own namespace, so the host's
    // mount table (which every new mount namespace copies) does not grow
    // with the number of live sandboxes.
    if let Err(e) = private_mount_namespace() {
        eprintln!("warren spawner: {e}");
        std::process::exit(2);
    }
    // gVisor sandboxes' processes (runsc's sentry, gofer and their ptrace
    // stubs) are orphaned as `runsc create` exits, and again as the sentry
    // dies: they become this spawner's children, reaped below, rather than
    // the daemon's, which only reaps the inits it watches.
    // SAFETY: prctl(PR_SET_CHILD_SUBREAPER) takes plain integers.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    if let Ok(null) = File::open("/dev/null") {
        // SAFETY: replaces stdin with /dev/null; nothing else holds fd 0.
        unsafe { libc::dup2(null.as_raw_fd(), 0) };
    }
    loop {
        // Sandbox inits are our children (libcontainer clones them with
        // CLONE_PARENT); reap the ones that died while we wait for work. The
        // daemon learns of their death through a pidfd, not from us.
        while !readable_within(&sock, 100) {
            reap_children();
        }
        reap_children();
        let request = match proto::recv::<SpawnerRequest>(&sock) {
            Ok((r, _)) => r,
            Err(_) => std::process::exit(0),
        };
        let SpawnerRequest::Create {
            id,
            bundle,
            state_root,
            socket,
            lower,
            disk,
            id_base,
            volumes,
            secrets,
            start,
        } = request;
        let mounts = crate::RootMounts {
            lower: &lower,
            disk,
            volumes: &volumes,
            secrets: &secrets,
        };
        let reply = match create(&id, &bundle, &state_root, &socket, &mounts, id_base, &start) {
            Ok((pid, phases)) => SpawnerReply::Created { pid, phases },
            // The boundary: the daemon gets the error's text.
            Err(e) => SpawnerReply::Error {
                message: e.to_string(),
            },
        };
        if proto::send(&sock, &reply, &[]).is_err() {
            std::process::exit(0);
        }
        if matches!(reply, SpawnerReply::Created { .. }) {
            // After the answer: each unmount waits for an RCU grace period
            // (1-3 ms, more on a busy host), which no create needs to wait
            // for. The sandbox's namespace holds its own copies.
            if let Err(e) = crate::unmount_root(&bundle, &id) {
                eprintln!("warren spawner: sandbox {id}: {}", plain_message(&e));
            }
        }
        if id_base.is_some() {
            crate::userns::prepare_spare();
        }
    }
}

fn readable_within(sock: &UnixStream, ms: u16) -> bool {
    use std::os::fd::AsFd;
    let mut fds = [nix::poll::PollFd::new(
        sock.as_fd(),
        nix::poll::PollFlags::POLLIN,
    )];
    matches!(nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(ms)), Ok(n) if n > 0)
}

fn reap_children() {
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    while let Ok(status) = waitpid(nix::unistd::Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
        if matches!(status, WaitStatus::StillAlive) {
            break;
        }
    }
}

/// Moves this (single-threaded) process into a mount namespace of its own
/// whose mounts do not propagate to the host's: what it mounts, the host's
/// mount table never sees.
pub(crate) fn unshare_private_mounts() -> Result<(), OsError> {
    use nix::mount::{mount, MsFlags};
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)
        .map_err(|e| OsError::new("unshare mount namespace", e))?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| OsError::new("make mounts private", e))
}

fn private_mount_namespace() -> Result<(), OsError> {
    use nix::mount::{mount, MsFlags};
    unshare_private_mounts()?;
    // This spawner's own place for sandbox roots (see ROOTS_DIR); the host
    // directory under it stays empty.
    std::fs::create_dir_all(crate::ROOTS_DIR)
        .map_err(|e| OsError::new(format!("create {}", crate::ROOTS_DIR), e))?;
    mount(
        Some("tmpfs"),
        crate::ROOTS_DIR,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some("mode=0755,size=1m"),
    )
    .map_err(|e| OsError::new(format!("mount a tmpfs at {}", crate::ROOTS_DIR), e))
}

fn create(
    id: &str,
    bundle: &Path,
    state_root: &Path,
    socket: &Path,
    mounts: &crate::RootMounts,
    id_base: Option<u32>,
    start: &proto::Start,
) -> Result<Created, SpawnError> {
    let mut phases = Vec::new();
    let mut since = std::time::Instant::now();
    let ids = id_base.map(|base| crate::userns::IdRange { base });
    let mounted = crate::mount_root(id, bundle, mounts, ids).map_err(SpawnError::Mount);
    took(&mut phases, "spawn_mounts", &mut since);
    let result = mounted.and_then(|()| match start {
        proto::Start::Runsc(run) => crate::gvisor::spawn::start(
            id,
            bundle,
            &crate::root_mount(id),
            run,
            ids,
            None,
            &mut |name| took(&mut phases, name, &mut since),
        )
        .map_err(SpawnError::from),
        proto::Start::RunscRestore { run, image } => crate::gvisor::spawn::start(
            id,
            bundle,
            &crate::root_mount(id),
            run,
            ids,
            Some(image),
            &mut |name| took(&mut phases, name, &mut since),
        )
        .map_err(SpawnError::from),
        proto::Start::Container => create_mounted(id, bundle, state_root, socket, &mut phases),
    });
    match result {
        // The mounts are detached once the answer is sent (see main).
        Ok(pid) => Ok((pid, phases)),
        Err(e) => {
            let _ = crate::unmount_root(bundle, id);
            Err(e)
        }
    }
}

/// A sandbox's init pid and the spawner's phases (name, microseconds).
pub type Created = (i32, Vec<(String, u64)>);

/// Records a phase that took since `since`, and starts the next.
fn took(phases: &mut Vec<(String, u64)>, name: &str, since: &mut std::time::Instant) {
    let micros = since.elapsed().as_micros().min(u64::MAX as u128) as u64;
    phases.push((name.to_string(), micros));
    *since = std::time::Instant::now();
}

fn create_mounted(
    id: &str,
    bundle: &Path,
    state_root: &Path,
    socket: &Path,
    phases: &mut Vec<(String, u64)>,
) -> Result<i32, SpawnError> {
    let _ = std::fs::remove_file(socket);
    let listener = UnixListener::bind(socket)
        .map_err(|e| OsError::new(format!("bind {}", socket.display()), e))?;
    let listener = OwnedFd::from(listener);
    // The init expects its socket at LISTEN_FD; the lowest free descriptor
    // may already be that one.
    let at_listen_fd = if listener.as_raw_fd() == LISTEN_FD {
        listener
    } else {
        // SAFETY: dup2 onto LISTEN_FD, which this process keeps free (see main).
        if unsafe { libc::dup2(listener.as_raw_fd(), LISTEN_FD) } < 0 {
            return Err(OsError::last("dup2 listening socket").into());
        }
        drop(listener);
        // SAFETY: dup2 just created LISTEN_FD for us; nothing else owns it.
        unsafe { OwnedFd::from_raw_fd(LISTEN_FD) }
    };
    let result = if crate::cgroups::unified() {
        let built = build_and_start(id, bundle, state_root, phases);
        if built.is_err() {
            if let Ok(mut c) = libcontainer::container::Container::load(state_root.join(id)) {
                let _ = c.delete(true);
            }
        }
        built
    } else {
        let mut since = std::time::Instant::now();
        crate::setup::spawn(id, bundle, &mut |name| took(phases, name, &mut since))
            .map_err(SpawnError::from)
    };
    // The init has its own copy now.
    drop(at_listen_fd);
    if result.is_err() {
        let _ = std::fs::remove_file(socket);
    }
    result
}

fn null() -> Result<OwnedFd, OsError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map(OwnedFd::from)
        .map_err(|e| OsError::new("open /dev/null", e))
}

fn build_and_start(
    id: &str,
    bundle: &Path,
    state_root: &Path,
    phases: &mut Vec<(String, u64)>,
) -> Result<i32, SpawnError> {
    let mut since = std::time::Instant::now();
    fn err(what: &'static str) -> impl Fn(LibcontainerError) -> SpawnError {
        move |e| SpawnError::Libcontainer {
            what,
            source: Box::new(e),
        }
    }
    let mut container = ContainerBuilder::new(id.to_string(), SyscallType::default())
        .with_executor(WarrenInit)
        .with_root_path(state_root)
        .map_err(err("state root"))?
        .with_preserved_fds(1)
        .with_stdin(null()?)
        .with_stdout(null()?)
        .with_stderr(null()?)
        .validate_id()
        .map_err(err("sandbox id"))?
        .as_init(bundle)
        .with_systemd(false)
        .with_detach(true)
        .build()
        .map_err(err("create"))?;
    // Namespaces (user namespace and id maps included), cgroup, the init
    // process created and waiting.
    took(phases, "spawn_build", &mut since);
    let pid = container.pid().ok_or(SpawnError::NoPid)?.as_raw();
    crate::netns::loopback_up(pid).map_err(|e| OsError::new("bring up loopback", e))?;
    took(phases, "spawn_loopback", &mut since);
    container.start().map_err(err("start"))?;
    took(phases, "spawn_start", &mut since);
    Ok(pid)
}

/// How long one create may take in a spawner. A create takes milliseconds;
/// one with a disk limit makes a file system first (mkfs, a loop mount),
/// which can take seconds on a busy disk.
pub const SPAWNER_DEADLINE: std::time::Duration = std::time::Duration::from_secs(60);

/// The daemon's handle on one spawner process.
pub struct SpawnerClient {
    child: Child,
    sock: UnixStream,
}

impl SpawnerClient {
    pub fn start(exe: &Path, args: &[String]) -> Result<SpawnerClient, RuntimeError> {
        let (ours, theirs) = UnixStream::pair().map_err(RuntimeError::io("socketpair"))?;
        let child = Command::new(exe)
            .args(args)
            .stdin(Stdio::from(OwnedFd::from(theirs)))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .env_clear()
            .envs(std::env::vars().filter(|(k, _)| k == "WARREN_LOG"))
            // mkfs.ext4 and mount for disk limits.
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .spawn()
            .map_err(RuntimeError::io("start spawner"))?;
        Ok(SpawnerClient { child, sock: ours })
    }

    /// Blocking; call from a blocking thread. A spawner that does not
    /// answer within [`SPAWNER_DEADLINE`] is killed (the pool starts a new
    /// one), so a wedged create never holds the daemon.
    pub fn create(&mut self, req: &SpawnerRequest) -> Result<Created, RuntimeError> {
        let _ = self.sock.set_write_timeout(Some(SPAWNER_DEADLINE));
        let _ = self.sock.set_read_timeout(Some(SPAWNER_DEADLINE));
        let reply = proto::send(&self.sock, req, &[])
            .and_then(|()| proto::recv::<SpawnerReply>(&self.sock));
        match reply {
            Ok((SpawnerReply::Created { pid, phases }, _)) => Ok((pid, phases)),
            Ok((SpawnerReply::Error { message }, _)) => Err(RuntimeError::Create(message)),
            Err(proto::ProtoError::Io(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                let _ = self.child.kill();
                Err(RuntimeError::Unresponsive(format!(
                    "the spawner did not create the sandbox within {}s; it was replaced",
                    SPAWNER_DEADLINE.as_secs()
                )))
            }
            Err(e) => {
                let _ = self.child.kill();
                Err(e.into())
            }
        }
    }

    pub fn is_alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for SpawnerClient {
    fn drop(&mut self) {
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
        let _ = self.child.wait();
    }
}

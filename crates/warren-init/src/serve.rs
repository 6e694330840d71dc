//! Warren's init: PID 1 of every sandbox.
//!
//! The spawner's child sets up the sandbox (namespaces entered, rootfs
//! pivoted, capabilities dropped, no_new_privs set, the seccomp filter
//! installed; warren-runtime's `setup`, or libcontainer on cgroup v2 hosts)
//! and then execs this small static program, so that init shares no
//! memory with the spawner (docs/benchmarks.md, "An init with an address
//! space of its own"). It accepts exec requests on the
//! listening socket the spawner left at fd 3, forks and execs each command
//! (so every exec inherits all of the sandbox's confinement), reaps every
//! zombie in the sandbox, and forwards termination signals to the main
//! process. Nothing here may panic: a dead init is a dead sandbox.

use std::collections::HashMap;
use std::ffi::CString;
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::Duration;

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{killpg, SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{fork, ForkResult, Pid};

use crate::exec_cgroups::{ExecCgroup, Hierarchy};
use crate::exec_tree;
use crate::proto::{self, ExecSpec, InitReply, InitRequest};
use crate::relay::{OutputRelay, Relay};

/// The descriptor number at which the spawner hands init its listening socket.
pub const LISTEN_FD: RawFd = 3;

const FORWARDED: [Signal; 6] = [
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
];

/// Runs init in this freshly exec'd process and exits when it ends.
pub fn main() -> ! {
    let code = match run() {
        Ok(()) => 0,
        Err(_) => 1,
    };
    std::process::exit(code)
}

struct Exec {
    /// The command's pid, which is also its process group.
    pgid: i32,
    conn: Option<UnixStream>,
    main: bool,
    /// The cgroup init made for it, where the daemon gives it none.
    cgroup: Option<ExecCgroup>,
}

struct Init {
    /// None while quiesced for a checkpoint (see [`Init::quiesce`]).
    listener: Option<UnixListener>,
    signals: SignalFd,
    /// Running execs by the pid of their shim (see exec_tree); each command
    /// is its own session and process group.
    execs: HashMap<i32, Exec>,
    /// The main process's shim.
    main_pid: Option<i32>,
    main_exit: Option<(i32, Option<i32>)>,
    /// Read ends of the main process's stdout and stderr (see proto).
    main_output: Vec<OwnedFd>,
    /// Terminals and ports init relays (see relay.rs), until they end.
    relays: Vec<Relay>,
    /// Init's own exec cgroups, in gVisor (see exec_cgroups).
    cgroups: Option<Hierarchy>,
    /// Whether the main process writes to pipes of the sandbox's own that
    /// init relays (gVisor, where init binds its own socket: see
    /// [`OutputRelay`]), and those relays, stdout then stderr.
    relays_main: bool,
    main_relays: Vec<OutputRelay>,
}

fn run() -> Result<(), Errno> {
    // Only stdio and the listening socket are meant to come through the
    // exec; close anything else that was not marked close-on-exec.
    close_from(LISTEN_FD + 1);
    crate::procstat::open();
    // Before anything of the sandbox runs: it gives up a capability.
    let cgroups = Hierarchy::mount();
    // Non-dumpable (an exec made it dumpable again): no process in the
    // sandbox can ptrace init or open its /proc entries.
    set_dumpable(false);
    // The name ps shows, in place of the memfd's.
    // SAFETY: prctl(PR_SET_NAME) copies at most 16 bytes from a C string.
    unsafe { libc::prctl(libc::PR_SET_NAME, c"warren-init".as_ptr(), 0, 0, 0) };

    // Before any process of the sandbox runs.
    ensure_hosts_file();

    let mut mask = SigSet::empty();
    mask.add(Signal::SIGCHLD);
    for s in FORWARDED {
        mask.add(s);
    }
    mask.add(Signal::SIGPWR);
    mask.thread_block()?;
    let signals = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)?;
    let listener = listener()?;
    listener.set_nonblocking(true).map_err(io_errno)?;
    let mut init = Init {
        listener: Some(listener),
        signals,
        execs: HashMap::new(),
        main_pid: None,
        main_exit: None,
        main_output: Vec::new(),
        relays: Vec::new(),
        cgroups,
        relays_main: std::env::var_os(SOCKET_ENV).is_some(),
        main_relays: Vec::new(),
    };
    init.serve()
}

/// The socket the daemon's exec requests arrive on: the one the spawner
/// left at [`LISTEN_FD`], or, under gVisor (where a listening socket
/// cannot cross into the sandbox), one init binds itself at the path
/// [`SOCKET_ENV`] names, in a directory the host shares with it (runsc's
/// `--host-uds=create` makes it a host socket the daemon connects to).
fn listener() -> Result<UnixListener, Errno> {
    let Some(path) = std::env::var_os(SOCKET_ENV) else {
        // SAFETY: fd 3 was placed there by the spawner for us and nothing
        // else in this process refers to it.
        return Ok(unsafe { UnixListener::from_raw_fd(LISTEN_FD) });
    };
    // Only root in the sandbox may connect (as only the daemon reaches
    // the container class's socket): an exec runs as whoever it names.
    // SAFETY: umask only sets the process's file mode mask.
    let old = unsafe { libc::umask(0o077) };
    let _ = std::fs::remove_file(&path);
    let bound = UnixListener::bind(&path).map_err(io_errno);
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    bound
}

/// The environment variable that tells init to bind its own socket (see
/// [`listener`]).
pub const SOCKET_ENV: &str = "WARREN_INIT_SOCKET";

/// The signal that tells a quiesced init to listen again (see
/// [`Init::quiesce`]), by number (runsc's `kill` takes the classic signals
/// only). SIGPWR: no sandbox tool sends it to PID 1 by habit, and a process
/// in the sandbox cannot send it to init (PID 1 of its namespace takes no
/// signal it has no handler for); SIGUSR1 and SIGUSR2 are the main
/// process's.
pub const LISTEN_AGAIN: i32 = libc::SIGPWR;

/// Gives an image without an `/etc/hosts` the one every container tool
/// gives it (Docker writes one into each container): `localhost` on the
/// loopback addresses and the sandbox's own name on 127.0.1.1, as Debian
/// does. Programs that resolve `localhost` through the file (Python's
/// servers and clients, SandboxFusion's tests) otherwise fail in a scratch
/// or busybox image. An image's own file (or a symlink there, dangling or
/// not) is left alone; one Warren wrote (a fork's, or one a commit kept) is
/// written again for this sandbox's name; a read-only root keeps what it
/// has. Runs inside the sandbox, so nothing it touches is outside it.
fn ensure_hosts_file() {
    use std::io::{Read, Seek, Write};
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    const PATH: &str = "/etc/hosts";
    let _ = std::fs::DirBuilder::new().mode(0o755).create("/etc");
    let open = |create: bool| {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(create)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW)
            .open(PATH)
    };
    let mut file = match open(true) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let Ok(mut f) = open(false) else { return };
            let mut head = [0u8; HOSTS_MARKER.len()];
            let ours = f.read_exact(&mut head).is_ok() && head == *HOSTS_MARKER.as_bytes();
            if !ours || f.set_len(0).is_err() || f.rewind().is_err() {
                return;
            }
            f
        }
        Err(_) => return,
    };
    let name = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_default();
    let mut text = format!(
        "{HOSTS_MARKER}\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
    );
    if !name.is_empty() && name != "localhost" {
        text.push_str(&format!("127.0.1.1\t{name}\n"));
    }
    let _ = file.write_all(text.as_bytes());
}

/// The first line of an `/etc/hosts` Warren wrote.
const HOSTS_MARKER: &str = "# written by warren-init: the image has no /etc/hosts";

/// The init's `argv[0]`, all the sandbox reads in /proc/1/cmdline (the
/// executable is a sealed memfd; no host path shows).
pub const TITLE: &str = "/.warren-init";

fn io_errno(e: std::io::Error) -> Errno {
    Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO))
}

impl Init {
    fn serve(&mut self) -> Result<(), Errno> {
        loop {
            let conn_fds: Vec<(i32, RawFd)> = self
                .execs
                .iter()
                .filter_map(|(pid, e)| e.conn.as_ref().map(|c| (*pid, c.as_raw_fd())))
                .collect();
            let mut readable = Vec::new();
            let (listen_ready, signal_ready) = {
                // A quiesced init polls its signals twice in place of the
                // listener, so the indexes stay put.
                let listening = self
                    .listener
                    .as_ref()
                    .map_or(self.signals.as_fd(), |l| l.as_fd());
                let mut fds = vec![
                    PollFd::new(listening, PollFlags::POLLIN),
                    PollFd::new(self.signals.as_fd(), PollFlags::POLLIN),
                ];
                for (pid, _) in &conn_fds {
                    if let Some(c) = self.execs.get(pid).and_then(|e| e.conn.as_ref()) {
                        fds.push(PollFd::new(c.as_fd(), PollFlags::POLLIN));
                    }
                }
                for relay in &self.relays {
                    relay.watch(&mut fds);
                }
                for relay in &self.main_relays {
                    relay.watch(&mut fds);
                }
                match poll(&mut fds, PollTimeout::NONE) {
                    Ok(_) | Err(Errno::EINTR) => {}
                    Err(e) => return Err(e),
                }
                let ready = |f: &PollFd| f.revents().is_some_and(|r| !r.is_empty());
                for (i, (pid, _)) in conn_fds.iter().enumerate() {
                    if fds.get(i + 2).is_some_and(ready) {
                        readable.push(*pid);
                    }
                }
                (ready(&fds[0]), ready(&fds[1]))
            };
            for relay in &mut self.relays {
                relay.pump();
            }
            self.relays.retain(|r| !r.done());
            for relay in &mut self.main_relays {
                relay.pump();
            }
            if signal_ready {
                self.handle_signals();
            }
            for pid in readable {
                self.handle_conn(pid);
            }
            if listen_ready && self.listener.is_some() {
                self.accept_all();
            }
        }
    }

    fn handle_signals(&mut self) {
        while let Ok(Some(info)) = self.signals.read_signal() {
            let signo = info.ssi_signo as i32;
            if signo == libc::SIGCHLD {
                self.reap();
            } else if signo == LISTEN_AGAIN {
                self.listen_again();
            } else if let (Some(pgid), Ok(sig)) = (self.main_pgid(), Signal::try_from(signo)) {
                let _ = killpg(Pid::from_raw(pgid), sig);
            } else if signo == libc::SIGTERM || signo == libc::SIGINT {
                // No main process: a stop request ends the sandbox.
                std::process::exit(0);
            }
        }
    }

    fn main_pgid(&self) -> Option<i32> {
        self.main_pid
            .and_then(|shim| self.execs.get(&shim))
            .map(|e| e.pgid)
    }

    fn reap(&mut self) {
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) => self.exited(pid.as_raw(), code, None),
                Ok(WaitStatus::Signaled(pid, sig, _)) => {
                    self.exited(pid.as_raw(), 128 + sig as i32, Some(sig as i32))
                }
                Ok(WaitStatus::StillAlive) | Err(_) => return,
                Ok(_) => continue,
            }
        }
    }

    fn exited(&mut self, pid: i32, code: i32, signal: Option<i32>) {
        let Some(exec) = self.execs.remove(&pid) else {
            return;
        };
        // The shim exits once its command has; a shim that ended first was
        // killed from inside the sandbox, and the exec ends with it. (The
        // daemon's exec cgroup does the same where it has one; without one,
        // as in gVisor, the command, its session and init's own cgroup of
        // the exec are found here.)
        if exec_tree::alive(exec.pgid) {
            exec_tree::kill_tree(pid, Some(exec.pgid), exec.cgroup.as_ref());
        }
        if let (Some(cgroups), Some(cgroup)) = (self.cgroups.as_mut(), exec.cgroup) {
            cgroups.release(cgroup);
        }
        if exec.main {
            self.main_exit = Some((code, signal));
            self.main_output.clear();
            // What it wrote reaches the daemon before its exit does.
            for relay in &mut self.main_relays {
                relay.flush(Duration::from_secs(2));
            }
        }
        if let Some(conn) = exec.conn {
            let _ = proto::send(&conn, &InitReply::Exited { code, signal }, &[]);
        }
    }

    fn handle_conn(&mut self, pid: i32) {
        let Some(exec) = self.execs.get_mut(&pid) else {
            return;
        };
        let Some(conn) = exec.conn.as_ref() else {
            return;
        };
        match proto::recv::<InitRequest>(conn) {
            Ok((InitRequest::Signal { signal }, _)) => match Signal::try_from(signal) {
                // Killing an exec kills all it started, detached or not.
                Ok(Signal::SIGKILL) => {
                    exec_tree::kill_tree(pid, Some(exec.pgid), exec.cgroup.as_ref())
                }
                Ok(sig) => {
                    let _ = killpg(Pid::from_raw(exec.pgid), sig);
                }
                Err(_) => {}
            },
            Ok(_) => {}
            Err(_) => {
                // The daemon went away. An ordinary exec dies with its stream;
                // the main process outlives daemon restarts.
                exec.conn = None;
                if !exec.main {
                    exec_tree::kill_tree(pid, Some(exec.pgid), exec.cgroup.as_ref());
                }
            }
        }
    }

    fn accept_all(&mut self) {
        loop {
            let Some(listener) = self.listener.as_ref() else {
                return;
            };
            let conn = match listener.accept() {
                Ok((c, _)) => c,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(_) => return,
            };
            // The request follows the connect immediately; a peer that sends
            // nothing must not stall init.
            let _ = conn.set_nonblocking(false);
            let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
            let request = proto::recv::<InitRequest>(&conn);
            let _ = conn.set_read_timeout(None);
            match request {
                Ok((InitRequest::Exec(spec), fds)) => self.start_exec(conn, spec, fds),
                Ok((InitRequest::AttachMain, fds)) => self.attach_main(conn, fds),
                Ok((InitRequest::Forward { port }, fds)) => self.start_forward(conn, port, fds),
                Ok((InitRequest::Quiesce, _)) => {
                    self.quiesce(conn);
                    return;
                }
                Ok((InitRequest::Signal { .. }, _)) | Err(_) => {}
            }
        }
    }

    /// Lets go of every host socket init holds, so that runsc can save the
    /// sandbox (gVisor cannot save a host socket): its listener (the file
    /// goes too), the port and terminal relays, and the exec streams. An
    /// ordinary exec ends with its stream, as when the daemon goes away;
    /// the main process runs on. The reply goes out before the request's
    /// own connection closes, last. Init listens again on
    /// [`LISTEN_AGAIN`].
    fn quiesce(&mut self, conn: UnixStream) {
        self.relays.clear();
        for relay in &mut self.main_relays {
            relay.detach();
        }
        let mut ended = Vec::new();
        for (pid, exec) in self.execs.iter_mut() {
            if exec.main {
                exec.conn = None;
            } else if exec.conn.take().is_some() {
                exec_tree::kill_tree(*pid, Some(exec.pgid), exec.cgroup.as_ref());
                ended.push((*pid, exec.pgid));
            }
        }
        // Their descriptors are the daemon's pipes: gone only once they
        // have exited.
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while ended
            .iter()
            .any(|(shim, group)| exec_tree::alive(*shim) || exec_tree::alive(*group))
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        self.listener = None;
        if let Some(path) = std::env::var_os(SOCKET_ENV) {
            let _ = std::fs::remove_file(path);
        }
        let _ = proto::send(&conn, &InitReply::Quiesced, &[]);
    }

    fn listen_again(&mut self) {
        if self.listener.is_some() {
            return;
        }
        if let Ok(l) = listener() {
            if l.set_nonblocking(true).is_ok() {
                self.listener = Some(l);
            }
        }
    }

    fn start_forward(&mut self, conn: UnixStream, port: u16, mut fds: Vec<OwnedFd>) {
        let fail = |message: String| InitReply::Failed { message, code: 1 };
        let (Some(stream), true) = (fds.pop(), fds.is_empty()) else {
            let _ = proto::send(&conn, &fail("expected one stream socket".into()), &[]);
            return;
        };
        // Loopback answers at once (accepted, queued or refused); the
        // timeout only bounds a listener whose backlog is full.
        let to = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        match std::net::TcpStream::connect_timeout(&to, Duration::from_secs(2)) {
            Ok(tcp) => {
                if proto::send(&conn, &InitReply::Forwarding, &[]).is_ok() {
                    self.relays.push(Relay::port(OwnedFd::from(tcp), stream));
                }
            }
            Err(e) => {
                let message = format!("nothing accepts connections on port {port}: {e}");
                let _ = proto::send(&conn, &fail(message), &[]);
            }
        }
    }

    /// `fds`: new write ends for the main process's stdout and stderr,
    /// which a main process whose output init relays writes to from now on
    /// (its reply carries no descriptors then).
    fn attach_main(&mut self, conn: UnixStream, fds: Vec<OwnedFd>) {
        let running = self.main_pid.filter(|_| self.main_exit.is_none());
        if !self.main_relays.is_empty() && fds.len() == self.main_relays.len() {
            for (relay, to) in self.main_relays.iter_mut().zip(fds) {
                relay.attach(to);
            }
        }
        let reply = InitReply::Main {
            pid: running.and(self.main_pgid()),
            exit: self.main_exit,
        };
        let fds: Vec<RawFd> = if running.is_some() {
            self.main_output.iter().map(|f| f.as_raw_fd()).collect()
        } else {
            vec![]
        };
        if proto::send(&conn, &reply, &fds).is_err() {
            return;
        }
        if let Some(exec) = running.and_then(|pid| self.execs.get_mut(&pid)) {
            exec.conn = Some(conn);
        }
    }

    fn start_exec(&mut self, conn: UnixStream, spec: ExecSpec, mut fds: Vec<OwnedFd>) {
        let relaying = spec.tty.is_some() && spec.tty_relay;
        let stdio_fds = match (spec.tty.is_some(), relaying) {
            (false, _) => 3,
            (true, false) => 0,
            // The relay's stream and window-size sockets.
            (true, true) => 2,
        };
        if fds.len() < stdio_fds {
            let message = format!("expected {stdio_fds} descriptors, got {}", fds.len());
            let _ = proto::send(&conn, &InitReply::Failed { message, code: 126 }, &[]);
            return;
        }
        let cgroup = (spec.cgroup && fds.len() > stdio_fds).then(|| fds.remove(stdio_fds));
        // Where the daemon gives no cgroup, one of init's own if it keeps them.
        let own = match (&cgroup, self.cgroups.as_mut()) {
            (None, Some(cgroups)) => cgroups.create(),
            _ => None,
        };
        let relay_ends = if relaying {
            fds.drain(..2).collect::<Vec<_>>()
        } else {
            Vec::new()
        };
        let readers = if spec.main && fds.len() == 5 {
            fds.split_off(3)
        } else {
            vec![]
        };
        // Opened here, in the sandbox's mount namespace: the terminal is one
        // of the sandbox's devpts instance, as if the sandbox had opened it.
        let terminal = match spec.tty.map(open_terminal).transpose() {
            Ok(t) => t,
            Err(e) => {
                let message = format!("cannot open a terminal in the sandbox: {}", e.desc());
                let _ = proto::send(&conn, &InitReply::Failed { message, code: 126 }, &[]);
                return;
            }
        };
        let own_stdio = if spec.main && self.relays_main && terminal.is_none() {
            match own_stdio() {
                Ok(s) => Some(s),
                Err(e) => {
                    let message = format!("cannot make the main process's pipes: {}", e.desc());
                    let _ = proto::send(&conn, &InitReply::Failed { message, code: 126 }, &[]);
                    return;
                }
            }
        } else {
            None
        };
        let stdio: Vec<BorrowedFd> = match (&terminal, &own_stdio) {
            (Some(t), _) => vec![t.slave.as_fd(); 3],
            (None, Some(own)) => own.for_command.iter().map(|f| f.as_fd()).collect(),
            (None, None) => fds.iter().map(|f| f.as_fd()).collect(),
        };
        let enter = cgroup.as_ref().or(own.as_ref().map(|c| &c.procs));
        match spawn(&spec, &stdio, enter) {
            Ok(Spawned { shim, pid }) => {
                drop(stdio);
                if spec.main {
                    self.main_pid = Some(shim);
                    self.main_exit = None;
                    self.main_output = readers;
                    self.main_relays.clear();
                    if let Some(own) = own_stdio {
                        // The daemon's stdout and stderr; its stdin and
                        // the read ends it sent are not needed.
                        let mut theirs = fds.drain(..).skip(1);
                        self.main_output.clear();
                        for (from, to) in own.for_init.into_iter().zip(theirs.by_ref()) {
                            self.main_relays.push(OutputRelay::new(from, to));
                        }
                    }
                }
                drop((fds, cgroup));
                // The master goes to the daemon; init keeps neither end, so
                // the terminal hangs up when the command's side closes. A
                // relayed terminal's master stays here, and only it.
                let master: Vec<RawFd> = terminal
                    .iter()
                    .filter(|_| !relaying)
                    .map(|t| t.master.as_raw_fd())
                    .collect();
                let _ = proto::send(&conn, &InitReply::Started { pid }, &master);
                if let (true, Some(t), Some([stream, resize])) = (
                    relaying,
                    terminal,
                    <[OwnedFd; 2]>::try_from(relay_ends).ok(),
                ) {
                    drop(t.slave);
                    self.relays
                        .push(Relay::terminal(t.master, stream, resize, pid));
                }
                self.execs.insert(
                    shim,
                    Exec {
                        pgid: pid,
                        conn: Some(conn),
                        main: spec.main,
                        cgroup: own,
                    },
                );
            }
            Err(failure) => {
                let _ = proto::send(&conn, &failure, &[]);
                if let (Some(cgroups), Some(cgroup)) = (self.cgroups.as_mut(), own) {
                    cgroups.release(cgroup);
                }
            }
        }
    }
}

/// A relayed main process's own stdio (see [`OutputRelay`]): the
/// sandbox's /dev/null and the write ends of two pipes for the command,
/// their read ends for init.
struct OwnStdio {
    for_command: [OwnedFd; 3],
    for_init: [OwnedFd; 2],
}

fn own_stdio() -> Result<OwnStdio, Errno> {
    use nix::fcntl::{open, OFlag};
    use nix::sys::stat::Mode;
    let null = open(
        "/dev/null",
        OFlag::O_RDONLY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    // SAFETY: open just returned this descriptor, which nothing else owns.
    let null = unsafe { OwnedFd::from_raw_fd(null) };
    let (out_r, out_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    let (err_r, err_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    Ok(OwnStdio {
        for_command: [null, out_w, err_w],
        for_init: [out_r, err_r],
    })
}

struct Spawned {
    /// The exec's shim, init's child (see exec_tree).
    shim: i32,
    /// The command, the shim's child.
    pid: i32,
}

/// Forks the exec's shim, which forks and execs the command. Returns once
/// execve succeeded (the error pipe closed empty) or with the reason it
/// failed.
fn spawn(
    spec: &ExecSpec,
    fds: &[BorrowedFd],
    cgroup: Option<&OwnedFd>,
) -> Result<Spawned, InitReply> {
    let fail = |message: String, code: i32| InitReply::Failed { message, code };
    if fds.len() != 3 {
        return Err(fail(
            format!("expected 3 stdio descriptors, got {}", fds.len()),
            126,
        ));
    }
    let cstr = |s: &str| CString::new(s).map_err(|_| fail(format!("NUL byte in {s:?}"), 126));
    let argv: Vec<CString> = spec
        .argv
        .iter()
        .map(|a| cstr(a))
        .collect::<Result<_, _>>()?;
    let env: Vec<CString> = spec.env.iter().map(|a| cstr(a)).collect::<Result<_, _>>()?;
    let Some(program) = spec.argv.first() else {
        return Err(fail("empty command".into(), 126));
    };
    let path_var = spec
        .env
        .iter()
        .find_map(|kv| kv.strip_prefix("PATH="))
        .unwrap_or("/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
    let candidates: Vec<CString> = if program.contains('/') {
        vec![cstr(program)?]
    } else {
        path_var
            .split(':')
            .filter(|d| !d.is_empty())
            .filter_map(|d| CString::new(format!("{d}/{program}")).ok())
            .collect()
    };
    let cwd = cstr(&spec.cwd)?;
    let (err_r, err_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| fail(format!("pipe: {e}"), 126))?;
    let (pid_r, pid_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| fail(format!("pipe: {e}"), 126))?;

    // SAFETY: init is single-threaded, so the shim and the command may run
    // arbitrary code (including allocation) before execve.
    match unsafe { fork() } {
        Err(e) => Err(fail(format!("fork failed: {e}"), 126)),
        Ok(ForkResult::Child) => {
            drop((err_r, pid_r));
            exec_tree::enter_cgroup(cgroup);
            exec_tree::become_subreaper();
            // SAFETY: as above; the shim is single-threaded too.
            match unsafe { fork() } {
                Ok(ForkResult::Child) => {
                    drop(pid_w);
                    let code = child(spec, fds, &candidates, &argv, &env, &cwd).code();
                    let _ = nix::unistd::write(&err_w, &code.to_le_bytes());
                    // SAFETY: _exit is always safe; we must not run init's destructors.
                    unsafe { libc::_exit(127) }
                }
                Ok(ForkResult::Parent { child }) => {
                    let _ = nix::unistd::write(&pid_w, &child.as_raw().to_le_bytes());
                    // Nothing of init's (its socket, other execs' streams,
                    // this exec's stdio) stays open in the shim.
                    drop((err_w, pid_w));
                    close_from(LISTEN_FD);
                    exec_tree::shim_wait(child.as_raw())
                }
                // SAFETY: _exit is always safe; init reads no pid and fails the exec.
                Err(_) => unsafe { libc::_exit(126) },
            }
        }
        Ok(ForkResult::Parent { child: shim }) => {
            drop((err_w, pid_w));
            // Init serves every exec of the sandbox: it never waits on one
            // longer than START_DEADLINE (a shim or command that cannot run,
            // e.g. frozen by its cgroup, is given up and killed).
            let given_up = |what: &str| {
                exec_tree::kill_tree(shim.as_raw(), None, None);
                let _ = nix::sys::signal::kill(shim, Signal::SIGKILL);
                fail(
                    format!(
                        "the command did not {what} within {}s",
                        START_DEADLINE.as_secs()
                    ),
                    126,
                )
            };
            let mut pid = [0u8; 4];
            match read_within(pid_r, &mut pid) {
                Some(4) => {}
                Some(_) => return Err(fail("fork failed in the exec's shim".into(), 126)),
                None => return Err(given_up("start")),
            }
            let pid = i32::from_le_bytes(pid);
            let mut buf = [0u8; 4];
            match read_within(err_r, &mut buf) {
                None => Err(given_up("start its program")),
                Some(4) => {
                    let raw = i32::from_le_bytes(buf);
                    // The child and its shim exit right away; reap()
                    // ignores unknown pids.
                    if raw & CHDIR_FAILED != 0 {
                        let errno = Errno::from_raw(raw & !CHDIR_FAILED);
                        let why = match errno {
                            Errno::ENOENT => "does not exist".to_string(),
                            Errno::ENOTDIR => "is not a directory".to_string(),
                            e => e.desc().to_lowercase(),
                        };
                        return Err(fail(format!("working directory {} {why}", spec.cwd), 126));
                    }
                    let errno = Errno::from_raw(raw);
                    let code = if matches!(errno, Errno::ENOENT) {
                        127
                    } else {
                        126
                    };
                    Err(fail(
                        format!("cannot run {program:?}: {}", errno.desc()),
                        code,
                    ))
                }
                Some(_) => Ok(Spawned {
                    shim: shim.as_raw(),
                    pid,
                }),
            }
        }
    }
}

/// How long init waits for an exec's shim and command to start.
const START_DEADLINE: Duration = Duration::from_secs(10);

/// Reads what the pipe gives until it is full or closed, for at most
/// START_DEADLINE; None when the time ran out.
fn read_within(fd: OwnedFd, buf: &mut [u8]) -> Option<usize> {
    let deadline = std::time::Instant::now() + START_DEADLINE;
    let mut file = std::fs::File::from(fd);
    let mut got = 0;
    while got < buf.len() {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
        let mut fds = [PollFd::new(file.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(0) => return None,
            Ok(_) => {}
            Err(Errno::EINTR) => continue,
            Err(_) => return Some(got),
        }
        match file.read(&mut buf[got..]) {
            Ok(0) => return Some(got),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return Some(got),
        }
    }
    Some(got)
}

/// Runs in the forked child; returns only on failure, with the errno.
/// Set in the errno a child reports when its working directory was the
/// failure, not the program (errno values stay far below it).
const CHDIR_FAILED: i32 = 1 << 16;

/// Why a child did not become its program.
enum Failed {
    Chdir(Errno),
    Exec(Errno),
}

impl Failed {
    /// What the child writes to its parent.
    fn code(self) -> i32 {
        match self {
            Failed::Chdir(e) => e as i32 | CHDIR_FAILED,
            Failed::Exec(e) => e as i32,
        }
    }
}

fn child(
    spec: &ExecSpec,
    fds: &[BorrowedFd],
    candidates: &[CString],
    argv: &[CString],
    env: &[CString],
    cwd: &CString,
) -> Failed {
    // The spawner is a Rust program, which ignores SIGPIPE; ignored
    // dispositions survive execve, so restore the defaults a program expects.
    // Real-time signals included: the C library's internal ones (32, 33)
    // arrive ignored too, and its signal() refuses to touch them, so this
    // uses the raw system call with the kernel's sigaction layout.
    #[repr(C)]
    struct KernelSigaction {
        handler: usize,
        flags: u64,
        restorer: usize,
        mask: u64,
    }
    let default = KernelSigaction {
        handler: libc::SIG_DFL,
        flags: 0,
        restorer: 0,
        mask: 0,
    };
    for signo in 1..=64 {
        if signo != libc::SIGKILL && signo != libc::SIGSTOP {
            // SAFETY: rt_sigaction reads the struct we own and installs no
            // handler; numbers the kernel rejects just fail.
            unsafe {
                libc::syscall(
                    libc::SYS_rt_sigaction,
                    signo,
                    &default as *const KernelSigaction,
                    std::ptr::null_mut::<KernelSigaction>(),
                    8usize,
                )
            };
        }
    }
    let _ = SigSet::all().thread_unblock();
    // Own session and process group: the whole tree of this exec can be
    // signalled at once (timeouts, cancellation).
    let _ = nix::unistd::setsid();
    for (target, fd) in fds.iter().enumerate() {
        // SAFETY: dup2 onto 0..2 replaces init's /dev/null stdio in this child only.
        if unsafe { libc::dup2(fd.as_raw_fd(), target as RawFd) } < 0 {
            return Failed::Exec(Errno::last());
        }
    }
    let gid = nix::unistd::Gid::from_raw(spec.gid);
    let uid = nix::unistd::Uid::from_raw(spec.uid);
    if spec.tty.is_some() {
        // The new session's controlling terminal (and its foreground
        // process group), so job control, ^C and /dev/tty work.
        if let Err(e) = rustix::process::ioctl_tiocsctty(fds[0]) {
            return Failed::Exec(Errno::from_raw(e.raw_os_error()));
        }
        // The user's own terminal, as a login gives one; a sandbox without
        // CAP_CHOWN keeps it root's, which the user can still use.
        if !uid.is_root() {
            let _ = nix::unistd::fchown(fds[0].as_raw_fd(), Some(uid), None);
        }
    }
    // Only fds 0-2 survive execve.
    close_from_on_exec(3);
    let groups: Vec<nix::unistd::Gid> = spec
        .groups
        .iter()
        .map(|g| nix::unistd::Gid::from_raw(*g))
        .collect();
    if let Err(e) = nix::unistd::setgroups(&groups) {
        return Failed::Exec(e);
    }
    if let Err(e) = nix::unistd::setresgid(gid, gid, gid) {
        return Failed::Exec(e);
    }
    if let Err(e) = nix::unistd::setresuid(uid, uid, uid) {
        return Failed::Exec(e);
    }
    if let Err(e) = nix::unistd::chdir(cwd.as_c_str()) {
        return Failed::Chdir(e);
    }
    exec_tree::raise_oom_score();
    let mut last = Errno::ENOENT;
    for path in candidates {
        match nix::unistd::execve(path, argv, env) {
            Err(Errno::ENOENT) | Err(Errno::ENOTDIR) => continue,
            Err(e) => last = e,
            Ok(_) => {}
        }
    }
    Failed::Exec(last)
}

fn close_from(first: RawFd) {
    // SAFETY: close_range on a range we own; fds above `first` are not used
    // by any Rust object in init at this point.
    let done = unsafe { libc::syscall(libc::SYS_close_range, first as u32, u32::MAX, 0u32) } == 0;
    if !done {
        for fd in open_fds_from(first) {
            // SAFETY: as above, one descriptor at a time.
            unsafe { libc::close(fd) };
        }
    }
}

/// This process's descriptors numbered `first` or above, for kernels
/// without close_range (gVisor's sentry among them).
fn open_fds_from(first: RawFd) -> Vec<RawFd> {
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    // Collected first: the listing's own descriptor is among them.
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|fd| *fd >= first)
        .collect()
}

fn close_from_on_exec(first: RawFd) {
    // SAFETY: marks descriptors close-on-exec; no memory is touched.
    let done = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first as u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    } == 0;
    if done {
        return;
    }
    // A kernel without close_range's CLOEXEC: one by one. Init relays
    // terminals and holds their masters, which no command may inherit.
    for fd in open_fds_from(first) {
        // SAFETY: F_SETFD on a descriptor number; a closed one gives EBADF.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
}

fn set_dumpable(on: bool) {
    // SAFETY: prctl(PR_SET_DUMPABLE) takes plain integers.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, on as libc::c_ulong, 0, 0, 0) };
}

/// Opens a new terminal pair of `size` from the sandbox's own `/dev/ptmx`,
/// for an exec with `tty` (warren-runtime's `pty` holds the daemon's end).
fn open_terminal(size: proto::TermSize) -> Result<nix::pty::OpenptyResult, nix::Error> {
    let winsize = nix::pty::Winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    nix::pty::openpty(&winsize, None)
}

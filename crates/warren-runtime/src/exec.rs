//! The daemon side of an exec: pipes for stdio, a connection to the
//! sandbox's init, and the control stream that reports the exit.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::time::Duration;

use nix::fcntl::OFlag;
use tokio::net::unix::pipe;

use crate::proto::{self, ExecSpec, InitReply, InitRequest};
use crate::pty::Pty;
use crate::RuntimeError;

/// How long the daemon waits for a sandbox's init to accept a connection
/// and answer a request. Init answers within milliseconds unless it cannot
/// run at all: its sandbox is frozen, or the host is stalled. Nothing the
/// daemon does waits on a sandbox longer than this.
pub const INIT_DEADLINE: Duration = Duration::from_secs(10);

async fn within<T>(
    what: &str,
    fut: impl std::future::Future<Output = Result<T, RuntimeError>>,
) -> Result<T, RuntimeError> {
    match tokio::time::timeout(INIT_DEADLINE, fut).await {
        Ok(r) => r,
        Err(_) => Err(RuntimeError::Unresponsive(format!(
            "the sandbox's init did not {what} within {}s (is the sandbox paused, starved at its own CPU or memory limit, or the host overloaded?)",
            INIT_DEADLINE.as_secs()
        ))),
    }
}

async fn connect(socket: &Path) -> Result<tokio::net::UnixStream, RuntimeError> {
    within("accept a connection", async {
        tokio::net::UnixStream::connect(socket).await.map_err(|e| {
            RuntimeError::Exec(format!(
                "sandbox init is not reachable at {}: {e}",
                socket.display()
            ))
        })
    })
    .await
}

pub struct RunningExec {
    pub pid: i32,
    pub io: ExecIo,
    pub exit: ExitWait,
    pub signal: ExecSignal,
}

/// How the daemon reaches a running exec's stdio.
pub enum ExecIo {
    Pipes {
        /// The write end of the command's stdin, when it was kept open.
        stdin: Option<pipe::Sender>,
        stdout: pipe::Receiver,
        stderr: pipe::Receiver,
    },
    /// The master of the exec's terminal: its output (stdout and stderr
    /// both), its input (when kept open), its window size.
    Pty(Pty),
}

pub enum ExecOutcome {
    Exited { code: i32, signal: Option<i32> },
}

/// What the command's stdin gets.
pub enum Stdin {
    /// These bytes (maybe none), then end of file (for a terminal: nothing
    /// more).
    Bytes(Option<Vec<u8>>),
    /// Left open: the caller writes to the stdin pipe of `ExecIo::Pipes`,
    /// or to the terminal.
    Open,
}

/// Starts a command through init. `stdin` is written in full and then
/// closed, or kept open for the caller. `cgroup` is the exec cgroup's `cgroup.procs` (see exec_cgroup),
/// sent along when `spec.cgroup` says so. With `spec.tty` init opens a
/// terminal for the command and hands its master back.
pub async fn start(
    socket: &Path,
    spec: &ExecSpec,
    stdin: Stdin,
    cgroup: Option<OwnedFd>,
) -> Result<Result<RunningExec, (String, i32)>, RuntimeError> {
    let pipes = match spec.tty {
        Some(_) => None,
        None => Some(Pipes::new()?),
    };
    let relay = match (spec.tty, spec.tty_relay) {
        (Some(size), true) => {
            Some(crate::pty::RelayEnds::new(size).map_err(RuntimeError::io("terminal relay"))?)
        }
        _ => None,
    };
    let conn = connect(socket).await?;
    let mut fds = pipes.as_ref().map(Pipes::for_init).unwrap_or_default();
    if let Some(r) = &relay {
        fds.extend(r.for_init());
    }
    let mut spec = spec.clone();
    spec.cgroup = cgroup.is_some();
    if let Some(c) = &cgroup {
        fds.push(c.as_raw_fd());
    }
    if let (true, Some(p)) = (spec.main, &pipes) {
        // Init keeps these so the main process survives a daemon restart.
        fds.extend([p.out_r.as_raw_fd(), p.err_r.as_raw_fd()]);
    }
    let request = InitRequest::Exec(spec);
    within("take the request", async {
        proto::send_async_fds(&conn, &request, &fds)
            .await
            .map_err(RuntimeError::from)
    })
    .await?;
    drop(cgroup);
    let pipes = pipes.map(Pipes::sent);
    let (reply, mut reply_fds) = within("start the command", async {
        proto::recv_async_fds::<InitReply>(&conn)
            .await
            .map_err(RuntimeError::from)
    })
    .await?;
    let (reader, writer) = conn.into_split();
    let pid = match reply {
        InitReply::Started { pid } => pid,
        InitReply::Failed { message, code } => return Ok(Err((message, code))),
        other => {
            return Err(RuntimeError::Exec(format!(
                "unexpected reply from init: {other:?}"
            )))
        }
    };
    let io = match pipes {
        Some((in_w, out_r, err_r)) => {
            let stdin = match stdin {
                Stdin::Bytes(data) => {
                    feed_stdin(in_w, data)?;
                    None
                }
                Stdin::Open => {
                    Some(pipe::Sender::from_owned_fd(in_w).map_err(RuntimeError::io("pipe"))?)
                }
            };
            ExecIo::Pipes {
                stdin,
                stdout: receiver(out_r)?,
                stderr: receiver(err_r)?,
            }
        }
        None => {
            let pty = match relay {
                // Init keeps the master and relays it (see pty::RelayEnds).
                Some(r) => r.into_pty().map_err(RuntimeError::io("terminal relay"))?,
                None if reply_fds.len() == 1 => {
                    Pty::new(reply_fds.remove(0)).map_err(RuntimeError::io("terminal"))?
                }
                None => {
                    return Err(RuntimeError::Exec(format!(
                        "init started a terminal exec but sent {} descriptors, not its terminal",
                        reply_fds.len()
                    )))
                }
            };
            if let Stdin::Bytes(Some(data)) = stdin.filter_empty() {
                let pty = pty.clone();
                tokio::spawn(async move {
                    // A command that exits first leaves this unwritten; fine.
                    let _ = pty.write_all(&data).await;
                });
            }
            ExecIo::Pty(pty)
        }
    };
    Ok(Ok(RunningExec {
        pid,
        io,
        exit: ExitWait {
            reader,
            _writer: None,
        },
        signal: ExecSignal { writer },
    }))
}

impl Stdin {
    fn filter_empty(self) -> Stdin {
        match self {
            Stdin::Bytes(Some(d)) if d.is_empty() => Stdin::Bytes(None),
            other => other,
        }
    }
}

/// The three pipes of an exec without a terminal.
struct Pipes {
    in_r: OwnedFd,
    in_w: OwnedFd,
    out_r: OwnedFd,
    out_w: OwnedFd,
    err_r: OwnedFd,
    err_w: OwnedFd,
}

impl Pipes {
    fn new() -> Result<Pipes, RuntimeError> {
        let pipe = || nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(RuntimeError::nix("pipe"));
        let (in_r, in_w) = pipe()?;
        let (out_r, out_w) = pipe()?;
        let (err_r, err_w) = pipe()?;
        Ok(Pipes {
            in_r,
            in_w,
            out_r,
            out_w,
            err_r,
            err_w,
        })
    }

    /// The command's ends, in the order init takes them.
    fn for_init(&self) -> Vec<RawFd> {
        vec![
            self.in_r.as_raw_fd(),
            self.out_w.as_raw_fd(),
            self.err_w.as_raw_fd(),
        ]
    }

    /// Once init holds the command's ends, the daemon keeps only its own
    /// (stdin's write end, the read ends of the outputs).
    fn sent(self) -> (OwnedFd, OwnedFd, OwnedFd) {
        (self.in_w, self.out_r, self.err_r)
    }
}

fn receiver(fd: OwnedFd) -> Result<pipe::Receiver, RuntimeError> {
    pipe::Receiver::from_owned_fd(fd).map_err(RuntimeError::io("pipe"))
}

fn feed_stdin(w: OwnedFd, data: Option<Vec<u8>>) -> Result<(), RuntimeError> {
    let Some(data) = data.filter(|d| !d.is_empty()) else {
        return Ok(());
    };
    let mut sender = pipe::Sender::from_owned_fd(w).map_err(RuntimeError::io("pipe"))?;
    tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        // A process that exits without reading its stdin makes this fail; fine.
        let _ = sender.write_all(&data).await;
    });
    Ok(())
}

/// Reads the exit report of one exec.
pub struct ExitWait {
    reader: tokio::net::unix::OwnedReadHalf,
    /// Dropping a write half shuts the socket down for writing, which init
    /// reads as "the daemon went away"; an attached main keeps it open.
    _writer: Option<tokio::net::unix::OwnedWriteHalf>,
}

impl ExitWait {
    pub async fn wait(mut self) -> Result<ExecOutcome, RuntimeError> {
        match proto::recv_async::<InitReply>(&mut self.reader).await {
            Ok(InitReply::Exited { code, signal }) => Ok(ExecOutcome::Exited { code, signal }),
            Ok(other) => Err(RuntimeError::Exec(format!(
                "unexpected reply from init: {other:?}"
            ))),
            Err(proto::ProtoError::Closed) => Err(RuntimeError::Exec(
                "the sandbox's init went away before the command finished (sandbox destroyed?)"
                    .into(),
            )),
            Err(e) => Err(e.into()),
        }
    }
}

/// Signals one exec's whole process group. Dropping it (together with the
/// `ExitWait`) closes the connection, which makes init kill an ordinary exec.
pub struct ExecSignal {
    writer: tokio::net::unix::OwnedWriteHalf,
}

impl ExecSignal {
    pub async fn send(&mut self, signal: i32) -> Result<(), RuntimeError> {
        proto::send_async(&mut self.writer, &InitRequest::Signal { signal }).await?;
        Ok(())
    }
}

/// Init's answer when nothing in the sandbox accepted a forwarded
/// connection: its words for why.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct PortRefused(pub String);

/// A connection to `port` on the sandbox's loopback, made and relayed by
/// its init (for a sandbox on gVisor's own network stack, which the host
/// cannot reach into). The inner error says why nothing accepted it.
pub async fn forward(
    socket: &Path,
    port: u16,
) -> Result<Result<tokio::net::UnixStream, PortRefused>, RuntimeError> {
    let (ours, theirs) =
        std::os::unix::net::UnixStream::pair().map_err(RuntimeError::io("socketpair"))?;
    let conn = connect(socket).await?;
    let (reply, _) = within("answer", async {
        proto::send_async_fds(&conn, &InitRequest::Forward { port }, &[theirs.as_raw_fd()]).await?;
        drop(theirs);
        Ok(proto::recv_async_fds::<InitReply>(&conn).await?)
    })
    .await?;
    match reply {
        InitReply::Forwarding => {
            ours.set_nonblocking(true)
                .map_err(RuntimeError::io("socketpair"))?;
            Ok(Ok(
                tokio::net::UnixStream::from_std(ours).map_err(RuntimeError::io("socketpair"))?
            ))
        }
        InitReply::Failed { message, .. } => Ok(Err(PortRefused(message))),
        other => Err(RuntimeError::Exec(format!(
            "unexpected reply from init: {other:?}"
        ))),
    }
}

/// What re-attaching to a sandbox's main process found.
pub enum MainAttach {
    Running {
        pid: i32,
        stdout: pipe::Receiver,
        stderr: pipe::Receiver,
        exit: ExitWait,
    },
    Exited {
        code: i32,
        signal: Option<i32>,
    },
    /// The sandbox has no main process.
    NoMain,
}

/// Re-attaches to the main process after a daemon restart (or a gVisor
/// sandbox's restore). The sandbox must not be frozen (its init could not
/// answer): every step has a deadline. New pipes for its output go along:
/// an init that relays the main process's output (gVisor) writes to them
/// and sends nothing back; one whose main process holds the daemon's pipes
/// sends back the read ends it kept.
pub async fn attach_main(socket: &Path) -> Result<MainAttach, RuntimeError> {
    let pipe = || nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(RuntimeError::nix("pipe"));
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    let conn = connect(socket).await?;
    let (reply, mut fds) = within("answer", async {
        proto::send_async_fds(
            &conn,
            &InitRequest::AttachMain,
            &[out_w.as_raw_fd(), err_w.as_raw_fd()],
        )
        .await?;
        Ok(proto::recv_async_fds::<InitReply>(&conn).await?)
    })
    .await?;
    drop((out_w, err_w));
    let running = |stdout: OwnedFd, stderr: OwnedFd, conn: tokio::net::UnixStream, pid: i32| {
        let (reader, writer) = conn.into_split();
        Ok(MainAttach::Running {
            pid,
            stdout: receiver(stdout)?,
            stderr: receiver(stderr)?,
            exit: ExitWait {
                reader,
                _writer: Some(writer),
            },
        })
    };
    match reply {
        InitReply::Main { pid: Some(pid), .. } if fds.len() == 2 => {
            let stderr = fds.remove(1);
            let stdout = fds.remove(0);
            running(stdout, stderr, conn, pid)
        }
        InitReply::Main { pid: Some(pid), .. } if fds.is_empty() => {
            running(out_r, err_r, conn, pid)
        }
        InitReply::Main {
            exit: Some((code, signal)),
            ..
        } => Ok(MainAttach::Exited { code, signal }),
        InitReply::Main { .. } => Ok(MainAttach::NoMain),
        other => Err(RuntimeError::Exec(format!(
            "unexpected reply from init: {other:?}"
        ))),
    }
}

/// Asks a gVisor sandbox's init to let go of every host socket (see
/// `warren_init::proto::InitRequest::Quiesce`), and waits until it has:
/// its answer, then the connection closing.
pub async fn quiesce(socket: &Path) -> Result<(), RuntimeError> {
    let mut conn = connect(socket).await?;
    let reply = within("answer", async {
        proto::send_async(&mut conn, &InitRequest::Quiesce).await?;
        Ok(proto::recv_async::<InitReply>(&mut conn).await?)
    })
    .await?;
    if !matches!(reply, InitReply::Quiesced) {
        return Err(RuntimeError::Exec(format!(
            "unexpected reply from init: {reply:?}"
        )));
    }
    within("close its connection", async {
        use tokio::io::AsyncReadExt;
        let mut rest = [0u8; 1];
        let _ = conn.read(&mut rest).await;
        Ok(())
    })
    .await
}

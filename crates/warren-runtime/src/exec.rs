//! The daemon side of an exec: pipes for stdio, a connection to the
//! sandbox's init, and the control stream that reports the exit.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

use nix::fcntl::OFlag;
use tokio::net::unix::pipe;

use crate::proto::{self, ExecSpec, InitReply, InitRequest};
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
    /// The write end of the command's stdin, when it was kept open.
    pub stdin: Option<pipe::Sender>,
    pub stdout: pipe::Receiver,
    pub stderr: pipe::Receiver,
    pub exit: ExitWait,
    pub signal: ExecSignal,
}

pub enum ExecOutcome {
    Exited { code: i32, signal: Option<i32> },
}

/// What the command's stdin gets.
pub enum Stdin {
    /// These bytes (maybe none), then end of file.
    Bytes(Option<Vec<u8>>),
    /// Left open: the caller writes to `RunningExec::stdin`.
    Open,
}

/// Starts a command through init. `stdin` is written in full and then
/// closed, or kept open for the caller. `cgroup` is the exec cgroup's `cgroup.procs` (see exec_cgroup),
/// sent along when `spec.cgroup` says so.
pub async fn start(
    socket: &Path,
    spec: &ExecSpec,
    stdin: Stdin,
    cgroup: Option<OwnedFd>,
) -> Result<Result<RunningExec, (String, i32)>, RuntimeError> {
    let (in_r, in_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(RuntimeError::nix("pipe"))?;
    let (out_r, out_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(RuntimeError::nix("pipe"))?;
    let (err_r, err_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(RuntimeError::nix("pipe"))?;
    let conn = connect(socket).await?;
    let mut fds = vec![in_r.as_raw_fd(), out_w.as_raw_fd(), err_w.as_raw_fd()];
    let mut spec = spec.clone();
    spec.cgroup = cgroup.is_some();
    if let Some(c) = &cgroup {
        fds.push(c.as_raw_fd());
    }
    if spec.main {
        // Init keeps these so the main process survives a daemon restart.
        fds.extend([out_r.as_raw_fd(), err_r.as_raw_fd()]);
    }
    let request = InitRequest::Exec(spec);
    within("take the request", async {
        proto::send_async_fds(&conn, &request, &fds)
            .await
            .map_err(RuntimeError::from)
    })
    .await?;
    drop((in_r, out_w, err_w, cgroup));
    let (mut reader, writer) = conn.into_split();
    let reply = within("start the command", async {
        proto::recv_async::<InitReply>(&mut reader)
            .await
            .map_err(RuntimeError::from)
    })
    .await?;
    match reply {
        InitReply::Started { pid } => {
            let stdin = match stdin {
                Stdin::Bytes(data) => {
                    feed_stdin(in_w, data)?;
                    None
                }
                Stdin::Open => {
                    Some(pipe::Sender::from_owned_fd(in_w).map_err(RuntimeError::io("pipe"))?)
                }
            };
            Ok(Ok(RunningExec {
                pid,
                stdin,
                stdout: receiver(out_r)?,
                stderr: receiver(err_r)?,
                exit: ExitWait {
                    reader,
                    _writer: None,
                },
                signal: ExecSignal { writer },
            }))
        }
        InitReply::Failed { message, code } => Ok(Err((message, code))),
        other => Err(RuntimeError::Exec(format!(
            "unexpected reply from init: {other:?}"
        ))),
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

/// Re-attaches to the main process after a daemon restart. The sandbox
/// must not be frozen (its init could not answer): every step has a
/// deadline.
pub async fn attach_main(socket: &Path) -> Result<MainAttach, RuntimeError> {
    let conn = connect(socket).await?;
    let (reply, mut fds) = within("answer", async {
        proto::send_async_fds(&conn, &InitRequest::AttachMain, &[]).await?;
        Ok(proto::recv_async_fds::<InitReply>(&conn).await?)
    })
    .await?;
    match reply {
        InitReply::Main { pid: Some(pid), .. } if fds.len() == 2 => {
            let stderr = receiver(fds.remove(1))?;
            let stdout = receiver(fds.remove(0))?;
            let (reader, writer) = conn.into_split();
            let exit = ExitWait {
                reader,
                _writer: Some(writer),
            };
            Ok(MainAttach::Running {
                pid,
                stdout,
                stderr,
                exit,
            })
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

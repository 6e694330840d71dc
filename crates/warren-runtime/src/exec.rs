//! The daemon side of an exec: pipes for stdio, a connection to the
//! sandbox's init, and the control stream that reports the exit.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;

use nix::fcntl::OFlag;
use tokio::net::unix::pipe;

use crate::proto::{self, ExecSpec, InitReply, InitRequest};
use crate::RuntimeError;

pub struct RunningExec {
    pub pid: i32,
    pub stdout: pipe::Receiver,
    pub stderr: pipe::Receiver,
    pub exit: ExitWait,
    pub signal: ExecSignal,
}

pub enum ExecOutcome {
    Exited { code: i32, signal: Option<i32> },
}

/// Starts a command through init. `stdin` is written in full and then closed.
pub async fn start(
    socket: &Path,
    spec: &ExecSpec,
    stdin: Option<Vec<u8>>,
) -> Result<Result<RunningExec, (String, i32)>, RuntimeError> {
    let (in_r, in_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(RuntimeError::nix("pipe"))?;
    let (out_r, out_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(RuntimeError::nix("pipe"))?;
    let (err_r, err_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(RuntimeError::nix("pipe"))?;
    let conn = UnixStream::connect(socket).map_err(|e| {
        RuntimeError::Exec(format!(
            "sandbox init is not reachable at {}: {e}",
            socket.display()
        ))
    })?;
    let mut fds = vec![in_r.as_raw_fd(), out_w.as_raw_fd(), err_w.as_raw_fd()];
    if spec.main {
        // Init keeps these so the main process survives a daemon restart.
        fds.extend([out_r.as_raw_fd(), err_r.as_raw_fd()]);
    }
    proto::send(&conn, &InitRequest::Exec(spec.clone()), &fds)?;
    drop((in_r, out_w, err_w));
    conn.set_nonblocking(true)
        .map_err(RuntimeError::io("socket"))?;
    let control = tokio::net::UnixStream::from_std(conn).map_err(RuntimeError::io("socket"))?;
    let (mut reader, writer) = control.into_split();
    match proto::recv_async::<InitReply>(&mut reader).await? {
        InitReply::Started { pid } => {
            feed_stdin(in_w, stdin)?;
            Ok(Ok(RunningExec {
                pid,
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

/// Re-attaches to the main process after a daemon restart.
pub async fn attach_main(socket: &Path) -> Result<MainAttach, RuntimeError> {
    let conn = UnixStream::connect(socket)
        .map_err(|e| RuntimeError::Exec(format!("sandbox init is not reachable: {e}")))?;
    proto::send(&conn, &InitRequest::AttachMain, &[])?;
    let (reply, mut fds) = proto::recv::<InitReply>(&conn)?;
    match reply {
        InitReply::Main { pid: Some(pid), .. } if fds.len() == 2 => {
            let stderr = receiver(fds.remove(1))?;
            let stdout = receiver(fds.remove(0))?;
            conn.set_nonblocking(true)
                .map_err(RuntimeError::io("socket"))?;
            let control =
                tokio::net::UnixStream::from_std(conn).map_err(RuntimeError::io("socket"))?;
            let (reader, writer) = control.into_split();
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

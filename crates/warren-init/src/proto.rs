//! Length-prefixed JSON frames over a Unix stream socket, optionally carrying
//! file descriptors (SCM_RIGHTS), and the messages between the daemon and
//! each sandbox's init. The daemon and the spawner speak the same frames
//! (warren-runtime adds their messages and async forms). Both ends treat the other's
//! frames as untrusted input: sizes are bounded and parse errors are errors.

use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Frames are small control messages; anything bigger is a bug or an attack.
pub const MAX_FRAME: usize = 1 << 20;
pub const MAX_FDS: usize = 8;

#[derive(Debug, thiserror::Error)]
pub enum ProtoError {
    #[error("peer closed the connection")]
    Closed,
    #[error("frame of {0} bytes exceeds the {MAX_FRAME}-byte limit")]
    TooLarge(usize),
    #[error("malformed frame: {0}")]
    Malformed(#[from] serde_json::Error),
    #[error("socket error: {0}")]
    Io(#[from] std::io::Error),
}

impl From<nix::Error> for ProtoError {
    fn from(e: nix::Error) -> Self {
        ProtoError::Io(std::io::Error::from(e))
    }
}

pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, ProtoError> {
    let body = serde_json::to_vec(msg)?;
    if body.len() > MAX_FRAME {
        return Err(ProtoError::TooLarge(body.len()));
    }
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
    frame.extend_from_slice(&body);
    Ok(frame)
}

/// Sends one frame; the descriptors travel with its first byte.
pub fn send<T: Serialize>(sock: &UnixStream, msg: &T, fds: &[RawFd]) -> Result<(), ProtoError> {
    let frame = encode(msg)?;
    let mut sent = 0;
    if !fds.is_empty() {
        let cmsg = [ControlMessage::ScmRights(fds)];
        let iov = [IoSlice::new(&frame)];
        sent = loop {
            match sendmsg::<()>(sock.as_raw_fd(), &iov, &cmsg, MsgFlags::MSG_NOSIGNAL, None) {
                Err(nix::Error::EINTR) => continue,
                r => break r?,
            }
        };
    }
    let mut w = sock;
    w.write_all(&frame[sent..])?;
    Ok(())
}

/// Receives one frame and any descriptors sent with it.
pub fn recv<T: DeserializeOwned>(sock: &UnixStream) -> Result<(T, Vec<OwnedFd>), ProtoError> {
    let mut header = [0u8; 4];
    let mut fds = Vec::new();
    let got = {
        let mut iov = [IoSliceMut::new(&mut header)];
        let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
        let msg = loop {
            match recvmsg::<()>(
                sock.as_raw_fd(),
                &mut iov,
                Some(&mut space),
                MsgFlags::MSG_CMSG_CLOEXEC,
            ) {
                Err(nix::Error::EINTR) => continue,
                r => break r?,
            }
        };
        for c in msg.cmsgs()? {
            if let ControlMessageOwned::ScmRights(raw) = c {
                for fd in raw {
                    // SAFETY: the kernel just installed this descriptor in our
                    // table for us; nothing else owns it.
                    fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
                }
            }
        }
        msg.bytes
    };
    if got == 0 {
        return Err(ProtoError::Closed);
    }
    let mut r = sock;
    r.read_exact(&mut header[got..]).map_err(eof_as_closed)?;
    let len = u32::from_le_bytes(header) as usize;
    if len > MAX_FRAME {
        return Err(ProtoError::TooLarge(len));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).map_err(eof_as_closed)?;
    Ok((serde_json::from_slice(&body)?, fds))
}

pub fn eof_as_closed(e: std::io::Error) -> ProtoError {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        ProtoError::Closed
    } else {
        ProtoError::Io(e)
    }
}

/// What the daemon asks a sandbox's init to do. The stdio descriptors of an
/// `Exec` (stdin, stdout, stderr, in that order; none with `tty`) ride along
/// with the frame;
/// a main process's also carries copies of the stdout and stderr read ends,
/// which init holds so the main process outlives a daemon restart (its
/// writes block instead of failing) and hands back on `AttachMain`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum InitRequest {
    Exec(ExecSpec),
    /// Signal the process group of the exec on this connection.
    Signal {
        signal: i32,
    },
    /// Re-attach to the main process after a daemon restart: the reply is
    /// `Main`, carrying the read ends of its stdout and stderr while it runs,
    /// and `Exited` follows on the same connection when it ends.
    AttachMain,
    /// Connect to `port` on the sandbox's loopback and relay it to the
    /// stream socket that rides along (a sandbox on gVisor's own network
    /// stack, which the host cannot reach into). The reply is `Forwarding`,
    /// or `Failed` when nothing accepts there.
    Forward {
        port: u16,
    },
    /// Let go of every host socket (gVisor, before a checkpoint): the reply
    /// is `Quiesced`, and init listens again when it gets
    /// [`crate::LISTEN_AGAIN`].
    Quiesce,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExecSpec {
    pub argv: Vec<String>,
    /// Complete environment as `KEY=VALUE`.
    pub env: Vec<String>,
    pub cwd: String,
    pub uid: u32,
    pub gid: u32,
    #[serde(default)]
    pub groups: Vec<u32>,
    /// The sandbox's main process: survives the connection closing.
    #[serde(default)]
    pub main: bool,
    /// A writable `cgroup.procs` of the exec's own cgroup rides along (after
    /// the stdio descriptors): the shim moves itself there before it forks
    /// the command, so everything the exec starts is found and killed by
    /// the host, whatever the sandbox does to its processes.
    #[serde(default)]
    pub cgroup: bool,
    /// Run on a new terminal of this size, which init opens in the sandbox:
    /// no stdio descriptors come with the request, and the terminal's master
    /// comes back with `Started`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tty: Option<TermSize>,
    /// With `tty`, where no descriptor can leave the sandbox (gVisor):
    /// init keeps the master and relays it to the stream socket that rides
    /// along, and applies window sizes sent on the datagram socket after it
    /// (4 bytes: rows, cols); `Started` carries no descriptor.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tty_relay: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum InitReply {
    Started {
        pid: i32,
    },
    /// The program could not be started (not found, not executable, ...).
    Failed {
        message: String,
        code: i32,
    },
    Exited {
        code: i32,
        signal: Option<i32>,
    },
    Main {
        pid: Option<i32>,
        exit: Option<(i32, Option<i32>)>,
    },
    /// A `Forward`'s connection is made; its bytes flow on the stream.
    Forwarding,
    /// Init holds no host socket now (`Quiesce`).
    Quiesced,
}

/// A terminal's size in rows and columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TermSize {
    pub rows: u16,
    pub cols: u16,
}

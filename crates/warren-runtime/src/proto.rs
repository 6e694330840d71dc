//! The daemon's side of the frames [`warren_init::proto`] defines: async
//! forms for the daemon's runtime, and the daemon ↔ spawner messages.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

pub use warren_init::proto::*;

/// Async read of one frame without descriptors (replies never carry any).
pub async fn recv_async<T: DeserializeOwned>(
    sock: &mut (impl tokio::io::AsyncRead + Unpin),
) -> Result<T, ProtoError> {
    use tokio::io::AsyncReadExt;
    let mut header = [0u8; 4];
    sock.read_exact(&mut header).await.map_err(eof_as_closed)?;
    let len = u32::from_le_bytes(header) as usize;
    if len > MAX_FRAME {
        return Err(ProtoError::TooLarge(len));
    }
    let mut body = vec![0u8; len];
    sock.read_exact(&mut body).await.map_err(eof_as_closed)?;
    Ok(serde_json::from_slice(&body)?)
}

/// Async send of one frame whose first byte carries `fds`, on a socket the
/// daemon's runtime drives (so a peer that stops reading cannot hold a
/// thread; callers put a deadline around it).
pub async fn send_async_fds<T: Serialize>(
    sock: &tokio::net::UnixStream,
    msg: &T,
    fds: &[RawFd],
) -> Result<(), ProtoError> {
    let frame = encode(msg)?;
    let mut sent = 0;
    if !fds.is_empty() {
        let cmsg = [ControlMessage::ScmRights(fds)];
        sent = loop {
            sock.writable().await?;
            let iov = [IoSlice::new(&frame)];
            match sock.try_io(tokio::io::Interest::WRITABLE, || {
                sendmsg::<()>(sock.as_raw_fd(), &iov, &cmsg, MsgFlags::MSG_NOSIGNAL, None)
                    .map_err(std::io::Error::from)
            }) {
                Ok(n) => break n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e.into()),
            }
        };
    }
    while sent < frame.len() {
        sock.writable().await?;
        match sock.try_write(&frame[sent..]) {
            Ok(n) => sent += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Async receive of one frame and the descriptors that came with it.
pub async fn recv_async_fds<T: DeserializeOwned>(
    sock: &tokio::net::UnixStream,
) -> Result<(T, Vec<OwnedFd>), ProtoError> {
    let mut header = [0u8; 4];
    let mut fds = Vec::new();
    let got = loop {
        sock.readable().await?;
        let mut iov = [IoSliceMut::new(&mut header)];
        let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
        let received = sock.try_io(tokio::io::Interest::READABLE, || {
            let msg = recvmsg::<()>(
                sock.as_raw_fd(),
                &mut iov,
                Some(&mut space),
                MsgFlags::MSG_CMSG_CLOEXEC,
            )
            .map_err(std::io::Error::from)?;
            let mut raw = Vec::new();
            for c in msg.cmsgs().map_err(std::io::Error::from)? {
                if let ControlMessageOwned::ScmRights(r) = c {
                    raw.extend(r);
                }
            }
            Ok((msg.bytes, raw))
        });
        match received {
            Ok((n, raw)) => {
                for fd in raw {
                    // SAFETY: the kernel just installed this descriptor in our
                    // table for us; nothing else owns it.
                    fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
                }
                break n;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        }
    };
    if got == 0 {
        return Err(ProtoError::Closed);
    }
    let mut have = got;
    while have < 4 {
        have += read_some(sock, &mut header[have..]).await?;
    }
    let len = u32::from_le_bytes(header) as usize;
    if len > MAX_FRAME {
        return Err(ProtoError::TooLarge(len));
    }
    let mut body = vec![0u8; len];
    let mut have = 0;
    while have < len {
        have += read_some(sock, &mut body[have..]).await?;
    }
    Ok((serde_json::from_slice(&body)?, fds))
}

async fn read_some(sock: &tokio::net::UnixStream, buf: &mut [u8]) -> Result<usize, ProtoError> {
    loop {
        sock.readable().await?;
        match sock.try_read(buf) {
            Ok(0) => return Err(ProtoError::Closed),
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

pub async fn send_async<T: Serialize>(
    sock: &mut (impl tokio::io::AsyncWrite + Unpin),
    msg: &T,
) -> Result<(), ProtoError> {
    use tokio::io::AsyncWriteExt;
    sock.write_all(&encode(msg)?).await?;
    Ok(())
}

/// Daemon ↔ spawner.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum SpawnerRequest {
    Create {
        id: String,
        /// The sandbox directory: config.json, upper/, init.sock.
        bundle: PathBuf,
        state_root: PathBuf,
        socket: PathBuf,
        /// Image layer directories, topmost first.
        lower: Vec<PathBuf>,
        /// Size of the sandbox's own disk; 0 = none.
        disk: u64,
        /// Host uid/gid of root in the sandbox's user namespace; none when
        /// the sandbox shares the host's ids.
        id_base: Option<u32>,
        /// Volumes to mount into its root.
        #[serde(default)]
        volumes: Vec<crate::VolumeBind>,
        /// Files at /run/secrets.
        #[serde(default)]
        secrets: Vec<crate::SecretFileData>,
        /// How it starts once its root is mounted.
        #[serde(default)]
        start: Start,
    },
}

/// How the spawner starts a sandbox of each isolation class (see
/// [`crate::class`]).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(tag = "class", rename_all = "snake_case")]
pub enum Start {
    /// Warren's own set-up (cgroup v1) or libcontainer (v2) clones init.
    #[default]
    Container,
    /// runsc creates and starts it (see [`crate::gvisor::spawn`]).
    Runsc(crate::gvisor::Invocation),
    /// runsc restores it from a checkpoint's memory image (a gVisor fork
    /// with processes: see [`crate::Runtime::checkpoint`]).
    RunscRestore {
        run: crate::gvisor::Invocation,
        image: PathBuf,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum SpawnerReply {
    Created {
        pid: i32,
        /// How long each of the spawner's steps took: (name, microseconds).
        #[serde(default)]
        phases: Vec<(String, u64)>,
    },
    Error {
        message: String,
    },
}

#[cfg(test)]
mod tests {
    use super::SpawnerReply;

    #[test]
    fn created_without_phases_still_parses() {
        let old: SpawnerReply = match serde_json::from_str(r#"{"result":"created","pid":7}"#) {
            Ok(reply) => reply,
            Err(e) => panic!("old reply: {e}"),
        };
        assert!(matches!(old, SpawnerReply::Created { pid: 7, ref phases } if phases.is_empty()));
        let new = SpawnerReply::Created {
            pid: 8,
            phases: vec![("spawn_build".into(), 12)],
        };
        let text = serde_json::to_string(&new).unwrap_or_default();
        assert!(text.contains("spawn_build"), "{text}");
    }
}

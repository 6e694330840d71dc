//! Pseudo-terminals for execs with `tty`.
//!
//! The sandbox's init (warren-init) opens the pair, from the sandbox's own
//! `/dev/ptmx`, so the terminal belongs to the sandbox's devpts instance
//! (`/dev/pts/N` inside it; the host's /dev/pts never sees it). The command
//! gets the slave as its stdio and controlling terminal; init sends the
//! master to the daemon with its `Started` reply and keeps no copy, so the
//! daemon's [`Pty`] is the only master and reads end (`EIO`) once every
//! holder of the slave is gone.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use tokio::io::unix::AsyncFd;
use warren_core::WindowSize;

/// The daemon's end of an exec's terminal: what the command writes is read
/// here, what is written here is the command's input, and its window size
/// is set here. Clones share the one descriptor (the output pump reads,
/// the input writer writes and resizes).
#[derive(Clone)]
pub struct Pty {
    /// The master, or for a relayed terminal the stream init relays it to.
    master: Arc<AsyncFd<OwnedFd>>,
    relay: Option<Arc<Relayed>>,
}

/// A terminal whose master stays in the sandbox (see [`RelayEnds`]).
struct Relayed {
    /// Window sizes go to init as datagrams.
    resize: OwnedFd,
    size: std::sync::Mutex<WindowSize>,
}

/// The sockets of a terminal init relays, for sandboxes no descriptor can
/// leave (gVisor): a stream for the bytes and a datagram socket for window
/// sizes. Init gets [`RelayEnds::for_init`]; the daemon's ends become the
/// exec's [`Pty`].
pub struct RelayEnds {
    stream: OwnedFd,
    resize: OwnedFd,
    theirs: [OwnedFd; 2],
    size: crate::TermSize,
}

impl RelayEnds {
    pub fn new(size: crate::TermSize) -> io::Result<RelayEnds> {
        use rustix::net::{socketpair, AddressFamily, SocketFlags, SocketType};
        let (stream, their_stream) = socketpair(
            AddressFamily::UNIX,
            SocketType::STREAM,
            SocketFlags::CLOEXEC,
            None,
        )?;
        let (resize, their_resize) = socketpair(
            AddressFamily::UNIX,
            SocketType::DGRAM,
            SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
            None,
        )?;
        Ok(RelayEnds {
            stream,
            resize,
            theirs: [their_stream, their_resize],
            size,
        })
    }

    /// Init's ends, in the order it takes them (after the request's other
    /// descriptors).
    pub fn for_init(&self) -> [std::os::fd::RawFd; 2] {
        use std::os::fd::AsRawFd;
        [self.theirs[0].as_raw_fd(), self.theirs[1].as_raw_fd()]
    }

    /// The daemon's terminal, once init holds its ends (dropped here).
    pub fn into_pty(self) -> io::Result<Pty> {
        let mut pty = Pty::new(self.stream)?;
        pty.relay = Some(Arc::new(Relayed {
            resize: self.resize,
            size: std::sync::Mutex::new(WindowSize {
                rows: self.size.rows,
                cols: self.size.cols,
            }),
        }));
        Ok(pty)
    }
}

impl Pty {
    /// Takes over the master init sent; must run inside the tokio runtime.
    pub fn new(master: OwnedFd) -> io::Result<Pty> {
        let flags = rustix::fs::fcntl_getfl(&master)?;
        rustix::fs::fcntl_setfl(&master, flags | rustix::fs::OFlags::NONBLOCK)?;
        // SAFETY: the AsyncFd owns the master (an OwnedFd), so the
        // descriptor stays open and unchanged for the AsyncFd's whole life.
        let master = unsafe { AsyncFd::register(master) }.map_err(io::Error::from)?;
        Ok(Pty {
            master: Arc::new(master),
            relay: None,
        })
    }

    /// Reads output; 0 once the terminal hung up (every slave closed: Linux
    /// answers EIO then, after what was written before is read).
    pub async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let mut ready = self.master.readable().await?;
            match ready.try_io(|fd| read_now(fd.get_ref(), buf)) {
                Ok(r) => return r,
                Err(_would_block) => continue,
            }
        }
    }

    /// Reads what is there now; `WouldBlock` when nothing is.
    pub fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        read_now(self.master.get_ref(), buf)
    }

    /// Writes all of `data` as the terminal's input.
    pub async fn write_all(&self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            let mut ready = self.master.writable().await?;
            match ready.try_io(|fd| Ok(rustix::io::write(fd.get_ref(), data)?)) {
                Ok(Ok(0)) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(Ok(n)) => data = &data[n..],
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
        Ok(())
    }

    /// Sets the window size; the kernel sends SIGWINCH to the terminal's
    /// foreground process group when it changed.
    pub fn resize(&self, size: WindowSize) -> io::Result<()> {
        if let Some(r) = &self.relay {
            let mut msg = [0u8; 4];
            msg[..2].copy_from_slice(&size.rows.to_le_bytes());
            msg[2..].copy_from_slice(&size.cols.to_le_bytes());
            rustix::io::write(&r.resize, &msg)?;
            *warren_core::sync::lock(&r.size) = size;
            return Ok(());
        }
        let winsize = rustix::termios::Winsize {
            ws_row: size.rows,
            ws_col: size.cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        Ok(rustix::termios::tcsetwinsize(
            self.master.get_ref(),
            winsize,
        )?)
    }

    /// The current window size.
    pub fn size(&self) -> io::Result<WindowSize> {
        if let Some(r) = &self.relay {
            return Ok(*warren_core::sync::lock(&r.size));
        }
        let w = rustix::termios::tcgetwinsize(self.master.get_ref())?;
        Ok(WindowSize {
            rows: w.ws_row,
            cols: w.ws_col,
        })
    }
}

fn read_now(fd: impl AsFd, buf: &mut [u8]) -> io::Result<usize> {
    match rustix::io::read(fd, buf) {
        Ok(n) => Ok(n),
        // The slave side is closed: the end of the output.
        Err(rustix::io::Errno::IO) => Ok(0),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pair opened here (as init opens one in a sandbox): output, input,
    /// the size set at open and by resize, and the hang-up as end of output.
    #[tokio::test]
    async fn master_reads_writes_resizes_and_ends() {
        let size = nix::pty::Winsize {
            ws_row: 30,
            ws_col: 100,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        let pair = nix::pty::openpty(&size, None).unwrap();
        let pty = Pty::new(pair.master).unwrap();
        assert_eq!(
            pty.size().unwrap(),
            WindowSize {
                rows: 30,
                cols: 100
            }
        );
        let slave_size = rustix::termios::tcgetwinsize(&pair.slave).unwrap();
        assert_eq!((slave_size.ws_row, slave_size.ws_col), (30, 100));
        pty.resize(WindowSize { rows: 5, cols: 7 }).unwrap();
        let slave_size = rustix::termios::tcgetwinsize(&pair.slave).unwrap();
        assert_eq!((slave_size.ws_row, slave_size.ws_col), (5, 7));

        // Input typed at the master reaches the slave (and is echoed back).
        pty.write_all(b"hi\n").await.unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 64];
        while !got.ends_with(b"\r\n") {
            let n = pty.read(&mut buf).await.unwrap();
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got, b"hi\r\n");
        let n = rustix::io::read(&pair.slave, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"hi\n");

        // Output written before the slave closes is read, then the end.
        rustix::io::write(&pair.slave, b"bye\n").unwrap();
        drop(pair.slave);
        let mut out = Vec::new();
        loop {
            let n = pty.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
        assert_eq!(out, b"bye\r\n");
        assert!(matches!(pty.try_read(&mut buf), Ok(0)));
    }
}

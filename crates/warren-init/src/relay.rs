//! Byte relays through init, for sandboxes no descriptor can leave and the
//! host cannot reach into (gVisor: a descriptor sent from the sandbox to the
//! host is refused, and a sandbox on gVisor's own network stack has no
//! socket the host can connect to). Init copies bytes between a stream
//! socket the daemon sent in and:
//! - a terminal's master, which stays in init (window sizes arrive as
//!   4-byte datagrams, rows and cols as little-endian u16s, on a second
//!   socket);
//! - or a TCP connection init made to a port on the sandbox's loopback.
//!
//! Everything is non-blocking and driven by init's one poll loop, so a slow
//! reader stalls only its own relay.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags};
use nix::sys::socket::{shutdown, Shutdown};

/// Bytes buffered each way before init stops reading the other side.
const BUFFER: usize = 64 << 10;

/// One side of a relay: what was read from it waits in `pending` for the
/// other side.
struct Side {
    fd: OwnedFd,
    /// It said end of file (or the terminal hung up).
    ended: bool,
    /// Bytes read from the other side, waiting to be written here.
    pending: Vec<u8>,
    /// Its write half was shut down after the other side ended.
    closed_for_writing: bool,
}

pub(crate) struct Relay {
    /// The sandbox's side: a terminal's master or a TCP connection.
    inner: Side,
    /// The daemon's stream.
    outer: Side,
    /// A terminal's window-size socket; none for a port.
    resize: Option<OwnedFd>,
    /// The terminal's session (the exec's process group).
    session: i32,
    failed: bool,
}

impl Side {
    fn new(fd: OwnedFd) -> Side {
        set_nonblocking(fd.as_fd());
        Side {
            fd,
            ended: false,
            pending: Vec::new(),
            closed_for_writing: false,
        }
    }
}

impl Relay {
    /// A terminal of the exec whose process group is `session`: `master`
    /// stays in init.
    pub(crate) fn terminal(
        master: OwnedFd,
        stream: OwnedFd,
        resize: OwnedFd,
        session: i32,
    ) -> Relay {
        set_nonblocking(resize.as_fd());
        Relay {
            inner: Side::new(master),
            outer: Side::new(stream),
            resize: Some(resize),
            session,
            failed: false,
        }
    }

    /// A connection to a port inside the sandbox.
    pub(crate) fn port(conn: OwnedFd, stream: OwnedFd) -> Relay {
        Relay {
            inner: Side::new(conn),
            outer: Side::new(stream),
            resize: None,
            session: 0,
            failed: false,
        }
    }

    fn is_terminal(&self) -> bool {
        self.resize.is_some()
    }

    /// Done once both sides ended and what they said was delivered, or the
    /// daemon hung up a terminal, or an error ended it.
    pub(crate) fn done(&self) -> bool {
        if self.failed {
            return true;
        }
        if self.is_terminal() {
            // The command's output delivered after the terminal hung up;
            // or the daemon went away (the terminal hangs up with it).
            return (self.inner.ended && self.outer.pending.is_empty()) || self.outer.ended;
        }
        self.inner.ended
            && self.outer.ended
            && self.inner.pending.is_empty()
            && self.outer.pending.is_empty()
    }

    /// Adds this relay's descriptors to a poll round.
    pub(crate) fn watch<'a>(&'a self, fds: &mut Vec<PollFd<'a>>) {
        for (side, other) in [(&self.inner, &self.outer), (&self.outer, &self.inner)] {
            let mut f = PollFlags::empty();
            // Read while the other side has room for it.
            if !side.ended && other.pending.len() < BUFFER {
                f |= PollFlags::POLLIN;
            }
            if !side.pending.is_empty() {
                f |= PollFlags::POLLOUT;
            }
            fds.push(PollFd::new(side.fd.as_fd(), f));
        }
        if let Some(r) = &self.resize {
            fds.push(PollFd::new(r.as_fd(), PollFlags::POLLIN));
        }
    }

    /// Moves what it can after a poll round, whatever the round reported
    /// (every descriptor is non-blocking).
    pub(crate) fn pump(&mut self) {
        self.apply_resizes();
        let terminal = self.is_terminal();
        let ok = move_bytes(&mut self.inner, &mut self.outer, terminal)
            && move_bytes(&mut self.outer, &mut self.inner, false);
        if !ok {
            self.failed = true;
            return;
        }
        // A side that ended, once all it said is through, ends the other's
        // input (a port's half-close; a terminal just finishes).
        if !terminal {
            let (inner_ended, outer_ended) = (self.inner.ended, self.outer.ended);
            for (ended, other) in [
                (inner_ended, &mut self.outer),
                (outer_ended, &mut self.inner),
            ] {
                if ended && other.pending.is_empty() && !other.closed_for_writing {
                    let _ = shutdown(other.fd.as_raw_fd(), Shutdown::Write);
                    other.closed_for_writing = true;
                }
            }
        }
    }

    fn apply_resizes(&mut self) {
        let Some(resize) = &self.resize else { return };
        let mut msg = [0u8; 4];
        while let Ok(4) = nix::unistd::read(resize.as_raw_fd(), &mut msg) {
            let winsize = libc::winsize {
                ws_row: u16::from_le_bytes([msg[0], msg[1]]),
                ws_col: u16::from_le_bytes([msg[2], msg[3]]),
                ws_xpixel: 0,
                ws_ypixel: 0,
            };
            // SAFETY: TIOCSWINSZ reads one winsize from the pointer, which
            // outlives the call.
            unsafe { libc::ioctl(self.inner.fd.as_raw_fd(), libc::TIOCSWINSZ, &winsize) };
            // A kernel signals the terminal's foreground group; gVisor's
            // (runsc 2022) does not, so init does (a second SIGWINCH from a
            // kernel that does is harmless: it only asks for a redraw).
            // Its foreground group is not known from the master there
            // either: every process group of the terminal's session.
            for group in session_groups(self.session) {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(group),
                    nix::sys::signal::Signal::SIGWINCH,
                );
            }
        }
    }
}

/// The process groups of session `session`, from /proc (fields 5 and 6
/// of each process's stat, after its parenthesised name).
fn session_groups(session: i32) -> Vec<i32> {
    let mut groups = Vec::new();
    if session <= 0 {
        return groups;
    }
    for pid in crate::procstat::pids() {
        let Some(stat) = crate::procstat::read(&pid.to_string()) else {
            continue;
        };
        let (Some(pgrp), Some(sid)) = (stat.field(5), stat.field(6)) else {
            continue;
        };
        if sid.parse::<i32>().ok() == Some(session) {
            if let Ok(g) = pgrp.parse::<i32>() {
                if !groups.contains(&g) {
                    groups.push(g);
                }
            }
        }
    }
    groups
}

/// Reads what `from` has (while `to` has room) and writes what `to` has
/// waiting. False on an error that ends the relay.
fn move_bytes(from: &mut Side, to: &mut Side, from_terminal: bool) -> bool {
    if !from.ended {
        match fill(from.fd.as_fd(), &mut to.pending) {
            Ok(true) => from.ended = true,
            Ok(false) => {}
            // EIO: every holder of the terminal's slave is gone.
            Err(Errno::EIO) if from_terminal => from.ended = true,
            Err(_) => return false,
        }
    }
    drain(to.fd.as_fd(), &mut to.pending).is_ok()
}

/// Reads into `buf` up to [`BUFFER`]; Ok(true) at end of file.
fn fill(fd: BorrowedFd, buf: &mut Vec<u8>) -> Result<bool, Errno> {
    let mut chunk = [0u8; 8192];
    while buf.len() < BUFFER {
        let room = (BUFFER - buf.len()).min(chunk.len());
        match nix::unistd::read(fd.as_raw_fd(), &mut chunk[..room]) {
            Ok(0) => return Ok(true),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(Errno::EAGAIN) | Err(Errno::EINTR) => return Ok(false),
            Err(e) => return Err(e),
        }
    }
    Ok(false)
}

/// Writes what it can of `buf`, keeping the rest.
fn drain(fd: BorrowedFd, buf: &mut Vec<u8>) -> Result<(), Errno> {
    while !buf.is_empty() {
        match nix::unistd::write(fd, buf) {
            Ok(n) => {
                buf.drain(..n);
            }
            Err(Errno::EAGAIN) | Err(Errno::EINTR) => return Ok(()),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn set_nonblocking(fd: BorrowedFd) {
    // SAFETY: F_GETFL/F_SETFL on a descriptor we own; only flags change.
    unsafe {
        let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        if flags >= 0 {
            libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK);
        }
    }
}

/// The main process's stdout or stderr in gVisor: the process writes to a
/// pipe of the sandbox's own, and init copies it to the daemon's pipe.
/// gVisor cannot save a process that holds a host descriptor, so this is
/// what lets runsc checkpoint a sandbox whose main process runs: at a
/// quiesce the daemon's end is dropped (output waits in the sandbox's pipe
/// and then blocks the writer, as when the daemon is away), and a re-attach
/// brings a new one.
pub(crate) struct OutputRelay {
    /// The sandbox's pipe, read end.
    from: Side,
    /// The daemon's pipe, write end, while one is attached.
    to: Option<OwnedFd>,
}

impl OutputRelay {
    pub(crate) fn new(from: OwnedFd, to: OwnedFd) -> OutputRelay {
        set_nonblocking(to.as_fd());
        OutputRelay {
            from: Side::new(from),
            to: Some(to),
        }
    }

    /// Adds this relay's descriptors to a poll round.
    pub(crate) fn watch<'a>(&'a self, fds: &mut Vec<PollFd<'a>>) {
        let Some(to) = &self.to else { return };
        if !self.from.ended && self.from.pending.len() < BUFFER {
            fds.push(PollFd::new(self.from.fd.as_fd(), PollFlags::POLLIN));
        }
        if !self.from.pending.is_empty() {
            fds.push(PollFd::new(to.as_fd(), PollFlags::POLLOUT));
        }
    }

    /// Moves what it can. The daemon's end goes at an error (the daemon
    /// went away) and once everything the sandbox's end said is through,
    /// so the daemon reads end of file.
    pub(crate) fn pump(&mut self) {
        let Some(to) = &self.to else { return };
        if !self.from.ended {
            match fill(self.from.fd.as_fd(), &mut self.from.pending) {
                Ok(true) => self.from.ended = true,
                Ok(false) => {}
                Err(_) => self.from.ended = true,
            }
        }
        if drain(to.as_fd(), &mut self.from.pending).is_err()
            || (self.from.ended && self.from.pending.is_empty())
        {
            self.to = None;
        }
    }

    /// Copies everything the sandbox's end holds now, waiting up to
    /// `within` for the daemon to read: the process has exited, so what
    /// it wrote is all in the pipe.
    pub(crate) fn flush(&mut self, within: std::time::Duration) {
        let deadline = std::time::Instant::now() + within;
        let mut emptied = false;
        loop {
            self.pump();
            let Some(to) = &self.to else { return };
            // Nothing waiting twice in a row: the pipe is empty now.
            if self.from.pending.is_empty() {
                if emptied {
                    return;
                }
                emptied = true;
                continue;
            }
            emptied = false;
            if std::time::Instant::now() >= deadline {
                return;
            }
            let mut fds = [PollFd::new(to.as_fd(), PollFlags::POLLOUT)];
            let _ = nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(10u8));
        }
    }

    /// Lets go of the daemon's end (a quiesce).
    pub(crate) fn detach(&mut self) {
        self.to = None;
    }

    /// A new daemon's end (a re-attach); a relay that ended takes none.
    pub(crate) fn attach(&mut self, to: OwnedFd) {
        if self.from.ended && self.from.pending.is_empty() {
            return;
        }
        set_nonblocking(to.as_fd());
        self.to = Some(to);
    }
}

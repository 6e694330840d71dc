//! What every long-running process of Warren's binaries does alike: its
//! listening sockets and the signal that stops it.

/// The first SIGINT or SIGTERM (never, if neither can be watched).
pub async fn first_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => {},
        _ = term.recv() => {},
    }
}

/// How many finished handshakes a listener holds before the daemon accepts
/// them (the kernel caps it at `net.core.somaxconn`, 4096 by default).
/// tokio's `TcpListener::bind` asks for 128: a training run that opened a
/// thousand connections at once overflowed it, the kernel dropped the
/// handshakes past it (`TcpExtListenOverflows` in `nstat`), and those
/// clients waited on retransmits while the daemon was idle.
const ACCEPT_BACKLOG: u32 = 4096;

/// A listening socket for one of the daemon's HTTP APIs.
pub fn listen(addr: std::net::SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = match addr {
        std::net::SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        std::net::SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    // As `TcpListener::bind` does: a restarted daemon rebinds its port
    // while the last one's connections sit in TIME_WAIT.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(ACCEPT_BACKLOG)
}

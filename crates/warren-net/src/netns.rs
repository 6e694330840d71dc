//! Running socket calls inside a sandbox's network namespace. A socket keeps
//! the namespace it was created in, so the daemon can create listeners (and
//! inbound connections) there and serve them from its own runtime.

use std::fs::File;
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsFd;

use nix::sched::{setns, CloneFlags};

/// Runs `f` on a new thread that has entered the network namespace of
/// `pid`. A fresh thread, because a thread that joined another namespace
/// must never go back to a pool.
pub(crate) async fn run_in<T, F>(pid: i32, f: F) -> std::io::Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> std::io::Result<T> + Send + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("warren-netns".into())
        .spawn(move || {
            let result = File::open(format!("/proc/{pid}/ns/net")).and_then(|ns| {
                setns(ns.as_fd(), CloneFlags::CLONE_NEWNET)?;
                f()
            });
            let _ = tx.send(result);
        })?;
    rx.await
        .map_err(|_| std::io::Error::other("network namespace thread panicked"))?
}

/// A listening TCP socket in the current thread's namespace, ready for tokio.
pub(crate) fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let l = TcpListener::bind(addr)?;
    l.set_nonblocking(true)?;
    Ok(l)
}

pub(crate) fn bind_udp(addr: SocketAddr) -> std::io::Result<UdpSocket> {
    let s = UdpSocket::bind(addr)?;
    s.set_nonblocking(true)?;
    Ok(s)
}

/// Connects to `port` on the loopback of the sandbox whose init is `pid`:
/// inbound access (port-forward) without any host-side interface.
pub async fn connect_in(pid: i32, port: u16) -> std::io::Result<tokio::net::TcpStream> {
    let std_stream = run_in(pid, move || {
        let s = TcpStream::connect_timeout(
            &SocketAddr::from(([127, 0, 0, 1], port)),
            std::time::Duration::from_secs(5),
        )?;
        s.set_nonblocking(true)?;
        Ok(s)
    })
    .await?;
    tokio::net::TcpStream::from_std(std_stream)
}

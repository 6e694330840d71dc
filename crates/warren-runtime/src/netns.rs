//! Network namespace setup done from the host side. A new network namespace
//! has only a loopback device, and it is down; network mode `none` means
//! "loopback works, nothing else exists".

use std::fs::File;
use std::os::fd::AsFd;

use nix::sched::{setns, CloneFlags};

/// Brings `lo` up inside the network namespace of `pid`. The calling thread
/// enters that namespace and returns to its own; only call this from a
/// single-threaded process or a thread that owns nothing else.
pub fn loopback_up(pid: i32) -> std::io::Result<()> {
    let own = File::open("/proc/thread-self/ns/net")?;
    let target = File::open(format!("/proc/{pid}/ns/net"))?;
    setns(target.as_fd(), CloneFlags::CLONE_NEWNET)?;
    let result = set_up("lo");
    setns(own.as_fd(), CloneFlags::CLONE_NEWNET)?;
    result
}

fn set_up(name: &str) -> std::io::Result<()> {
    let sock = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Inet,
        nix::sys::socket::SockType::Datagram,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *dst = src as libc::c_char;
    }
    use std::os::fd::AsRawFd;
    // SAFETY: SIOCGIFFLAGS reads into the ifreq we own.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: ifru_flags is the active union member after SIOCGIFFLAGS.
    unsafe { req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
    // SAFETY: SIOCSIFFLAGS reads the ifreq we own.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

//! One netlink request: `ip route add local 0.0.0.0/0 dev lo` in the
//! current thread's network namespace. Every IPv4 address then counts as
//! local, so a connection to any address stays inside the namespace and
//! reaches the transparent listeners (or is refused); nothing can leave,
//! because there is no device to leave through.

use std::io::{Error, ErrorKind, Result};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const RTM_NEWROUTE: u16 = 24;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const NLMSG_ERROR: u16 = 2;
const RT_TABLE_MAIN: u8 = 254;
const RTPROT_BOOT: u8 = 3;
const RT_SCOPE_HOST: u8 = 254;
const RTN_LOCAL: u8 = 2;
const RTA_OIF: u16 = 4;

pub(crate) fn add_local_default() -> Result<()> {
    // SAFETY: plain socket(2) call; the result is checked before use.
    let raw = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        )
    };
    if raw < 0 {
        return Err(Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh descriptor that nothing else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: the argument is a NUL-terminated literal.
    let lo = unsafe { libc::if_nametoindex(c"lo".as_ptr()) };
    if lo == 0 {
        return Err(Error::last_os_error());
    }

    let mut msg = Vec::with_capacity(36);
    let len: u32 = 16 + 12 + 8;
    msg.extend_from_slice(&len.to_ne_bytes());
    msg.extend_from_slice(&RTM_NEWROUTE.to_ne_bytes());
    msg.extend_from_slice(&(NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL).to_ne_bytes());
    msg.extend_from_slice(&1u32.to_ne_bytes()); // sequence
    msg.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel fills it
                                                // struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags
    msg.extend_from_slice(&[
        libc::AF_INET as u8,
        0,
        0,
        0,
        RT_TABLE_MAIN,
        RTPROT_BOOT,
        RT_SCOPE_HOST,
        RTN_LOCAL,
    ]);
    msg.extend_from_slice(&0u32.to_ne_bytes());
    // rtattr RTA_OIF = lo
    msg.extend_from_slice(&8u16.to_ne_bytes());
    msg.extend_from_slice(&RTA_OIF.to_ne_bytes());
    msg.extend_from_slice(&lo.to_ne_bytes());

    // SAFETY: sockaddr_nl is plain data; zero means "the kernel".
    let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    kernel.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    // SAFETY: the buffer and address outlive the call; lengths match them.
    let sent = unsafe {
        libc::sendto(
            sock.as_raw_fd(),
            msg.as_ptr().cast(),
            msg.len(),
            0,
            (&kernel as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if sent < 0 {
        return Err(Error::last_os_error());
    }
    let mut buf = [0u8; 512];
    // SAFETY: recv writes at most buf.len() bytes into our buffer.
    let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        return Err(Error::last_os_error());
    }
    let n = n as usize;
    if n < 20 || u16::from_ne_bytes([buf[4], buf[5]]) != NLMSG_ERROR {
        return Err(Error::new(
            ErrorKind::InvalidData,
            "unexpected netlink reply",
        ));
    }
    let code = i32::from_ne_bytes([buf[16], buf[17], buf[18], buf[19]]);
    if code != 0 {
        return Err(Error::from_raw_os_error(-code));
    }
    Ok(())
}

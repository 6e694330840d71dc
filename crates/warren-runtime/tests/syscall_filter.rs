//! The sandbox's seccomp filter as the spawner compiles it, installed in a
//! real child process: what it lets through and what it refuses.

#![allow(clippy::expect_used)]

use warren_runtime::oci::seccomp_profile;
use warren_runtime::syscall_filter::{compile, install};

/// Runs `probe` in a forked child under the compiled filter and returns
/// its exit code (the probe's verdicts as bits; 255 if the filter could
/// not be installed).
fn under_filter(probe: fn() -> i32) -> i32 {
    let program = compile(&seccomp_profile()).expect("the profile compiles");
    // SAFETY: the child calls only raw syscalls (no allocation, no locks)
    // before _exit, so forking this multi-threaded test process is sound.
    match unsafe { libc::fork() } {
        0 => {
            // SAFETY: prctl with integer arguments.
            let nnp = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
            let code = if nnp != 0 || install(&program).is_err() {
                255
            } else {
                probe()
            };
            // SAFETY: ends the child without running the parent's atexit work.
            unsafe { libc::_exit(code) }
        }
        pid if pid > 0 => {
            let mut status = 0;
            // SAFETY: waits for our own child.
            let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
            assert_eq!(waited, pid);
            assert!(
                libc::WIFEXITED(status),
                "the probe died: status {status:#x}"
            );
            libc::WEXITSTATUS(status)
        }
        _ => panic!("fork: {}", std::io::Error::last_os_error()),
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// 0 if the socket could be made (it is closed again), else the errno.
fn socket(family: i32) -> i32 {
    // SAFETY: socket takes integers; the descriptor is closed at once.
    let fd = unsafe { libc::socket(family, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return errno();
    }
    // SAFETY: our own descriptor.
    unsafe { libc::close(fd) };
    0
}

#[test]
fn the_compiled_filter_refuses_what_the_profile_denies() {
    fn probe() -> i32 {
        let mut bad = 0;
        // SAFETY: unshare with a flag only; refused under the filter.
        if unsafe { libc::unshare(libc::CLONE_NEWUSER) } == 0 || errno() != libc::EPERM {
            bad |= 1;
        }
        // SAFETY: clone3 with a null argument; refused before it is read.
        if unsafe { libc::syscall(libc::SYS_clone3, 0, 0) } == 0 || errno() != libc::ENOSYS {
            bad |= 2;
        }
        // Only UNIX, IPv4, IPv6 and netlink sockets: EPERM is the filter's
        // answer (EAFNOSUPPORT would be a kernel's that lacks the family,
        // after the filter let it through).
        for (bit, family) in [
            (4, libc::AF_VSOCK),
            (8, libc::AF_ALG),
            (32, libc::AF_PACKET),
            (64, libc::AF_TIPC),
            (128, libc::AF_KEY),
        ] {
            if socket(family) != libc::EPERM {
                bad |= bit;
            }
        }
        // No namespace flags to clone: a new user namespace would hand the
        // sandbox a fresh set of capabilities over the kernel.
        // SAFETY: a raw clone that shares nothing unusual; were it to
        // succeed, the new child leaves at once.
        let pid = unsafe {
            libc::syscall(
                libc::SYS_clone,
                libc::CLONE_NEWUSER | libc::SIGCHLD,
                0,
                0,
                0,
                0,
            )
        };
        if pid == 0 {
            // SAFETY: the child of the clone above ends here.
            unsafe { libc::_exit(0) };
        }
        if pid > 0 || errno() != libc::EPERM {
            bad |= 256;
        }
        // A plain fork is still a clone without namespace flags.
        // SAFETY: as above; the child leaves at once and is reaped.
        let pid = unsafe { libc::syscall(libc::SYS_clone, libc::SIGCHLD, 0, 0, 0, 0) };
        if pid == 0 {
            // SAFETY: the child of the clone above ends here.
            unsafe { libc::_exit(0) };
        }
        if pid < 0 {
            bad |= 512;
        } else {
            let mut status = 0;
            // SAFETY: reaps the child just made.
            unsafe { libc::waitpid(pid as i32, &mut status, 0) };
        }
        // SAFETY: keyctl with integer arguments; refused under the filter.
        if unsafe { libc::syscall(libc::SYS_keyctl, 0, 0, 0, 0, 0) } == 0 || errno() != libc::EPERM
        {
            bad |= 16;
        }
        bad
    }
    assert_eq!(
        under_filter(probe),
        0,
        "bits of the refusals that did not happen"
    );
}

#[test]
fn the_compiled_filter_lets_ordinary_work_through() {
    fn probe() -> i32 {
        let mut bad = 0;
        // SAFETY: getpid cannot fail.
        if unsafe { libc::getpid() } <= 0 {
            bad |= 1;
        }
        // The families a program needs: UNIX, IPv4, IPv6 and netlink.
        for (bit, family) in [
            (2, libc::AF_UNIX),
            (4, libc::AF_INET),
            (8, libc::AF_INET6),
            (16, libc::AF_NETLINK),
        ] {
            let kind = if family == libc::AF_NETLINK {
                libc::SOCK_RAW
            } else {
                libc::SOCK_STREAM
            };
            // SAFETY: socket takes integers; the descriptor is closed at once.
            let fd = unsafe { libc::socket(family, kind | libc::SOCK_CLOEXEC, 0) };
            if fd < 0 {
                bad |= bit;
            } else {
                // SAFETY: our own descriptor.
                unsafe { libc::close(fd) };
            }
        }
        bad
    }
    assert_eq!(
        under_filter(probe),
        0,
        "bits of the calls that were refused"
    );
}

#[test]
fn the_program_fits_the_kernel() {
    let program = compile(&seccomp_profile()).expect("the profile compiles");
    // BPF_MAXINSNS: the kernel refuses longer classic programs.
    assert!(
        !program.is_empty() && program.len() <= 4096,
        "{} instructions",
        program.len()
    );
}

//! How a sandbox's set-up becomes its init: with the seccomp filter the
//! spawner compiled installed, the child execs `warren-init` (the
//! warren-init crate), built static and at a fixed address and embedded in
//! this library (see build.rs). The spawner copies it once into a sealed
//! memfd; each init then starts from that, with nothing of the spawner's
//! memory: a forked init kept the spawner's pages, and with thousands alive
//! every reverse-map walk of them (the kernel's reclaim, DAMON) walked
//! thousands of mappings (docs/benchmarks.md, "An init with an address
//! space of its own"). The exec also needs no file in the sandbox's root.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::OnceLock;

use libcontainer::oci_spec::runtime::Spec;
use libcontainer::workload::{Executor, ExecutorError, ExecutorValidationError};

use crate::os_error::OsError;

pub use warren_init::LISTEN_FD;

/// The static `warren-init` executable.
pub(crate) static PROGRAM: &[u8] = include_bytes!(env!("WARREN_INIT_BIN"));

/// The spawner's sealed copy of [`PROGRAM`].
static EXECUTABLE: OnceLock<OwnedFd> = OnceLock::new();

/// Copies the init program into a sealed memfd for the inits this spawner
/// starts. Call once, before the first create.
pub fn prepare() -> Result<(), OsError> {
    let fd = memfd_with(PROGRAM)?;
    let _ = EXECUTABLE.set(fd);
    Ok(())
}

/// A close-on-exec copy of `fd` numbered 100 or above, so that fd 3
/// ([`LISTEN_FD`]) stays free for the listening socket each init receives.
pub(crate) fn above_listen_fd(fd: RawFd) -> std::io::Result<OwnedFd> {
    // SAFETY: fcntl(F_DUPFD_CLOEXEC) only duplicates `fd`; an invalid one gives -1.
    let high = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 100) };
    if high < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `high` is a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(high) })
}

fn memfd_with(bytes: &[u8]) -> Result<OwnedFd, OsError> {
    use std::io::Write;
    let flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
    // MFD_EXEC (Linux 6.3) keeps the memfd executable where
    // vm.memfd_noexec=1 would make it not; older kernels reject the flag,
    // and their memfds are executable anyway.
    // SAFETY: memfd_create takes a C string and flags; it returns a new descriptor or -1.
    let mut raw = unsafe { libc::memfd_create(c"warren-init".as_ptr(), flags | libc::MFD_EXEC) };
    if raw < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
        // SAFETY: as above.
        raw = unsafe { libc::memfd_create(c"warren-init".as_ptr(), flags) };
    }
    if raw < 0 {
        return Err(OsError::last("create a memfd for warren-init"));
    }
    // SAFETY: `raw` is a fresh descriptor owned by nobody else.
    let created = unsafe { OwnedFd::from_raw_fd(raw) };
    let fd = above_listen_fd(created.as_raw_fd())
        .map_err(|e| OsError::new("move the warren-init memfd", e))?;
    drop(created);
    let mut file = std::fs::File::from(fd);
    file.write_all(bytes)
        .map_err(|e| OsError::new("write warren-init to its memfd", e))?;
    let seals = libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;
    // SAFETY: fcntl(F_ADD_SEALS) on our memfd with integer flags.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
        return Err(OsError::last("seal the warren-init memfd"));
    }
    Ok(OwnedFd::from(file))
}

#[derive(Clone, Default)]
pub struct WarrenInit;

impl Executor for WarrenInit {
    fn exec(&self, _spec: &Spec) -> Result<(), ExecutorError> {
        serve()
    }

    fn validate(&self, _spec: &Spec) -> Result<(), ExecutorValidationError> {
        Ok(())
    }
}

/// Becomes the sandbox's init in a process whose isolation is set up
/// (by [`crate::setup`], or by libcontainer on cgroup v2 hosts): installs
/// the seccomp filter, before anything the sandbox asks for is served, and
/// execs `warren-init`, which keeps the filter. Never returns; on failure
/// the create fails, as the daemon never hears from this init.
pub(crate) fn serve() -> ! {
    if let Err(e) = crate::syscall_filter::install_prepared() {
        eprintln!("warren init: {e}");
        std::process::exit(1);
    }
    let Some(executable) = EXECUTABLE.get() else {
        eprintln!("warren init: no warren-init was prepared in this spawner");
        std::process::exit(1);
    };
    // The one descriptor that must survive the exec.
    // SAFETY: fcntl(F_SETFD) on LISTEN_FD, which the spawner placed for us.
    if unsafe { libc::fcntl(LISTEN_FD, libc::F_SETFD, 0) } < 0 {
        eprintln!(
            "warren init: keep the listening socket: {}",
            std::io::Error::last_os_error()
        );
        std::process::exit(1);
    }
    let title = CString::new(warren_init::TITLE).unwrap_or_default();
    let argv = [title.as_ptr(), std::ptr::null()];
    let env: Vec<CString> = std::env::vars_os()
        .filter_map(|(key, value)| {
            let mut entry = key.into_encoded_bytes();
            entry.push(b'=');
            entry.extend(value.into_encoded_bytes());
            CString::new(entry).ok()
        })
        .collect();
    let mut envp: Vec<*const libc::c_char> = env.iter().map(|e| e.as_ptr()).collect();
    envp.push(std::ptr::null());
    // SAFETY: argv and envp are null-terminated arrays of C strings that
    // outlive the call, which only returns on failure.
    unsafe {
        libc::syscall(
            libc::SYS_execveat,
            executable.as_raw_fd(),
            c"".as_ptr(),
            argv.as_ptr(),
            envp.as_ptr(),
            libc::AT_EMPTY_PATH,
        )
    };
    eprintln!(
        "warren init: exec warren-init: {}",
        std::io::Error::last_os_error()
    );
    std::process::exit(1)
}

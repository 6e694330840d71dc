//! cgroup v2 has no devices controller: a cgroup's device rules are an eBPF
//! program attached to it. libcontainer compiles a sandbox's OCI rule list
//! ([`crate::oci::device_cgroup_rules`]) into one and attaches it as the
//! sandbox starts (libcgroups' `cgroupsv2_devices`). This module builds the
//! same program from the same rules, so `warren doctor` can ask the kernel
//! ahead of time whether it takes one from this node ([`load_check`]), and
//! tests can hold Warren's rules against the kernel ([`attach`]).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use libcgroups::v2::devices::bpf::{self, BpfError};
use libcgroups::v2::devices::emulator::Emulator;
use libcgroups::v2::devices::program::{Program, ProgramError};
use thiserror::Error;

use crate::cdi::Injection;
use crate::oci::DeviceRulesError;
use crate::os_error::OsError;

#[derive(Debug, Error)]
pub enum DeviceProgramError {
    #[error(transparent)]
    Rules(#[from] DeviceRulesError),
    #[error("compile the device rules: {0}")]
    Compile(#[source] ProgramError),
    #[error("the kernel refused a cgroup device program: {0}")]
    Load(#[source] BpfError),
    #[error(transparent)]
    Os(#[from] OsError),
    #[error("attach the device program to {}: {source}", cgroup.display())]
    Attach {
        cgroup: std::path::PathBuf,
        source: BpfError,
    },
}

/// libcontainer raises RLIMIT_MEMLOCK (soft and hard) to this before it
/// loads a device program, and the create fails when it cannot: a node
/// whose hard limit is lower needs CAP_SYS_RESOURCE.
pub const LIBCONTAINER_MEMLOCK: u64 = 128 << 20;

/// Warren's rules for a sandbox with `devices` as one program
/// (libcontainer adds libcgroups' defaults on top: mknod of any node,
/// /dev/console and /dev/net/tun, none of which a sandbox's /dev holds).
fn compile(devices: &Injection) -> Result<Program, DeviceProgramError> {
    let mut emulator = Emulator::with_default_allow(false);
    emulator.add_rules(&crate::oci::device_cgroup_rules(devices)?);
    Program::from_rules(&emulator.rules, emulator.default_allow)
        .map_err(DeviceProgramError::Compile)
}

fn load(program: &Program) -> Result<OwnedFd, DeviceProgramError> {
    // NUL-terminated: the kernel reads the licence as a C string.
    let fd =
        bpf::prog::load("Apache-2.0\0", program.bytecodes()).map_err(DeviceProgramError::Load)?;
    // SAFETY: `load` returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Loads (without attaching) the program a plain sandbox gets and returns
/// its length in instructions. Closing it unloads it again.
pub fn load_check() -> Result<usize, DeviceProgramError> {
    let program = compile(&Injection::default())?;
    load(&program)?;
    Ok(program.bytecodes().len() / 8)
}

/// Attaches the program for `devices` to the cgroup2 directory `cgroup`
/// alongside any already there, as libcontainer does. It stays attached
/// until the cgroup is removed.
pub fn attach(cgroup: &Path, devices: &Injection) -> Result<(), DeviceProgramError> {
    let prog = load(&compile(devices)?)?;
    let dir = std::fs::File::open(cgroup)
        .map_err(|e| OsError::new(format!("open {}", cgroup.display()), e))?;
    bpf::prog::attach(prog.as_raw_fd(), dir.as_raw_fd()).map_err(|source| {
        DeviceProgramError::Attach {
            cgroup: cgroup.to_path_buf(),
            source,
        }
    })
}

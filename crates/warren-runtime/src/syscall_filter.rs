//! The sandbox's seccomp filter, compiled once per spawner instead of once
//! per sandbox. libcontainer compiles the OCI profile with libseccomp in
//! every init it starts (293 rules; its build of a sandbox took 2-3 ms
//! longer with it, docs/benchmarks.md); the
//! profile is the same for every sandbox, so the spawner compiles it at its
//! start and each sandbox's set-up, a copy of the spawner's memory,
//! installs the finished BPF program before it execs the init (see
//! [`crate::init`]), which keeps it.
//!
//! The translation from the OCI profile follows libcontainer's (0.7.0,
//! `seccomp::initialize_seccomp`) rule for rule, with one difference: a
//! `SCMP_CMP_MASKED_EQ` comparison reads `value` as the mask and `valueTwo`
//! as the value, as runc and Docker's profiles do. libcontainer reads them
//! the other way round, which turned the profile's four socket families
//! (UNIX, INET, INET6, NETLINK) into every family that shares a bit with
//! one of them: AF_ALG, AF_PACKET, AF_TIPC and AF_KEY got through.
//! tests/syscall_filter.rs holds the filter to the profile's meaning.

use std::io::{Read, Seek};
use std::sync::OnceLock;

use libcontainer::oci_spec::runtime::{
    Arch, LinuxSeccomp, LinuxSeccompAction, LinuxSeccompArg, LinuxSeccompOperator,
};
use libseccomp::{
    ScmpAction, ScmpArch, ScmpArgCompare, ScmpCompareOp, ScmpFilterContext, ScmpSyscall,
};
use thiserror::Error;

use crate::os_error::OsError;

/// A compiled filter: classic BPF instructions as the kernel takes them.
pub type Program = Vec<libc::sock_filter>;

/// Why the filter could not be compiled or installed.
#[derive(Debug, Error)]
pub enum FilterError {
    #[error("the seccomp profile does not fit the OCI schema: {0}")]
    Schema(#[source] serde_json::Error),
    /// The profile asks for what Warren's filter does not do.
    #[error("{0}")]
    Unsupported(String),
    /// libseccomp refused a step: which one, and its error.
    #[error("{what}: {source}")]
    Seccomp {
        what: String,
        source: libseccomp::error::SeccompError,
    },
    #[error(transparent)]
    Os(#[from] OsError),
    #[error("no seccomp filter was prepared in this process")]
    NotPrepared,
    #[error("a seccomp filter of {0} instructions is too long")]
    TooLong(usize),
    #[error("libseccomp exported {0} bytes, not whole BPF instructions")]
    Torn(usize),
}

impl FilterError {
    fn seccomp(what: impl Into<String>) -> impl FnOnce(libseccomp::error::SeccompError) -> Self {
        move |source| FilterError::Seccomp {
            what: what.into(),
            source,
        }
    }
}

static PROGRAM: OnceLock<Program> = OnceLock::new();

/// Compiles the sandbox profile ([`crate::oci::seccomp_profile`]) for this
/// process and the inits it starts. Call once, before the first create.
pub fn prepare() -> Result<(), FilterError> {
    let program = compile(&crate::oci::seccomp_profile())?;
    // A second call would compile the same profile: keep the first.
    let _ = PROGRAM.set(program);
    Ok(())
}

/// Installs the prepared filter on the calling thread (an init has one).
/// The caller must have set no_new_privs (libcontainer does, from the
/// config's `noNewPrivileges`): without it an unprivileged process may not
/// install a filter, and the kernel says EACCES.
pub fn install_prepared() -> Result<(), FilterError> {
    let program = PROGRAM.get().ok_or(FilterError::NotPrepared)?;
    install(program)
}

/// Installs `program` on the calling thread.
pub fn install(program: &[libc::sock_filter]) -> Result<(), FilterError> {
    let prog = libc::sock_fprog {
        len: u16::try_from(program.len()).map_err(|_| FilterError::TooLong(program.len()))?,
        filter: program.as_ptr().cast_mut(),
    };
    // SAFETY: `prog` points at `program`, which outlives the call; the kernel
    // copies the instructions and keeps no pointer to them.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0,
            &prog as *const libc::sock_fprog,
        )
    };
    if rc != 0 {
        return Err(OsError::last("install the seccomp filter").into());
    }
    Ok(())
}

/// Compiles an OCI `linux.seccomp` profile to a BPF program.
pub fn compile(profile: &serde_json::Value) -> Result<Program, FilterError> {
    let seccomp: LinuxSeccomp =
        serde_json::from_value(profile.clone()).map_err(FilterError::Schema)?;
    if seccomp.flags().as_ref().is_some_and(|f| !f.is_empty()) {
        // Warren's profile sets none; refuse rather than drop them silently.
        return Err(FilterError::Unsupported(
            "the seccomp profile sets filter flags, which Warren does not apply".into(),
        ));
    }
    let mut ctx = ScmpFilterContext::new(action(
        seccomp.default_action(),
        seccomp.default_errno_ret(),
    ))
    .map_err(FilterError::seccomp("compile the seccomp profile"))?;
    for arch in seccomp.architectures().iter().flatten() {
        ctx.add_arch(scmp_arch(*arch)?)
            .map_err(FilterError::seccomp(format!(
                "seccomp architecture {arch:?}"
            )))?;
    }
    add_rules(&mut ctx, &seccomp).map_err(FilterError::seccomp("compile the seccomp profile"))?;
    export(&ctx)
}

fn add_rules(
    ctx: &mut ScmpFilterContext,
    seccomp: &LinuxSeccomp,
) -> Result<(), libseccomp::error::SeccompError> {
    let default_action = action(seccomp.default_action(), seccomp.default_errno_ret());
    // As libcontainer: no_new_privs is the config's business, not libseccomp's.
    ctx.set_ctl_nnp(false)?;
    for rule in seccomp.syscalls().iter().flatten() {
        let rule_action = action(rule.action(), rule.errno_ret());
        if rule_action == default_action {
            continue;
        }
        for name in rule.names() {
            // A name this libseccomp does not know is a syscall this kernel
            // generation lacks: libcontainer skips it too.
            let Ok(sc) = ScmpSyscall::from_name(name) else {
                continue;
            };
            let Some(args) = rule.args() else {
                ctx.add_rule(rule_action, sc)?;
                continue;
            };
            let compares: Vec<ScmpArgCompare> = args.iter().map(compare).collect();
            let mut indices: Vec<usize> = args.iter().map(|a| a.index()).collect();
            indices.sort_unstable();
            indices.dedup();
            if indices.len() == args.len() {
                ctx.add_rule_conditional(rule_action, sc, &compares)?;
            } else {
                // libseccomp compares each argument once per rule: one rule
                // per comparison, as runc and libcontainer do.
                for c in &compares {
                    ctx.add_rule_conditional(rule_action, sc, std::slice::from_ref(c))?;
                }
            }
        }
    }
    Ok(())
}

fn export(ctx: &ScmpFilterContext) -> Result<Program, FilterError> {
    let fd = rustix::fs::memfd_create("warren-seccomp", rustix::fs::MemfdFlags::CLOEXEC)
        .map_err(|e| OsError::new("memfd for the seccomp filter", e))?;
    let mut file = std::fs::File::from(fd);
    ctx.export_bpf(&file)
        .map_err(FilterError::seccomp("export the seccomp filter"))?;
    let mut bytes = Vec::new();
    file.rewind()
        .and_then(|_| file.read_to_end(&mut bytes))
        .map_err(|e| OsError::new("read the seccomp filter back", e))?;
    let size = std::mem::size_of::<libc::sock_filter>();
    if bytes.is_empty() || bytes.len() % size != 0 {
        return Err(FilterError::Torn(bytes.len()));
    }
    Ok(bytes
        .chunks_exact(size)
        .map(|i| libc::sock_filter {
            code: u16::from_ne_bytes([i[0], i[1]]),
            jt: i[2],
            jf: i[3],
            k: u32::from_ne_bytes([i[4], i[5], i[6], i[7]]),
        })
        .collect())
}

fn action(action: LinuxSeccompAction, errno: Option<u32>) -> ScmpAction {
    let errno = errno.map(|e| e as i32).unwrap_or(libc::EPERM);
    match action {
        LinuxSeccompAction::ScmpActKill | LinuxSeccompAction::ScmpActKillThread => {
            ScmpAction::KillThread
        }
        LinuxSeccompAction::ScmpActKillProcess => ScmpAction::KillProcess,
        LinuxSeccompAction::ScmpActTrap => ScmpAction::Trap,
        LinuxSeccompAction::ScmpActErrno => ScmpAction::Errno(errno),
        LinuxSeccompAction::ScmpActTrace => ScmpAction::Trace(errno as u16),
        LinuxSeccompAction::ScmpActAllow => ScmpAction::Allow,
        LinuxSeccompAction::ScmpActNotify => ScmpAction::Notify,
        LinuxSeccompAction::ScmpActLog => ScmpAction::Log,
    }
}

/// One argument comparison; for `SCMP_CMP_MASKED_EQ`, `value` is the mask
/// and `valueTwo` what the masked argument must equal (runc's reading).
fn compare(arg: &LinuxSeccompArg) -> ScmpArgCompare {
    let (op, datum) = match arg.op() {
        LinuxSeccompOperator::ScmpCmpNe => (ScmpCompareOp::NotEqual, arg.value()),
        LinuxSeccompOperator::ScmpCmpLt => (ScmpCompareOp::Less, arg.value()),
        LinuxSeccompOperator::ScmpCmpLe => (ScmpCompareOp::LessOrEqual, arg.value()),
        LinuxSeccompOperator::ScmpCmpEq => (ScmpCompareOp::Equal, arg.value()),
        LinuxSeccompOperator::ScmpCmpGe => (ScmpCompareOp::GreaterEqual, arg.value()),
        LinuxSeccompOperator::ScmpCmpGt => (ScmpCompareOp::Greater, arg.value()),
        LinuxSeccompOperator::ScmpCmpMaskedEq => (
            ScmpCompareOp::MaskedEqual(arg.value()),
            arg.value_two().unwrap_or(0),
        ),
    };
    ScmpArgCompare::new(arg.index() as u32, op, datum)
}

/// The architectures the profile names: the native one of each host Warren
/// builds for (see `oci::native_arch`).
fn scmp_arch(arch: Arch) -> Result<ScmpArch, FilterError> {
    match arch {
        Arch::ScmpArchNative => Ok(ScmpArch::Native),
        Arch::ScmpArchX86_64 => Ok(ScmpArch::X8664),
        Arch::ScmpArchAarch64 => Ok(ScmpArch::Aarch64),
        other => Err(FilterError::Unsupported(format!(
            "the seccomp profile names architecture {other:?}; Warren's filter is for the host's own"
        ))),
    }
}

//! `warren-probe`: the escape suite's probe. It runs inside a sandbox (as
//! root and as an unprivileged user), tries what an attacker would, and
//! prints one JSON line per check: `{"check", "expect", "observed", "pass"}`.
//! `pass` is `null` (with a `reason`) for a check that does not apply to
//! the sandbox's isolation class; the test decides which may be.
//! It is built as a static binary so it runs in any image, and it needs
//! nothing from the network. Checks are numbered after security.md §a.
//!
//! The isolation class the sandbox runs in comes from the environment
//! (`WARREN_PROBE_ISOLATION`: `container`, the default, or `gvisor`); check
//! 00 verifies it against what the kernel inside says, so a container can
//! never be held to gVisor's expectations. Where a class differs, each
//! check says so next to the expectation, and why.
//!
//! Every probe here is a raw system call whose arguments are constants or
//! buffers it owns; the SAFETY notes say so once per helper.

use std::ffi::CString;
use std::fs;
use std::io::{Read, Write};

fn json_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

/// What stands between the sandbox and the host (Warren's isolation classes).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Class {
    /// Namespaces, cgroups, seccomp and capabilities on the host's kernel.
    Container,
    /// gVisor's user-space kernel (runsc), which serves every system call.
    Gvisor,
}

impl Class {
    fn name(self) -> &'static str {
        match self {
            Class::Container => "container",
            Class::Gvisor => "gvisor",
        }
    }
}

struct Report {
    class: Class,
    failed: usize,
    not_applicable: usize,
}

impl Report {
    fn line(&mut self, check: &str, expect: &str, observed: &str, pass: bool) {
        if !pass {
            self.failed += 1;
        }
        let esc = json_escape;
        println!(
            "{{\"check\":\"{}\",\"expect\":\"{}\",\"observed\":\"{}\",\"pass\":{}}}",
            esc(check),
            esc(expect),
            esc(observed),
            pass
        );
    }

    /// A check that does not apply to this isolation class: `pass` is null
    /// and `reason` says why (and where the property is checked instead).
    fn not_applicable(&mut self, check: &str, expect: &str, observed: &str, reason: &str) {
        self.not_applicable += 1;
        let esc = json_escape;
        println!(
            "{{\"check\":\"{}\",\"expect\":\"{}\",\"observed\":\"{}\",\"pass\":null,\"reason\":\"{}\"}}",
            esc(check),
            esc(expect),
            esc(observed),
            esc(reason)
        );
    }

    fn gvisor(&self) -> bool {
        self.class == Class::Gvisor
    }

    /// The expectation of this class: `container`'s or `gvisor`'s.
    fn pick<'a>(&self, container: &'a str, gvisor: &'a str) -> &'a str {
        if self.gvisor() {
            gvisor
        } else {
            container
        }
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn errname(e: i32) -> String {
    match e {
        0 => "ok".into(),
        libc::EPERM => "EPERM".into(),
        libc::EACCES => "EACCES".into(),
        libc::ENOENT => "ENOENT".into(),
        libc::ENOSYS => "ENOSYS".into(),
        libc::EROFS => "EROFS".into(),
        libc::EINVAL => "EINVAL".into(),
        libc::EAFNOSUPPORT => "EAFNOSUPPORT".into(),
        libc::ESRCH => "ESRCH".into(),
        libc::EBADF => "EBADF".into(),
        libc::EFAULT => "EFAULT".into(),
        libc::EEXIST => "EEXIST".into(),
        libc::EBUSY => "EBUSY".into(),
        libc::EISDIR => "EISDIR".into(),
        libc::ENXIO => "ENXIO".into(),
        libc::EIO => "EIO".into(),
        e => format!("errno {e}"),
    }
}

/// A raw system call with up to six integer arguments; returns errno (0 on success).
fn sys(nr: libc::c_long, a: [libc::c_long; 6]) -> i32 {
    // SAFETY: the probes pass constants, null pointers or pointers to
    // buffers they own; the kernel validates everything else.
    let r = unsafe { libc::syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]) };
    if r < 0 {
        errno()
    } else {
        0
    }
}

fn denied(e: i32) -> bool {
    matches!(e, libc::EPERM | libc::EACCES | libc::ENOSYS | libc::EROFS)
}

fn read_status(field: &str) -> String {
    status_field(field).unwrap_or_default()
}

/// A field of /proc/self/status; None when the kernel shows no such line
/// (gVisor's status has no NoNewPrivs or CapAmb line).
fn status_field(field: &str) -> Option<String> {
    fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field).map(|v| v.trim().to_string()))
}

/// Runs `f` in a forked child; returns how the child ended.
fn in_child(f: impl FnOnce() -> i32) -> String {
    // SAFETY: the probe is single-threaded, so the child may run any code.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let code = f();
        // SAFETY: leaving the child without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waiting for the child we just forked.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    if libc::WIFSIGNALED(status) {
        format!("killed by signal {}", libc::WTERMSIG(status))
    } else {
        format!("exit {}", libc::WEXITSTATUS(status))
    }
}

/// `int 0x80` (the i386 system call gate) from this 64-bit process, with
/// every argument register set, so that what runs is the same each time
/// whichever ABI serves it: `a` goes to rdi, rsi, rdx, r10, r8, r9 (the
/// x86-64 ABI's registers; gVisor's ptrace platform serves `int 0x80` as
/// the x86-64 call of that number) and its first two to rbx and rcx (the
/// i386 ABI's first two, which the kernel reads on the host).
fn int80(nr: i64, a: [i64; 6]) -> i64 {
    let ret: i64;
    // SAFETY: a system call whose arguments are constants or pointers to
    // buffers the caller owns; rbx (reserved by LLVM) is swapped in and
    // restored around it, and every register the gate may change is
    // declared clobbered.
    unsafe {
        std::arch::asm!(
            "xchg {b}, rbx",
            "int 0x80",
            "xchg {b}, rbx",
            b = inout(reg) a[0] => _,
            inlateout("rax") nr => ret,
            inout("rcx") a[1] => _,
            inout("rdi") a[0] => _,
            inout("rsi") a[1] => _,
            inout("rdx") a[2] => _,
            inout("r10") a[3] => _,
            inout("r8") a[4] => _,
            inout("r9") a[5] => _,
            out("r11") _,
            options(nostack),
        )
    };
    ret
}

/// Child exit codes for a system call's outcome: its errno, or these.
const CALL_RETURNED_PID: i32 = 200;
const CALL_SUCCEEDED: i32 = 201;

fn call_outcome(ret: i64) -> i32 {
    if ret < 0 {
        (-ret) as i32
    } else if ret == i64::from(std::process::id()) {
        CALL_RETURNED_PID
    } else {
        CALL_SUCCEEDED
    }
}

/// How a child that reported [`call_outcome`] ended, in words: "killed by
/// signal N", an errno name, "returned its pid" or "succeeded".
fn describe_outcome(out: &str) -> String {
    match out
        .strip_prefix("exit ")
        .and_then(|c| c.parse::<i32>().ok())
    {
        Some(CALL_RETURNED_PID) => "returned its pid".into(),
        Some(CALL_SUCCEEDED) => "succeeded".into(),
        Some(e) => errname(e),
        None => out.to_string(),
    }
}

/// The i386 getpid (20) through `int 0x80`. The x86-64 call 20 is writev,
/// here of descriptor -1 (EBADF), which is what gVisor answers.
fn int80_getpid() -> i32 {
    call_outcome(int80(20, [-1, 0, 0, 0, 0, 0]))
}

fn x32_getpid() -> i32 {
    // SAFETY: getpid with the x32 bit set takes no arguments.
    let rc = unsafe { libc::syscall(0x4000_0000 | libc::SYS_getpid) };
    call_outcome(if rc < 0 { -i64::from(errno()) } else { rc })
}

/// `mount(2)` with constant strings; returns errno (0 on success).
fn mount_fs(source: &str, target: &str, fstype: &str, data: &str) -> i32 {
    let c = |v: &str| CString::new(v).unwrap_or_default();
    let (src, tgt, fst, dat) = (c(source), c(target), c(fstype), c(data));
    // SAFETY: mount with C strings we own for the duration of the call.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            tgt.as_ptr(),
            fst.as_ptr(),
            0,
            dat.as_ptr() as *const libc::c_void,
        )
    };
    if rc < 0 {
        errno()
    } else {
        0
    }
}

/// CDK's mount-cgroup: mount a cgroup v1 hierarchy (or cgroup2) and point
/// its release_agent at a payload, which the host kernel would run as root.
/// Any release_agent found open is only written with its own content.
fn cdk_mount_cgroup(r: &mut Report) {
    let _ = fs::create_dir_all("/tmp/probe-cg");
    let mut observed = Vec::new();
    let mut pass = true;
    for (fstype, data) in [("cgroup", "rdma"), ("cgroup", "memory"), ("cgroup2", "")] {
        let e = mount_fs("cgroup", "/tmp/probe-cg", fstype, data);
        observed.push(format!(
            "mount {}: {}",
            format!("{fstype} {data}").trim(),
            errname(e)
        ));
        pass &= denied(e);
        if e == 0 {
            pass = false;
            let agent = write_back("/tmp/probe-cg/release_agent");
            observed.push(format!("release_agent write: {agent:?}"));
            // SAFETY: unmounting the path we just mounted.
            unsafe { libc::umount2(c"/tmp/probe-cg".as_ptr(), libc::MNT_DETACH) };
        }
    }
    // The hierarchies the sandbox already sees must not let it set one either.
    let mut agents: Vec<String> = vec!["/sys/fs/cgroup/release_agent".into()];
    if let Ok(d) = fs::read_dir("/sys/fs/cgroup") {
        for e in d.flatten() {
            agents.push(format!("{}/release_agent", e.path().display()));
        }
    }
    let mut seen = 0;
    for path in &agents {
        match fs::OpenOptions::new().write(true).open(path) {
            Ok(_) => {
                pass = false;
                observed.push(format!("{path} opens for writing ({:?})", write_back(path)));
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(_) => seen += 1,
        }
    }
    observed.push(format!(
        "{seen} existing release_agent files, none writable"
    ));
    r.line(
        "39 cdk mount-cgroup (release_agent)",
        "mount EPERM; no writable release_agent",
        &observed.join("; "),
        pass,
    );
}

/// Writes a file's own content back to it: proves it can be written
/// without changing what the host would run.
fn write_back(path: &str) -> std::io::Result<()> {
    let current = fs::read(path)?;
    let mut f = fs::OpenOptions::new().write(true).open(path)?;
    f.write_all(if current.is_empty() { b"\n" } else { &current })
}

/// CDK's rewrite-cgroup-devices, and its kin: the sandbox's own cgroup
/// files (device allowlist, pids and memory limits) and new cgroups must be
/// out of its reach, or root inside lifts its own limits.
fn cdk_rewrite_cgroup(r: &mut Report) {
    let mut writable = Vec::new();
    let mut refused = 0;
    for path in [
        "/sys/fs/cgroup/devices/devices.allow",
        "/sys/fs/cgroup/pids/pids.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
        "/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes",
        "/sys/fs/cgroup/cpu/cpu.cfs_quota_us",
        "/sys/fs/cgroup/pids.max",
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/cpu.max",
        "/sys/fs/cgroup/cgroup.procs",
    ] {
        match fs::OpenOptions::new().write(true).open(path) {
            Ok(_) => writable.push(path.to_string()),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(_) => refused += 1,
        }
    }
    let hierarchies: Vec<String> = fs::read_dir("/sys/fs/cgroup")
        .map(|d| {
            d.flatten()
                .map(|e| e.path().display().to_string())
                .collect()
        })
        .unwrap_or_default();
    for dir in std::iter::once("/sys/fs/cgroup".to_string()).chain(hierarchies) {
        let new = format!("{dir}/probe-cgroup");
        if fs::create_dir(&new).is_ok() {
            let _ = fs::remove_dir(&new);
            writable.push(format!("mkdir {new}"));
        }
    }
    if r.gvisor() {
        // gVisor mounts no cgroupfs here: its /sys/fs/cgroup is empty. The
        // sandbox's limits are the host cgroup of the sentry, which nothing
        // inside can name. gVisor's own cgroups hold each exec (init keeps
        // them through a descriptor of a detached mount: /proc/cgroups lists
        // that hierarchy), and no mount of them is in reach.
        let entries = fs::read_dir("/sys/fs/cgroup")
            .map(|d| d.count())
            .unwrap_or(0);
        let mounted = fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .filter(|l| {
                l.split(" - ")
                    .nth(1)
                    .is_some_and(|t| t.starts_with("cgroup"))
            })
            .count();
        r.line(
            "39 cdk rewrite-cgroup-devices (own limits, new cgroups)",
            "no cgroupfs mounted; nothing writable",
            &format!(
                "/sys/fs/cgroup: {entries} entries; cgroup mounts: {mounted}; {}",
                if writable.is_empty() {
                    "nothing writable".to_string()
                } else {
                    format!("writable: {writable:?}")
                }
            ),
            writable.is_empty() && entries == 0 && mounted == 0,
        );
        return;
    }
    r.line(
        "39 cdk rewrite-cgroup-devices (own limits, new cgroups)",
        "EROFS/EACCES",
        &if writable.is_empty() {
            format!("{refused} limit files refused, no mkdir")
        } else {
            format!("writable: {writable:?}")
        },
        writable.is_empty() && refused > 0,
    );
}

/// CDK's mount-procfs: a fresh procfs would bypass the read-only
/// /proc/sys and let core_pattern run a host command.
fn cdk_mount_procfs(r: &mut Report) {
    let _ = fs::create_dir_all("/tmp/probe-proc");
    let e = mount_fs("proc", "/tmp/probe-proc", "proc", "");
    let mut observed = format!("mount proc: {}", errname(e));
    let mut pass = denied(e);
    if e == 0 {
        let w = fs::write(
            "/tmp/probe-proc/sys/kernel/core_pattern",
            b"|/probe-payload",
        );
        observed.push_str(&format!("; core_pattern write: {w:?}"));
        // SAFETY: unmounting the path we just mounted.
        unsafe { libc::umount2(c"/tmp/probe-proc".as_ptr(), libc::MNT_DETACH) };
        pass = false;
    }
    r.line(
        "39 cdk mount-procfs (core_pattern)",
        "EPERM",
        &observed,
        pass,
    );
}

/// The header of `struct file_handle` followed by an ext4/xfs-style handle
/// (inode, generation): what the shocker exploit forges.
#[repr(C)]
struct ForgedHandle {
    handle_bytes: u32,
    handle_type: i32,
    ino: u32,
    generation: u32,
}

/// CDK's cap-dac-read-search ("shocker"): open_by_handle_at with a forged
/// handle for inode 2 (the root of most host file systems) walks straight
/// out of any mount namespace if CAP_DAC_READ_SEARCH is held.
fn cdk_cap_dac_read_search(r: &mut Report) {
    let cap_eff = u64::from_str_radix(&read_status("CapEff:"), 16).unwrap_or(u64::MAX);
    // CAP_DAC_READ_SEARCH is capability 2 (linux/capability.h).
    let has_cap = cap_eff & (1 << 2) != 0;
    let mut observed = format!(
        "CAP_DAC_READ_SEARCH {}",
        if has_cap { "held" } else { "absent" }
    );
    let mut pass = !has_cap;
    for path in ["/", "/etc/hostname"] {
        let Ok(mount) = fs::File::open(path) else {
            continue;
        };
        use std::os::fd::AsRawFd;
        let mut handle = ForgedHandle {
            handle_bytes: 8,
            handle_type: 1,
            ino: 2,
            generation: 0,
        };
        let e = sys(
            libc::SYS_open_by_handle_at,
            [
                mount.as_raw_fd() as libc::c_long,
                &mut handle as *mut ForgedHandle as libc::c_long,
                libc::O_RDONLY as libc::c_long,
                0,
                0,
                0,
            ],
        );
        observed.push_str(&format!(
            "; open_by_handle_at(inode 2 via {path}): {}",
            errname(e)
        ));
        pass &= denied(e);
    }
    r.line(
        "39 cdk cap-dac-read-search (shocker)",
        "capability absent; EPERM",
        &observed,
        pass,
    );
}

/// The part of CDK's abuse-unpriv-userns (CVE-2022-0492) that runs after
/// unshare: in a child, ask for user, mount and cgroup namespaces at once;
/// if that worked, mount cgroupfs and set release_agent, as the exploit does.
fn userns_chain() -> i32 {
    // SAFETY: unshare takes flags only.
    if unsafe { libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS | libc::CLONE_NEWCGROUP) } < 0
    {
        return 10 + errno();
    }
    let _ = fs::create_dir_all("/tmp/probe-ucg");
    if mount_fs("cgroup", "/tmp/probe-ucg", "cgroup", "rdma") != 0 {
        return 2;
    }
    if write_back("/tmp/probe-ucg/release_agent").is_err() {
        return 3;
    }
    4
}

fn cdk_abuse_unpriv_userns(r: &mut Report) {
    let out = in_child(userns_chain);
    let observed = match out
        .strip_prefix("exit ")
        .and_then(|c| c.parse::<i32>().ok())
    {
        Some(c) if c >= 10 => format!("unshare: {}", errname(c - 10)),
        Some(2) => "unshare worked; cgroup mount refused".into(),
        Some(3) => "unshare and cgroup mount worked; release_agent refused".into(),
        Some(4) => "release_agent written".into(),
        _ => out.clone(),
    };
    let refused = observed == "unshare: EPERM" || observed == "unshare: ENOSYS";
    r.line(
        "39 cdk abuse-unpriv-userns",
        "unshare EPERM",
        &observed,
        refused || out.starts_with("killed"),
    );
}

/// Inode numbers the kernel gives the initial namespaces (PROC_*_INIT_INO):
/// a sandbox showing one of these shares that namespace with the host.
const INIT_NS: [(&str, u64); 5] = [
    ("pid", 0xEFFF_FFFC),
    ("ipc", 0xEFFF_FFFF),
    ("uts", 0xEFFF_FFFE),
    ("cgroup", 0xEFFF_FFFB),
    ("user", 0xEFFF_FFFD),
];

fn ns_inode(name: &str) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(format!("/proc/self/ns/{name}"))
        .ok()
        .map(|m| m.ino())
}

/// amicontained's profile, as far as security.md §9 does not cover it
/// already (seccomp mode and capabilities are check 09): namespaces, the
/// LSM profile and the number of syscalls the sandbox cannot make.
fn amicontained(r: &mut Report) {
    if r.gvisor() {
        // gVisor's /proc/self/ns shows only the namespaces its own kernel
        // has (net, pid, user), numbered by gVisor: they say nothing about
        // the host's. The sentry's host namespaces are checked from the host.
        let shown: Vec<String> = ["pid", "ipc", "uts", "cgroup", "user", "net", "mnt"]
            .iter()
            .map(|n| match ns_inode(n) {
                Some(ino) => format!("{n}:{ino}"),
                None => format!("{n}:absent"),
            })
            .collect();
        r.not_applicable(
            "39 amicontained namespaces",
            "own: pid ipc uts cgroup user; host: none",
            &shown.join(" "),
            "gVisor's namespaces and inode numbers are its own kernel's, not the host's; the sentry's host namespaces are checked from the host by tests/test_gvisor.py",
        );
    } else {
        amicontained_namespaces(r);
    }
    amicontained_profile(r);
}

fn amicontained_namespaces(r: &mut Report) {
    let mut own = Vec::new();
    let mut shared = Vec::new();
    for (name, init) in INIT_NS {
        match ns_inode(name) {
            Some(ino) if ino == init => shared.push(name),
            Some(_) => own.push(name),
            None => shared.push(name),
        }
    }
    r.line(
        "39 amicontained namespaces",
        "own: pid ipc uts cgroup user; host: none",
        &format!("own: {}; host: {}", own.join(" "), shared.join(" ")),
        shared.is_empty(),
    );
}

fn amicontained_profile(r: &mut Report) {
    let lsm = [
        "/proc/self/attr/apparmor/current",
        "/proc/self/attr/current",
    ]
    .iter()
    .find_map(|p| fs::read_to_string(p).ok())
    .map(|s| s.trim_end_matches('\0').trim().to_string())
    .unwrap_or_else(|| "none".into());
    r.line(
        "39 amicontained LSM profile",
        "none or unconfined (Warren sets no LSM profile)",
        &lsm,
        lsm == "none" || lsm == "unconfined" || lsm.is_empty(),
    );
    let (blocked, names) = blocked_syscalls();
    let must = [
        "mount",
        "umount2",
        "unshare",
        "setns",
        "pivot_root",
        "bpf",
        "ptrace",
        "keyctl",
        "init_module",
        "kexec_load",
        "open_by_handle_at",
        "perf_event_open",
        "userfaultfd",
    ];
    let missing: Vec<&str> = must
        .iter()
        .copied()
        .filter(|m| !names.contains(m))
        .collect();
    r.line(
        "39 amicontained blocked syscalls",
        "at least Docker's 57, including mount unshare setns bpf ptrace ...",
        &format!("{blocked} blocked; missing from the must-list: {missing:?}"),
        blocked >= 57 && missing.is_empty(),
    );
}

/// Syscalls that would block or end the probing child instead of answering.
const NOT_PROBED: [libc::c_long; 14] = [
    libc::SYS_pause,
    libc::SYS_select,
    libc::SYS_pselect6,
    libc::SYS_ppoll,
    libc::SYS_poll,
    libc::SYS_rt_sigsuspend,
    libc::SYS_exit,
    libc::SYS_exit_group,
    libc::SYS_fork,
    libc::SYS_vfork,
    libc::SYS_clone,
    libc::SYS_clone3,
    libc::SYS_rt_sigreturn,
    libc::SYS_seccomp,
];

/// Like amicontained: every x86_64 syscall with zero arguments, each in a
/// child of its own (with a one-second alarm), counted as blocked when it
/// answers EPERM or the filter kills the caller.
fn blocked_syscalls() -> (usize, Vec<&'static str>) {
    let named: [(&str, libc::c_long); 13] = [
        ("mount", libc::SYS_mount),
        ("umount2", libc::SYS_umount2),
        ("unshare", libc::SYS_unshare),
        ("setns", libc::SYS_setns),
        ("pivot_root", libc::SYS_pivot_root),
        ("bpf", libc::SYS_bpf),
        ("ptrace", libc::SYS_ptrace),
        ("keyctl", libc::SYS_keyctl),
        ("init_module", libc::SYS_init_module),
        ("kexec_load", libc::SYS_kexec_load),
        ("open_by_handle_at", libc::SYS_open_by_handle_at),
        ("perf_event_open", libc::SYS_perf_event_open),
        ("userfaultfd", libc::SYS_userfaultfd),
    ];
    let mut count = 0;
    let mut names = Vec::new();
    for nr in 0..=462 {
        if NOT_PROBED.contains(&nr) {
            continue;
        }
        // SAFETY: the probe is single-threaded, so the child may run any code.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: alarm and a zero-argument syscall in a throwaway child;
            // _exit leaves without touching the parent's state.
            unsafe {
                libc::alarm(1);
                let rc = libc::syscall(nr, 0, 0, 0, 0, 0, 0);
                let code = if rc < 0 && errno() == libc::EPERM {
                    1
                } else {
                    0
                };
                libc::_exit(code)
            }
        }
        if pid < 0 {
            continue;
        }
        let mut status = 0;
        // SAFETY: waiting for the child we just forked.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        let blocked = (libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 1)
            || (libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGSYS);
        if blocked {
            count += 1;
            if let Some((name, _)) = named.iter().find(|(_, n)| *n == nr) {
                names.push(*name);
            }
        }
    }
    (count, names)
}

/// Check 09's ambient set: no capability is ambient, and none can be made
/// so without first being inheritable (none is). Asked of the kernel with
/// prctl, as well as read from /proc (gVisor shows no CapAmb line).
/// gVisor has no ambient capabilities at all: every PR_CAP_AMBIENT call,
/// RAISE included, answers EINVAL, which is the property itself.
fn ambient_capabilities(r: &mut Report) {
    let last = fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse::<libc::c_ulong>().ok())
        .unwrap_or(40);
    let mut set = Vec::new();
    let mut errors = std::collections::BTreeSet::new();
    for cap in 0..=last {
        // SAFETY: prctl with integer arguments only.
        let rc = unsafe {
            libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_IS_SET as libc::c_ulong,
                cap,
                0 as libc::c_ulong,
                0 as libc::c_ulong,
            )
        };
        match rc {
            0 => {}
            1 => set.push(cap),
            _ => {
                errors.insert(errname(errno()));
            }
        }
    }
    // In a child, so that a raise that worked changes nothing here.
    // CAP_NET_BIND_SERVICE (10) is in root's permitted set.
    let raise = describe_outcome(&in_child(|| {
        // SAFETY: prctl with integer arguments only.
        let rc = unsafe {
            libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_RAISE as libc::c_ulong,
                10 as libc::c_ulong,
                0 as libc::c_ulong,
                0 as libc::c_ulong,
            )
        };
        if rc < 0 {
            errno()
        } else {
            CALL_SUCCEEDED
        }
    }));
    let line = status_field("CapAmb:");
    let is_set = if errors.is_empty() {
        format!("set: {set:?}")
    } else {
        format!(
            "set: {set:?}, errors: {}",
            errors.into_iter().collect::<Vec<_>>().join(" ")
        )
    };
    let observed = format!(
        "/proc/self/status {}; PR_CAP_AMBIENT_IS_SET 0..={last}: {is_set}; RAISE(NET_BIND_SERVICE): {raise}",
        line.as_deref().unwrap_or("has no such line"),
    );
    let pass = if r.gvisor() {
        set.is_empty()
            && is_set == "set: [], errors: EINVAL"
            && raise == "EINVAL"
            && line.as_deref().is_none_or(|v| v == "0000000000000000")
    } else {
        set.is_empty()
            && is_set == "set: []"
            && raise == "EPERM"
            && line.as_deref() == Some("0000000000000000")
    };
    r.line(
        "09 CapAmb:",
        r.pick(
            "0000000000000000; none set; RAISE EPERM (not inheritable)",
            "no ambient capabilities: every PR_CAP_AMBIENT call EINVAL",
        ),
        &observed,
        pass,
    );
}

/// errno of a libc call that returns -1 on failure (0 on success).
fn rc_errno(rc: libc::c_int) -> i32 {
    if rc < 0 {
        errno()
    } else {
        0
    }
}

/// gVisor only: the directory on the sentry's /dev where init binds the
/// socket the node reaches it by (a tmpfs of the sandbox's own; the node
/// connects through the gofer's view of it). Only root inside may enter it,
/// and nobody may remove, move or replace the socket, which would take the
/// node's connections elsewhere.
fn init_socket_dir(r: &mut Report, root: bool) {
    use std::os::unix::fs::MetadataExt;
    let c = |v: &str| CString::new(v).unwrap_or_default();
    let (dir, sock, moved) = (
        "/dev/.warren",
        c("/dev/.warren/init.sock"),
        c("/dev/.warren/probe-moved"),
    );
    let (owner, mode) = fs::symlink_metadata(dir)
        .map(|m| (m.uid(), m.mode() & 0o7777))
        .unwrap_or((u32::MAX, 0));
    let list = fs::read_dir(dir)
        .err()
        .and_then(|e| e.raw_os_error())
        .unwrap_or(0);
    // SAFETY: path calls on C strings we own.
    let unlink = rc_errno(unsafe { libc::unlink(sock.as_ptr()) });
    // SAFETY: as above.
    let rename = rc_errno(unsafe { libc::rename(sock.as_ptr(), moved.as_ptr()) });
    let slash = c("/");
    // SAFETY: as above.
    let replace = rc_errno(unsafe { libc::symlink(slash.as_ptr(), sock.as_ptr()) });
    let observed = format!(
        "owner {owner} mode {mode:o}; list: {}; unlink init.sock: {}; rename it: {}; symlink in its place: {}",
        errname(list),
        errname(unlink),
        errname(rename),
        errname(replace)
    );
    let refused = |e: i32| matches!(e, libc::EPERM | libc::EACCES);
    let pass = owner == 0
        && mode == 0o700
        && replace != 0
        && if root {
            unlink == libc::EPERM && rename == libc::EPERM
        } else {
            list == libc::EACCES && refused(unlink) && refused(rename)
        };
    r.line(
        "13 /dev/.warren (init's socket)",
        "root's, 0700 (EACCES for others); init.sock cannot be removed, moved or replaced (EPERM)",
        &observed,
        pass,
    );
}

/// gVisor only: warren-init's binary, a read-only bind of the node's copy
/// (the memfd the container class uses cannot cross into gVisor). It must
/// not be changed, truncated, removed or moved.
fn init_binary(r: &mut Report, root: bool) {
    let path = "/dev/.warren-init";
    let c = |v: &str| CString::new(v).unwrap_or_default();
    let (p, other) = (c(path), c("/dev/probe-init"));
    let write = fs::OpenOptions::new()
        .write(true)
        .open(path)
        .err()
        .and_then(|e| e.raw_os_error())
        .unwrap_or(0);
    // SAFETY: path calls on C strings we own.
    let truncate = rc_errno(unsafe { libc::truncate(p.as_ptr(), 0) });
    // SAFETY: as above.
    let unlink = rc_errno(unsafe { libc::unlink(p.as_ptr()) });
    // SAFETY: as above.
    let rename = rc_errno(unsafe { libc::rename(p.as_ptr(), other.as_ptr()) });
    let want = if root { libc::EROFS } else { libc::EACCES };
    r.line(
        "13 /dev/.warren-init (init's binary)",
        "open for writing and truncate EROFS (root) or EACCES (others); unlink and rename refused",
        &format!(
            "open for writing: {}; truncate: {}; unlink: {}; rename: {}",
            errname(write),
            errname(truncate),
            errname(unlink),
            errname(rename)
        ),
        write == want && truncate == want && unlink != 0 && rename != 0,
    );
}

/// FUSE: gVisor's /dev has a fuse device anyone may open; mounting a file
/// system served by it must still be refused (the filter refuses mount).
fn fuse_mount(r: &mut Report) {
    use std::os::fd::AsRawFd;
    let dev = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse");
    let (opened, fd) = match &dev {
        Ok(f) => ("ok".to_string(), f.as_raw_fd()),
        Err(e) => (errname(e.raw_os_error().unwrap_or(0)), -1),
    };
    let _ = fs::create_dir_all("/tmp/probe-fuse");
    let e = mount_fs(
        "probe",
        "/tmp/probe-fuse",
        "fuse",
        &format!("fd={fd},rootmode=40000,user_id=0,group_id=0"),
    );
    if e == 0 {
        // SAFETY: unmounting the path we just mounted.
        unsafe { libc::umount2(c"/tmp/probe-fuse".as_ptr(), libc::MNT_DETACH) };
    }
    r.line(
        "13 mount fuse",
        "EPERM",
        &format!("open /dev/fuse: {opened}; mount fuse: {}", errname(e)),
        denied(e),
    );
}

/// A TUN device would put packets of the sandbox's choosing on a network
/// stack: the container class has no /dev/net; gVisor's own network stack
/// has /dev/net/tun, and making an interface there needs CAP_NET_ADMIN.
fn tun_device(r: &mut Report) {
    use std::os::fd::AsRawFd;
    let (observed, pass) = match fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
    {
        Err(e) => (
            format!("open: {}", errname(e.raw_os_error().unwrap_or(0))),
            true,
        ),
        Ok(f) => {
            // struct ifreq: the name, then the flags (IFF_TUN | IFF_NO_PI).
            let mut ifr = [0u8; 40];
            ifr[..6].copy_from_slice(b"probe0");
            let flags = (libc::IFF_TUN | libc::IFF_NO_PI) as i16;
            ifr[16..18].copy_from_slice(&flags.to_ne_bytes());
            // SAFETY: TUNSETIFF reads and writes the ifreq buffer we own.
            let e =
                rc_errno(unsafe { libc::ioctl(f.as_raw_fd(), libc::TUNSETIFF, ifr.as_mut_ptr()) });
            (
                format!("open: ok; TUNSETIFF: {}", errname(e)),
                e == libc::EPERM,
            )
        }
    };
    r.line(
        "13 /dev/net/tun",
        "absent, or TUNSETIFF EPERM (no CAP_NET_ADMIN)",
        &observed,
        pass,
    );
}

/// Known container-escape toolkits' techniques, written as our own probes
/// (security.md §a check 39): CDK's mount-cgroup, mount-procfs,
/// cap-dac-read-search and abuse-unpriv-userns, and amicontained's profile.
fn toolkit_techniques(r: &mut Report) {
    cdk_mount_cgroup(r);
    cdk_rewrite_cgroup(r);
    cdk_mount_procfs(r);
    cdk_cap_dac_read_search(r);
    cdk_abuse_unpriv_userns(r);
    amicontained(r);
}

/// The class the test says the sandbox runs in, checked against what the
/// kernel inside shows: gVisor's sentry has a /proc/sentry-meminfo, no
/// Linux kernel does. A mismatch fails, and the checks that follow hold the
/// sandbox to the container class's expectations (the stricter ones).
fn isolation_class() -> (Class, String, bool) {
    let declared = std::env::var("WARREN_PROBE_ISOLATION").unwrap_or_default();
    let sentry = fs::metadata("/proc/sentry-meminfo").is_ok();
    // SAFETY: uname fills the struct we own.
    let mut uts: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let release = if unsafe { libc::uname(&mut uts) } == 0 {
        // SAFETY: uname NUL-terminates each field.
        unsafe { std::ffi::CStr::from_ptr(uts.release.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    } else {
        "unknown".into()
    };
    let seen = format!(
        "kernel {release}, /proc/sentry-meminfo {}",
        if sentry { "present" } else { "absent" }
    );
    match declared.as_str() {
        "" | "container" => (Class::Container, format!("container: {seen}"), !sentry),
        "gvisor" => (Class::Gvisor, format!("gvisor: {seen}"), sentry),
        other => (
            Class::Container,
            format!("unknown WARREN_PROBE_ISOLATION {other:?}: {seen}"),
            false,
        ),
    }
}

fn main() {
    let (class, seen, matches) = isolation_class();
    let class = if matches { class } else { Class::Container };
    let mut r = Report {
        class,
        failed: 0,
        not_applicable: 0,
    };
    r.line(
        "00 isolation class",
        "the kernel inside is the declared class's (gVisor's sentry for gvisor)",
        &seen,
        matches,
    );
    let root = read_status("Uid:").split_whitespace().next() == Some("0");

    // 1. Masked kernel information.
    for path in [
        "/proc/kcore",
        "/proc/keys",
        "/proc/timer_list",
        "/proc/sched_debug",
        "/proc/acpi",
        "/sys/firmware",
    ] {
        let observed = match fs::File::open(path) {
            Err(e) => errname(e.raw_os_error().unwrap_or(0)),
            Ok(mut f) => {
                let mut buf = [0u8; 64];
                match f.read(&mut buf) {
                    Ok(0) => "empty".into(),
                    Ok(n) => format!("read {n} bytes"),
                    Err(e) => errname(e.raw_os_error().unwrap_or(0)),
                }
            }
        };
        let ok = observed == "empty" || observed == "EISDIR" || !observed.starts_with("read");
        let ok = ok
            && !(path.starts_with("/sys/firmware")
                && fs::read_dir(path).map(|d| d.count() > 0).unwrap_or(false));
        r.line(
            &format!("01 masked {path}"),
            "empty or refused",
            &observed,
            ok,
        );
    }
    // 2. Read-only kernel knobs.
    for path in [
        "/proc/sysrq-trigger",
        "/proc/sys/kernel/core_pattern",
        "/proc/sys/vm/drop_caches",
        "/sys/kernel/mm/transparent_hugepage/enabled",
    ] {
        let observed = match fs::OpenOptions::new().write(true).open(path) {
            Ok(mut f) => match f.write_all(b"0") {
                Ok(()) => "written".into(),
                Err(e) => errname(e.raw_os_error().unwrap_or(0)),
            },
            Err(e) => errname(e.raw_os_error().unwrap_or(0)),
        };
        r.line(
            &format!("02 write {path}"),
            "EROFS/EACCES/EPERM",
            &observed,
            observed != "written",
        );
    }
    // 3. Only the sandbox's processes; PID 1 is Warren's init.
    let pids: Vec<u32> = fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    r.line(
        "03 visible pids",
        "only a few, starting at 1",
        &format!("{} pids", pids.len()),
        pids.contains(&1) && pids.len() < 20,
    );
    // SAFETY: kill with signal 0 only checks for existence.
    let e = if unsafe { libc::kill(4_000_000 - 1, 0) } < 0 {
        errno()
    } else {
        0
    };
    r.line(
        "03 signal a host pid",
        "ESRCH",
        &errname(e),
        e == libc::ESRCH,
    );
    // 4. Mounts and root changes.
    let tmpfs = CString::new("tmpfs").unwrap_or_default();
    let mnt = CString::new("/tmp").unwrap_or_default();
    // SAFETY: mount with constant C strings we own.
    let e = if unsafe {
        libc::mount(
            tmpfs.as_ptr(),
            mnt.as_ptr(),
            tmpfs.as_ptr(),
            0,
            std::ptr::null(),
        )
    } < 0
    {
        errno()
    } else {
        0
    };
    r.line("04 mount tmpfs", "EPERM", &errname(e), denied(e));
    let proc_path = CString::new("/proc").unwrap_or_default();
    // SAFETY: umount2 of a constant path.
    let e = if unsafe { libc::umount2(proc_path.as_ptr(), libc::MNT_DETACH) } < 0 {
        errno()
    } else {
        0
    };
    r.line("04 umount /proc", "EPERM", &errname(e), denied(e));
    // SAFETY: chroot of a constant path.
    let e = if unsafe { libc::chroot(mnt.as_ptr()) } < 0 {
        errno()
    } else {
        0
    };
    r.line("04 chroot", "EPERM", &errname(e), denied(e));
    let root_c = CString::new("/").unwrap_or_default();
    let e = sys(
        libc::SYS_pivot_root,
        [
            root_c.as_ptr() as libc::c_long,
            root_c.as_ptr() as libc::c_long,
            0,
            0,
            0,
            0,
        ],
    );
    r.line("04 pivot_root", "EPERM", &errname(e), denied(e));
    let e = sys(
        libc::SYS_fsopen,
        [tmpfs.as_ptr() as libc::c_long, 0, 0, 0, 0, 0],
    );
    r.line("04 fsopen", "EPERM/ENOSYS", &errname(e), denied(e));
    let e = sys(
        libc::SYS_open_tree,
        [
            libc::AT_FDCWD as libc::c_long,
            root_c.as_ptr() as libc::c_long,
            1,
            0,
            0,
            0,
        ],
    );
    r.line("04 open_tree", "EPERM/ENOSYS", &errname(e), denied(e));
    // 5. New namespaces and entering others.
    for (name, flags) in [
        ("user", libc::CLONE_NEWUSER),
        ("mount", libc::CLONE_NEWNS),
        ("net", libc::CLONE_NEWNET),
        ("pid", libc::CLONE_NEWPID),
        ("cgroup", libc::CLONE_NEWCGROUP),
    ] {
        // SAFETY: unshare takes flags only.
        let e = if unsafe { libc::unshare(flags) } < 0 {
            errno()
        } else {
            0
        };
        r.line(
            &format!("05 unshare {name}"),
            "EPERM",
            &errname(e),
            denied(e),
        );
    }
    let e = sys(
        libc::SYS_clone,
        [
            (libc::CLONE_NEWNS | libc::SIGCHLD) as libc::c_long,
            0,
            0,
            0,
            0,
            0,
        ],
    );
    r.line("05 clone(CLONE_NEWNS)", "EPERM", &errname(e), denied(e));
    let e = sys(libc::SYS_clone3, [0, 0, 0, 0, 0, 0]);
    r.line("05 clone3", "ENOSYS/EPERM", &errname(e), denied(e));
    // Every namespace the kernel shows (gVisor shows only net, pid and
    // user): PID 1's where it can be opened (init is not dumpable in the
    // container class, so its /proc/1/ns is closed to the sandbox), else the
    // probe's own. setns must be refused for each: finding nothing to open
    // is not a pass.
    let mut tried = Vec::new();
    let mut pass = true;
    for name in ["mnt", "net", "user", "pid", "ipc", "uts", "cgroup"] {
        let (whose, f) = match fs::File::open(format!("/proc/1/ns/{name}")) {
            Ok(f) => ("1", f),
            Err(_) => match fs::File::open(format!("/proc/self/ns/{name}")) {
                Ok(f) => ("self", f),
                Err(_) => continue,
            },
        };
        use std::os::fd::AsRawFd;
        // SAFETY: setns on a descriptor we hold.
        let e = rc_errno(unsafe { libc::setns(f.as_raw_fd(), 0) });
        pass &= denied(e);
        tried.push(format!("{whose}/{name}: {}", errname(e)));
    }
    r.line(
        "05 setns into a namespace",
        "EPERM for each (PID 1's, else its own)",
        &if tried.is_empty() {
            "no namespace file to open".to_string()
        } else {
            tried.join(", ")
        },
        pass && !tried.is_empty(),
    );
    // 6. Kernel and host state.
    let empty = CString::new("").unwrap_or_default();
    for (name, nr, args) in [
        (
            "init_module",
            libc::SYS_init_module,
            [0, 0, empty.as_ptr() as libc::c_long, 0, 0, 0],
        ),
        (
            "finit_module",
            libc::SYS_finit_module,
            [0, empty.as_ptr() as libc::c_long, 0, 0, 0, 0],
        ),
        (
            "delete_module",
            libc::SYS_delete_module,
            [empty.as_ptr() as libc::c_long, 0, 0, 0, 0, 0],
        ),
        ("kexec_load", libc::SYS_kexec_load, [0; 6]),
        ("reboot", libc::SYS_reboot, [0, 0, 0, 0, 0, 0]),
        (
            "swapon",
            libc::SYS_swapon,
            [empty.as_ptr() as libc::c_long, 0, 0, 0, 0, 0],
        ),
        ("acct", libc::SYS_acct, [0; 6]),
        ("settimeofday", libc::SYS_settimeofday, [0; 6]),
        ("iopl", libc::SYS_iopl, [3, 0, 0, 0, 0, 0]),
        ("ioperm", libc::SYS_ioperm, [0, 1, 1, 0, 0, 0]),
    ] {
        let e = sys(nr, args);
        r.line(&format!("06 {name}"), "EPERM", &errname(e), denied(e));
    }
    // EPERM is the seccomp filter's answer; EAFNOSUPPORT would mean the
    // filter let the family through to a kernel that happens to lack it.
    for (name, family) in [
        ("AF_ALG", libc::AF_ALG),
        ("AF_VSOCK", libc::AF_VSOCK),
        ("AF_PACKET", libc::AF_PACKET),
        ("AF_TIPC", libc::AF_TIPC),
        ("AF_KEY", libc::AF_KEY),
    ] {
        // SAFETY: socket takes integers only; a descriptor it returns is closed.
        let fd = unsafe { libc::socket(family, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
        let e = if fd < 0 {
            errno()
        } else {
            // SAFETY: closing the descriptor we just got.
            unsafe { libc::close(fd) };
            0
        };
        r.line(
            &format!("06/24 socket({name})"),
            "EPERM",
            &errname(e),
            e == libc::EPERM,
        );
    }
    // SAFETY: socket takes integers only.
    let fd = unsafe {
        libc::socket(
            libc::AF_INET,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::IPPROTO_ICMP,
        )
    };
    let e = if fd < 0 { errno() } else { 0 };
    r.line("24 raw socket", "EPERM", &errname(e), e != 0);
    // 7. Kernel attack surface.
    for (name, nr, args) in [
        ("bpf", libc::SYS_bpf, [0; 6]),
        ("perf_event_open", libc::SYS_perf_event_open, [0; 6]),
        ("userfaultfd", libc::SYS_userfaultfd, [0; 6]),
        (
            "io_uring_setup",
            libc::SYS_io_uring_setup,
            [1, 0, 0, 0, 0, 0],
        ),
        ("keyctl", libc::SYS_keyctl, [0; 6]),
        ("add_key", libc::SYS_add_key, [0; 6]),
        ("request_key", libc::SYS_request_key, [0; 6]),
        ("open_by_handle_at", libc::SYS_open_by_handle_at, [0; 6]),
        ("name_to_handle_at", libc::SYS_name_to_handle_at, [0; 6]),
        (
            "ptrace(ATTACH, 1)",
            libc::SYS_ptrace,
            [libc::PTRACE_ATTACH as libc::c_long, 1, 0, 0, 0, 0],
        ),
        (
            "process_vm_readv",
            libc::SYS_process_vm_readv,
            [1, 0, 0, 0, 0, 0],
        ),
        ("syslog(READ_ALL)", libc::SYS_syslog, [3, 0, 0, 0, 0, 0]),
        (
            "personality(READ_IMPLIES_EXEC)",
            libc::SYS_personality,
            [0x0400000, 0, 0, 0, 0, 0],
        ),
    ] {
        let e = sys(nr, args);
        r.line(
            &format!("07 {name}"),
            "EPERM/ENOSYS",
            &errname(e),
            denied(e),
        );
    }
    // 8. Other syscall ABIs never bypass the filter.
    // On the host kernel the filter admits only the native ABI, so the
    // i386 getpid kills the caller. gVisor's ptrace platform serves
    // `int 0x80` as the x86-64 call of the same number (writev of
    // descriptor -1 here: EBADF), under the same filter; the i386 getpid
    // never runs, which is what matters: its pid must never come back.
    let out = describe_outcome(&in_child(int80_getpid));
    let refused = out.starts_with("killed") || out == "EPERM" || out == "ENOSYS";
    r.line(
        "08 int 0x80 getpid",
        r.pick(
            "killed or refused",
            "killed or refused; or the x86-64 call 20 (writev of fd -1): EBADF",
        ),
        &out,
        refused || (r.gvisor() && out == "EBADF"),
    );
    // The x86-64 numbers of calls the filter refuses, through `int 0x80`:
    // the host kills the caller (not the native ABI), gVisor must refuse
    // each with the filter's EPERM (it serves them as x86-64 calls, so a
    // filter that saw another ABI would let them through).
    let none = CString::new("none").unwrap_or_default();
    let target = CString::new("/tmp").unwrap_or_default();
    let tmpfs_type = CString::new("tmpfs").unwrap_or_default();
    for (name, nr, args) in [
        (
            "unshare",
            272,
            [
                i64::from(libc::CLONE_NEWUSER | libc::CLONE_NEWNS),
                0,
                0,
                0,
                0,
                0,
            ],
        ),
        (
            "mount",
            165,
            [
                none.as_ptr() as i64,
                target.as_ptr() as i64,
                tmpfs_type.as_ptr() as i64,
                0,
                0,
                0,
            ],
        ),
        ("process_vm_readv", 310, [1, 0, 0, 0, 0, 0]),
        ("bpf", 321, [0, 0, 0, 0, 0, 0]),
    ] {
        let out = describe_outcome(&in_child(move || call_outcome(int80(nr, args))));
        let sigsys = format!("killed by signal {}", libc::SIGSYS);
        r.line(
            &format!("08 int 0x80 with x86-64 {name} ({nr})"),
            r.pick("killed (SIGSYS)", "EPERM"),
            &out,
            if r.gvisor() {
                out == "EPERM"
            } else {
                out == sigsys
            },
        );
    }
    let out = describe_outcome(&in_child(x32_getpid));
    r.line(
        "08 x32 getpid",
        "killed or refused",
        &out,
        out.starts_with("killed") || out == "EPERM" || out == "ENOSYS",
    );
    // 9. Privilege state.
    // SAFETY: prctl with integer arguments only.
    let nnp = unsafe { libc::prctl(libc::PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) };
    let line = status_field("NoNewPrivs:");
    r.line(
        "09 NoNewPrivs",
        r.pick(
            "prctl 1; /proc/self/status 1",
            "prctl 1 (gVisor's status has no such line)",
        ),
        &format!(
            "prctl {nnp}; /proc/self/status {}",
            line.as_deref().unwrap_or("has no such line")
        ),
        nnp == 1
            && match &line {
                Some(v) => v == "1",
                None => r.gvisor(),
            },
    );
    r.line(
        "09 Seccomp",
        "2",
        &read_status("Seccomp:"),
        read_status("Seccomp:") == "2",
    );
    let want_eff = if root {
        "00000000000004fb"
    } else {
        "0000000000000000"
    };
    for field in ["CapEff:", "CapPrm:"] {
        let v = read_status(field);
        r.line(&format!("09 {field}"), want_eff, &v, v == want_eff);
    }
    let v = read_status("CapBnd:");
    r.line(
        "09 CapBnd:",
        "00000000000004fb",
        &v,
        v == "00000000000004fb",
    );
    ambient_capabilities(&mut r);
    let v = read_status("CapInh:");
    r.line(
        "09 CapInh:",
        "0000000000000000",
        &v,
        v == "0000000000000000",
    );
    // 11. Root inside is an unprivileged host id range.
    for file in ["uid_map", "gid_map"] {
        let map = fs::read_to_string(format!("/proc/self/{file}")).unwrap_or_default();
        let fields: Vec<&str> = map.split_whitespace().collect();
        let check = format!("11 {file}");
        let expect = "0 <host base >= 65536> 65536";
        // gVisor's kernel shows its own identity map: ids inside are the
        // sentry's, not the host's, so the map says nothing about who the
        // sandbox is on the host. Any other map there is unexplained.
        if r.gvisor() && fields == ["0", "0", "4294967295"] {
            r.not_applicable(
                &check,
                expect,
                &fields.join(" "),
                "gVisor's own identity map: ids inside are gVisor's, not host ids; the host identity is the sentry's and its ptrace stubs': nobody in a user namespace of their own with network none (tests/test_gvisor.py checks it), host root with CAP_SYS_PTRACE under seccomp with host networking",
            );
            continue;
        }
        let unprivileged = matches!(fields.as_slice(),
            ["0", base, "65536"] if base.parse::<u64>().is_ok_and(|b| b >= 65536));
        r.line(&check, expect, &fields.join(" "), unprivileged);
    }
    // 13. Devices.
    for path in [
        "/dev/mem",
        "/dev/kmsg",
        "/dev/sda",
        "/dev/vda",
        "/dev/kvm",
        "/dev/console",
    ] {
        let e = fs::File::open(path)
            .err()
            .and_then(|e| e.raw_os_error())
            .unwrap_or(0);
        r.line(
            &format!("13 open {path}"),
            "ENOENT/EPERM",
            &errname(e),
            e != 0,
        );
    }
    let node = CString::new("/tmp/probe-dev").unwrap_or_default();
    // SAFETY: mknod with a path we own; makedev of constants.
    let e = if unsafe { libc::mknod(node.as_ptr(), libc::S_IFCHR | 0o600, libc::makedev(1, 1)) } < 0
    {
        errno()
    } else {
        0
    };
    r.line("13 mknod /dev/mem-like", "EPERM", &errname(e), denied(e));
    let devs: Vec<String> = fs::read_dir("/dev")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    let allowed = [
        "null", "zero", "full", "random", "urandom", "tty", "pts", "ptmx", "shm", "mqueue", "fd",
        "stdin", "stdout", "stderr",
    ];
    let mut extra: Vec<&String> = devs
        .iter()
        .filter(|d| !allowed.contains(&d.as_str()))
        .collect();
    extra.sort();
    // gVisor's /dev is the sentry's: it adds its own fuse device (and
    // net/tun when the sandbox runs on gVisor's network stack), and
    // Warren adds init's binary and socket directory there (checked
    // below); nothing else may appear.
    let net: Vec<String> = fs::read_dir("/dev/net")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    let mut observed = format!("extra: {extra:?}");
    let pass = if r.gvisor() {
        let own: Vec<&str> = extra
            .iter()
            .map(|d| d.as_str())
            .filter(|d| *d != "net")
            .collect();
        let has_net = extra.iter().any(|d| d.as_str() == "net");
        if has_net {
            observed.push_str(&format!("; /dev/net: {net:?}"));
        }
        own == [".warren", ".warren-init", "fuse"] && (!has_net || net == ["tun"])
    } else {
        extra.is_empty()
    };
    r.line(
        "13 /dev contents",
        r.pick(
            "only the minimal set",
            "the minimal set and exactly .warren .warren-init fuse (and net/tun on gVisor's own network stack)",
        ),
        &observed,
        pass,
    );
    if r.gvisor() {
        init_socket_dir(&mut r, root);
        init_binary(&mut r, root);
    }
    fuse_mount(&mut r);
    tun_device(&mut r);
    // 14. Only fds 0-2 at exec, and the working directory is inside.
    let fds: Vec<String> = fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    // The read_dir itself holds one descriptor (3).
    let extra: Vec<&String> = fds
        .iter()
        .filter(|f| !["0", "1", "2", "3"].contains(&f.as_str()))
        .collect();
    r.line(
        "14 open fds at exec",
        "0, 1, 2",
        &format!("extra: {extra:?}"),
        extra.is_empty(),
    );
    let cwd = std::env::current_dir()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|e| e.to_string());
    r.line(
        "14 cwd inside the root",
        "an absolute path",
        &cwd,
        cwd.starts_with('/') && !cwd.contains("(unreachable)"),
    );
    // 15. The runtime binary is out of reach.
    let e = fs::OpenOptions::new()
        .write(true)
        .open("/proc/1/exe")
        .err()
        .and_then(|e| e.raw_os_error())
        .unwrap_or(0);
    r.line(
        "15 open /proc/1/exe for writing",
        "EACCES/EPERM",
        &errname(e),
        e != 0,
    );
    let e = fs::read_link("/proc/1/exe")
        .err()
        .and_then(|e| e.raw_os_error())
        .unwrap_or(0);
    r.line(
        "15 readlink /proc/1/exe",
        "EACCES/EPERM",
        &errname(e),
        e != 0,
    );
    // 37. Information about the host: the overlay's options name the
    // directories it was built from, which must not reveal the host's layout.
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let named: Vec<&str> = mountinfo
        .split([' ', ','])
        .filter_map(|opt| {
            ["lowerdir=", "upperdir=", "workdir="]
                .iter()
                .find_map(|k| opt.strip_prefix(k))
        })
        .flat_map(|v| v.split(':'))
        .filter(|p| !p.starts_with("/run/warren/roots/"))
        .collect();
    r.line(
        "37 host paths in mountinfo",
        "none (overlay dirs under /run/warren/roots)",
        &if named.is_empty() {
            "none".to_string()
        } else {
            named.join(" ")
        },
        !mountinfo.is_empty() && named.is_empty(),
    );
    let cmdline = fs::read("/proc/1/cmdline").unwrap_or_default();
    let shown = String::from_utf8_lossy(&cmdline)
        .trim_end_matches('\0')
        .replace('\0', " ");
    // gVisor's init is a read-only bind on the sentry's /dev (check 13);
    // the container class's is a sealed memfd named by its argv.
    let want = r.pick("/.warren-init", "/dev/.warren-init");
    r.line("37 /proc/1/cmdline", want, &shown, shown == want);
    // 37. Kernel logs and debug interfaces.
    for path in [
        "/sys/kernel/debug",
        "/sys/kernel/security",
        "/sys/kernel/tracing",
    ] {
        let n = fs::read_dir(path).map(|d| d.count()).unwrap_or(0);
        r.line(
            &format!("37 {path}"),
            "absent or empty",
            &format!("{n} entries"),
            n == 0,
        );
    }
    // 36. No controlling terminal to inject into.
    let tty = fs::File::open("/dev/tty")
        .err()
        .and_then(|e| e.raw_os_error())
        .unwrap_or(0);
    r.line(
        "36 controlling tty",
        "none (ENXIO)",
        &errname(tty),
        tty != 0,
    );

    toolkit_techniques(&mut r);

    println!(
        "{{\"summary\":true,\"isolation\":\"{}\",\"uid\":\"{}\",\"failed\":{},\"not_applicable\":{}}}",
        r.class.name(),
        json_escape(&read_status("Uid:")),
        r.failed,
        r.not_applicable
    );
    std::process::exit(if r.failed == 0 { 0 } else { 1 });
}

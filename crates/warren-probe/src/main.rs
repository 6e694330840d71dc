//! `warren-probe`: the escape suite's probe. It runs inside a sandbox (as
//! root and as an unprivileged user), tries what an attacker would, and
//! prints one JSON line per check: `{"check", "expect", "observed", "pass"}`.
//! It is built as a static binary so it runs in any image, and it needs
//! nothing from the network. Checks are numbered after security.md §a.
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

struct Report {
    failed: usize,
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
    fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field).map(|v| v.trim().to_string()))
        .unwrap_or_default()
}

/// Runs `f` in a forked child; returns how the child ended.
fn in_child(f: fn() -> i32) -> String {
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

fn int80_getpid() -> i32 {
    let ret: i64;
    // SAFETY: issues the 32-bit getpid system call through int 0x80; it
    // takes no arguments and touches no memory.
    unsafe { std::arch::asm!("int 0x80", inlateout("rax") 20i64 => ret, options(nostack)) };
    if ret < 0 {
        (-ret) as i32
    } else {
        0
    }
}

fn x32_getpid() -> i32 {
    sys(0x4000_0000 | libc::SYS_getpid, [0; 6])
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

fn main() {
    let mut r = Report { failed: 0 };
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
    let ns = fs::File::open("/proc/1/ns/mnt");
    let e = match &ns {
        Ok(f) => {
            use std::os::fd::AsRawFd;
            // SAFETY: setns on a descriptor we hold.
            if unsafe { libc::setns(f.as_raw_fd(), 0) } < 0 {
                errno()
            } else {
                0
            }
        }
        Err(e) => e.raw_os_error().unwrap_or(0),
    };
    r.line("05 setns into /proc/1/ns/mnt", "EPERM", &errname(e), e != 0);
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
    let out = in_child(int80_getpid);
    r.line(
        "08 int 0x80 getpid",
        "killed or refused",
        &out,
        out.starts_with("killed") || out == "exit 1" || out == "exit 38",
    );
    let out = in_child(x32_getpid);
    r.line("08 x32 getpid", "killed or refused", &out, out != "exit 0");
    // 9. Privilege state.
    r.line(
        "09 NoNewPrivs",
        "1",
        &read_status("NoNewPrivs:"),
        read_status("NoNewPrivs:") == "1",
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
    for field in ["CapAmb:", "CapInh:"] {
        let v = read_status(field);
        r.line(
            &format!("09 {field}"),
            "0000000000000000",
            &v,
            v == "0000000000000000",
        );
    }
    // 11. Root inside is an unprivileged host id range.
    for file in ["uid_map", "gid_map"] {
        let map = fs::read_to_string(format!("/proc/self/{file}")).unwrap_or_default();
        let fields: Vec<&str> = map.split_whitespace().collect();
        let unprivileged = matches!(fields.as_slice(),
            ["0", base, "65536"] if base.parse::<u64>().is_ok_and(|b| b >= 65536));
        r.line(
            &format!("11 {file}"),
            "0 <host base >= 65536> 65536",
            &fields.join(" "),
            unprivileged,
        );
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
    let extra: Vec<&String> = devs
        .iter()
        .filter(|d| !allowed.contains(&d.as_str()))
        .collect();
    r.line(
        "13 /dev contents",
        "only the minimal set",
        &format!("extra: {extra:?}"),
        extra.is_empty(),
    );
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
    r.line(
        "37 /proc/1/cmdline",
        "/.warren-init",
        &shown,
        shown == "/.warren-init",
    );
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
        "{{\"summary\":true,\"uid\":\"{}\",\"failed\":{}}}",
        json_escape(&read_status("Uid:")),
        r.failed
    );
    std::process::exit(if r.failed == 0 { 0 } else { 1 });
}

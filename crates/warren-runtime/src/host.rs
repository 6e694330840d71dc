//! What this host can do for Warren: the checks behind `warren doctor`.
//! Each check says what it found and what it means for the guarantees.

use std::path::Path;

use crate::check::check;
pub use crate::check::{Check, Status};

fn kernel_version() -> (String, (u32, u32)) {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string();
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|p| p.parse::<u32>().ok());
    let v = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (release, v)
}

fn filesystems() -> String {
    std::fs::read_to_string("/proc/filesystems").unwrap_or_default()
}

fn effective_caps() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .unwrap_or(0)
}

/// On cgroup v2 every sandbox's device rules are an eBPF program, and a
/// create fails where libcontainer cannot load one: it first raises
/// RLIMIT_MEMLOCK, which needs CAP_SYS_RESOURCE or a high enough hard
/// limit, then the kernel must take the program.
fn v2_device_rules(caps: u64) -> Check {
    const NAME: &str = "device rules";
    let wanted = crate::device_program::LIBCONTAINER_MEMLOCK;
    let hard = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_MEMLOCK)
        .map(|(_, hard)| hard)
        .unwrap_or(0);
    if caps & (1 << 24) == 0 && hard < wanted {
        return check(
            NAME,
            Status::Missing,
            format!("cgroup v2; no CAP_SYS_RESOURCE; locked-memory hard limit {hard} bytes"),
            format!(
                "every create fails: libcontainer raises RLIMIT_MEMLOCK to {} MiB before it \
                 loads a sandbox's device program. Start the node with LimitMEMLOCK=infinity \
                 (as deploy/systemd/warren-node.service sets), `--ulimit memlock=-1` for a \
                 container, or from a root shell that has CAP_SYS_RESOURCE",
                wanted >> 20
            ),
        );
    }
    match crate::device_program::load_check() {
        Ok(len) => check(
            NAME,
            Status::Ok,
            format!("cgroup v2 eBPF device program loads ({len} instructions)"),
            "a sandbox opens only its default devices and the CDI devices it holds",
        ),
        Err(e) => check(
            NAME,
            Status::Missing,
            e.to_string(),
            "every create fails: the node needs CAP_BPF or CAP_SYS_ADMIN in the host's \
             user namespace and a kernel with CONFIG_CGROUP_BPF",
        ),
    }
}

/// The checks; `home` is Warren's home (the file system image layers and
/// sandboxes live on).
pub fn probe(home: &Path) -> Vec<Check> {
    let mut out = Vec::new();
    let (release, (major, minor)) = kernel_version();
    out.push(if (major, minor) >= (5, 9) {
        check(
            "kernel",
            Status::Ok,
            release,
            "pidfd, openat2 and close_range are available",
        )
    } else {
        check(
            "kernel",
            Status::Missing,
            release,
            "Warren needs Linux 5.9 or newer (pidfd_open, openat2, close_range)",
        )
    });

    let root = nix::unistd::geteuid().is_root();
    let caps = effective_caps();
    let sys_admin = caps & (1 << 21) != 0;
    out.push(if root && sys_admin {
        check(
            "privileges",
            Status::Ok,
            "root with CAP_SYS_ADMIN",
            "namespaces, mounts and cgroups can be set up",
        )
    } else {
        check(
            "privileges",
            Status::Missing,
            format!("euid root: {root}, CAP_SYS_ADMIN: {sys_admin}"),
            "run `warren up` as root",
        )
    });
    // A sandbox gets min(65536, the daemon's hard limit): only a hard
    // limit below that, which Warren cannot raise itself without
    // CAP_SYS_RESOURCE, costs sandboxes anything.
    let hard = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map(|(_, hard)| hard)
        .unwrap_or(0);
    out.push(if caps & (1 << 24) != 0 {
        check(
            "rlimits",
            Status::Ok,
            "CAP_SYS_RESOURCE",
            "sandboxes get 65536 open files",
        )
    } else if hard >= 65536 {
        check(
            "rlimits",
            Status::Ok,
            format!("no CAP_SYS_RESOURCE; open-file hard limit {hard}"),
            "sandboxes get 65536 open files",
        )
    } else {
        check(
            "rlimits",
            Status::Degraded,
            format!("no CAP_SYS_RESOURCE; open-file hard limit {hard}"),
            format!(
                "sandboxes get {hard} open files instead of 65536, and Warren cannot raise \
                 the limit itself: start `warren up` with a hard limit of at least 65536 \
                 (LimitNOFILE=1048576 in its systemd unit, as deploy/systemd/warren-up.service \
                 sets; `--ulimit nofile=1048576` for a container; or `ulimit -Hn 1048576` \
                 in a root shell that has CAP_SYS_RESOURCE)"
            ),
        )
    });

    match libcgroups::common::get_cgroup_setup() {
        Ok(setup) => {
            let (status, meaning) = match setup {
                libcgroups::common::CgroupSetup::Unified => {
                    let ctrls = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
                        .unwrap_or_default();
                    let missing: Vec<&str> = ["cpu", "memory", "pids"]
                        .into_iter()
                        .filter(|c| !ctrls.split_whitespace().any(|x| x == *c))
                        .collect();
                    if missing.is_empty() {
                        (
                            Status::Ok,
                            "cgroup v2: cpu, memory, pids limits and the freezer are enforced"
                                .to_string(),
                        )
                    } else {
                        (
                            Status::Missing,
                            format!(
                                "cgroup v2 lacks the {} controller(s): limits cannot be enforced",
                                missing.join(", ")
                            ),
                        )
                    }
                }
                _ => {
                    let missing: Vec<&str> =
                        ["cpu", "cpuacct", "memory", "pids", "freezer", "devices"]
                            .into_iter()
                            .filter(|c| !Path::new("/sys/fs/cgroup").join(c).is_dir())
                            .collect();
                    if missing.is_empty() {
                        (Status::Ok, "cgroup v1: cpu, memory, pids, device limits and the freezer are enforced".to_string())
                    } else {
                        (
                            Status::Missing,
                            format!(
                                "cgroup v1 lacks {}: limits cannot be enforced",
                                missing.join(", ")
                            ),
                        )
                    }
                }
            };
            out.push(check("cgroups", status, format!("{setup:?}"), meaning));
            if matches!(setup, libcgroups::common::CgroupSetup::Unified) {
                out.push(v2_device_rules(caps));
            }
        }
        Err(e) => out.push(check(
            "cgroups",
            Status::Missing,
            e.to_string(),
            "no cgroup hierarchy: no limits, no freezer",
        )),
    }

    let fs = filesystems();
    out.push(if fs.contains("overlay") {
        check(
            "overlayfs",
            Status::Ok,
            "available",
            "sandbox roots share cached image layers",
        )
    } else {
        check(
            "overlayfs",
            Status::Missing,
            "not in /proc/filesystems",
            "sandbox roots cannot be made",
        )
    });

    let seccomp = std::fs::read_to_string("/proc/self/status")
        .map(|s| s.contains("Seccomp:"))
        .unwrap_or(false);
    out.push(if seccomp {
        check(
            "seccomp",
            Status::Ok,
            "filter mode supported; libseccomp linked",
            "the syscall allowlist is enforced, non-native ABIs refused",
        )
    } else {
        check(
            "seccomp",
            Status::Missing,
            "no seccomp in this kernel",
            "untrusted code reaches every syscall: do not run untrusted code here",
        )
    });

    out.push(match crate::userns::check_idmap(home) {
        Ok(dir) => check(
            "user namespaces",
            Status::Ok,
            format!("user namespaces and id-mapped mounts on {}", dir.display()),
            "root in a sandbox is an unprivileged host uid range of its own; image layers are shared through id-mapped mounts",
        ),
        Err(e) => check(
            "user namespaces",
            Status::Missing,
            e.to_string(),
            "sandboxes cannot get their own uid range here (kernel 5.19+ and a file system with id-mapped mounts are needed): `warren up --no-userns` runs them with root inside as host root, held in only by capabilities, seccomp and namespaces",
        ),
    });

    let loop_dev = Path::new("/dev/loop-control").exists();
    let mkfs = ["/sbin/mkfs.ext4", "/usr/sbin/mkfs.ext4"]
        .iter()
        .any(|p| Path::new(p).exists());
    out.push(match loop_dev && mkfs && fs.contains("ext4") {
        true => check(
            "disk limits",
            Status::Ok,
            "loop devices, mkfs.ext4, ext4",
            "`disk` gives a sandbox its own file system of that size (bytes and inodes bounded); without `disk` a sandbox shares the node's disk",
        ),
        false => check(
            "disk limits",
            Status::Degraded,
            format!("loop-control: {loop_dev}, mkfs.ext4: {mkfs}"),
            "`disk` cannot be enforced: install e2fsprogs and load the loop driver",
        ),
    });

    out.push(home_filesystem(home));
    out.push(accept_queue(
        std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .ok()
            .and_then(|s| s.trim().parse().ok()),
    ));

    let openat2 = rustix::fs::openat2(
        rustix::fs::CWD,
        "/",
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
        rustix::fs::ResolveFlags::IN_ROOT,
    )
    .is_ok();
    out.push(if openat2 {
        check(
            "openat2",
            Status::Ok,
            "RESOLVE_IN_ROOT works",
            "the file API cannot be led out of a sandbox by `..` or symlinks",
        )
    } else {
        check(
            "openat2",
            Status::Missing,
            "not available",
            "the file API cannot confine paths",
        )
    });
    out
}

/// The daemon's listeners ask for 4,096 finished handshakes waiting to be
/// accepted; the kernel caps that at `net.core.somaxconn`, and a burst of
/// connections past the cap has its handshakes dropped and retried a
/// second later (docs/configuration.md, "The API under load").
fn accept_queue(somaxconn: Option<u64>) -> Check {
    const NAME: &str = "accept queue";
    match somaxconn {
        Some(n) if n >= 1024 => check(
            NAME,
            Status::Ok,
            format!("net.core.somaxconn {n}"),
            "a burst of connections waits for the daemon instead of being dropped",
        ),
        Some(n) => check(
            NAME,
            Status::Degraded,
            format!("net.core.somaxconn {n}"),
            "past that many connections opened at once, clients wait a second or more for a retried handshake: `sysctl -w net.core.somaxconn=4096` (and in /etc/sysctl.d), then restart the daemon",
        ),
        None => check(
            NAME,
            Status::Ok,
            "not checked",
            "/proc/sys/net/core/somaxconn could not be read",
        ),
    }
}

/// ext4 made without a journal skips every recently freed inode when it
/// allocates one, reading each candidate from its inode table; a node
/// makes and frees about a dozen inodes per sandbox, so under churn that
/// search took 15% of a two-core machine's CPU (docs/benchmarks.md).
fn home_filesystem(home: &Path) -> Check {
    const NAME: &str = "home file system";
    const EXT4_SUPER_MAGIC: u64 = 0xEF53;
    // The home may not exist yet: its nearest existing ancestor is where it
    // will be made.
    let Some(at) = home.ancestors().find(|p| p.exists()) else {
        return check(
            NAME,
            Status::Ok,
            "not checked",
            "no part of the home's path exists",
        );
    };
    let is_ext4 = rustix::fs::statfs(at)
        .map(|s| s.f_type as u64 == EXT4_SUPER_MAGIC)
        .unwrap_or(false);
    if !is_ext4 {
        return check(
            NAME,
            Status::Ok,
            format!("{} is not on ext4", at.display()),
            "no journal check needed",
        );
    }
    match ext4_has_journal(at) {
        Some(false) => check(
            NAME,
            Status::Degraded,
            format!("{} is on ext4 without a journal", at.display()),
            "every new inode there is searched for past recently freed ones, which costs CPU on each sandbox create under churn: put the home on a journaled file system (`tune2fs -O has_journal` on an unmounted ext4, or XFS)",
        ),
        Some(true) => check(
            NAME,
            Status::Ok,
            format!("{} is on ext4 with a journal", at.display()),
            "inodes are allocated without a search past recently freed ones",
        ),
        None => check(
            NAME,
            Status::Ok,
            format!("{} is on ext4 (its journal could not be read from /sys/fs/ext4)", at.display()),
            "if it has no journal, sandbox creates cost more CPU (docs/configuration.md)",
        ),
    }
}

/// From `/sys/fs/ext4/<device>/journal_task`, which names the journal's
/// thread, or `<none>`.
fn ext4_has_journal(path: &Path) -> Option<bool> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(path).ok()?.dev();
    let (major, minor) = (nix::sys::stat::major(dev), nix::sys::stat::minor(dev));
    let device = std::fs::read_link(format!("/sys/dev/block/{major}:{minor}")).ok()?;
    let name = device.file_name()?.to_str()?.to_string();
    let task = std::fs::read_to_string(format!("/sys/fs/ext4/{name}/journal_task")).ok()?;
    Some(task.trim() != "<none>")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_accept_queue_is_a_warning_that_says_how_to_lengthen_it() {
        assert_eq!(accept_queue(Some(4096)).status, Status::Ok);
        let short = accept_queue(Some(128));
        assert_eq!(short.status, Status::Degraded);
        assert!(short.found.contains("128"), "{short:?}");
        assert!(
            short.meaning.contains("sysctl -w net.core.somaxconn=4096"),
            "{short:?}"
        );
    }

    #[test]
    fn v2_device_rules_load_here_and_name_the_memlock_fix() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        // With every capability the check only asks the kernel, which
        // takes cgroup device programs from root on any host with cgroup2.
        let loaded = v2_device_rules(u64::MAX);
        assert_eq!(loaded.status, Status::Ok, "{loaded:?}");
        assert!(loaded.found.contains("instructions"), "{loaded:?}");
        let hard = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_MEMLOCK)
            .map(|(_, hard)| hard)
            .unwrap_or(0);
        if hard < crate::device_program::LIBCONTAINER_MEMLOCK {
            let refused = v2_device_rules(0);
            assert_eq!(refused.status, Status::Missing, "{refused:?}");
            assert!(
                refused.meaning.contains("LimitMEMLOCK=infinity"),
                "{refused:?}"
            );
        }
    }
}

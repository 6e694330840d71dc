//! The OCI runtime config (config.json) of a sandbox. Kept as data in one
//! place so that every hardening choice can be read and reviewed together;
//! docs/security.md explains each one.

use std::path::Path;

use serde_json::{json, Value};
use warren_core::ResolvedResources;

/// Capabilities a sandbox's root keeps. Enough to install packages, change
/// ownership and run as another user inside; nothing that reaches the kernel's
/// global state (no SYS_ADMIN, NET_ADMIN, SYS_PTRACE, MKNOD, NET_RAW, SYS_CHROOT).
pub const CAPABILITIES: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_NET_BIND_SERVICE",
];

/// OCI default masked paths plus a few the defaults miss on newer kernels.
pub const MASKED_PATHS: &[&str] = &[
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/proc/interrupts",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
    "/sys/kernel/debug",
    // On cgroup v1 the sandbox is not placed in the name=systemd hierarchy,
    // so its cgroup namespace shows that hierarchy's host root: host cgroup
    // names, and a release_agent file.
    "/sys/fs/cgroup/systemd",
];

pub const READONLY_PATHS: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
    // libcontainer 0.7 mounted each cgroup v1 hierarchy read-write whatever
    // the /sys/fs/cgroup mount's options said, which let root in a sandbox
    // write its own pids.max or memory limits and create cgroups. Warren's
    // own set-up (setup/mounts.rs) mounts them read-only; each is still
    // listed, so a hierarchy that is not read-only is made so (names a host
    // lacks, and mounts already read-only, are skipped). On cgroup v2 the
    // one mount at /sys/fs/cgroup is covered by the first entry.
    "/sys/fs/cgroup",
    "/sys/fs/cgroup/blkio",
    "/sys/fs/cgroup/cpu",
    "/sys/fs/cgroup/cpuacct",
    "/sys/fs/cgroup/cpu,cpuacct",
    "/sys/fs/cgroup/cpuset",
    "/sys/fs/cgroup/devices",
    "/sys/fs/cgroup/freezer",
    "/sys/fs/cgroup/hugetlb",
    "/sys/fs/cgroup/memory",
    "/sys/fs/cgroup/misc",
    "/sys/fs/cgroup/net_cls",
    "/sys/fs/cgroup/net_prio",
    "/sys/fs/cgroup/net_cls,net_prio",
    "/sys/fs/cgroup/perf_event",
    "/sys/fs/cgroup/pids",
    "/sys/fs/cgroup/rdma",
    "/sys/fs/cgroup/unified",
];

const CPU_PERIOD_US: u64 = 100_000;
const SECCOMP_PROFILE: &str = include_str!("seccomp/default.json");

fn native_arch() -> &'static str {
    if cfg!(target_arch = "aarch64") {
        "SCMP_ARCH_AARCH64"
    } else {
        "SCMP_ARCH_X86_64"
    }
}

pub fn seccomp_profile() -> Value {
    // The embedded profile is checked by a unit test; failing to parse it is a
    // build defect, so fall back to a deny-everything profile rather than none.
    let mut profile: Value = serde_json::from_str(SECCOMP_PROFILE)
        .unwrap_or_else(|_| json!({"defaultAction": "SCMP_ACT_KILL_PROCESS", "syscalls": []}));
    if let Some(obj) = profile.as_object_mut() {
        obj.remove("_comment");
        obj.insert("architectures".into(), json!([native_arch()]));
    }
    profile
}

/// The capability sets of a sandbox's processes: [`CAPABILITIES`], none
/// inheritable or ambient (every isolation class gives the same).
pub(crate) fn capabilities() -> Value {
    let caps = CAPABILITIES;
    json!({
        "bounding": caps, "effective": caps, "permitted": caps,
        "inheritable": [], "ambient": []
    })
}

/// A minimal /dev (tmpfs, its own devpts, a size-capped /dev/shm) and a
/// read-only /sys, as every isolation class mounts them.
pub(crate) fn dev_and_sys_mounts() -> [Value; 4] {
    [
        json!({ "destination": "/dev", "type": "tmpfs", "source": "tmpfs",
                "options": ["nosuid", "strictatime", "mode=755", "size=65536k"] }),
        json!({ "destination": "/dev/pts", "type": "devpts", "source": "devpts",
                "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"] }),
        json!({ "destination": "/dev/shm", "type": "tmpfs", "source": "shm",
                "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"] }),
        json!({ "destination": "/sys", "type": "sysfs", "source": "sysfs",
                "options": ["nosuid", "noexec", "nodev", "ro"] }),
    ]
}

pub struct ConfigInput<'a> {
    pub id: &'a str,
    pub rootfs: &'a Path,
    pub cgroup_path: &'a str,
    pub resources: &'a ResolvedResources,
    /// Open-file limit: 65536, or the daemon's hard limit when that is lower
    /// (raising it needs CAP_SYS_RESOURCE, which some hosts withhold).
    pub nofile: u64,
    /// Locked-memory limit, the same way: on cgroup v2 libcontainer lifts
    /// its own limit to load the device program, and the sandbox would
    /// inherit "unlimited" unless its config names one.
    pub memlock: u64,
    /// The sandbox's host id range: it gets a user namespace mapping it.
    pub ids: Option<crate::userns::IdRange>,
    /// What its CDI devices add (see [`crate::cdi`]).
    pub devices: &'a crate::cdi::Injection,
}

pub fn config(input: &ConfigInput<'_>) -> Value {
    let mut config = base_config(input);
    add_device_mounts(&mut config, input.devices);
    if let Some(ids) = input.ids {
        add_user_namespace(&mut config, ids);
    }
    config
}

/// Gives `config` a user namespace mapping root (and the 65535 ids above
/// it) to the sandbox's host range.
pub(crate) fn add_user_namespace(config: &mut Value, ids: crate::userns::IdRange) {
    let map = json!([{ "containerID": 0, "hostID": ids.base, "size": crate::userns::SIZE }]);
    let linux = &mut config["linux"];
    if let Some(ns) = linux["namespaces"].as_array_mut() {
        // First, so every other namespace is owned by it.
        ns.insert(0, json!({ "type": "user" }));
    }
    linux["uidMappings"] = map.clone();
    linux["gidMappings"] = map;
}

fn base_config(input: &ConfigInput<'_>) -> Value {
    let mut mounts = vec![
        json!({ "destination": "/proc", "type": "proc", "source": "proc",
                                  "options": ["nosuid", "noexec", "nodev"] }),
    ];
    mounts.extend(dev_and_sys_mounts());
    mounts.extend([
        json!({ "destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
                "options": ["nosuid", "noexec", "nodev"] }),
        json!({ "destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
                "options": ["nosuid", "noexec", "nodev", "relatime", "ro"] }),
    ]);
    let r = input.resources;
    let quota = (r.cpu_millis * CPU_PERIOD_US / 1000).max(1000);
    // Requests become the kernel's shares of contended resources: CPU
    // weight in proportion to the request (as the kubelet: 1024 per core,
    // at least 2), and the memory the kernel reclaims from last under host
    // pressure (v1 soft limit, v2 memory.low).
    let shares = (r.cpu_request() * 1024 / 1000).max(2);
    json!({
        "ociVersion": "1.2.0",
        "root": { "path": input.rootfs, "readonly": false },
        "hostname": input.id,
        "process": {
            "terminal": false,
            "user": { "uid": 0, "gid": 0 },
            // The set-up execs Warren's own init (see init.rs), whatever
            // these say; they must not be empty.
            "args": ["/.warren-init"],
            "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "cwd": "/",
            "noNewPrivileges": true,
            "capabilities": capabilities(),
            "rlimits": [
                { "type": "RLIMIT_NOFILE", "hard": input.nofile, "soft": input.nofile },
                { "type": "RLIMIT_MEMLOCK", "hard": input.memlock, "soft": input.memlock },
                { "type": "RLIMIT_CORE", "hard": 0, "soft": 0 }
            ]
        },
        "mounts": mounts,
        "linux": {
            "namespaces": [
                { "type": "pid" }, { "type": "mount" }, { "type": "ipc" },
                { "type": "uts" }, { "type": "network" }, { "type": "cgroup" }
            ],
            "cgroupsPath": input.cgroup_path,
            "resources": {
                "devices": device_rules(input.devices),
                // cgroup v1 keeps socket buffers in a counter of their own,
                // unlimited unless set: a sandbox in network mode `none`
                // could queue hundreds of MiB in loopback connections that
                // its memory limit never saw. A quarter of the limit on top
                // of it (v2 charges them to memory.current; this is ignored).
                "memory": {
                    "limit": r.memory, "swap": r.memory, "kernelTCP": tcp_limit(r.memory),
                    "reservation": r.memory_request()
                },
                "cpu": { "quota": quota, "period": CPU_PERIOD_US, "shares": shares },
                "pids": { "limit": r.pids },
                // cgroup v2: an OOM kill takes the sandbox's whole process
                // group, not one process of it. libcgroups writes `unified`
                // only on v2; v1 has no equivalent (its OOM killer picks one
                // process, always inside the sandbox's memory cgroup).
                "unified": { "memory.oom.group": "1" }
            },
            "rootfsPropagation": "private",
            "maskedPaths": MASKED_PATHS,
            "readonlyPaths": READONLY_PATHS
            // No "seccomp": the init installs the filter the spawner
            // compiled once from seccomp_profile() (syscall_filter.rs),
            // instead of libcontainer compiling it for every sandbox.
        }
    })
}

/// A sandbox's CDI device nodes and file mounts. Each device node is a
/// bind mount of the host's node, not an OCI `linux.devices` entry: in a
/// user namespace mknod is impossible, and libcontainer then binds the host
/// file at the container's path, which is wrong whenever the spec's
/// `hostPath` differs from its `path`. The bind carries no `nodev`: the
/// node's mount belongs to the host's user namespace, so the kernel lets
/// the sandbox open it, and the device cgroup ([`device_rules`]) is what
/// limits it.
fn add_device_mounts(config: &mut Value, d: &crate::cdi::Injection) {
    if let Some(mounts) = config["mounts"].as_array_mut() {
        for n in &d.nodes {
            mounts.push(json!({
                "destination": n.path, "type": "bind", "source": n.host_path,
                "options": ["bind", "nosuid", "noexec"]
            }));
        }
        for m in &d.mounts {
            mounts.push(json!({
                "destination": m.container_path, "type": "bind", "source": m.host_path,
                "options": m.options
            }));
        }
    }
}

/// Warren's device rules, as JSON, did not read back as OCI rules.
#[derive(Debug, thiserror::Error)]
#[error("device rules do not fit the OCI schema: {0}")]
pub struct DeviceRulesError(#[source] pub serde_json::Error);

/// The same rules as libcontainer reads them from the config.
pub fn device_cgroup_rules(
    d: &crate::cdi::Injection,
) -> Result<Vec<libcontainer::oci_spec::runtime::LinuxDeviceCgroup>, DeviceRulesError> {
    serde_json::from_value(Value::Array(device_rules(d))).map_err(DeviceRulesError)
}

/// Socket buffer memory a sandbox may hold on cgroup v1 (see base_config).
pub fn tcp_limit(memory: u64) -> u64 {
    (memory / 4).max(4 << 20)
}

/// The device cgroup's rules: /dev/null, zero, full, random, urandom, tty,
/// ptmx and pts (the devices a program expects), then exactly the sandbox's
/// CDI device nodes with the access their spec gives; everything else is
/// denied. Warren's set-up writes them to the v1 devices controller; on
/// cgroup v2 libcontainer compiles them into the eBPF device program it
/// attaches to the sandbox's cgroup (its `cgroupsv2_devices` feature).
fn device_rules(d: &crate::cdi::Injection) -> Vec<Value> {
    let deny_all = json!({ "allow": false, "access": "rwm" });
    std::iter::once(deny_all)
        .chain([(1, 3), (1, 5), (1, 7), (1, 8), (1, 9), (5, 0), (5, 2)]
        .into_iter()
        .map(|(major, minor)| {
            json!({ "allow": true, "type": "c", "major": major, "minor": minor, "access": "rwm" })
        }))
        .chain(std::iter::once(
            json!({ "allow": true, "type": "c", "major": 136, "access": "rwm" }),
        ))
        .chain(d.nodes.iter().map(|n| {
            json!({
                "allow": true, "type": n.kind, "major": n.major, "minor": n.minor,
                "access": n.access
            })
        }))
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn sandbox_config(cpu_millis: u64, disk: u64) -> Value {
        with_devices(cpu_millis, disk, &crate::cdi::Injection::default())
    }

    fn with_devices(cpu_millis: u64, disk: u64, devices: &crate::cdi::Injection) -> Value {
        test_config(cpu_millis, disk, devices, None)
    }

    /// The config of a test sandbox `sbx-1` (64M memory, 64 pids).
    pub(crate) fn test_config(
        cpu_millis: u64,
        disk: u64,
        devices: &crate::cdi::Injection,
        ids: Option<crate::userns::IdRange>,
    ) -> Value {
        config(&ConfigInput {
            devices,
            id: "sbx-1",
            rootfs: Path::new("/tmp/r"),
            cgroup_path: "/warren/sbx-1",
            ids,
            resources: &ResolvedResources {
                cpu_millis,
                memory: 64 << 20,
                cpu_request_millis: Some(cpu_millis / 2),
                memory_request: Some(16 << 20),
                pids: 64,
                disk,
                gpus: 0,
            },
            nofile: 1024,
            memlock: 8 << 20,
        })
    }

    #[test]
    fn seccomp_profile_is_an_allowlist_for_the_native_arch() {
        let p: Value = serde_json::from_str(SECCOMP_PROFILE).expect("profile parses");
        assert_eq!(p["defaultAction"], "SCMP_ACT_ERRNO");
        let allowed: Vec<&str> = p["syscalls"][0]["names"]
            .as_array()
            .expect("names")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        for denied in [
            "mount",
            "unshare",
            "setns",
            "bpf",
            "init_module",
            "ptrace",
            "io_uring_setup",
            "keyctl",
        ] {
            assert!(!allowed.contains(&denied), "{denied} must not be allowed");
        }
        assert_eq!(seccomp_profile()["architectures"], json!([native_arch()]));
    }

    /// A GPU-like device node and a library file, as a CDI spec gives them.
    pub(crate) fn test_devices() -> crate::cdi::Injection {
        use crate::cdi::{Injection, MountEdit, NodeEdit};
        Injection {
            env: Default::default(),
            nodes: vec![NodeEdit {
                path: "/dev/testgpu0".into(),
                host_path: "/srv/cdi/gpu0".into(),
                kind: "c".into(),
                major: 195,
                minor: 0,
                access: "rw".into(),
            }],
            mounts: vec![MountEdit {
                host_path: "/srv/cdi/lib.so".into(),
                container_path: "/usr/lib/lib.so".into(),
                options: vec!["rbind".into(), "ro".into(), "nosuid".into()],
            }],
        }
    }

    #[test]
    fn cdi_devices_are_bound_and_only_they_are_allowed() {
        let c = with_devices(1000, 0, &test_devices());
        let mounts = c["mounts"].as_array().expect("mounts");
        let node = mounts
            .iter()
            .find(|m| m["destination"] == "/dev/testgpu0")
            .expect("the node is bound");
        assert_eq!(node["source"], "/srv/cdi/gpu0");
        assert!(!node["options"]
            .as_array()
            .expect("options")
            .contains(&json!("nodev")));
        assert!(mounts
            .iter()
            .any(|m| m["destination"] == "/usr/lib/lib.so" && m["options"][1] == "ro"));
        let rules = c["linux"]["resources"]["devices"]
            .as_array()
            .expect("rules");
        assert_eq!(
            rules[0],
            json!({ "allow": false, "access": "rwm" }),
            "deny first"
        );
        assert_eq!(
            rules.last(),
            Some(&json!({ "allow": true, "type": "c", "major": 195, "minor": 0, "access": "rw" }))
        );
        let plain = sandbox_config(1000, 0);
        let plain_rules = plain["linux"]["resources"]["devices"]
            .as_array()
            .expect("rules");
        assert_eq!(plain_rules.len() + 1, rules.len());
        assert!(c["linux"]["devices"].is_null(), "no mknod list");
    }

    #[test]
    fn config_carries_limits() {
        let c = sandbox_config(500, 1 << 30);
        assert_eq!(c["linux"]["resources"]["cpu"]["quota"], 50_000);
        assert_eq!(c["linux"]["resources"]["memory"]["limit"], 64 << 20);
        assert_eq!(c["linux"]["resources"]["memory"]["kernelTCP"], 16 << 20);
        assert_eq!(c["linux"]["resources"]["memory"]["reservation"], 16 << 20);
        assert_eq!(c["linux"]["resources"]["cpu"]["shares"], 256);
        assert_eq!(c["linux"]["resources"]["unified"]["memory.oom.group"], "1");
        assert_eq!(c["hostname"], "sbx-1");
        assert_eq!(c["process"]["noNewPrivileges"], true);
    }

    // Found by the escape suite (check 39, CDK rewrite-cgroup): root in a
    // sandbox could raise its own pids.max through a read-write cgroup v1
    // mount. The kernel-side proof is tests/test_escape.py.
    #[test]
    fn cgroup_hierarchies_are_read_only_and_systemd_masked() {
        let c = sandbox_config(1000, 0);
        let list = |key: &str| -> Vec<String> {
            c["linux"][key]
                .as_array()
                .expect(key)
                .iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect()
        };
        let ro = list("readonlyPaths");
        for h in [
            "", "/pids", "/memory", "/devices", "/cpu", "/cpuset", "/freezer",
        ] {
            let path = format!("/sys/fs/cgroup{h}");
            assert!(ro.contains(&path), "{path} must be read-only");
        }
        assert!(list("maskedPaths").contains(&"/sys/fs/cgroup/systemd".to_string()));
    }
}

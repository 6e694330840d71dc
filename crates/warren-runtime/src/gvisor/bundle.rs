//! The OCI config runsc reads for a gVisor sandbox. gVisor makes its own
//! /proc, /sys and /dev inside the sentry, so only what Warren adds is
//! spelled out: warren-init and its socket directory, the sandbox's cgroup
//! and limits, and a network namespace of its own (the node sets it up through the sentry's
//! pid, as it does through a container's init). The spawner adds /tmp
//! (see spawn.rs).

use std::path::Path;

use serde_json::{json, Value};
use warren_core::ResolvedResources;

pub(crate) struct ConfigInput<'a> {
    pub id: &'a str,
    pub rootfs: &'a Path,
    pub cgroup_path: &'a str,
    pub resources: &'a ResolvedResources,
    pub nofile: u64,
    /// The node's copy of warren-init.
    pub init: &'a Path,
    /// The host directory shared at [`super::IPC_DIR`].
    pub ipc: &'a Path,
    /// The host ids the gofer's user namespace maps root to; None: the
    /// gofer is root in the host's (see [`super::prepare`]).
    pub ids: Option<crate::userns::IdRange>,
}

/// Host tasks a gVisor sandbox may have per process it asks for: on the
/// ptrace platform each guest process costs 7-12 host threads (its stub
/// and the sentry's), plus about 21 for an idle sandbox
/// (docs/design/gvisor-runsc.md). The host pids limit is only a ceiling
/// against a fork bomb reaching the host; hitting it ends the sandbox.
const HOST_TASKS_PER_PROCESS: u64 = 12;
const HOST_TASKS_BASE: u64 = 64;

pub(crate) fn config(input: &ConfigInput<'_>) -> Value {
    let mut config = base_config(input);
    if let Some(ids) = input.ids {
        crate::oci::add_user_namespace(&mut config, ids);
    }
    config
}

fn base_config(input: &ConfigInput<'_>) -> Value {
    let r = input.resources;
    let period = 100_000u64;
    let quota = (r.cpu_millis * period / 1000).max(1000);
    let shares = (r.cpu_request() * 1024 / 1000).max(2);
    let mut mounts = vec![json!({ "destination": "/proc", "type": "proc", "source": "proc" })];
    mounts.extend(crate::oci::dev_and_sys_mounts());
    mounts.extend([
        json!({ "destination": super::INIT_PATH, "type": "bind", "source": input.init,
                "options": ["rbind", "ro"] }),
        json!({ "destination": super::IPC_DIR, "type": "bind", "source": input.ipc,
                "options": ["rbind", "rw"] }),
    ]);
    json!({
        "ociVersion": "1.0.2",
        "root": { "path": input.rootfs, "readonly": false },
        "hostname": input.id,
        "process": {
            "terminal": false,
            "user": { "uid": 0, "gid": 0 },
            "args": [super::INIT_PATH],
            "env": [
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                format!("{}={}/init.sock", warren_init::SOCKET_ENV, super::IPC_DIR),
                format!("{}=1", warren_init::EXEC_CGROUPS_ENV),
            ],
            "cwd": "/",
            "noNewPrivileges": true,
            "capabilities": init_capabilities(),
            "rlimits": [
                { "type": "RLIMIT_NOFILE", "hard": input.nofile, "soft": input.nofile },
                { "type": "RLIMIT_CORE", "hard": 0, "soft": 0 }
            ]
        },
        "mounts": mounts,
        "linux": {
            "namespaces": [
                { "type": "pid" }, { "type": "mount" }, { "type": "ipc" },
                { "type": "uts" }, { "type": "network" }
            ],
            "cgroupsPath": input.cgroup_path,
            // The container class's filter, enforced by the sentry: what it
            // refuses never reaches gVisor's code either (a second wall
            // behind the first).
            "seccomp": seccomp_profile(),
            "resources": {
                // Socket buffers as in the container class (oci.rs): with
                // host networking the sandbox's sockets are host sockets, whose
                // buffers cgroup v1 charges only under a kernel TCP limit.
                "memory": {
                    "limit": r.memory, "swap": r.memory,
                    "kernelTCP": crate::oci::tcp_limit(r.memory),
                    "reservation": r.memory_request()
                },
                "cpu": { "quota": quota, "period": period, "shares": shares },
                "pids": {
                    "limit": (r.pids as u64).saturating_mul(HOST_TASKS_PER_PROCESS)
                        .saturating_add(HOST_TASKS_BASE)
                }
            }
        }
    })
}

/// The container class's capabilities, and for init alone, until it has
/// mounted its exec cgroups (warren-init's exec_cgroups), CAP_SYS_ADMIN in
/// gVisor's kernel: effective and permitted, not in the bounding set, so no
/// execve (init's own children's) can get it.
fn init_capabilities() -> Value {
    let mut caps = crate::oci::capabilities();
    for set in ["effective", "permitted"] {
        if let Some(list) = caps[set].as_array_mut() {
            list.push(json!("CAP_SYS_ADMIN"));
        }
    }
    caps
}

/// The container class's seccomp profile, as gVisor's runsc reads it:
/// - runsc looks names up in gVisor's own syscall table, which calls 270
///   `pselect` (not `pselect6`) and drops names it does not know, so
///   `select()` and `pselect()` were refused (found running E2B's SDK
///   tests: bash's line editor waits in it);
/// - this runsc turns every errno rule into EPERM, ignoring `errnoRet`, so
///   the profile's ENOSYS answer to `clone3` (whose flags seccomp cannot
///   read) became EPERM, on which glibc does not fall back to `clone`: no
///   thread could start. gVisor gets `clone3` through: this one answers
///   ENOSYS itself, and one that implements it makes threads and
///   namespaces in its own kernel, not the host's;
/// - `mount` and `umount2` reach gVisor, for init to mount its exec
///   cgroups: gVisor's kernel asks CAP_SYS_ADMIN for both, which only init
///   has, until it has (see [`init_capabilities`]). The host's kernel never
///   sees them.
pub(crate) fn seccomp_profile() -> Value {
    let mut profile = crate::oci::seccomp_profile();
    if let Some(rules) = profile["syscalls"].as_array_mut() {
        rules.push(json!({ "names": ["mount", "umount2"], "action": "SCMP_ACT_ALLOW" }));
        for rule in rules.iter_mut() {
            let enosys = rule["action"] == "SCMP_ACT_ERRNO" && rule["errnoRet"] == libc::ENOSYS;
            let Some(names) = rule["names"].as_array_mut() else {
                continue;
            };
            if names.iter().any(|n| n == "pselect6") {
                names.push(json!("pselect"));
            }
            if enosys && names.iter().any(|n| n == "clone3") {
                rule["action"] = json!("SCMP_ACT_ALLOW");
                if let Some(r) = rule.as_object_mut() {
                    r.remove("errnoRet");
                }
            }
        }
    }
    profile
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_and_warren_mounts() {
        let resources = ResolvedResources {
            cpu_millis: 500,
            memory: 64 << 20,
            cpu_request_millis: None,
            memory_request: None,
            pids: 10,
            disk: 0,
            gpus: 0,
        };
        let c = config(&ConfigInput {
            id: "sbx-1",
            rootfs: Path::new("/run/warren/roots/sbx-1"),
            cgroup_path: "/warren/sbx-1",
            resources: &resources,
            nofile: 1024,
            init: Path::new("/h/runsc/warren-init"),
            ipc: Path::new("/run/warren/roots/sbx-1.ipc"),
            ids: None,
        });
        assert_eq!(c["linux"]["resources"]["cpu"]["quota"], 50_000);
        assert_eq!(c["linux"]["resources"]["memory"]["limit"], 64 << 20);
        assert_eq!(c["linux"]["resources"]["memory"]["kernelTCP"], 16 << 20);
        assert_eq!(c["linux"]["resources"]["pids"]["limit"], 10 * 12 + 64);
        assert_eq!(c["process"]["args"][0], super::super::INIT_PATH);
        let mounts = c["mounts"].as_array().unwrap();
        let init = mounts
            .iter()
            .find(|m| m["destination"] == super::super::INIT_PATH)
            .unwrap();
        assert!(init["options"].as_array().unwrap().contains(&json!("ro")));
        // select() under gVisor's name for it; clone3 through to gVisor.
        let rules = c["linux"]["seccomp"]["syscalls"].as_array().unwrap();
        let allowed = |name: &str| {
            rules.iter().any(|r| {
                r["action"] == "SCMP_ACT_ALLOW"
                    && r.get("args").is_none()
                    && r["names"].as_array().unwrap().iter().any(|n| n == name)
            })
        };
        assert!(allowed("pselect") && allowed("pselect6") && allowed("clone3"));
        // init's mount of its exec cgroups: CAP_SYS_ADMIN for init alone,
        // never in the bounding set that every execve is limited by.
        assert!(allowed("mount") && allowed("umount2"));
        let caps = &c["process"]["capabilities"];
        let has = |set: &str| {
            caps[set]
                .as_array()
                .unwrap()
                .contains(&json!("CAP_SYS_ADMIN"))
        };
        assert!(has("effective") && has("permitted"));
        assert!(!has("bounding") && !has("inheritable") && !has("ambient"));
        // Never the host's network namespace.
        assert!(c["linux"]["namespaces"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["type"] == "network" && n.get("path").is_none()));
    }
}

//! Who a sandbox's init is once it is set up: its user and groups, its
//! resource limits, environment and capabilities.

use std::str::FromStr;

use caps::{CapSet, Capability, CapsHashSet};
use nix::sys::resource::{setrlimit, Resource};
use nix::unistd::{setgroups, setresgid, setresuid, Gid, Uid};

use super::error::SetupError;
use super::spec::{Capabilities, Rlimit, User};

/// Takes the config's user and group, with no supplementary groups. In a
/// new user namespace the process is still the host's root until it does:
/// root of the namespace is the first id of the sandbox's range.
pub fn become_user(user: &User) -> Result<(), SetupError> {
    setgroups(&[]).map_err(|e| SetupError::os("drop supplementary groups", e))?;
    let gid = Gid::from_raw(user.gid);
    setresgid(gid, gid, gid).map_err(|e| SetupError::os(format!("set group {}", user.gid), e))?;
    let uid = Uid::from_raw(user.uid);
    setresuid(uid, uid, uid).map_err(|e| SetupError::os(format!("set user {}", user.uid), e))
}

pub fn set_rlimits(limits: &[Rlimit]) -> Result<(), SetupError> {
    for l in limits {
        let resource = match l.kind.as_str() {
            "RLIMIT_NOFILE" => Resource::RLIMIT_NOFILE,
            "RLIMIT_MEMLOCK" => Resource::RLIMIT_MEMLOCK,
            "RLIMIT_CORE" => Resource::RLIMIT_CORE,
            "RLIMIT_NPROC" => Resource::RLIMIT_NPROC,
            "RLIMIT_STACK" => Resource::RLIMIT_STACK,
            other => {
                return Err(SetupError::Unsupported(format!(
                    "the resource limit {other} is not one Warren sets"
                )))
            }
        };
        setrlimit(resource, l.soft, l.hard)
            .map_err(|e| SetupError::os(format!("set {}", l.kind), e))?;
    }
    Ok(())
}

/// The config's environment and nothing of the spawner's; HOME as runc
/// sets it for root when the config has none.
pub fn set_env(env: &[String]) {
    for (key, _) in std::env::vars_os() {
        std::env::remove_var(key);
    }
    for entry in env {
        if let Some((key, value)) = entry.split_once('=') {
            std::env::set_var(key, value);
        }
    }
    if std::env::var_os("HOME").is_none() {
        std::env::set_var("HOME", "/root");
    }
}

pub fn set_no_new_privs() -> Result<(), SetupError> {
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(SetupError::last_os("set no_new_privs"));
    }
    Ok(())
}

fn set_of(names: &[String]) -> Result<CapsHashSet, SetupError> {
    names
        .iter()
        .map(|n| {
            Capability::from_str(n)
                .map_err(|_| SetupError::Unsupported(format!("unknown capability {n}")))
        })
        .collect()
}

/// Leaves the process with exactly the config's capabilities: every other
/// one out of the bounding set (so no exec can regain it), then the
/// effective, permitted and inheritable sets, and no ambient ones.
pub fn drop_capabilities(c: &Capabilities) -> Result<(), SetupError> {
    let bounding = set_of(&c.bounding)?;
    for cap in caps::all() {
        // A capability newer than the kernel is not in its bounding set.
        if !bounding.contains(&cap) && caps::has_cap(None, CapSet::Bounding, cap).unwrap_or(false) {
            caps::drop(None, CapSet::Bounding, cap).map_err(|e| SetupError::Caps {
                what: format!("drop {cap}"),
                source: e,
            })?;
        }
    }
    // Effective first: it may never hold more than the permitted set.
    for (set, names) in [
        (CapSet::Effective, &c.effective),
        (CapSet::Permitted, &c.permitted),
        (CapSet::Inheritable, &c.inheritable),
    ] {
        caps::set(None, set, &set_of(names)?).map_err(|e| SetupError::Caps {
            what: format!("set {set:?} capabilities"),
            source: e,
        })?;
    }
    if !c.ambient.is_empty() {
        return Err(SetupError::Unsupported(
            "ambient capabilities are not something Warren sets".into(),
        ));
    }
    caps::clear(None, CapSet::Ambient).map_err(|e| SetupError::Caps {
        what: "clear ambient capabilities".into(),
        source: e,
    })
}

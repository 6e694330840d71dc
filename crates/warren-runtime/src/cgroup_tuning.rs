//! Host cgroup settings that keep a create's cost flat as live sandboxes
//! grow (docs/benchmarks.md, "Create latency as live sandboxes grow").
//!
//! Every create makes cgroups and moves its init into them. Moving a
//! process between cgroups takes the global threadgroup semaphore for
//! writing, which by default first waits for an RCU grace period: with
//! thousands of sandboxes alive a create spent about 12 ms there.
//! `favordynmods` on the cgroup2 mount keeps the semaphore in its slow mode
//! for good: no wait on a move, a little more on each fork and exit (the
//! kernel's cgroup-v2 documentation describes the trade). The semaphore is
//! one for all hierarchies, so this also serves a cgroup v1 host through
//! its unified (hybrid) mount.
//!
//! (On cgroup v1 sandboxes have no cpuset of their own: see
//! `setup::cgroup_v1`.)

use std::path::PathBuf;

use nix::mount::{mount, MsFlags};

use crate::os_error::OsError;

/// Turns on `favordynmods` on the host's cgroup2 mount (the whole hierarchy
/// on v2, the unified mount on a hybrid host). Returns the mount point when
/// it changed anything; None when there is no cgroup2 mount or it was on.
/// The kernel keeps the setting until the host restarts.
pub fn favor_dynmods() -> Result<Option<PathBuf>, OsError> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| OsError::new("read /proc/self/mountinfo", e))?;
    let Some(m) = mountinfo.lines().find_map(Cgroup2Mount::parse) else {
        return Ok(None);
    };
    if m.super_options.iter().any(|o| o == "favordynmods") {
        return Ok(None);
    }
    // A remount sets the mount's flags and the file system's options to
    // exactly what it is given, so both are passed on as they are, plus ours.
    let mut data: Vec<&str> = m
        .super_options
        .iter()
        .map(String::as_str)
        .filter(|o| *o != "rw" && *o != "ro")
        .collect();
    data.push("favordynmods");
    mount(
        None::<&str>,
        &m.point,
        None::<&str>,
        MsFlags::MS_REMOUNT | m.flags,
        Some(data.join(",").as_str()),
    )
    .map_err(|e| {
        OsError::new(
            format!("remount {} with favordynmods", m.point.display()),
            e,
        )
    })?;
    Ok(Some(m.point))
}

/// Where the host's cgroup2 hierarchy is mounted (`/sys/fs/cgroup` on v2,
/// usually `/sys/fs/cgroup/unified` on a hybrid host), if it is.
pub fn cgroup2_mount_point() -> Option<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mountinfo
        .lines()
        .find_map(Cgroup2Mount::parse)
        .map(|m| m.point)
}

/// One cgroup2 line of mountinfo.
#[derive(Debug, PartialEq)]
struct Cgroup2Mount {
    point: PathBuf,
    flags: MsFlags,
    super_options: Vec<String>,
}

impl Cgroup2Mount {
    /// `id parent dev root point mount-options [optional...] - fstype source super-options`
    fn parse(line: &str) -> Option<Cgroup2Mount> {
        let (left, right) = line.split_once(" - ")?;
        let mut right = right.split(' ');
        if right.next()? != "cgroup2" {
            return None;
        }
        let super_options = right.nth(1)?.split(',').map(str::to_string).collect();
        let mut left = left.split(' ');
        let point = unescape(left.nth(4)?);
        let flags = left.next()?.split(',').fold(MsFlags::empty(), |f, o| {
            f | match o {
                "ro" => MsFlags::MS_RDONLY,
                "nosuid" => MsFlags::MS_NOSUID,
                "nodev" => MsFlags::MS_NODEV,
                "noexec" => MsFlags::MS_NOEXEC,
                "noatime" => MsFlags::MS_NOATIME,
                "nodiratime" => MsFlags::MS_NODIRATIME,
                "relatime" => MsFlags::MS_RELATIME,
                "strictatime" => MsFlags::MS_STRICTATIME,
                _ => MsFlags::empty(),
            }
        });
        Some(Cgroup2Mount {
            point: PathBuf::from(point),
            flags,
            super_options,
        })
    }
}

/// mountinfo writes space, tab, newline and backslash as octal escapes.
pub(crate) fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        let code = rest
            .get(i + 1..i + 4)
            .and_then(|o| u8::from_str_radix(o, 8).ok());
        match code {
            Some(c) => {
                out.push(c as char);
                rest = &rest[i + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[i + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_systemd_v2_mount_with_its_flags_and_options() {
        let line = "35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot";
        let m = Cgroup2Mount::parse(line).expect("a cgroup2 line");
        assert_eq!(m.point, PathBuf::from("/sys/fs/cgroup"));
        assert_eq!(
            m.flags,
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC | MsFlags::MS_RELATIME
        );
        assert_eq!(
            m.super_options,
            ["rw", "nsdelegate", "memory_recursiveprot"]
        );
    }

    #[test]
    fn reads_a_hybrid_unified_mount_and_skips_other_file_systems() {
        let cgroup1 = "40 30 0:35 / /sys/fs/cgroup/cpuset rw,nosuid - cgroup cgroup rw,cpuset";
        assert_eq!(Cgroup2Mount::parse(cgroup1), None);
        let unified = "31 30 0:27 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw";
        let m = Cgroup2Mount::parse(unified).expect("a cgroup2 line");
        assert_eq!(m.point, PathBuf::from("/sys/fs/cgroup/unified"));
        assert_eq!(m.super_options, ["rw"]);
    }

    #[test]
    fn unescapes_mount_points() {
        assert_eq!(unescape(r"/mnt/a\040b"), "/mnt/a b");
        assert_eq!(unescape(r"/plain"), "/plain");
        assert_eq!(unescape(r"/odd\x"), r"/odd\x");
    }
}

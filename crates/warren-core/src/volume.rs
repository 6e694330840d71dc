//! Volumes: named, persistent storage on a node, of a fixed size, mounted
//! into sandboxes at a path (read-write by one sandbox at a time, or
//! read-only by many: datasets, model caches). A volume outlives every
//! sandbox that used it until it is removed.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::units::ByteSize;

/// Smallest volume: room for the file system's own structures.
pub const MIN_VOLUME: u64 = 16 << 20;
/// Largest volume accepted (what is left is the node's disk to refuse).
pub const MAX_VOLUME: u64 = 1 << 50;
/// Volumes one sandbox may mount.
pub const MAX_MOUNTS: usize = 16;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VolumeError {
    #[error("volume name {0:?}: 1 to 63 lowercase letters, digits, `-`, `_` and `.`, starting with a letter or digit")]
    Name(String),
    #[error("mount path {0:?}: an absolute path without `.`, `..` or empty parts, not `/` and not under /proc, /sys or /dev")]
    Path(String),
    #[error("volume size {0} bytes: a volume holds at least 16M and at most 1P")]
    Size(u64),
    #[error("{0:?}: write a volume as NAME:/PATH or NAME:/PATH:ro")]
    Mount(String),
    #[error("two volumes are mounted at {0}")]
    PathTwice(String),
    #[error("volume {0} is mounted twice")]
    NameTwice(String),
    #[error("{0} volumes asked for; a sandbox mounts at most {MAX_MOUNTS}")]
    TooMany(usize),
}

/// A volume's name, unique on its node (and in a cluster).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, ToSchema)]
#[serde(try_from = "String", into = "String")]
#[schema(value_type = String)]
pub struct VolumeName(String);

impl TryFrom<String> for VolumeName {
    type Error = VolumeError;

    fn try_from(s: String) -> Result<Self, VolumeError> {
        let ok = (1..=63).contains(&s.len())
            && s.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
            && s.chars().all(|c| {
                c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_' | '.')
            });
        if ok {
            Ok(VolumeName(s))
        } else {
            Err(VolumeError::Name(s))
        }
    }
}

impl From<VolumeName> for String {
    fn from(n: VolumeName) -> String {
        n.0
    }
}

impl VolumeName {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for VolumeName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where a volume appears in a sandbox: an absolute, normal path outside
/// the kernel's and the device file systems.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(try_from = "String", into = "String")]
#[schema(value_type = String)]
pub struct MountPath(String);

impl TryFrom<String> for MountPath {
    type Error = VolumeError;

    fn try_from(s: String) -> Result<Self, VolumeError> {
        let trimmed = s.trim_end_matches('/');
        let normal = trimmed.starts_with('/')
            && trimmed.len() < 4096
            && !trimmed.contains('\0')
            && trimmed[1..]
                .split('/')
                .all(|part| !part.is_empty() && part != "." && part != "..");
        let first = trimmed.split('/').nth(1).unwrap_or("");
        if !normal || matches!(first, "proc" | "sys" | "dev") {
            return Err(VolumeError::Path(s));
        }
        Ok(MountPath(trimmed.to_string()))
    }
}

impl From<MountPath> for String {
    fn from(p: MountPath) -> String {
        p.0
    }
}

impl MountPath {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A volume mounted into a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VolumeMount {
    pub name: VolumeName,
    pub path: MountPath,
    /// Read-only: any number of sandboxes may mount it so at once; a
    /// read-write mount is the only one while it lasts.
    #[serde(default)]
    pub read_only: bool,
}

impl std::str::FromStr for VolumeMount {
    type Err = VolumeError;

    /// `NAME:/PATH` or `NAME:/PATH:ro` (`:rw` too), as `docker run -v`.
    fn from_str(s: &str) -> Result<Self, VolumeError> {
        let mut parts = s.splitn(3, ':');
        let (Some(name), Some(path)) = (parts.next(), parts.next()) else {
            return Err(VolumeError::Mount(s.to_string()));
        };
        let read_only = match parts.next() {
            None | Some("rw") => false,
            Some("ro") => true,
            Some(_) => return Err(VolumeError::Mount(s.to_string())),
        };
        Ok(VolumeMount {
            name: VolumeName::try_from(name.to_string())?,
            path: MountPath::try_from(path.to_string())?,
            read_only,
        })
    }
}

/// A sandbox's mounts, checked together: at most [`MAX_MOUNTS`], each path
/// and each volume once.
pub fn check_mounts(mounts: &[VolumeMount]) -> Result<(), VolumeError> {
    if mounts.len() > MAX_MOUNTS {
        return Err(VolumeError::TooMany(mounts.len()));
    }
    for (i, m) in mounts.iter().enumerate() {
        for other in &mounts[..i] {
            if other.path == m.path {
                return Err(VolumeError::PathTwice(m.path.0.clone()));
            }
            if other.name == m.name {
                return Err(VolumeError::NameTwice(m.name.0.clone()));
            }
        }
    }
    Ok(())
}

/// `POST /v1/volumes`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VolumeRequest {
    pub name: VolumeName,
    /// Its size (a file system of its own, so bytes and files are bounded).
    pub size: VolumeSize,
    /// In a cluster, labels the node it is made on must carry.
    #[serde(default, skip_serializing_if = "crate::Labels::is_empty")]
    pub node_selector: crate::Labels,
}

/// A volume's size, within [`MIN_VOLUME`] and [`MAX_VOLUME`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(try_from = "ByteSize", into = "ByteSize")]
#[schema(value_type = String)]
pub struct VolumeSize(u64);

impl TryFrom<ByteSize> for VolumeSize {
    type Error = VolumeError;

    fn try_from(b: ByteSize) -> Result<Self, VolumeError> {
        if (MIN_VOLUME..=MAX_VOLUME).contains(&b.0) {
            Ok(VolumeSize(b.0))
        } else {
            Err(VolumeError::Size(b.0))
        }
    }
}

impl From<VolumeSize> for ByteSize {
    fn from(s: VolumeSize) -> ByteSize {
        ByteSize(s.0)
    }
}

impl VolumeSize {
    pub fn bytes(self) -> u64 {
        self.0
    }
}

/// A volume as a node (and the API) shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct VolumeInfo {
    pub name: VolumeName,
    /// Bytes it holds at most.
    pub size: u64,
    /// Bytes its files take now.
    pub used: u64,
    /// The node it lives on.
    #[serde(default)]
    pub node: String,
    pub created_at: String,
    /// Live sandboxes mounting it now.
    #[serde(default)]
    pub mounted_by: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mounts_are_written_as_docker_writes_them() {
        let m: VolumeMount = "data:/mnt/data:ro".parse().expect("ro");
        assert_eq!(
            (m.name.as_str(), m.path.as_str(), m.read_only),
            ("data", "/mnt/data", true)
        );
        let m: VolumeMount = "cache-1:/root/.cache/".parse().expect("rw");
        assert_eq!((m.path.as_str(), m.read_only), ("/root/.cache", false));
        for bad in [
            "data",
            "Data:/x",
            "data:x",
            "data:/",
            "data:/proc/x",
            "data:/a/../etc",
            "data:/a//b",
            "data:/x:rx",
            "-a:/x",
        ] {
            assert!(bad.parse::<VolumeMount>().is_err(), "{bad}");
        }
        let two = |a: &str, b: &str| check_mounts(&[a.parse().unwrap(), b.parse().unwrap()]);
        assert_eq!(
            two("a:/x", "b:/x"),
            Err(VolumeError::PathTwice("/x".into()))
        );
        assert_eq!(two("a:/x", "a:/y"), Err(VolumeError::NameTwice("a".into())));
        assert!(two("a:/x", "b:/x/y").is_ok());
    }

    #[test]
    fn sizes_and_names_are_checked_when_read() {
        let ok: VolumeRequest =
            serde_json::from_str(r#"{"name":"ds","size":"1G"}"#).expect("request");
        assert_eq!(ok.size.bytes(), 1 << 30);
        assert!(serde_json::from_str::<VolumeRequest>(r#"{"name":"ds","size":"1M"}"#).is_err());
        assert!(serde_json::from_str::<VolumeRequest>(r#"{"name":"a b","size":"1G"}"#).is_err());
    }
}

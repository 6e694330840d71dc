//! The cgroup every sandbox of a node lives below (`warren` unless told
//! otherwise), relative to each hierarchy's root.
//!
//! Two nodes on one host (a test suite's daemons, two Warrens lending
//! shares of one machine) each take a parent of their own, so each sees,
//! caps and cleans only its own sandboxes' cgroups. The home remembers its
//! parent: a node restarted with another one would no longer find the
//! cgroups of the sandboxes it takes over, so that start is refused.

use std::path::Path;

/// The parent a node takes when told none: shared by every such node on
/// the host, so it is never removed.
pub const DEFAULT: &str = warren_core::RESOURCE_PREFIX;

/// The file under the home that records the parent its sandboxes use.
const FILE: &str = "cgroup-parent";

/// A valid cgroup parent: one or more `/`-separated names of ASCII
/// letters, digits, `.`, `_` and `-` (no `.` or `..` names), at most 200
/// bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupParent(String);

#[derive(Debug, thiserror::Error)]
pub enum CgroupParentError {
    #[error(
        "invalid cgroup parent {0:?}: use names of letters, digits, '.', '_' and '-' joined by '/', such as warren or warren/ci-7"
    )]
    Invalid(String),
    #[error(
        "this home's sandboxes live below the cgroup {recorded:?}, not {requested:?}: start with --cgroup-parent {recorded}, or use a new home"
    )]
    Mismatch { recorded: String, requested: String },
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: String,
        source: std::io::Error,
    },
}

impl std::str::FromStr for CgroupParent {
    type Err = CgroupParentError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let trimmed = s.trim_matches('/');
        let name_ok = |n: &str| {
            !n.is_empty()
                && n != "."
                && n != ".."
                && n.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        };
        if trimmed.len() > 200 || !trimmed.split('/').all(name_ok) {
            return Err(CgroupParentError::Invalid(s.to_string()));
        }
        Ok(CgroupParent(trimmed.to_string()))
    }
}

impl Default for CgroupParent {
    fn default() -> Self {
        CgroupParent(DEFAULT.to_string())
    }
}

impl std::fmt::Display for CgroupParent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl CgroupParent {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether this is the parent every node told none shares.
    pub fn is_default(&self) -> bool {
        self.0 == DEFAULT
    }

    /// The parent of the node whose home is `home`: the one it recorded
    /// (a `requested` other than it is refused), or `requested` (else the
    /// default), recorded for the next start.
    pub fn for_home(
        home: &Path,
        requested: Option<CgroupParent>,
    ) -> Result<CgroupParent, CgroupParentError> {
        let path = home.join(FILE);
        let io = |what, source| CgroupParentError::Io {
            what,
            path: path.display().to_string(),
            source,
        };
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                let recorded: CgroupParent = text.trim().parse()?;
                match requested {
                    Some(r) if r != recorded => Err(CgroupParentError::Mismatch {
                        recorded: recorded.0,
                        requested: r.0,
                    }),
                    _ => Ok(recorded),
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let parent = requested.unwrap_or_default();
                std::fs::write(&path, format!("{}\n", parent.0)).map_err(|e| io("write", e))?;
                Ok(parent)
            }
            Err(e) => Err(io("read", e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_safe_characters_joined_by_slashes_are_parents() {
        for ok in ["warren", "warren/ci-7", "/a.b/c_d/", "x"] {
            let p: CgroupParent = ok.parse().unwrap();
            assert_eq!(p.as_str(), ok.trim_matches('/'));
        }
        for bad in [
            "",
            "/",
            "a//b",
            "..",
            "a/../b",
            "a/./b",
            "a b",
            "a\nb",
            "é",
            &"x".repeat(201),
        ] {
            assert!(bad.parse::<CgroupParent>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_home_keeps_the_parent_it_started_with() {
        let home = tempfile::tempdir().unwrap();
        let ci: CgroupParent = "warren/ci".parse().unwrap();
        assert_eq!(
            CgroupParent::for_home(home.path(), Some(ci.clone())).unwrap(),
            ci
        );
        // Told nothing, it takes the recorded one; told the same, too.
        assert_eq!(CgroupParent::for_home(home.path(), None).unwrap(), ci);
        assert_eq!(
            CgroupParent::for_home(home.path(), Some(ci.clone())).unwrap(),
            ci
        );
        let other = CgroupParent::default();
        let e = CgroupParent::for_home(home.path(), Some(other)).unwrap_err();
        assert!(e.to_string().contains("--cgroup-parent warren/ci"), "{e}");
        // A new home told nothing takes (and records) the default.
        let fresh = tempfile::tempdir().unwrap();
        assert!(CgroupParent::for_home(fresh.path(), None)
            .unwrap()
            .is_default());
        assert!(CgroupParent::for_home(fresh.path(), None)
            .unwrap()
            .is_default());
    }
}

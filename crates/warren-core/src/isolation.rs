//! Isolation classes: what stands between a sandbox's code and the host.
//!
//! `container` shares the host kernel behind namespaces, a seccomp filter
//! and dropped capabilities (Warren's own set-up). `gvisor` runs the
//! sandbox on gVisor's user-space kernel (`runsc`), so a kernel bug
//! reachable through an allowed syscall reaches the sentry, not the host.
//! A node offers the classes it can run (see `warren doctor`); a spec that
//! names none gets its node's default.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Default,
    Serialize,
    Deserialize,
    ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Isolation {
    /// Namespaces, cgroups, seccomp and dropped capabilities on the host's
    /// kernel.
    #[default]
    Container,
    /// gVisor's `runsc`: the sandbox's system calls are served by a
    /// user-space kernel.
    Gvisor,
}

impl Isolation {
    pub const ALL: [Isolation; 2] = [Isolation::Container, Isolation::Gvisor];

    pub fn as_str(self) -> &'static str {
        match self {
            Isolation::Container => "container",
            Isolation::Gvisor => "gvisor",
        }
    }

    /// The classes a node runs, as it lists them (`NodeInfo.isolation`, its
    /// default first): an empty list, from a node older than classes, is
    /// `container` alone.
    pub fn offered(classes: &[Isolation]) -> &[Isolation] {
        if classes.is_empty() {
            &[Isolation::Container]
        } else {
            classes
        }
    }

    /// Whether a node listing `classes` runs this class.
    pub fn offered_by(self, classes: &[Isolation]) -> bool {
        Isolation::offered(classes).contains(&self)
    }

    /// The class a node listing `classes` gives a sandbox that names none.
    pub fn default_of(classes: &[Isolation]) -> Isolation {
        Isolation::offered(classes)[0]
    }

    /// How a node comes to offer this class (said with a create that no
    /// node can take).
    pub fn how_offered(self) -> &'static str {
        match self {
            Isolation::Container => "`warren node ls` lists the classes each node runs",
            Isolation::Gvisor => {
                "a node offers it when it finds runsc (on PATH, or `--runsc PATH`); `warren doctor` on the node says what it found"
            }
        }
    }
}

impl std::fmt::Display for Isolation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown isolation class {0:?}: expected container or gvisor")]
pub struct UnknownIsolation(pub String);

impl std::str::FromStr for Isolation {
    type Err = UnknownIsolation;
    fn from_str(s: &str) -> Result<Self, UnknownIsolation> {
        Isolation::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| UnknownIsolation(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_each_class() {
        for class in Isolation::ALL {
            assert_eq!(class.as_str().parse::<Isolation>(), Ok(class));
            assert_eq!(
                serde_json::to_string(&class).unwrap(),
                format!("\"{class}\"")
            );
        }
    }

    #[test]
    fn a_node_that_lists_no_class_runs_containers_alone() {
        use Isolation::*;
        assert_eq!(Isolation::offered(&[]), &[Container]);
        assert!(Container.offered_by(&[]) && !Gvisor.offered_by(&[]));
        assert!(Gvisor.offered_by(&[Container, Gvisor]));
        assert!(!Container.offered_by(&[Gvisor]));
        assert_eq!(Isolation::default_of(&[]), Container);
        assert_eq!(Isolation::default_of(&[Gvisor, Container]), Gvisor);
    }

    #[test]
    fn refuses_an_unknown_class_by_name() {
        let err = "kata".parse::<Isolation>().unwrap_err();
        assert!(err.to_string().contains("container or gvisor"), "{err}");
        assert!(serde_json::from_str::<Isolation>("\"runc\"").is_err());
    }
}

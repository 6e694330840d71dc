//! What an image reference names, as far as a client or the control plane
//! needs to know before any image store is asked.

/// The registry host of `reference` when its first component names one
/// (has a `.` or `:`, or is `localhost`), as Docker decides. `busybox:latest`
/// and `team/app` are local names; `127.0.0.1:5000/app` and `ghcr.io/o/app`
/// are registry references.
pub fn registry_host(reference: &str) -> Option<&str> {
    let (first, rest) = reference.split_once('/')?;
    if rest.is_empty() {
        return None;
    }
    (first == "localhost" || first.contains('.') || first.contains(':')).then_some(first)
}

/// The name `name` is kept under: with `:latest` when it has no tag (a
/// `:` after its last `/`) and no digest, as every image store writes it,
/// so `app` and `app:latest` are one name to whoever owns them.
pub fn with_tag(name: &str) -> String {
    let last = name.rsplit('/').next().unwrap_or(name);
    if name.contains('@') || last.contains(':') {
        name.to_string()
    } else {
        format!("{name}:latest")
    }
}

/// A short name (no registry in it) written out in full on `registry`, as
/// Docker and podman do: on docker.io a one-component repository is under
/// `library/` (`debian:bookworm` is `docker.io/library/debian:bookworm`).
pub fn qualify(short: &str, registry: &str) -> String {
    let repo = short.split(['@', ':']).next().unwrap_or(short);
    if registry == "docker.io" && !repo.contains('/') {
        format!("{registry}/library/{short}")
    } else {
        format!("{registry}/{short}")
    }
}

/// A registry reference pinned to `digest` (`host/repo@sha256:…`), so every
/// node pulls exactly that image whatever the tag points at later; None for
/// a local name (each node resolves it in its own store).
pub fn pinned(reference: &str, digest: &str) -> Option<String> {
    let host = registry_host(reference)?;
    let path = &reference[host.len()..];
    let path = path.split_once('@').map_or(path, |(p, _)| p);
    // A tag is a `:` after the last `/` (a port sits in the host).
    let path = match path.rsplit_once('/') {
        Some((dir, last)) => match last.split_once(':') {
            Some((name, _)) => &path[..dir.len() + 1 + name.len()],
            None => path,
        },
        None => path,
    };
    Some(format!("{host}{path}@{digest}"))
}

/// Where a cluster publishes the images built, committed or imported in
/// it (`warren server --cluster-registry HOST[:PORT][/PATH]`): a registry
/// every node reaches, so an image made on one node can be pulled by digest
/// on any other. Local names are published below it (`demo:1` as
/// `HOST[:PORT]/PATH/demo:1`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterRegistry(String);

/// Why `--cluster-registry` names no registry to publish below.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClusterRegistryError {
    /// Its host would make the references below it read as local names.
    #[error("{0:?} is not a registry: give HOST[:PORT][/PATH] whose host has a `.` or a port, or is localhost (e.g. registry.internal:5000/warren)")]
    Host(String),
    #[error("{0:?} is not a repository path: lowercase letters, digits, `.`, `_` and `-` between slashes")]
    Path(String),
}

impl std::str::FromStr for ClusterRegistry {
    type Err = ClusterRegistryError;

    fn from_str(s: &str) -> Result<Self, ClusterRegistryError> {
        let s = s.trim().trim_end_matches('/');
        let (host, path) = s.split_once('/').unwrap_or((s, ""));
        // Without a `.`, `:` or `localhost` the references made below it
        // would read as local names (see `registry_host`).
        let host_ok = !host.is_empty()
            && (host == "localhost" || host.contains('.') || host.contains(':'))
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | ':' | '-' | '[' | ']'));
        if !host_ok {
            return Err(ClusterRegistryError::Host(s.to_string()));
        }
        let path_ok = path.is_empty()
            || path.split('/').all(|c| {
                !c.is_empty()
                    && c.chars().all(|ch| {
                        ch.is_ascii_lowercase()
                            || ch.is_ascii_digit()
                            || matches!(ch, '.' | '_' | '-')
                    })
            });
        if !path_ok {
            return Err(ClusterRegistryError::Path(path.to_string()));
        }
        Ok(ClusterRegistry(s.to_string()))
    }
}

impl std::fmt::Display for ClusterRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl ClusterRegistry {
    /// Where the local name `name` is published; None for what is not a
    /// local name (a registry reference every node pulls already, a bare
    /// digest that names no repository).
    pub fn reference(&self, name: &str) -> Option<String> {
        if registry_host(name).is_some() || name.starts_with("sha256:") || name.is_empty() {
            return None;
        }
        Some(format!("{}/{name}", self.0))
    }

    /// The published `name` pinned to `digest`: what a node that lacks the
    /// image pulls.
    pub fn pinned(&self, name: &str, digest: &str) -> Option<String> {
        pinned(&self.reference(name)?, digest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_without_a_tag_is_kept_as_latest() {
        assert_eq!(with_tag("app"), "app:latest");
        assert_eq!(with_tag("team/app:1"), "team/app:1");
        assert_eq!(with_tag("127.0.0.1:5000/app"), "127.0.0.1:5000/app:latest");
        assert_eq!(with_tag("r.io/app@sha256:ab"), "r.io/app@sha256:ab");
    }

    #[test]
    fn a_cluster_registry_publishes_local_names_below_it() {
        let reg: ClusterRegistry = "127.0.0.1:5000/warren/".parse().unwrap();
        assert_eq!(reg.to_string(), "127.0.0.1:5000/warren");
        assert_eq!(
            reg.reference("demo:1").as_deref(),
            Some("127.0.0.1:5000/warren/demo:1")
        );
        assert_eq!(
            reg.pinned("e2b-template/x:v2@sha256:00", "sha256:ab")
                .as_deref(),
            Some("127.0.0.1:5000/warren/e2b-template/x@sha256:ab")
        );
        assert_eq!(reg.reference("ghcr.io/o/app:v1"), None);
        assert_eq!(reg.reference("sha256:ab"), None);
        let bare: ClusterRegistry = "localhost".parse().unwrap();
        assert_eq!(bare.reference("a").as_deref(), Some("localhost/a"));
        for bad in [
            "",
            "registry",
            "reg.internal/Warren",
            "reg.internal//x",
            "a b.c",
        ] {
            assert!(bad.parse::<ClusterRegistry>().is_err(), "{bad:?}");
        }
        assert_eq!(
            "reg.internal/Warren".parse::<ClusterRegistry>(),
            Err(ClusterRegistryError::Path("Warren".into()))
        );
    }

    #[test]
    fn pinning_drops_the_tag_and_keeps_the_port() {
        let d = "sha256:ab";
        assert_eq!(
            pinned("127.0.0.1:5000/team/app:v1", d).as_deref(),
            Some("127.0.0.1:5000/team/app@sha256:ab")
        );
        assert_eq!(
            pinned("ghcr.io/o/app", d).as_deref(),
            Some("ghcr.io/o/app@sha256:ab")
        );
        assert_eq!(
            pinned("localhost/app@sha256:00", d).as_deref(),
            Some("localhost/app@sha256:ab")
        );
        assert_eq!(pinned("busybox:latest", d), None);
    }

    #[test]
    fn short_names_are_written_out_as_docker_does() {
        assert_eq!(
            qualify("debian:bookworm", "docker.io"),
            "docker.io/library/debian:bookworm"
        );
        assert_eq!(qualify("debian", "docker.io"), "docker.io/library/debian");
        assert_eq!(qualify("team/app:v1", "docker.io"), "docker.io/team/app:v1");
        assert_eq!(qualify("app:v1", "quay.io"), "quay.io/app:v1");
        let pinned = format!("debian@sha256:{}", "ab".repeat(32));
        assert_eq!(
            qualify(&pinned, "docker.io"),
            format!("docker.io/library/{pinned}")
        );
        assert_eq!(
            registry_host(&qualify("debian", "127.0.0.1:5000")),
            Some("127.0.0.1:5000")
        );
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

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

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

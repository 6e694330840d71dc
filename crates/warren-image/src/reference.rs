//! Image names (`repo:tag`) and references (name or manifest digest).

use crate::error::ImageError;

/// Shortest digest prefix accepted, so that a reference is unlikely to be
/// ambiguous by accident.
pub(crate) const MIN_DIGEST_PREFIX: usize = 12;

const MAX_NAME_LEN: usize = 255;
const MAX_TAG_LEN: usize = 128;

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Reference {
    /// A normalised `repo:tag`.
    Name(String),
    /// `sha256:<hex or prefix>`: the hex part.
    Digest(String),
    /// A bare hex string of at least 12 chars: a name if one exists, else a
    /// digest prefix (like `docker run 3f4e5a6b7c8d`). Also `repo@sha256:…`:
    /// the record of that name, else the image of that digest.
    NameOrDigest(String, String),
}

/// Validates a `repo[:tag]` name and adds `:latest` when there is no tag.
/// A colon after the last slash starts the tag, so `host:5000/app` is a
/// repository on a registry port, not a tag.
pub(crate) fn normalize_name(name: &str) -> Result<String, ImageError> {
    let bad = |reason: &str| ImageError::InvalidReference {
        reference: name.to_string(),
        reason: reason.to_string(),
    };
    if name.is_empty() {
        return Err(bad("the name is empty; use repo:tag, e.g. python:3.12"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(bad("the name is longer than 255 bytes"));
    }
    if let Some((repo, digest)) = name.split_once('@') {
        // A pulled `registry/repo@sha256:<hex>` is stored under that name;
        // anything shorter than a full digest would not pin the content.
        if crate::digest::sha256_hex(digest).is_none() {
            return Err(bad(
                "a digest reference needs repo@sha256:<64 lowercase hex digits>; use repo:tag \
                 or the full digest",
            ));
        }
        // `repo:tag@digest` means the digest: the tag is only a hint.
        let repo = normalize_name(repo)?;
        let repo = repo.rsplit_once(':').map_or(repo.as_str(), |(r, _)| r);
        return Ok(format!("{repo}@{digest}"));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/' | ':')))
    {
        return Err(bad(&format!(
            "character {c:?} is not allowed; names use letters, digits and . _ - / :"
        )));
    }
    let last_slash = name.rfind('/');
    let (repo, tag) = match name.rfind(':') {
        Some(colon) if last_slash.is_none_or(|slash| colon > slash) => {
            (&name[..colon], &name[colon + 1..])
        }
        _ => (name, "latest"),
    };
    if repo.is_empty() || repo.split('/').any(str::is_empty) {
        return Err(bad("the repository part has an empty path component"));
    }
    if repo.split('/').any(|c| c == "." || c == "..") {
        return Err(bad(
            "the repository part may not contain . or .. components",
        ));
    }
    if repo == "sha256" {
        return Err(bad(
            "a repository named sha256 would be confused with a digest reference",
        ));
    }
    let tag_ok = !tag.is_empty()
        && tag.len() <= MAX_TAG_LEN
        && !tag.starts_with(['.', '-'])
        && tag
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if !tag_ok {
        return Err(bad(
            "the tag must be 1-128 letters, digits, . _ or -, not starting with . or -",
        ));
    }
    Ok(format!("{repo}:{tag}"))
}

/// Parses what a caller may use to name an image.
pub(crate) fn parse_reference(reference: &str) -> Result<Reference, ImageError> {
    if let Some(hex) = reference.strip_prefix("sha256:") {
        if !is_hex_prefix(hex) {
            return Err(ImageError::InvalidReference {
                reference: reference.to_string(),
                reason: format!(
                    "a digest reference needs {MIN_DIGEST_PREFIX} to 64 lowercase hex digits \
                     after sha256:"
                ),
            });
        }
        return Ok(Reference::Digest(hex.to_string()));
    }
    let name = normalize_name(reference)?;
    // `repo@sha256:<hex>`: the record pulled under that name, else the
    // image of that digest under any name (the content is what it pins).
    if let Some((_, digest)) = name.split_once('@') {
        if let Some(hex) = crate::digest::sha256_hex(digest) {
            return Ok(Reference::NameOrDigest(name.clone(), hex.to_string()));
        }
    }
    if is_hex_prefix(reference) {
        return Ok(Reference::NameOrDigest(name, reference.to_string()));
    }
    Ok(Reference::Name(name))
}

fn is_hex_prefix(s: &str) -> bool {
    (MIN_DIGEST_PREFIX..=64).contains(&s.len())
        && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// File-name-safe form of a normalised name: bytes outside `[A-Za-z0-9._-]`
/// become `%XX`, so `/` and `:` can never create paths or clash.
pub(crate) fn escape_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 8);
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_get_a_default_tag() {
        assert_eq!(normalize_name("alpine").unwrap(), "alpine:latest");
        assert_eq!(normalize_name("alpine:3.20").unwrap(), "alpine:3.20");
        assert_eq!(
            normalize_name("localhost:5000/team/app").unwrap(),
            "localhost:5000/team/app:latest"
        );
        assert_eq!(
            normalize_name("localhost:5000/app:v1").unwrap(),
            "localhost:5000/app:v1"
        );
        let hex = "ab".repeat(32);
        assert_eq!(
            normalize_name(&format!("localhost:5000/app@sha256:{hex}")).unwrap(),
            format!("localhost:5000/app@sha256:{hex}")
        );
        assert_eq!(
            normalize_name(&format!("localhost:5000/app:v1@sha256:{hex}")).unwrap(),
            format!("localhost:5000/app@sha256:{hex}")
        );
    }

    #[test]
    fn bad_names_are_refused() {
        for bad in [
            "",
            "a b",
            "repo@sha256:abc",
            "repo@sha512:abc",
            "@sha256:0000000000000000000000000000000000000000000000000000000000000000",
            "repo:",
            "repo:-x",
            ":tag",
            "a//b",
            "../x",
            "sha256:abc",
            "x\n",
            &"a".repeat(300),
        ] {
            let err = normalize_name(bad).unwrap_err();
            assert!(
                matches!(err, ImageError::InvalidReference { .. }),
                "{bad:?}: {err}"
            );
        }
    }

    #[test]
    fn references() {
        let hex = "0123456789abcdef".repeat(4);
        assert_eq!(
            parse_reference(&format!("sha256:{hex}")).unwrap(),
            Reference::Digest(hex.clone())
        );
        assert_eq!(
            parse_reference("sha256:0123456789ab").unwrap(),
            Reference::Digest("0123456789ab".into())
        );
        assert!(parse_reference("sha256:0123").is_err());
        assert!(parse_reference("sha256:XYZ456789abc").is_err());
        assert_eq!(
            parse_reference("busybox").unwrap(),
            Reference::Name("busybox:latest".into())
        );
        assert_eq!(
            parse_reference("0123456789ab").unwrap(),
            Reference::NameOrDigest("0123456789ab:latest".into(), "0123456789ab".into())
        );
        let hex = "ab".repeat(32);
        assert_eq!(
            parse_reference(&format!("team/app:v1@sha256:{hex}")).unwrap(),
            Reference::NameOrDigest(format!("team/app@sha256:{hex}"), hex.clone())
        );
    }

    #[test]
    fn escaping_is_injective_and_path_free() {
        let a = escape_name("a/b:c");
        let b = escape_name("a:b/c");
        assert_ne!(a, b);
        assert!(!a.contains('/') && !a.contains(':'));
        assert_eq!(escape_name("x%y"), "x%25y");
        assert_eq!(
            escape_name("library/alpine:3.20"),
            "library%2Falpine%3A3.20"
        );
    }
}

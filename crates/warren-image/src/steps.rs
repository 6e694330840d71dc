//! Build steps' results: images the step cache keeps, named
//! `warren-build-step:<key>` (the key a sha256 of what the step depends
//! on). They are records like any other image — found by name or digest,
//! their layers kept from collection — but not listed, and pruned first:
//! a build makes them again.

const REPOSITORY: &str = "warren-build-step";

/// The name a build step's result is kept under; None unless `key` is 64
/// lowercase hex digits.
pub fn step_name(key: &str) -> Option<String> {
    (key.len() == 64 && key.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
        .then(|| format!("{REPOSITORY}:{key}"))
}

/// Whether an image name (with or without its tag) is a build step's.
pub fn is_step_name(name: &str) -> bool {
    name.split([':', '@']).next() == Some(REPOSITORY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_names_take_a_sha256_key() {
        let key = "a".repeat(64);
        let name = step_name(&key).unwrap();
        assert!(is_step_name(&name));
        assert_eq!(crate::reference::normalize_name(&name).unwrap(), name);
        assert_eq!(step_name("abc"), None);
        assert_eq!(step_name(&"A".repeat(64)), None);
        assert!(!is_step_name("python:3.12"));
        assert!(!is_step_name("warren-build-step/x:1"));
        assert!(is_step_name("warren-build-step"));
    }
}

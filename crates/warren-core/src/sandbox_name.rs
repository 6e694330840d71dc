//! A sandbox's name (`warren create --name`, as `docker run --name`):
//! unique among live sandboxes, and taken wherever an id is
//! (`/v1/sandboxes/{id or name}/...`, so every CLI command and the SDK).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// What every sandbox id starts with; a name may not, so the two are never
/// confused.
pub const ID_PREFIX: &str = "sbx-";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("sandbox name {0:?}: 1 to 63 letters, digits, `-`, `_` and `.`, starting with a letter or digit, and not starting with `sbx-` (ids do)")]
pub struct NameError(pub String);

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(try_from = "String", into = "String")]
#[schema(value_type = String)]
pub struct SandboxName(String);

impl TryFrom<String> for SandboxName {
    type Error = NameError;

    fn try_from(s: String) -> Result<Self, NameError> {
        let ok = (1..=63).contains(&s.len())
            && s.starts_with(|c: char| c.is_ascii_alphanumeric())
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            && !s.starts_with(ID_PREFIX);
        if ok {
            Ok(SandboxName(s))
        } else {
            Err(NameError(s))
        }
    }
}

impl From<SandboxName> for String {
    fn from(n: SandboxName) -> String {
        n.0
    }
}

impl std::str::FromStr for SandboxName {
    type Err = NameError;

    fn from_str(s: &str) -> Result<Self, NameError> {
        SandboxName::try_from(s.to_string())
    }
}

impl SandboxName {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for SandboxName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_never_ids() {
        for ok in ["web", "job-1.2_a", "A"] {
            assert!(ok.parse::<SandboxName>().is_ok(), "{ok}");
        }
        for bad in ["", "sbx-abc", "-a", "a b", "a/b", &"x".repeat(64)] {
            assert!(bad.parse::<SandboxName>().is_err(), "{bad}");
        }
    }
}

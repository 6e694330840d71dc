//! Secrets: named values (API keys, tokens) kept encrypted by the control
//! plane and given to the sandboxes that name them, as an environment
//! variable or as a file under `/run/secrets` (a memory file system of the
//! sandbox's own, so a commit, a fork's layer or the node's disk never hold
//! it). No read API returns a value; a sandbox's spec holds only the names.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The directory secret files appear in.
pub const SECRETS_DIR: &str = "/run/secrets";
/// The largest value a secret holds.
pub const MAX_VALUE: usize = 64 << 10;
/// Secrets one sandbox may name.
pub const MAX_PER_SANDBOX: usize = 64;
/// Bytes of values one sandbox may be given in all (they travel to its
/// node and its init in bounded frames, and live in its memory).
pub const MAX_PER_SANDBOX_BYTES: usize = 128 << 10;
/// Metadata limits (E2B's): entries, key and value bytes, total bytes.
pub const MAX_METADATA_ENTRIES: usize = 32;
pub const MAX_METADATA_KEY: usize = 128;
pub const MAX_METADATA_VALUE: usize = 1024;
pub const MAX_METADATA_TOTAL: usize = 8192;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("secret name {0:?}: 1 to 128 letters, digits, `-` and `_` (stored in lower case), not starting with `sec_`")]
    Name(String),
    #[error("a secret's value holds at most {MAX_VALUE} bytes, got {0}")]
    ValueSize(usize),
    #[error("secret metadata: at most {MAX_METADATA_ENTRIES} entries, keys of 1 to {MAX_METADATA_KEY} bytes, values of at most {MAX_METADATA_VALUE} bytes, {MAX_METADATA_TOTAL} bytes in all")]
    Metadata,
    #[error("environment variable {0:?} for a secret: letters, digits and `_`, not starting with a digit")]
    Env(String),
    #[error("secret file {0:?}: a file name (letters, digits, `-`, `_`, `.`) under {SECRETS_DIR}")]
    File(String),
    #[error("{0:?}: write a secret as NAME, NAME,env=VAR or NAME,target=FILE")]
    Shape(String),
    #[error("{0} secrets named; a sandbox takes at most {MAX_PER_SANDBOX}")]
    TooMany(usize),
    #[error("two secrets are given as {0}")]
    SameTarget(String),
}

/// A secret's name: unique, compared and stored in lower case.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, ToSchema)]
#[serde(try_from = "String", into = "String")]
#[schema(value_type = String)]
pub struct SecretName(String);

impl TryFrom<String> for SecretName {
    type Error = SecretError;

    fn try_from(s: String) -> Result<Self, SecretError> {
        let lower = s.to_ascii_lowercase();
        let ok = (1..=128).contains(&lower.len())
            && lower
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_'))
            && !lower.starts_with("sec_");
        if ok {
            Ok(SecretName(lower))
        } else {
            Err(SecretError::Name(s))
        }
    }
}

impl From<SecretName> for String {
    fn from(n: SecretName) -> String {
        n.0
    }
}

impl SecretName {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for SecretName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A secret's value: bounded, and never shown (`Debug` hides it).
#[derive(Clone, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(try_from = "String")]
#[schema(value_type = String)]
pub struct SecretValue(String);

impl TryFrom<String> for SecretValue {
    type Error = SecretError;

    fn try_from(s: String) -> Result<Self, SecretError> {
        if s.len() > MAX_VALUE {
            return Err(SecretError::ValueSize(s.len()));
        }
        Ok(SecretValue(s))
    }
}

impl SecretValue {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretValue(…)")
    }
}

/// Free text about a secret (who owns it, where it came from), within
/// E2B's limits.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(
    try_from = "BTreeMap<String, String>",
    into = "BTreeMap<String, String>"
)]
#[schema(value_type = BTreeMap<String, String>)]
pub struct SecretMetadata(BTreeMap<String, String>);

impl TryFrom<BTreeMap<String, String>> for SecretMetadata {
    type Error = SecretError;

    fn try_from(m: BTreeMap<String, String>) -> Result<Self, SecretError> {
        let total: usize = m.iter().map(|(k, v)| k.len() + v.len()).sum();
        let ok = m.len() <= MAX_METADATA_ENTRIES
            && total <= MAX_METADATA_TOTAL
            && m.iter().all(|(k, v)| {
                (1..=MAX_METADATA_KEY).contains(&k.len()) && v.len() <= MAX_METADATA_VALUE
            });
        if ok {
            Ok(SecretMetadata(m))
        } else {
            Err(SecretError::Metadata)
        }
    }
}

impl From<SecretMetadata> for BTreeMap<String, String> {
    fn from(m: SecretMetadata) -> Self {
        m.0
    }
}

/// `POST /v1/secrets` (and `PUT /v1/secrets/{name}`, where `name` is the
/// path's).
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SecretRequest {
    pub name: SecretName,
    pub value: SecretValue,
    #[serde(default)]
    pub metadata: Option<SecretMetadata>,
}

/// A secret as every read shows it: never its value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SecretInfo {
    pub name: SecretName,
    /// `sec_` and 24 hex digits.
    pub id: String,
    /// 1 when made, one more at each update.
    pub version: i64,
    pub metadata: SecretMetadata,
    pub created_at: String,
    pub updated_at: String,
}

/// How a sandbox gets a secret: as an environment variable, or as a file
/// under [`SECRETS_DIR`] (the default: `/run/secrets/NAME`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SecretRef {
    pub name: SecretName,
    /// The environment variable that holds the value in every process of
    /// the sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<EnvName>,
    /// The file's name under /run/secrets, or its full path there (when
    /// `env` is not given, `/run/secrets/NAME`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<SecretFile>,
}

impl SecretRef {
    /// Where the value goes.
    pub fn delivery(&self) -> Delivery {
        match (&self.env, &self.target) {
            (Some(env), _) => Delivery::Env(env.clone()),
            (None, Some(file)) => Delivery::File(file.clone()),
            (None, None) => Delivery::File(SecretFile(self.name.0.clone())),
        }
    }
}

impl std::str::FromStr for SecretRef {
    type Err = SecretError;

    /// `NAME`, `NAME,env=VAR` or `NAME,target=FILE` (as `docker run
    /// --secret` and BuildKit write it).
    fn from_str(s: &str) -> Result<Self, SecretError> {
        let mut parts = s.split(',');
        let name = SecretName::try_from(parts.next().unwrap_or_default().to_string())?;
        let (mut env, mut target) = (None, None);
        for part in parts {
            match part.split_once('=') {
                Some(("env", v)) if env.is_none() => env = Some(EnvName::try_from(v.to_string())?),
                Some(("target", v)) if target.is_none() => {
                    target = Some(SecretFile::try_from(v.to_string())?)
                }
                _ => return Err(SecretError::Shape(s.to_string())),
            }
        }
        if env.is_some() && target.is_some() {
            return Err(SecretError::Shape(s.to_string()));
        }
        Ok(SecretRef { name, env, target })
    }
}

/// Where one secret goes in a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Delivery {
    Env(EnvName),
    File(SecretFile),
}

/// An environment variable's name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, ToSchema)]
#[serde(try_from = "String", into = "String")]
#[schema(value_type = String)]
pub struct EnvName(String);

impl TryFrom<String> for EnvName {
    type Error = SecretError;

    fn try_from(s: String) -> Result<Self, SecretError> {
        let ok = !s.is_empty()
            && s.len() <= 256
            && !s.starts_with(|c: char| c.is_ascii_digit())
            && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if ok {
            Ok(EnvName(s))
        } else {
            Err(SecretError::Env(s))
        }
    }
}

impl From<EnvName> for String {
    fn from(n: EnvName) -> String {
        n.0
    }
}

impl EnvName {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A file's name directly under [`SECRETS_DIR`] (a full path there is
/// accepted and kept as the name).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(try_from = "String", into = "String")]
#[schema(value_type = String)]
pub struct SecretFile(String);

impl TryFrom<String> for SecretFile {
    type Error = SecretError;

    fn try_from(s: String) -> Result<Self, SecretError> {
        let name = s
            .strip_prefix(SECRETS_DIR)
            .and_then(|rest| rest.strip_prefix('/'))
            .unwrap_or(&s);
        let ok = (1..=255).contains(&name.len())
            && name != "."
            && name != ".."
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if ok {
            Ok(SecretFile(name.to_string()))
        } else {
            Err(SecretError::File(s))
        }
    }
}

impl From<SecretFile> for String {
    fn from(f: SecretFile) -> String {
        f.0
    }
}

impl SecretFile {
    /// The name under [`SECRETS_DIR`].
    pub fn name(&self) -> &str {
        &self.0
    }

    pub fn path(&self) -> String {
        format!("{SECRETS_DIR}/{}", self.0)
    }
}

/// A sandbox's secrets, checked together: each target once (one secret may
/// be given both as a variable and as a file).
pub fn check_refs(refs: &[SecretRef]) -> Result<(), SecretError> {
    if refs.len() > MAX_PER_SANDBOX {
        return Err(SecretError::TooMany(refs.len()));
    }
    for (i, r) in refs.iter().enumerate() {
        for other in &refs[..i] {
            if other.delivery() == r.delivery() {
                return Err(SecretError::SameTarget(match r.delivery() {
                    Delivery::Env(e) => format!("${}", e.0),
                    Delivery::File(f) => f.path(),
                }));
            }
        }
    }
    Ok(())
}

/// A secret resolved for one sandbox, as the control plane hands it to the
/// node: where it goes and its value.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resolved {
    pub delivery: Delivery,
    pub value: String,
}

impl std::fmt::Debug for Resolved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resolved")
            .field("delivery", &self.delivery)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_lower_case_and_refs_read_as_docker_writes_them() {
        let n = SecretName::try_from("OpenAI_Key-1".to_string()).expect("name");
        assert_eq!(n.as_str(), "openai_key-1");
        for bad in ["", "a b", "a.b", "sec_x", "SEC_x", &"x".repeat(129)] {
            assert!(SecretName::try_from(bad.to_string()).is_err(), "{bad}");
        }
        let r: SecretRef = "hf".parse().expect("plain");
        assert_eq!(r.delivery(), Delivery::File(SecretFile("hf".into())));
        let r: SecretRef = "hf,env=HF_TOKEN".parse().expect("env");
        assert_eq!(r.delivery(), Delivery::Env(EnvName("HF_TOKEN".into())));
        let r: SecretRef = "hf,target=/run/secrets/token".parse().expect("file");
        assert_eq!(r.delivery(), Delivery::File(SecretFile("token".into())));
        for bad in [
            "hf,env=1X",
            "hf,env=A-B",
            "hf,target=/etc/passwd",
            "hf,target=../x",
            "hf,target=a/b",
            "hf,env=A,target=b",
            "hf,mode=0400",
        ] {
            assert!(bad.parse::<SecretRef>().is_err(), "{bad}");
        }
        let two = |a: &str, b: &str| check_refs(&[a.parse().unwrap(), b.parse().unwrap()]);
        assert!(two("a", "a,env=X").is_ok());
        assert_eq!(
            two("a", "b,target=a"),
            Err(SecretError::SameTarget("/run/secrets/a".into()))
        );
        assert_eq!(
            two("a,env=X", "b,env=X"),
            Err(SecretError::SameTarget("$X".into()))
        );
        assert!(two("a", "b").is_ok());
    }

    #[test]
    fn values_and_metadata_are_bounded_and_never_printed() {
        let v = SecretValue::try_from("hunter2".to_string()).expect("value");
        assert!(!format!("{v:?}").contains("hunter2"));
        assert!(SecretValue::try_from("x".repeat(MAX_VALUE + 1)).is_err());
        let many: BTreeMap<String, String> =
            (0..33).map(|i| (i.to_string(), String::new())).collect();
        assert!(SecretMetadata::try_from(many).is_err());
        let empty_key = BTreeMap::from([(String::new(), "v".to_string())]);
        assert!(SecretMetadata::try_from(empty_key).is_err());
    }
}

//! Which registries we talk to and how: credentials and plain-HTTP
//! permission from `registries.toml`, which references name a registry, and
//! the translation of registry failures into messages a user can act on.
//!
//! ```toml
//! [registry."registry.example.com"]
//! username = "ci"
//! password = "secret"
//!
//! [registry."registry.internal:5000"]
//! insecure = true          # plain HTTP; refused unless listed like this
//!                          # (loopback registries are plain HTTP unless
//!                          # listed with insecure = false)
//!
//! [registry."ghcr.io"]
//! token = "..."            # sent as a bearer token
//!
//! [registry."registry.internal:5443"]
//! ca_file = "/etc/warren/internal-ca.pem"   # trusted besides the system roots
//!
//! # Where short names (`debian:bookworm`, `team/app`) are looked for, in
//! # order (default: docker.io, where one-component names are `library/…`).
//! unqualified-search-registries = ["docker.io"]
//!
//! [registry."docker.io"]
//! mirrors = ["mirror.internal:5000"]   # tried first, in order; the digest
//!                                      # is verified whichever one serves it
//! ```
//!
//! Credentials never reach a log line or an error message: the entry's
//! `Debug` redacts them and parse errors report a position, not the text.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use oci_client::errors::OciDistributionError;
use oci_client::secrets::RegistryAuth;
use serde::{Deserialize, Serialize};

use crate::error::ImageError;

/// The file under the warren home that configures registries.
pub const CONFIG_FILE: &str = "registries.toml";

#[derive(Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    #[serde(
        default,
        rename = "unqualified-search-registries",
        skip_serializing_if = "Option::is_none"
    )]
    search: Option<Vec<String>>,
    #[serde(default)]
    registry: BTreeMap<String, RegistryEntry>,
}

/// Where short names are looked for when `registries.toml` does not say.
pub const DEFAULT_SEARCH_REGISTRIES: &[&str] = &["docker.io"];

#[derive(Deserialize, Serialize, Default, Clone)]
#[serde(deny_unknown_fields)]
struct RegistryEntry {
    #[serde(skip_serializing_if = "Option::is_none")]
    username: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    password: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    token: Option<String>,
    /// Plain HTTP; unset means: only for a loopback registry without a
    /// `ca_file`.
    #[serde(skip_serializing_if = "Option::is_none")]
    insecure: Option<bool>,
    /// PEM file of CA certificates to trust for this registry's HTTPS.
    #[serde(skip_serializing_if = "Option::is_none")]
    ca_file: Option<PathBuf>,
    /// Registries (`host[:port]`) that serve the same repositories, tried
    /// in order before this one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    mirrors: Vec<String>,
}

impl fmt::Debug for RegistryEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistryEntry")
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("insecure", &self.insecure)
            .field("ca_file", &self.ca_file)
            .field("mirrors", &self.mirrors)
            .finish()
    }
}

/// The parsed `registries.toml`; an absent file means anonymous HTTPS
/// everywhere.
#[derive(Debug, Default)]
pub struct RegistryConfig {
    path: PathBuf,
    /// `unqualified-search-registries`; None: [`DEFAULT_SEARCH_REGISTRIES`].
    search: Option<Vec<String>>,
    registries: BTreeMap<String, RegistryEntry>,
    /// sha256 of the file's text: whether a client built for an earlier
    /// read (its connections, tokens, credentials) may be reused.
    fingerprint: String,
}

impl RegistryConfig {
    /// Reads `path`. It is read at every pull, so edits apply without a
    /// restart.
    pub fn load(path: &Path) -> Result<RegistryConfig, ImageError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(RegistryConfig {
                    path: path.to_path_buf(),
                    search: None,
                    registries: BTreeMap::new(),
                    fingerprint: String::new(),
                })
            }
            Err(e) => {
                return Err(ImageError::RegistryConfig {
                    path: path.display().to_string(),
                    message: format!("cannot read it: {e}"),
                })
            }
        };
        RegistryConfig::parse(path, &text)
    }

    /// Reads `text`, the contents of `path` (named in messages).
    fn parse(path: &Path, text: &str) -> Result<RegistryConfig, ImageError> {
        let bad = |message: String| ImageError::RegistryConfig {
            path: path.display().to_string(),
            message,
        };
        let parsed: ConfigFile = toml::from_str(text).map_err(|e| {
            // toml's Display quotes the offending line, which may be a
            // password; say where instead.
            let line = e.span().map(|s| {
                text.as_bytes()[..s.start.min(text.len())]
                    .iter()
                    .filter(|&&b| b == b'\n')
                    .count()
                    + 1
            });
            bad(format!(
                "{}{}; see docs/configuration.md for the format",
                e.message(),
                line.map(|l| format!(" (line {l})")).unwrap_or_default()
            ))
        })?;
        let is_host = |h: &str| !h.is_empty() && !h.contains(['/', '@', ' ']);
        for host in parsed.search.iter().flatten() {
            if !is_host(host) {
                return Err(bad(format!(
                    "unqualified-search-registries: {host:?} is not a registry host[:port]"
                )));
            }
        }
        for (host, entry) in &parsed.registry {
            if !is_host(host) {
                return Err(bad(format!(
                    "[registry.{host:?}]: the key must be a registry host[:port], e.g. \
                     \"registry.example.com\" or \"127.0.0.1:5000\""
                )));
            }
            if let Some(m) = entry.mirrors.iter().find(|m| !is_host(m) || *m == host) {
                return Err(bad(format!(
                    "[registry.{host:?}]: mirror {m:?} must be another registry's host[:port]"
                )));
            }
            match (&entry.username, &entry.password, &entry.token) {
                (Some(_), Some(_), None) | (None, None, None) | (None, None, Some(_)) => {}
                (Some(_), None, _) | (None, Some(_), _) => {
                    return Err(bad(format!(
                        "[registry.{host:?}]: username and password go together; set both"
                    )))
                }
                (Some(_), Some(_), Some(_)) => {
                    return Err(bad(format!(
                        "[registry.{host:?}]: set either username and password or token, not both"
                    )))
                }
            }
        }
        Ok(RegistryConfig {
            path: path.to_path_buf(),
            search: parsed.search,
            registries: parsed.registry,
            fingerprint: crate::digest::sha256_digest(text.as_bytes()),
        })
    }

    pub(crate) fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// What of `path` a control plane hands its nodes at join: the search
    /// registries, and each registry's mirrors and `insecure`, never a
    /// credential or a CA file's path (those stay on the host that has
    /// them). None when the file says nothing of the kind.
    pub fn shared(path: &Path) -> Result<Option<String>, ImageError> {
        let config = RegistryConfig::load(path)?;
        let registry: BTreeMap<String, RegistryEntry> = config
            .registries
            .into_iter()
            .map(|(host, e)| {
                (
                    host,
                    RegistryEntry {
                        insecure: e.insecure,
                        mirrors: e.mirrors,
                        ..Default::default()
                    },
                )
            })
            .filter(|(_, e)| e.insecure.is_some() || !e.mirrors.is_empty())
            .collect();
        if config.search.is_none() && registry.is_empty() {
            return Ok(None);
        }
        let file = ConfigFile {
            search: config.search,
            registry,
        };
        toml::to_string(&file)
            .map(Some)
            .map_err(|e| ImageError::RegistryConfig {
                path: path.display().to_string(),
                message: format!("cannot write what nodes are given of it: {e}"),
            })
    }

    /// This host's file with the cluster's (what [`RegistryConfig::shared`]
    /// wrote, given at join) beneath it: a registry the file names keeps
    /// its own entry, one it does not takes the cluster's; the search
    /// registries are the file's when it lists them.
    pub(crate) fn over(mut self, cluster: Option<&RegistryConfig>) -> RegistryConfig {
        let Some(cluster) = cluster else {
            return self;
        };
        for (host, entry) in &cluster.registries {
            self.registries
                .entry(host.clone())
                .or_insert_with(|| entry.clone());
        }
        if self.search.is_none() {
            self.search = cluster.search.clone();
        }
        self.fingerprint = crate::digest::sha256_digest(
            format!("{}\n{}", self.fingerprint, cluster.fingerprint).as_bytes(),
        );
        self
    }

    /// Reads what a control plane gave at join.
    pub(crate) fn from_cluster(text: &str) -> Result<RegistryConfig, ImageError> {
        RegistryConfig::parse(Path::new("the control plane's registries.toml"), text)
    }

    /// Where a short name is looked for, in order.
    pub fn search_registries(&self) -> Vec<String> {
        match &self.search {
            Some(list) => list.clone(),
            None => DEFAULT_SEARCH_REGISTRIES
                .iter()
                .map(|s| s.to_string())
                .collect(),
        }
    }

    /// What `reference` names in full: itself when it names its registry,
    /// else the short name on each search registry, in order.
    pub fn full_names(&self, reference: &str) -> Vec<String> {
        if registry_host(reference).is_some() {
            return vec![reference.to_string()];
        }
        self.search_registries()
            .iter()
            .map(|r| warren_core::image_ref::qualify(reference, r))
            .collect()
    }

    /// The hosts that serve `host`'s repositories, in the order to try
    /// them: its mirrors, then itself.
    pub fn sources(&self, host: &str) -> Vec<String> {
        let mut out = self
            .registries
            .get(host)
            .map(|e| e.mirrors.clone())
            .unwrap_or_default();
        out.push(host.to_string());
        out
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether `host` may be spoken to over plain HTTP: as its entry
    /// says, and otherwise only when it is on a loopback address. That is
    /// what Docker, containerd and podman do: no network lies between the
    /// node and a registry on its own loopback, and a local registry
    /// (`docker-registry`, `registry:2`) serves plain HTTP out of the box.
    pub fn is_insecure(&self, host: &str) -> bool {
        match self.registries.get(host) {
            Some(RegistryEntry {
                insecure: Some(insecure),
                ..
            }) => *insecure,
            // A CA file only means something for HTTPS.
            Some(RegistryEntry {
                ca_file: Some(_), ..
            }) => false,
            _ => is_loopback(host),
        }
    }

    /// Hosts spoken to over plain HTTP: those listed as insecure, and
    /// `host` (the one a pull is for) when it is insecure by default.
    pub fn insecure_hosts(&self, host: &str) -> Vec<String> {
        let mut hosts: Vec<String> = self
            .registries
            .iter()
            .filter(|(_, e)| e.insecure == Some(true))
            .map(|(h, _)| h.clone())
            .collect();
        if self.is_insecure(host) && !hosts.iter().any(|h| h == host) {
            hosts.push(host.to_string());
        }
        hosts
    }

    /// The PEM contents of every configured `ca_file`. oci-client trusts
    /// extra roots per client, not per registry, so all of them are added;
    /// a CA still only vouches for the names it signed.
    pub(crate) fn ca_certificates(&self) -> Result<Vec<Vec<u8>>, ImageError> {
        let mut out = Vec::new();
        for (host, entry) in &self.registries {
            if let Some(file) = &entry.ca_file {
                let pem = std::fs::read(file).map_err(|e| ImageError::RegistryConfig {
                    path: self.path.display().to_string(),
                    message: format!(
                        "[registry.{host:?}]: cannot read ca_file {}: {e}",
                        file.display()
                    ),
                })?;
                out.push(pem);
            }
        }
        Ok(out)
    }

    /// The credentials configured for `host`, anonymous when none are.
    pub fn auth(&self, host: &str) -> RegistryAuth {
        match self.registries.get(host) {
            Some(RegistryEntry {
                username: Some(u),
                password: Some(p),
                ..
            }) => RegistryAuth::Basic(u.clone(), p.clone()),
            Some(RegistryEntry { token: Some(t), .. }) => RegistryAuth::Bearer(t.clone()),
            _ => RegistryAuth::Anonymous,
        }
    }

    pub fn has_credentials(&self, host: &str) -> bool {
        !matches!(self.auth(host), RegistryAuth::Anonymous)
    }
}

pub(crate) use warren_core::image_ref::registry_host;

/// Whether a registry `host[:port]` is `localhost` or a loopback address.
fn is_loopback(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Turns an oci-client failure into a message that says what went wrong
/// and what to do. `what` names the request ("manifest of X", "layer Y").
pub(crate) fn describe(
    e: OciDistributionError,
    host: &str,
    what: &str,
    config: &RegistryConfig,
) -> ImageError {
    use OciDistributionError as E;
    let cfg = config.path().display();
    match e {
        E::UnauthorizedError { .. } | E::AuthenticationFailure(_) => {
            if config.has_credentials(host) {
                ImageError::RegistryAuth(format!(
                    "registry {host} refused the credentials configured for it in {cfg} while \
                     fetching {what}; check the username and password (or token) there"
                ))
            } else {
                ImageError::RegistryAuth(format!(
                    "registry {host} requires authentication for {what}; add \
                     [registry.\"{host}\"] with username and password (or token) to {cfg}"
                ))
            }
        }
        E::RegistryError { envelope, .. } => {
            use oci_client::errors::OciErrorCode as C;
            let codes = || envelope.errors.iter().map(|e| &e.code);
            let unknown = codes().any(|c| {
                matches!(
                    c,
                    C::ManifestUnknown | C::NameUnknown | C::BlobUnknown | C::NotFound
                )
            });
            let denied = codes().any(|c| matches!(c, C::Denied | C::Unauthorized));
            let text: Vec<String> = envelope
                .errors
                .iter()
                .map(|e| format!("{:?}: {}", e.code, e.message))
                .collect();
            let text = text.join("; ");
            if denied {
                ImageError::RegistryAuth(format!(
                    "registry {host} denied access to {what} ({text}); check the credentials \
                     for it in {cfg}"
                ))
            } else if unknown {
                ImageError::RemoteNotFound(format!(
                    "registry {host} has no {what} ({text}); check the repository and tag"
                ))
            } else {
                ImageError::Registry(format!("registry {host} refused {what}: {text}"))
            }
        }
        E::ServerError { code: 404, .. } | E::ImageManifestNotFoundError(_) => {
            ImageError::RemoteNotFound(format!(
                "registry {host} has no {what}; check the repository and tag"
            ))
        }
        E::ServerError { code, message, .. } => {
            let message: String = message.chars().take(300).collect();
            // A loopback registry is asked in plain HTTP by default; one
            // that serves HTTPS answers so.
            let hint = if config.is_insecure(host) && message.contains("HTTPS") {
                format!(
                    "; it serves HTTPS: add [registry.\"{host}\"] with insecure = false (and \
                     ca_file = \"/path/to/ca.pem\" if its CA is private) to {cfg}"
                )
            } else {
                String::new()
            };
            ImageError::Registry(format!(
                "registry {host} answered HTTP {code} for {what}: {message}{hint}"
            ))
        }
        E::DigestError(d) => ImageError::RemoteDigestMismatch {
            what: format!("{what} from registry {host}"),
            expected: match &d {
                oci_client::errors::DigestError::VerificationError { expected, .. } => {
                    expected.clone()
                }
                other => other.to_string(),
            },
            actual: match &d {
                oci_client::errors::DigestError::VerificationError { actual, .. } => actual.clone(),
                _ => "unknown".into(),
            },
        },
        E::RequestError(r) => {
            let chain = error_chain(&r);
            let untrusted = ["certificate", "UnknownIssuer", "CaUsedAsEndEntity"]
                .iter()
                .any(|w| chain.contains(w));
            // Neither plain HTTP nor a CA would help with these.
            let unresolved = [
                "dns error",
                "failed to lookup address",
                "Name or service not known",
            ]
            .iter()
            .any(|w| chain.contains(w));
            let unreachable = ["Connection refused", "timed out", "No route to host"]
                .iter()
                .any(|w| chain.contains(w));
            if unresolved {
                ImageError::Registry(format!(
                    "cannot resolve the registry name {host} ({chain}) while fetching {what}; \
                     check the name in the reference"
                ))
            } else if unreachable {
                ImageError::Registry(format!(
                    "cannot connect to registry {host} ({chain}) while fetching {what}; check \
                     that it runs and listens on that port"
                ))
            } else if untrusted && !config.is_insecure(host) {
                ImageError::Registry(format!(
                    "registry {host}'s TLS certificate is not trusted ({chain}) while fetching \
                     {what}; if it is signed by a private CA, add ca_file = \"/path/to/ca.pem\" \
                     to [registry.\"{host}\"] in {cfg}"
                ))
            } else if config.is_insecure(host) {
                ImageError::Registry(format!(
                    "cannot reach registry {host} over plain HTTP for {what}: {chain}"
                ))
            } else {
                ImageError::Registry(format!(
                    "cannot reach registry {host} over HTTPS for {what}: {chain}; if {host} \
                     serves plain HTTP, allow it with [registry.\"{host}\"] insecure = true in {cfg}"
                ))
            }
        }
        other => ImageError::Registry(format!("registry {host}, {what}: {other}")),
    }
}

/// `e: cause: cause…`, since reqwest's own Display hides the root cause
/// ("error sending request") that tells TLS from refused connections.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, text: &str) -> PathBuf {
        let p = dir.join(CONFIG_FILE);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn registry_references_are_told_from_local_names() {
        assert_eq!(
            registry_host("127.0.0.1:5000/app:v1"),
            Some("127.0.0.1:5000")
        );
        assert_eq!(registry_host("ghcr.io/o/app"), Some("ghcr.io"));
        assert_eq!(registry_host("localhost/app"), Some("localhost"));
        assert_eq!(registry_host("busybox:latest"), None);
        assert_eq!(registry_host("team/app:v1"), None);
        assert_eq!(registry_host("sha256:abc"), None);
        assert_eq!(registry_host("host.io/"), None);
    }

    #[test]
    fn missing_file_means_anonymous_https() {
        let dir = tempfile::tempdir().unwrap();
        let c = RegistryConfig::load(&dir.path().join(CONFIG_FILE)).unwrap();
        assert!(!c.is_insecure("10.0.0.1:5000"));
        assert!(!c.is_insecure("registry.example.com"));
        // Loopback registries are plain HTTP by default, as with Docker.
        for host in [
            "127.0.0.1:5000",
            "127.1.2.3",
            "localhost:5000",
            "[::1]:5000",
        ] {
            assert!(c.is_insecure(host), "{host}");
            assert_eq!(c.insecure_hosts(host), vec![host.to_string()]);
        }
        assert!(c.insecure_hosts("10.0.0.1:5000").is_empty());
        assert_eq!(c.auth("x.io"), RegistryAuth::Anonymous);
    }

    #[test]
    fn entries_give_auth_and_insecure() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(
            dir.path(),
            "[registry.\"127.0.0.1:5000\"]\ninsecure = true\nusername = \"u\"\npassword = \"p\"\n\
             [registry.\"ghcr.io\"]\ntoken = \"t\"\n",
        );
        let c = RegistryConfig::load(&p).unwrap();
        assert!(c.is_insecure("127.0.0.1:5000"));
        assert!(!c.is_insecure("ghcr.io"));
        assert_eq!(
            c.auth("127.0.0.1:5000"),
            RegistryAuth::Basic("u".into(), "p".into())
        );
        assert_eq!(c.auth("ghcr.io"), RegistryAuth::Bearer("t".into()));
        assert_eq!(
            c.insecure_hosts("ghcr.io"),
            vec!["127.0.0.1:5000".to_string()]
        );
        assert!(!format!("{c:?}").contains("\"p\""));
    }

    #[test]
    fn what_the_cluster_shares_sits_beneath_a_nodes_own_file() {
        let dir = tempfile::tempdir().unwrap();
        let server = write(
            dir.path(),
            "unqualified-search-registries = [\"docker.io\"]\n\
             [registry.\"docker.io\"]\nmirrors = [\"cache:5000\"]\nusername = \"u\"\npassword = \"secret\"\n\
             [registry.\"cache:5000\"]\ninsecure = true\n\
             [registry.\"ghcr.io\"]\ntoken = \"t0ken\"\nca_file = \"/ca.pem\"\n",
        );
        let shared = RegistryConfig::shared(&server).unwrap().unwrap();
        // No credential, no CA path, nothing but mirrors and insecure.
        for secret in ["secret", "t0ken", "ca.pem", "ghcr.io", "username"] {
            assert!(!shared.contains(secret), "{secret} in {shared}");
        }
        let cluster = RegistryConfig::from_cluster(&shared).unwrap();
        let node = tempfile::tempdir().unwrap();
        let own = write(
            node.path(),
            "unqualified-search-registries = []\n[registry.\"cache:5000\"]\ninsecure = false\n",
        );
        let c = RegistryConfig::load(&own).unwrap().over(Some(&cluster));
        assert_eq!(c.sources("docker.io"), ["cache:5000", "docker.io"]);
        // The node's own entries and search list win.
        assert!(!c.is_insecure("cache:5000"));
        assert!(c.full_names("debian").is_empty());
        let bare = RegistryConfig::load(&node.path().join("none.toml")).unwrap();
        let before = bare.fingerprint().to_string();
        let c = bare.over(Some(&cluster));
        assert!(c.is_insecure("cache:5000") && c.fingerprint() != before);
        assert_eq!(c.full_names("debian"), ["docker.io/library/debian"]);
        let empty = write(
            dir.path(),
            "[registry.\"x.io\"]\nusername = \"a\"\npassword = \"b\"\n",
        );
        assert_eq!(RegistryConfig::shared(&empty).unwrap(), None);
    }

    #[test]
    fn a_loopback_registry_listed_secure_is_https() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(
            dir.path(),
            "[registry.\"127.0.0.1:5443\"]\ninsecure = false\nca_file = \"/ca.pem\"\n",
        );
        let c = RegistryConfig::load(&p).unwrap();
        assert!(!c.is_insecure("127.0.0.1:5443"));
        assert!(c.insecure_hosts("127.0.0.1:5443").is_empty());
        let p = write(
            dir.path(),
            "[registry.\"127.0.0.1:5443\"]\nca_file = \"/ca.pem\"\n",
        );
        let c = RegistryConfig::load(&p).unwrap();
        assert!(!c.is_insecure("127.0.0.1:5443"), "a ca_file means HTTPS");
    }

    #[test]
    fn short_names_search_docker_io_and_mirrors_come_first() {
        let dir = tempfile::tempdir().unwrap();
        let none = RegistryConfig::load(&dir.path().join(CONFIG_FILE)).unwrap();
        assert_eq!(
            none.full_names("debian:bookworm"),
            ["docker.io/library/debian:bookworm"]
        );
        assert_eq!(none.sources("docker.io"), ["docker.io"]);
        let p = write(
            dir.path(),
            "unqualified-search-registries = [\"quay.io\", \"docker.io\"]\n\
             [registry.\"docker.io\"]\nmirrors = [\"m1:5000\", \"m2\"]\n",
        );
        let c = RegistryConfig::load(&p).unwrap();
        assert_eq!(
            c.full_names("app:v1"),
            ["quay.io/app:v1", "docker.io/library/app:v1"]
        );
        assert_eq!(c.full_names("h.io/app:v1"), ["h.io/app:v1"]);
        assert_eq!(c.sources("docker.io"), ["m1:5000", "m2", "docker.io"]);
        assert_eq!(c.sources("quay.io"), ["quay.io"]);
        let p = write(dir.path(), "unqualified-search-registries = []\n");
        assert!(RegistryConfig::load(&p)
            .unwrap()
            .full_names("app")
            .is_empty());
    }

    #[test]
    fn bad_files_are_refused_without_quoting_secrets() {
        let dir = tempfile::tempdir().unwrap();
        for (text, expect) in [
            ("[registry.\"h\"]\nusername = \"u\"\n", "go together"),
            (
                "[registry.\"h\"]\nusername = \"u\"\npassword = \"p\"\ntoken = \"t\"\n",
                "not both",
            ),
            ("[registry.\"a/b\"]\ninsecure = true\n", "host[:port]"),
            ("[registry.\"h\"]\npasword = \"hunter2\"\n", "line 2"),
            ("[registry.\"h\"]\npassword = hunter2\n", "line 2"),
            ("[registry.\"h\"]\nmirrors = [\"h\"]\n", "another registry"),
            (
                "[registry.\"h\"]\nmirrors = [\"m/x\"]\n",
                "another registry",
            ),
            ("unqualified-search-registries = [\"\"]\n", "not a registry"),
        ] {
            let p = write(dir.path(), text);
            let msg = RegistryConfig::load(&p).unwrap_err().to_string();
            assert!(msg.contains(expect), "{text:?}: {msg}");
            assert!(!msg.contains("hunter2"), "{msg}");
        }
    }
}

//! Registry sessions, shared by pulls and pushes: what one operation needs
//! to talk to a registry, made from a reference and `registries.toml`.
//! Its own module so that pull.rs and push.rs each depend on it and not on
//! each other.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference as OciReference};

use crate::digest::sha256_digest;
use crate::error::ImageError;
use crate::reference::normalize_name;
use crate::registry::{describe, registry_host, RegistryConfig};
use warren_core::sync::lock;

/// The registry a pull (or push) talks to, with what it needs for every
/// request.
pub(crate) struct Session {
    pub client: Client,
    pub host: String,
    pub repo: OciReference,
    pub auth: RegistryAuth,
    pub config: RegistryConfig,
    /// The reference as the user wrote it, normalised, for messages.
    pub origin: String,
    /// Whether this pull put a blob in the content store (which a failure
    /// must then collect).
    pub stored: std::sync::atomic::AtomicBool,
}

impl Session {
    pub(crate) fn fail(
        &self,
        what: &str,
    ) -> impl FnOnce(oci_client::errors::OciDistributionError) -> ImageError + '_ {
        let what = what.to_string();
        move |e| describe(e, &self.host, &what, &self.config)
    }

    pub(crate) fn at_digest(&self, digest: &str) -> OciReference {
        OciReference::with_digest(
            self.repo.registry().to_string(),
            self.repo.repository().to_string(),
            digest.to_string(),
        )
    }
}

/// Opens sessions against the registries `registries.toml` configures; the
/// file is read at every open.
pub(crate) struct Sessions {
    config_path: PathBuf,
    /// The client built for the current `registries.toml` (by fingerprint):
    /// reusing it keeps connections and tokens, which every create's tag
    /// resolution would otherwise pay for again.
    client: Mutex<Option<(String, Client)>>,
    /// What the cluster's control plane gave at join, beneath the file.
    cluster: Mutex<Option<Arc<RegistryConfig>>>,
}

impl Sessions {
    pub(crate) fn new(config_path: PathBuf) -> Sessions {
        Sessions {
            config_path,
            client: Mutex::new(None),
            cluster: Mutex::new(None),
        }
    }

    /// The file, read now, over what the cluster gave.
    pub(crate) fn config(&self) -> Result<RegistryConfig, ImageError> {
        let cluster = lock(&self.cluster).clone();
        Ok(RegistryConfig::load(&self.config_path)?.over(cluster.as_deref()))
    }

    pub(crate) fn set_cluster(&self, cluster: Option<RegistryConfig>) {
        *lock(&self.cluster) = cluster.map(Arc::new);
    }

    pub(crate) fn config_path(&self) -> &Path {
        &self.config_path
    }

    pub(crate) fn open(&self, reference: &str) -> Result<Session, ImageError> {
        let host = registry_host(reference).ok_or_else(|| no_registry(reference))?;
        self.open_at(reference, host)
    }

    /// Where to fetch `reference` from, in order, as (the name it is
    /// recorded under, the host that serves it): a short name on each
    /// `unqualified-search-registries` entry; each registry through its
    /// mirrors first.
    pub(crate) fn routes(&self, reference: &str) -> Result<Vec<(String, String)>, ImageError> {
        normalize_name(reference)?;
        let config = self.config()?;
        let names = config.full_names(reference);
        if names.is_empty() {
            return Err(ImageError::NotFound(format!(
                "no image named {reference} here, and {} lists no unqualified-search-registries to pull a short name from; import it (`warren image import`) or name its registry (host/repository:tag)",
                config.path().display()
            )));
        }
        let mut out = Vec::new();
        for name in names {
            let host = registry_host(&name).ok_or_else(|| no_registry(&name))?;
            for source in config.sources(host) {
                out.push((name.clone(), source));
            }
        }
        Ok(out)
    }

    /// A session for `reference` (which names its registry) served by
    /// `source`: that registry or one of its mirrors. The image is recorded
    /// under `reference` whichever serves it.
    pub(crate) fn open_at(&self, reference: &str, source: &str) -> Result<Session, ImageError> {
        let bad = |reason: String| ImageError::InvalidReference {
            reference: reference.to_string(),
            reason,
        };
        let origin = normalize_name(reference)?;
        let named: OciReference = origin
            .parse()
            .map_err(|e| bad(format!("not a registry reference: {e}")))?;
        let repo = match (named.digest(), named.tag()) {
            (Some(d), _) => OciReference::with_digest(
                source.to_string(),
                named.repository().to_string(),
                d.to_string(),
            ),
            (None, tag) => OciReference::with_tag(
                source.to_string(),
                named.repository().to_string(),
                tag.unwrap_or("latest").to_string(),
            ),
        };
        let host = source;
        let config = self.config()?;
        // The CA files are part of what the client was built from.
        let pems = config.ca_certificates()?;
        // So are the plain-HTTP hosts, which depend on the pulled host too
        // (a loopback registry is plain HTTP without an entry).
        let fingerprint = format!(
            "{} {} {:?}",
            config.fingerprint(),
            sha256_digest(&pems.concat()),
            config.insecure_hosts(host)
        );
        let client = {
            let mut cached = lock(&self.client);
            match cached.as_ref() {
                Some((built_from, client)) if *built_from == fingerprint => client.clone(),
                _ => {
                    install_tls_provider();
                    let roots = pems
                        .into_iter()
                        .map(|data| Certificate {
                            encoding: CertificateEncoding::Pem,
                            data,
                        })
                        .collect();
                    // Client::new would fall back to a default client (plain
                    // HTTPS, no extra roots) on a bad certificate; say so.
                    let client = Client::try_from(ClientConfig {
                        protocol: ClientProtocol::HttpsExcept(config.insecure_hosts(host)),
                        extra_root_certificates: roots,
                        connect_timeout: Some(Duration::from_secs(10)),
                        read_timeout: Some(Duration::from_secs(120)),
                        user_agent: concat!("warren/", env!("CARGO_PKG_VERSION")),
                        ..Default::default()
                    })
                    .map_err(|e| ImageError::RegistryConfig {
                        path: config.path().display().to_string(),
                        message: format!(
                            "cannot build a registry client ({e}); check the ca_file entries"
                        ),
                    })?;
                    *cached = Some((fingerprint, client.clone()));
                    client
                }
            }
        };
        Ok(Session {
            client,
            host: host.to_string(),
            auth: config.auth(host),
            repo,
            config,
            origin,
            stored: std::sync::atomic::AtomicBool::new(false),
        })
    }
}

fn no_registry(reference: &str) -> ImageError {
    ImageError::InvalidReference {
        reference: reference.to_string(),
        reason: "it names no registry; use host[:port]/repository[:tag|@sha256:digest], e.g. \
                 registry.example.com/team/app:v1 (local images are imported with `warren \
                 image import`)"
            .into(),
    }
}

/// rustls needs one process-wide crypto provider; ring builds quickly and
/// is all a registry client needs. Every reqwest client in the process
/// builds its TLS config from it (even one that only speaks plain HTTP), so
/// binaries call this before they make any.
pub fn install_tls_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // Err means another part of the process installed one first: fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_without_registry_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let sessions = Sessions::new(dir.path().join("registries.toml"));
        for bad in [
            "busybox:latest",
            "team/app",
            "127.0.0.1:5000/App:v1",
            "h.io/app:-x",
        ] {
            let err = sessions.open(bad).err().unwrap();
            assert!(
                matches!(err, ImageError::InvalidReference { .. }),
                "{bad}: {err}"
            );
        }
        assert!(sessions.open("127.0.0.1:5000/app:v1").is_ok());
    }
}

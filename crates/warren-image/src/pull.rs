//! Pulling images from OCI Distribution registries into the store.
//!
//! A pull resolves the reference to a manifest digest at the registry
//! every time (a tag can move), uses the store's copy only when it holds
//! that exact digest, and otherwise downloads what is missing:
//!
//! * every blob is checked against its digest while it streams (oci-client)
//!   and its size against the descriptor, into `tmp/` of the store; only a
//!   verified blob is renamed into `content/`;
//! * layers are unpacked and checked against their diffIDs by the same code
//!   as archive imports, before the image record is written;
//! * a failed pull removes what it brought (garbage collection with the
//!   pull's pins released), so the store holds nothing half-written.
//!
//! Concurrent pulls share work: one download per blob digest at a time (a
//! per-digest async mutex; the second waiter finds the blob stored), one
//! unpack per ChainID (the snapshot builder's own gate), and node-wide caps
//! on parallel downloads and unpacks.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::pin::Pin as StdPin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use oci_client::manifest::OciDescriptor;
use oci_spec::image::{Descriptor, ImageIndex, ImageManifest, MediaType};
use serde::Serialize;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::Semaphore;

use crate::digest::{sha256_digest, sha256_hex};
use crate::error::ImageError;
use crate::fsutil::unique_name;
use crate::layout::{check_layer_count, host_arch, parse_config_from};
use crate::record::ImageRecord;
use crate::registry::registry_host;
use crate::session::{Session, Sessions};
use crate::store::{blob_key, ImageStore, PulledImage};
use warren_core::sync::lock;

/// Manifests and configs larger than this are refused before download.
const JSON_LIMIT: u64 = 16 * 1024 * 1024;

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
const DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";
const ACCEPTED_MANIFESTS: &[&str] = &[OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_LIST];

/// What a pull reports as it goes (serialised as the `type`-tagged JSON
/// lines of `POST /v1/images/pull` and as events).
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum PullEvent {
    /// The reference names this manifest (or manifest list) digest now.
    Resolved { reference: String, digest: String },
    /// The platform manifest to fetch and what it holds.
    Manifest {
        digest: String,
        layers: usize,
        bytes: u64,
    },
    /// Bytes of one layer received so far.
    Progress {
        layer: usize,
        digest: String,
        bytes: u64,
        size: u64,
    },
    /// A layer blob is in the store; `downloaded` is false when it was
    /// already there (or another pull fetched it meanwhile).
    Layer {
        layer: usize,
        digest: String,
        size: u64,
        downloaded: bool,
    },
    /// The image is recorded (`cached`: without downloading anything).
    Done {
        name: String,
        digest: String,
        cached: bool,
    },
}

/// Receives pull events; must not block.
pub type Progress = Arc<dyn Fn(PullEvent) + Send + Sync>;

/// Pulls images into one store, sharing downloads between concurrent pulls.
pub struct Puller {
    store: Arc<ImageStore>,
    sessions: Sessions,
    downloads: Semaphore,
    unpacks: Arc<Semaphore>,
    /// One async mutex per blob digest being fetched.
    fetching: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// A download in `tmp/`, removed unless it was committed.
struct TmpFile(Option<PathBuf>);

impl Drop for TmpFile {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

impl Puller {
    /// `config_path` is `registries.toml`; it is read at every pull.
    pub fn new(
        store: Arc<ImageStore>,
        config_path: PathBuf,
        max_downloads: usize,
        max_unpacks: usize,
    ) -> Puller {
        Puller {
            store,
            sessions: Sessions::new(config_path),
            downloads: Semaphore::new(max_downloads.max(1)),
            unpacks: Arc::new(Semaphore::new(max_unpacks.max(1))),
            fetching: Mutex::new(HashMap::new()),
        }
    }

    pub fn config_path(&self) -> &Path {
        self.sessions.config_path()
    }

    /// Takes what the cluster's control plane gave at join (the text of
    /// [`crate::RegistryConfig::shared`]) beneath this node's own
    /// `registries.toml`: the cluster's mirrors, for registries the file
    /// does not name. None forgets it.
    pub fn set_cluster_registries(&self, text: Option<&str>) -> Result<(), ImageError> {
        let cluster = text
            .map(crate::registry::RegistryConfig::from_cluster)
            .transpose()?;
        self.sessions.set_cluster(cluster);
        Ok(())
    }

    /// The full names a short name (no registry in it) stands for, in the
    /// order of `unqualified-search-registries`; none for a registry
    /// reference or a digest.
    pub fn full_names(&self, reference: &str) -> Result<Vec<String>, ImageError> {
        if registry_host(reference).is_some()
            || reference.starts_with("sha256:")
            || crate::reference::normalize_name(reference).is_err()
        {
            return Ok(Vec::new());
        }
        let config = self.sessions.config()?;
        Ok(config.full_names(reference))
    }

    /// Resolves `reference` (`host[:port]/repo[:tag|@digest]`) at its
    /// registry and makes sure the store holds exactly that digest,
    /// downloading what is missing. The image is recorded under the
    /// normalised reference.
    ///
    /// A short name (`debian:bookworm`) is looked for on each
    /// `unqualified-search-registries` entry of `registries.toml` (default
    /// docker.io) and recorded under its full name; each registry is tried
    /// through its mirrors first. Every blob is checked against its digest
    /// whoever served it.
    pub async fn pull(
        &self,
        reference: &str,
        progress: Option<Progress>,
    ) -> Result<ImageRecord, ImageError> {
        let routes = self.sessions.routes(reference)?;
        let mut failed: Vec<(String, ImageError)> = Vec::new();
        for (name, source) in &routes {
            let session = self.sessions.open_at(name, source)?;
            match self.pull_from(session, progress.as_ref()).await {
                Ok(record) => return Ok(record),
                Err(e) if routes.len() == 1 => return Err(e),
                Err(e) => {
                    tracing::info!(image = %name, registry = %source, error = %e, "pull failed here; trying the next source");
                    failed.push((source.clone(), e));
                }
            }
        }
        Err(no_source(reference, failed))
    }

    /// One pull of the session's reference from the registry it talks to.
    async fn pull_from(
        &self,
        session: Session,
        progress: Option<&Progress>,
    ) -> Result<ImageRecord, ImageError> {
        let emit = |e: PullEvent| {
            if let Some(p) = progress {
                p(e)
            }
        };
        let name = session.origin.clone();

        let digest = match session.repo.digest() {
            Some(d) => d.to_string(),
            None => session
                .client
                .fetch_manifest_digest(&session.repo, &session.auth)
                .await
                .map_err(session.fail(&format!("manifest {name}")))?,
        };
        if sha256_hex(&digest).is_none() {
            return Err(ImageError::Registry(format!(
                "registry {} named {name} by digest {digest:?}; only sha256 digests are supported",
                session.host
            )));
        }
        emit(PullEvent::Resolved {
            reference: name.clone(),
            digest: digest.clone(),
        });

        let store = self.store.clone();
        let (n, d) = (name.clone(), digest.clone());
        if let Some(record) = blocking(move || store.tag_existing(&n, &d)).await? {
            emit(PullEvent::Done {
                name: record.name.clone(),
                digest: record.digest.clone(),
                cached: true,
            });
            return Ok(record);
        }

        let result = self.download(&session, &name, &digest, &emit).await;
        let result =
            match result {
                Ok(image) => {
                    let store = self.store.clone();
                    let permit =
                        self.unpacks.clone().acquire_owned().await.map_err(|_| {
                            ImageError::Conflict("the node is shutting down".into())
                        })?;
                    let (image, pin) = image;
                    let committed = blocking(move || {
                        let r = store.commit_pulled(image);
                        drop(permit);
                        r
                    })
                    .await;
                    drop(pin);
                    committed
                }
                Err(e) => Err(e),
            };
        match result {
            Ok(record) => {
                emit(PullEvent::Done {
                    name: record.name.clone(),
                    digest: record.digest.clone(),
                    cached: false,
                });
                Ok(record)
            }
            Err(e) => {
                // Verified blobs this pull stored are referenced by nothing
                // now that its pins are gone; drop them. (A pull that failed
                // before storing anything, say on a bad tag, skips the
                // collection and its exclusive lock.)
                if session.stored.load(std::sync::atomic::Ordering::Relaxed) {
                    let store = self.store.clone();
                    let _ = blocking(move || {
                        store.collect_garbage();
                        Ok(())
                    })
                    .await;
                }
                Err(remote(e))
            }
        }
    }

    /// Pushes the stored image `source` (default: the image named
    /// `reference`) to `reference` at its registry, uploading the blobs the
    /// registry lacks, then the manifest as stored (so the digest stays the
    /// same). Returns the image record and how many blobs were uploaded.
    pub async fn push(
        &self,
        reference: &str,
        source: Option<&str>,
    ) -> Result<(ImageRecord, crate::push::Pushed), ImageError> {
        let session = self.sessions.open(reference)?;
        let store = self.store.clone();
        let from = source.unwrap_or(reference).to_string();
        let record = blocking(move || store.resolve(&from)).await?;
        let pin = self.store.pin_image(&record);
        let pushed = crate::push::push(&self.store, &session, &record).await?;
        drop(pin);
        Ok((record, pushed))
    }

    /// Fetches the manifest `digest` names (through a manifest list when it
    /// is one), its config and its missing layer blobs. Returns the image
    /// to commit and the pin that keeps its blobs until then.
    async fn download(
        &self,
        s: &Session,
        name: &str,
        digest: &str,
        emit: &(dyn Fn(PullEvent) + Send + Sync),
    ) -> Result<(PulledImage, crate::store::Pin), ImageError> {
        let (bytes, media) = self.fetch_manifest(s, digest).await?;
        let (manifest_digest, manifest_bytes, index_digest) = if is_index(&media, &bytes) {
            let index: ImageIndex = serde_json::from_slice(&bytes).map_err(|e| {
                ImageError::InvalidImage(format!(
                    "{name}: manifest list {digest} is not valid: {e}"
                ))
            })?;
            let chosen = select_platform(index.manifests(), name, digest)?;
            let chosen_digest = chosen.digest().to_string();
            let (bytes, media) = self.fetch_manifest(s, &chosen_digest).await?;
            if is_index(&media, &bytes) {
                return Err(ImageError::InvalidImage(format!(
                    "{name}: manifest list {digest} points at another list {chosen_digest}; \
                     nested lists are not supported"
                )));
            }
            (chosen_digest, bytes, Some(digest.to_string()))
        } else {
            (digest.to_string(), bytes, None)
        };
        let manifest: ImageManifest = serde_json::from_slice(&manifest_bytes).map_err(|e| {
            ImageError::InvalidImage(format!(
                "{name}: manifest {manifest_digest} is not a v2 image manifest: {e}"
            ))
        })?;
        let config_desc = manifest.config();
        match config_desc.media_type() {
            MediaType::ImageConfig => {}
            MediaType::Other(t) if t == DOCKER_CONFIG => {}
            other => {
                return Err(ImageError::InvalidImage(format!(
                    "{name}: manifest {manifest_digest} has a config of type {other}; it is an \
                     OCI artifact, not a container image"
                )))
            }
        }
        if config_desc.size() > JSON_LIMIT {
            return Err(ImageError::InvalidImage(format!(
                "{name}: image config is {} bytes, more than the {JSON_LIMIT} allowed",
                config_desc.size()
            )));
        }
        let mut blobs: Vec<&Descriptor> = vec![config_desc];
        blobs.extend(manifest.layers().iter());
        let mut keys = Vec::with_capacity(blobs.len() + 1);
        for desc in &blobs {
            let d = desc.digest().to_string();
            let Some(hex) = sha256_hex(&d) else {
                return Err(ImageError::InvalidImage(format!(
                    "{name}: manifest {manifest_digest} names blob {d}; only sha256 digests are \
                     supported"
                )));
            };
            keys.push(blob_key(hex));
        }
        // Pinned before looking for them, so a collection cannot remove a
        // blob between "it is there" and the record that names it.
        let pin = self.store.pin_keys(keys);
        emit(PullEvent::Manifest {
            digest: manifest_digest.clone(),
            layers: manifest.layers().len(),
            bytes: manifest.layers().iter().map(|l| l.size()).sum(),
        });

        let config_digest = config_desc.digest().to_string();
        self.fetch_blob(s, config_desc, None, &|_| {}).await?;
        let config_path = self
            .store
            .blob_path(sha256_hex(&config_digest).unwrap_or_default());
        let config_bytes = tokio::fs::read(&config_path)
            .await
            .map_err(|e| ImageError::io(format!("reading {}", config_path.display()), e))?;
        let actual = sha256_digest(&config_bytes);
        if actual != config_digest {
            return Err(ImageError::DigestMismatch {
                what: format!("image config of {name} in the store"),
                expected: config_digest,
                actual,
            });
        }
        let config = parse_config_from(&config_bytes, &config_digest, name)?;
        check_layer_count(&config, manifest.layers().len(), &config_digest, name)?;

        let fetches = manifest
            .layers()
            .iter()
            .enumerate()
            .map(|(i, desc)| async move {
                let downloaded = self.fetch_blob(s, desc, Some(i), emit).await?;
                emit(PullEvent::Layer {
                    layer: i,
                    digest: desc.digest().to_string(),
                    size: desc.size(),
                    downloaded,
                });
                Ok::<_, ImageError>((desc.digest().to_string(), downloaded))
            });
        let layers = futures_util::future::try_join_all(fetches).await?;
        Ok((
            PulledImage {
                name: name.to_string(),
                origin: name.to_string(),
                manifest_digest,
                manifest_bytes,
                config_digest,
                config_bytes,
                config,
                layers,
                index_digest,
                source: format!("{}/{}", s.repo.registry(), s.repo.repository()),
            },
            pin,
        ))
    }

    /// GETs the manifest `digest` names and checks its bytes against it.
    async fn fetch_manifest(
        &self,
        s: &Session,
        digest: &str,
    ) -> Result<(Vec<u8>, String), ImageError> {
        let at = s.at_digest(digest);
        let (bytes, _) = s
            .client
            .pull_manifest_raw(&at, &s.auth, ACCEPTED_MANIFESTS)
            .await
            .map_err(s.fail(&format!("manifest {digest} of {}", s.origin)))?;
        if bytes.len() as u64 > JSON_LIMIT {
            return Err(ImageError::InvalidImage(format!(
                "{}: manifest {digest} is {} bytes, more than the {JSON_LIMIT} allowed",
                s.origin,
                bytes.len()
            )));
        }
        let actual = sha256_digest(&bytes);
        if actual != digest {
            return Err(ImageError::RemoteDigestMismatch {
                what: format!("manifest of {} from registry {}", s.origin, s.host),
                expected: digest.to_string(),
                actual,
            });
        }
        let doc = serde_json::from_slice::<serde_json::Value>(&bytes).unwrap_or_default();
        let media = doc["mediaType"].as_str().unwrap_or_default().to_string();
        if is_schema1(&doc) {
            return Err(ImageError::InvalidImage(format!(
                "{}: manifest {digest} is a Docker schema 1 manifest, which is not supported; \
                 push the image again with a current tool",
                s.origin
            )));
        }
        Ok((bytes.to_vec(), media))
    }

    /// Makes sure the blob is in the content store, downloading it when it
    /// is not. One download per digest at a time: a concurrent caller waits
    /// and then finds it stored. True when this call downloaded it.
    async fn fetch_blob(
        &self,
        s: &Session,
        desc: &Descriptor,
        layer: Option<usize>,
        emit: &(dyn Fn(PullEvent) + Send + Sync),
    ) -> Result<bool, ImageError> {
        let digest = desc.digest().to_string();
        let hex = sha256_hex(&digest).unwrap_or_default().to_string();
        let gate = lock(&self.fetching)
            .entry(hex.clone())
            .or_insert_with(|| Arc::new(tokio::sync::Mutex::new(())))
            .clone();
        let result = async {
            let _turn = gate.lock().await;
            if self.store.has_blob(&hex) {
                return Ok(false);
            }
            let _slot = self
                .downloads
                .acquire()
                .await
                .map_err(|_| ImageError::Conflict("the node is shutting down".into()))?;
            self.download_blob(s, desc, &hex, layer, emit).await?;
            Ok(true)
        }
        .await;
        let mut fetching = lock(&self.fetching);
        // The map's reference and ours: nobody else waits on this digest.
        if Arc::strong_count(&gate) == 2 {
            fetching.remove(&hex);
        }
        result
    }

    async fn download_blob(
        &self,
        s: &Session,
        desc: &Descriptor,
        hex: &str,
        layer: Option<usize>,
        emit: &(dyn Fn(PullEvent) + Send + Sync),
    ) -> Result<(), ImageError> {
        let digest = desc.digest().to_string();
        let what = match layer {
            Some(i) => format!("layer {} ({digest}) of {}", i + 1, s.origin),
            None => format!("image config {digest} of {}", s.origin),
        };
        let path = self.store.tmp_dir().join(unique_name("pull-"));
        let mut tmp = TmpFile(Some(path.clone()));
        let file = tokio::fs::File::create_new(&path)
            .await
            .map_err(|e| ImageError::io(format!("creating {}", path.display()), e))?;
        let size = desc.size();
        let mut out = Counting {
            inner: file,
            written: 0,
            limit: size,
            reported: 0,
            report: &|bytes| {
                if let Some(i) = layer {
                    emit(PullEvent::Progress {
                        layer: i,
                        digest: digest.clone(),
                        bytes,
                        size,
                    })
                }
            },
        };
        let oci_desc = OciDescriptor {
            media_type: desc.media_type().to_string(),
            digest: digest.clone(),
            size: size as i64,
            ..Default::default()
        };
        let fetched = s.client.pull_blob(&s.repo, &oci_desc, &mut out).await;
        if let Err(e) = fetched {
            // Our size limit surfaces as an I/O error from the writer.
            if out.written > size {
                return Err(ImageError::RemoteDigestMismatch {
                    what: format!(
                        "{what} from registry {}: more bytes than the {size} its descriptor states",
                        s.host
                    ),
                    expected: digest.clone(),
                    actual: "(longer content)".into(),
                });
            }
            return Err(s.fail(&what)(e));
        }
        if out.written != size {
            return Err(ImageError::RemoteDigestMismatch {
                what: format!(
                    "{what} from registry {}: {} bytes received, its descriptor states {size}",
                    s.host, out.written
                ),
                expected: digest.clone(),
                actual: "(shorter content)".into(),
            });
        }
        if out.reported != out.written {
            (out.report)(out.written);
        }
        let mut file = out.inner;
        file.flush()
            .await
            .map_err(|e| ImageError::io(format!("writing {}", path.display()), e))?;
        file.sync_all()
            .await
            .map_err(|e| ImageError::io(format!("syncing {}", path.display()), e))?;
        drop(file);
        let store = self.store.clone();
        let (from, hex_owned) = (path.clone(), hex.to_string());
        blocking(move || store.commit_blob(&from, &hex_owned)).await?;
        tmp.0 = None;
        s.stored.store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}

/// Runs store work off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ImageError> + Send + 'static,
) -> Result<T, ImageError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ImageError::io("image store task", std::io::Error::other(e.to_string())))?
}

/// Errors from the shared store code speak of archives; for a pull, the
/// registry's content is what was wrong.
/// Every source of a pull failed: one error that says what each answered
/// (not found everywhere stays "not found").
fn no_source(reference: &str, failed: Vec<(String, ImageError)>) -> ImageError {
    let all_missing = failed
        .iter()
        .all(|(_, e)| matches!(e, ImageError::RemoteNotFound(_)));
    let tried = failed
        .iter()
        .map(|(source, e)| format!("{source}: {e}"))
        .collect::<Vec<_>>()
        .join("; ");
    let message = format!("no registry served {reference} ({tried})");
    if all_missing {
        ImageError::RemoteNotFound(message)
    } else {
        ImageError::Registry(message)
    }
}

fn remote(e: ImageError) -> ImageError {
    match e {
        ImageError::DigestMismatch {
            what,
            expected,
            actual,
        } => ImageError::RemoteDigestMismatch {
            what,
            expected,
            actual,
        },
        ImageError::InvalidArchive(m) => ImageError::InvalidImage(m),
        other => other,
    }
}

/// Docker's schema 1 manifests (signed or not): no config, no diffIDs.
fn is_schema1(doc: &serde_json::Value) -> bool {
    let media = doc["mediaType"].as_str().unwrap_or_default();
    media.starts_with("application/vnd.docker.distribution.manifest.v1+")
        || doc["schemaVersion"].as_u64() == Some(1)
}

fn is_index(media: &str, bytes: &[u8]) -> bool {
    if media == OCI_INDEX || media == DOCKER_LIST {
        return true;
    }
    if media == OCI_MANIFEST || media == DOCKER_MANIFEST {
        return false;
    }
    serde_json::from_slice::<serde_json::Value>(bytes)
        .map(|v| v.get("manifests").is_some() && v.get("layers").is_none())
        .unwrap_or(false)
}

/// The manifest for this node's platform (linux/<arch>) in a list.
fn select_platform<'a>(
    manifests: &'a [Descriptor],
    name: &str,
    list: &str,
) -> Result<&'a Descriptor, ImageError> {
    let arch = host_arch();
    manifests
        .iter()
        .find(|d| {
            d.platform().as_ref().is_some_and(|p| {
                p.os().to_string() == "linux" && p.architecture().to_string() == arch
            })
        })
        .ok_or_else(|| {
            let platforms: Vec<String> = manifests
                .iter()
                .filter_map(|d| d.platform().as_ref())
                .map(|p| format!("{}/{}", p.os(), p.architecture()))
                .collect();
            ImageError::InvalidImage(format!(
                "{name}: manifest list {list} has no image for linux/{arch} (it has {}); push \
                 one for this platform",
                if platforms.is_empty() {
                    "no platforms".to_string()
                } else {
                    platforms.join(", ")
                }
            ))
        })
}

/// Counts what oci-client writes, refuses more than the descriptor's size
/// (a registry could stream forever) and reports progress now and then.
struct Counting<'a, W> {
    inner: W,
    written: u64,
    limit: u64,
    reported: u64,
    report: &'a (dyn Fn(u64) + Send + Sync),
}

impl<W: AsyncWrite + Unpin> AsyncWrite for Counting<'_, W> {
    fn poll_write(
        mut self: StdPin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.written + buf.len() as u64 > self.limit {
            self.written += buf.len() as u64;
            return Poll::Ready(Err(std::io::Error::other(
                "blob is larger than its descriptor states",
            )));
        }
        let this = &mut *self;
        let n = match StdPin::new(&mut this.inner).poll_write(cx, buf) {
            Poll::Ready(Ok(n)) => n,
            other => return other,
        };
        this.written += n as u64;
        // About twenty reports per blob, at least 1 MiB apart.
        let step = (this.limit / 20).max(1 << 20);
        if this.written - this.reported >= step {
            this.reported = this.written;
            (this.report)(this.written);
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(mut self: StdPin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        StdPin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: StdPin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        StdPin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema1_is_told_from_oci_v1_manifests() {
        let v = |j: serde_json::Value| is_schema1(&j);
        assert!(v(serde_json::json!({"schemaVersion": 1})));
        assert!(v(serde_json::json!({
            "schemaVersion": 1,
            "mediaType": "application/vnd.docker.distribution.manifest.v1+prettyjws"
        })));
        assert!(!v(
            serde_json::json!({"schemaVersion": 2, "mediaType": OCI_MANIFEST})
        ));
        assert!(!v(
            serde_json::json!({"schemaVersion": 2, "mediaType": DOCKER_MANIFEST})
        ));
    }

    #[test]
    fn index_detection() {
        assert!(is_index(OCI_INDEX, b"{}"));
        assert!(is_index(DOCKER_LIST, b"{}"));
        assert!(!is_index(OCI_MANIFEST, b"{\"manifests\":[]}"));
        assert!(is_index("", b"{\"manifests\":[]}"));
        assert!(!is_index("", b"{\"layers\":[]}"));
    }

    #[test]
    fn platform_selection_picks_this_host() {
        let index: ImageIndex = serde_json::from_value(serde_json::json!({
            "schemaVersion": 2,
            "manifests": [
                {"mediaType": OCI_MANIFEST, "digest": format!("sha256:{}", "1".repeat(64)), "size": 1,
                 "platform": {"os": "linux", "architecture": "s390x"}},
                {"mediaType": OCI_MANIFEST, "digest": format!("sha256:{}", "2".repeat(64)), "size": 1,
                 "platform": {"os": "linux", "architecture": host_arch()}},
            ]
        }))
        .unwrap();
        let chosen = select_platform(index.manifests(), "x", "sha256:l").unwrap();
        assert_eq!(
            chosen.digest().to_string(),
            format!("sha256:{}", "2".repeat(64))
        );
        let err = select_platform(&index.manifests()[..1], "x", "sha256:l").unwrap_err();
        assert!(err.to_string().contains("linux/s390x"), "{err}");
    }

    #[tokio::test]
    async fn counting_writer_refuses_oversized_blobs() {
        let seen = Mutex::new(Vec::new());
        let report = |n: u64| lock(&seen).push(n);
        let mut w = Counting {
            inner: Vec::new(),
            written: 0,
            limit: 4,
            reported: 0,
            report: &report,
        };
        w.write_all(b"abcd").await.unwrap();
        assert!(w.write_all(b"e").await.is_err());
        assert_eq!(w.inner, b"abcd");
    }
}

//! The node's images: its store and puller, resolving, pulling (within the
//! store's budget), pushing, pruning, checking that an image can be run,
//! and writing a commit's layer. Which images live sandboxes run is not
//! its business: a caller that must know says so.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::feed::Feed;
use crate::NodeError;
use warren_core::sync::lock;
use warren_image::{ImageRecord, ImageStore, Pin, Progress, Puller};
use warren_node_api::NodeEvent;

pub(crate) struct Images {
    store: Arc<ImageStore>,
    puller: Puller,
    /// Bytes the store may keep after a pull that downloaded layers.
    budget: Option<u64>,
    /// Digests that passed `check` (layers are immutable, so once is enough).
    checked: Mutex<HashSet<String>>,
    /// Where uploads are spooled before they are imported.
    tmp: PathBuf,
    /// Pulls and budget prunes are reported on the node's feed.
    feed: Arc<Feed>,
}

impl Images {
    pub(crate) fn new(
        store: Arc<ImageStore>,
        puller: Puller,
        budget: Option<u64>,
        tmp: PathBuf,
        feed: Arc<Feed>,
    ) -> Images {
        Images {
            store,
            puller,
            budget,
            checked: Mutex::new(HashSet::new()),
            tmp,
            feed,
        }
    }

    /// The store, for blocking work handed to a thread of its own.
    pub(crate) fn store(&self) -> Arc<ImageStore> {
        self.store.clone()
    }

    /// Where an upload is spooled before it is imported.
    pub(crate) fn tmp_dir(&self) -> &std::path::Path {
        &self.tmp
    }

    /// Keeps the image's layers while a sandbox runs it.
    pub(crate) fn pin(&self, image: &ImageRecord) -> Pin {
        self.store.pin_image(image)
    }

    /// The image's layer directories, for a sandbox's overlay root.
    pub(crate) async fn lower_dirs(&self, image: &ImageRecord) -> Result<Vec<PathBuf>, NodeError> {
        let images = self.store.clone();
        let image = image.clone();
        Ok(tokio::task::spawn_blocking(move || images.lower_dirs(&image)).await??)
    }

    /// Writes a sandbox's changes (`upper`, its writable layer) as a new
    /// layer on `base`, under `name`. The caller keeps the sandbox frozen
    /// meanwhile.
    pub(crate) async fn commit_changes(
        &self,
        base: &ImageRecord,
        upper: PathBuf,
        owners: warren_image::Owners,
        name: &str,
        created_by: String,
    ) -> Result<ImageRecord, NodeError> {
        let images = self.store.clone();
        let base = base.clone();
        let name = name.to_string();
        Ok(tokio::task::spawn_blocking(move || {
            let how = warren_image::Derivation {
                settings: None,
                created_by: &created_by,
                comment: "warren commit",
            };
            images.commit_changes(&base, &upper, owners, &name, &how)
        })
        .await??)
    }

    pub(crate) async fn resolve(&self, reference: &str) -> Result<ImageRecord, NodeError> {
        let images = self.store.clone();
        let r = reference.to_string();
        Ok(tokio::task::spawn_blocking(move || images.resolve(&r)).await??)
    }

    /// Takes the registries a cluster's control plane gives at join
    /// beneath the node's own `registries.toml` (None: none).
    pub(crate) fn set_cluster_registries(&self, text: Option<&str>) -> Result<(), NodeError> {
        Ok(self.puller.set_cluster_registries(text)?)
    }

    /// Pulls `reference` (`host[:port]/repo[:tag|@digest]`) from its
    /// registry: resolves it to a digest there and downloads what the
    /// store lacks.
    pub(crate) async fn pull(
        &self,
        reference: &str,
        progress: Option<Progress>,
    ) -> Result<ImageRecord, NodeError> {
        // (layers downloaded, bytes downloaded, answered from the store), for
        // the event at the end.
        let fetched = Arc::new(Mutex::new((0usize, 0u64, false)));
        let counter = fetched.clone();
        let tap: Progress = Arc::new(move |e: warren_image::PullEvent| {
            {
                let mut f = lock(&counter);
                match &e {
                    warren_image::PullEvent::Layer {
                        size,
                        downloaded: true,
                        ..
                    } => {
                        f.0 += 1;
                        f.1 += size;
                    }
                    warren_image::PullEvent::Done { cached, .. } => f.2 = *cached,
                    _ => {}
                }
            }
            if let Some(p) = &progress {
                p(e)
            }
        });
        let started = std::time::Instant::now();
        let result = self.puller.pull(reference, Some(tap)).await;
        let (layers, bytes, cached) = {
            let f = lock(&fetched);
            *f
        };
        let event = match &result {
            // Every create re-resolves its tag; one that found the digest in
            // the store is not news (the sandbox records the digest).
            Ok(_) if cached => return result.map_err(NodeError::from),
            Ok(image) => NodeEvent::ImagePull {
                reason: "image_pulled".into(),
                message: format!(
                    "{reference} is {} ({} layers); downloaded {layers} layers, {bytes} bytes \
                     in {:.3}s",
                    image.digest,
                    image.layers.len(),
                    started.elapsed().as_secs_f64()
                ),
            },
            Err(e) => NodeEvent::ImagePull {
                reason: "image_pull_failed".into(),
                message: format!("{reference}: {e}"),
            },
        };
        self.feed.push(event);
        if let (Some(budget), Ok(image)) = (self.budget, &result) {
            if layers > 0 {
                self.enforce_budget(budget, image);
            }
        }
        Ok(result?)
    }

    /// Prunes the store to `budget` in the background: the pull that grew it
    /// has its answer already, and its image is kept (it is about to be
    /// used).
    fn enforce_budget(&self, budget: u64, pulled: &ImageRecord) {
        let images = self.store.clone();
        let feed = self.feed.clone();
        let keep = self.store.pin_image(pulled);
        tokio::task::spawn_blocking(move || {
            let _keep = keep;
            match images.prune(Some(budget)) {
                Ok(report) if !report.removed.is_empty() => {
                    feed.push(NodeEvent::ImagePull {
                    reason: "images_pruned".into(),
                    message: format!(
                        "image store over its budget of {budget} bytes: removed {} ({} -> {} bytes)",
                        report.removed.join(", "),
                        report.used_before,
                        report.used_after
                    ),
                });
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "could not prune the image store to its budget")
                }
            }
        });
    }

    /// Pushes a stored image (`source`, default the image named
    /// `reference`) to `reference` at its registry. Returns the image and
    /// the blobs uploaded and mounted.
    pub(crate) async fn push(
        &self,
        reference: &str,
        source: Option<&str>,
    ) -> Result<(ImageRecord, warren_image::Pushed), NodeError> {
        Ok(self.puller.push(reference, source).await?)
    }

    /// Collects unreferenced image content and, with a budget, removes
    /// registry images no live sandbox uses until the store fits it.
    pub(crate) async fn prune(
        &self,
        budget: Option<u64>,
    ) -> Result<warren_image::PruneReport, NodeError> {
        let images = self.store.clone();
        Ok(tokio::task::spawn_blocking(move || images.prune(budget)).await??)
    }

    /// The image a new sandbox runs: a registry reference is resolved at
    /// the registry every time (a tag may have moved) and pulled when the
    /// store lacks that digest; anything else names an image in the store.
    ///
    /// A short name (`debian:bookworm`) the store lacks is, as with Docker,
    /// the copy pulled before under its full name (the search registries'
    /// order), else pulled through them.
    pub(crate) async fn for_create(&self, reference: &str) -> Result<ImageRecord, NodeError> {
        if warren_core::image_ref::registry_host(reference).is_some() {
            return self.pull(reference, None).await;
        }
        let missing = match self.resolve(reference).await {
            Err(NodeError::Image(e)) if e.kind() == warren_image::ErrorKind::NotFound => e,
            other => return other,
        };
        let full = self.puller.full_names(reference)?;
        if full.is_empty() {
            return Err(missing.into());
        }
        for name in &full {
            if let Ok(record) = self.resolve(name).await {
                return Ok(record);
            }
        }
        self.pull(reference, None).await
    }

    /// Refuses images a sandbox cannot safely be made from (see
    /// `warren_runtime::check_system_dirs`), before anything is recorded.
    pub(crate) async fn check(&self, image: &ImageRecord) -> Result<(), NodeError> {
        // Layers are immutable: an image that passed once passes again.
        if lock(&self.checked).contains(&image.digest) {
            return Ok(());
        }
        let images = self.store.clone();
        let record = image.clone();
        tokio::task::spawn_blocking(move || -> Result<(), NodeError> {
            let lower = images.lower_dirs(&record)?;
            Ok(warren_runtime::check_system_dirs(&lower)?)
        })
        .await??;
        {
            let mut c = lock(&self.checked);
            c.insert(image.digest.clone());
        }
        Ok(())
    }

    /// An image the store holds (or `scratch`, the empty one) with its
    /// config changed, or (with neither settings nor history) under one
    /// more name.
    pub(crate) async fn derive(
        &self,
        base: &str,
        name: &str,
        settings: Option<warren_core::build::ImageSettings>,
        created_by: Option<String>,
    ) -> Result<ImageRecord, NodeError> {
        let base = if base == "scratch" {
            let images = self.store.clone();
            tokio::task::spawn_blocking(move || images.scratch()).await??
        } else {
            self.resolve(base).await?
        };
        let images = self.store.clone();
        let name = name.to_string();
        Ok(
            tokio::task::spawn_blocking(move || match (&settings, &created_by) {
                (None, None) => images.tag(&base, &name),
                _ => {
                    let how = warren_image::Derivation {
                        settings: settings.as_ref(),
                        created_by: created_by.as_deref().unwrap_or(""),
                        comment: "warren build",
                    };
                    images.derive(&base, &how, &name)
                }
            })
            .await??,
        )
    }
}

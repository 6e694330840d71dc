//! The node's images: resolving, pulling (with the store's budget), pushing,
//! pruning, checking that an image can be run, and commits of sandboxes.

use std::sync::{Arc, Mutex};

use crate::{Node, NodeError};
use warren_core::sync::lock;
use warren_image::{ImageRecord, Progress};
use warren_node_api::{NodeEvent, Phase};

impl Node {
    /// Image digests used by live sandboxes (they must not be removed).
    pub fn images_in_use(&self) -> Vec<String> {
        lock(&self.live)
            .values()
            .map(|l| l.image_digest.clone())
            .collect()
    }

    pub async fn resolve_image(&self, reference: &str) -> Result<ImageRecord, NodeError> {
        let images = self.images.clone();
        let r = reference.to_string();
        Ok(tokio::task::spawn_blocking(move || images.resolve(&r)).await??)
    }

    /// Takes the registries a cluster's control plane gives at join
    /// beneath this node's own `registries.toml` (None: none).
    pub fn set_cluster_registries(&self, text: Option<&str>) -> Result<(), NodeError> {
        Ok(self.puller.set_cluster_registries(text)?)
    }

    /// Pulls `reference` (`host[:port]/repo[:tag|@digest]`) from its
    /// registry: resolves it to a digest there and downloads what the
    /// store lacks.
    pub async fn pull_image(
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
        if let (Some(budget), Ok(image)) = (self.image_budget, &result) {
            if layers > 0 {
                self.enforce_image_budget(budget, image);
            }
        }
        Ok(result?)
    }

    /// Prunes the store to `budget` in the background: the pull that grew it
    /// has its answer already, and its image is kept (it is about to be
    /// used).
    pub(crate) fn enforce_image_budget(&self, budget: u64, pulled: &ImageRecord) {
        let images = self.images.clone();
        let feed = self.feed.clone();
        let keep = self.images.pin_image(pulled);
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
    pub async fn push_image(
        &self,
        reference: &str,
        source: Option<&str>,
    ) -> Result<(ImageRecord, warren_image::Pushed), NodeError> {
        Ok(self.puller.push(reference, source).await?)
    }

    /// Collects unreferenced image content and, with a budget, removes
    /// registry images no live sandbox uses until the store fits it.
    pub async fn prune_images(
        &self,
        budget: Option<u64>,
    ) -> Result<warren_image::PruneReport, NodeError> {
        let images = self.images.clone();
        Ok(tokio::task::spawn_blocking(move || images.prune(budget)).await??)
    }

    /// The image a new sandbox runs: a registry reference is resolved at
    /// the registry every time (a tag may have moved) and pulled when the
    /// store lacks that digest; anything else names an image in the store.
    ///
    /// A short name (`debian:bookworm`) the store lacks is, as with Docker,
    /// the copy pulled before under its full name (the search registries'
    /// order), else pulled through them.
    pub async fn image_for_create(&self, reference: &str) -> Result<ImageRecord, NodeError> {
        if warren_core::image_ref::registry_host(reference).is_some() {
            return self.pull_image(reference, None).await;
        }
        let missing = match self.resolve_image(reference).await {
            Err(NodeError::Image(e)) if e.kind() == warren_image::ErrorKind::NotFound => e,
            other => return other,
        };
        let full = self.puller.full_names(reference)?;
        if full.is_empty() {
            return Err(missing.into());
        }
        for name in &full {
            if let Ok(record) = self.resolve_image(name).await {
                return Ok(record);
            }
        }
        self.pull_image(reference, None).await
    }

    /// Refuses images a sandbox cannot safely be made from (see
    /// `warren_runtime::check_system_dirs`), before anything is recorded.
    pub async fn check_image(&self, image: &ImageRecord) -> Result<(), NodeError> {
        // Layers are immutable: an image that passed once passes again.
        if lock(&self.checked_images).contains(&image.digest) {
            return Ok(());
        }
        let images = self.images.clone();
        let record = image.clone();
        tokio::task::spawn_blocking(move || -> Result<(), NodeError> {
            let lower = images.lower_dirs(&record)?;
            Ok(warren_runtime::check_system_dirs(&lower)?)
        })
        .await??;
        {
            let mut c = lock(&self.checked_images);
            c.insert(image.digest.clone());
        }
        Ok(())
    }

    /// Records the sandbox's filesystem changes as a new layer on top of its
    /// image, under `name`. A running sandbox's processes are frozen while
    /// the layer is written (so files are not caught half-changed) and
    /// thawed after; a paused or kept sandbox is already frozen.
    pub async fn commit(
        self: &Arc<Self>,
        id: &str,
        name: &str,
        created_by: Option<String>,
    ) -> Result<ImageRecord, NodeError> {
        let live = self.get(id)?;
        let freeze = live.phase() == Phase::Running;
        let upper = self.runtime.upper_dir(id).ok_or_else(|| {
            NodeError::BadRequest(format!(
                "sandbox {id} has a disk limit; its changes live on its own file system, \
                 which commit cannot read yet: create the sandbox without --disk to commit it"
            ))
        })?;
        if freeze {
            self.freeze(id, true).await?;
        }
        let images = self.images.clone();
        let base = live.image.clone();
        let name = name.to_string();
        let created_by = created_by.unwrap_or_else(|| format!("warren commit {id}"));
        let owners = warren_image::Owners {
            root: self.runtime.id_range(id).map(|r| r.base),
        };
        let result = tokio::task::spawn_blocking(move || {
            let how = warren_image::Derivation {
                settings: None,
                created_by: &created_by,
                comment: "warren commit",
            };
            images.commit_changes(&base, &upper, owners, &name, &how)
        })
        .await;
        if freeze {
            if let Err(e) = self.freeze(id, false).await {
                tracing::warn!(id, error = %e, "could not thaw the sandbox after commit");
            }
        }
        Ok(result??)
    }

    /// An image the store holds (or `scratch`, the empty one) with its
    /// config changed, or (with neither settings nor history) under one
    /// more name.
    pub async fn derive_image(
        &self,
        base: &str,
        name: &str,
        settings: Option<warren_core::build::ImageSettings>,
        created_by: Option<String>,
    ) -> Result<ImageRecord, NodeError> {
        let base = if base == "scratch" {
            let images = self.images.clone();
            tokio::task::spawn_blocking(move || images.scratch()).await??
        } else {
            self.resolve_image(base).await?
        };
        let images = self.images.clone();
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

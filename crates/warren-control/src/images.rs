//! Images, as the control plane asks its nodes for them: a push's
//! reference is checked here (it needs a registry), each node's store does
//! the rest (a short name is written out through its search registries).
//! Pulls, imports, removals and collections go to every reachable node.

mod owners;

use std::sync::Arc;

use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use warren_core::image_ref::{registry_host, ClusterRegistry};
use warren_core::tenant::TenantName;
use warren_core::ApiError;
use warren_node_api::{ErrorKind, GcReport, ImageInfo, NodeApi, NodeError, PullUpdate, Pushed};

use crate::admission::{admit_error, AdmitError};
use crate::node_errors::node_error;
use crate::nodes::{Health, NodeEntry, Nodes};
use crate::store::Store;
use crate::streams::to_node;
use crate::streams::ByteStream;

/// A push needs a registry in its reference (a pull or prewarm does not:
/// each node writes a short name out through its search registries).
fn needs_registry(reference: &str) -> Result<(), ApiError> {
    if registry_host(reference).is_some() {
        return Ok(());
    }
    Err(ApiError::bad_request(format!(
        "{reference:?} names no registry; push takes host[:port]/repository:tag (use --from to push a local image under that name)"
    )))
}

/// An image resolved for the cluster.
pub(crate) struct Resolved {
    pub(crate) image: ImageInfo,
    /// A registry reference pinned to its digest that any node can pull;
    /// None: the image is local to each node.
    pub(crate) source: Option<String>,
}

/// The images service: the cluster's images, kept by its nodes (each
/// through its contract) and published to the cluster registry.
pub struct Images {
    /// The nodes, shared with the control plane.
    nodes: Arc<Nodes>,
    /// Where images built, committed or imported here are published for
    /// every node (`--cluster-registry`); None: images stay on their node.
    cluster_registry: Option<ClusterRegistry>,
    /// Who owns each image name (see [`owners`]).
    store: Arc<dyn Store>,
}

/// The nodes image and volume calls go to: every reachable one.
pub(crate) fn reachable(nodes: &Nodes) -> Result<Vec<Arc<NodeEntry>>, ApiError> {
    let nodes: Vec<_> = nodes
        .all()
        .into_iter()
        .filter(|n| n.view().health == Health::Ready)
        .collect();
    if nodes.is_empty() {
        return Err(ApiError::new(
            warren_core::ErrorCode::Unavailable,
            "no node is reachable; see `warren node ls`",
        ));
    }
    Ok(nodes)
}

/// The node that resolves a create's image reference (and checks the
/// image): a reachable node carrying `selector`'s labels, not short of
/// disk or memory.
pub(crate) fn resolving_node(
    nodes: &Nodes,
    selector: &warren_core::Labels,
) -> Result<Arc<NodeEntry>, ApiError> {
    let candidates: Vec<_> = nodes
        .all()
        .into_iter()
        .map(|n| (n.view(), n))
        .filter(|(v, _)| {
            v.health == Health::Ready && crate::placement::selects(selector, &v.info.labels)
        })
        .collect();
    if candidates.is_empty() {
        let which = if selector.is_empty() {
            "is reachable".to_string()
        } else {
            let sel: Vec<String> = selector.iter().map(|(k, v)| format!("{k}={v}")).collect();
            format!("carrying the labels {} is reachable", sel.join(","))
        };
        return Err(admit_error(AdmitError::NoNode(which)));
    }
    let disk_low = candidates.iter().all(|(v, _)| v.info.load.disk_pressure);
    candidates
        .into_iter()
        .find(|(v, _)| !v.info.load.disk_pressure && !v.info.load.memory_pressure)
        .map(|(_, n)| n)
        .ok_or_else(|| ApiError {
            code: warren_core::ErrorCode::NoCapacity,
            message: if disk_low {
                "free disk space under the node's home is below its --disk-floor; no sandboxes start until some is freed (remove sandboxes, images or other files there, or lower --disk-floor; see docs/configuration.md)"
            } else {
                "the host's available memory is below the node's --memory-floor; no sandboxes start until some is freed (the sandbox furthest above its memory request is stopped; see `warren ps` and docs/configuration.md)"
            }
            .into(),
            retry_after_ms: Some(5000),
        })
}

impl Images {
    pub(crate) fn new(
        nodes: Arc<Nodes>,
        store: Arc<dyn Store>,
        cluster_registry: Option<ClusterRegistry>,
    ) -> Images {
        Images {
            nodes,
            cluster_registry,
            store,
        }
    }

    /// The node that resolves a create's image reference (and checks the
    /// image): a reachable node the create may run on, not short of disk.
    pub(crate) fn resolver(
        &self,
        selector: &warren_core::Labels,
    ) -> Result<Arc<dyn NodeApi>, ApiError> {
        self.resolving_node(selector).map(|n| n.api.clone())
    }

    /// [`Images::resolver`]'s node, named.
    pub(crate) fn resolving_node(
        &self,
        selector: &warren_core::Labels,
    ) -> Result<Arc<NodeEntry>, ApiError> {
        resolving_node(&self.nodes, selector)
    }

    /// Where a node that lacks `digest` pulls it for a sandbox of
    /// `reference`: the reference's own registry, or the cluster registry
    /// a local name is published to.
    pub(crate) fn source(&self, reference: &str, digest: &str) -> Option<String> {
        warren_core::image_ref::pinned(reference, digest).or_else(|| {
            self.cluster_registry
                .as_ref()
                .and_then(|r| r.pinned(reference, digest))
        })
    }

    /// The image a new sandbox of `reference` runs, resolved on `node`: a
    /// local name published to the cluster registry is its newest push
    /// there (any node can pull that digest, however old its own copy);
    /// anything else, or a name never published, as the node resolves it.
    /// Another tenant's image is, to `tenant`, no image at all.
    pub(crate) async fn for_create(
        &self,
        tenant: &TenantName,
        node: &dyn NodeApi,
        reference: &str,
    ) -> Result<ImageInfo, NodeError> {
        self.resolve(tenant, node, reference).await.map(|r| r.image)
    }

    /// [`Images::for_create`], with where any node pulls it.
    pub(crate) async fn resolve(
        &self,
        tenant: &TenantName,
        node: &dyn NodeApi,
        reference: &str,
    ) -> Result<Resolved, NodeError> {
        let resolved = self.resolve_any(node, reference).await?;
        self.check_use(tenant, reference, &resolved.image).await?;
        Ok(resolved)
    }

    /// [`Images::resolve`] for whoever asks.
    async fn resolve_any(
        &self,
        node: &dyn NodeApi,
        reference: &str,
    ) -> Result<Resolved, NodeError> {
        let published = self
            .cluster_registry
            .as_ref()
            .and_then(|r| r.reference(reference));
        if let Some(published) = published {
            match node.image_for_create(&published).await {
                Ok(image) => {
                    return Ok(Resolved {
                        source: warren_core::image_ref::pinned(&published, &image.digest),
                        image,
                    })
                }
                Err(e) if e.kind == ErrorKind::NotFound => {}
                Err(e) => tracing::warn!(
                    image = %reference,
                    "the cluster registry did not answer for {published} ({}); using the node's own copy",
                    e.message
                ),
            }
        }
        let image = node.image_for_create(reference).await?;
        Ok(Resolved {
            source: warren_core::image_ref::pinned(reference, &image.digest),
            image,
        })
    }

    /// Pushes the local image `name` from `node` to the cluster registry,
    /// so every node can pull it; the reference it now has there (None:
    /// no cluster registry, or not a local name).
    pub(crate) async fn publish(
        &self,
        node: &dyn NodeApi,
        name: &str,
    ) -> Result<Option<String>, ApiError> {
        let Some(published) = self
            .cluster_registry
            .as_ref()
            .and_then(|r| r.reference(name))
        else {
            return Ok(None);
        };
        node.image_push(&published, Some(name)).await.map_err(|e| {
            let mut e = node_error(e);
            e.message = format!(
                "publishing {name} to the cluster registry as {published}: {}",
                e.message
            );
            e
        })?;
        Ok(Some(published))
    }

    /// Every image on a reachable node, once per name and digest.
    async fn list_all(&self) -> Result<Vec<ImageInfo>, ApiError> {
        let mut seen = std::collections::HashSet::new();
        let mut all = Vec::new();
        for node in reachable(&self.nodes)? {
            for image in node.api.image_list().await.map_err(node_error)? {
                if seen.insert((image.name.clone(), image.digest.clone())) {
                    all.push(image);
                }
            }
        }
        Ok(all)
    }

    /// Imports an archive into every reachable node (and publishes it to
    /// the cluster registry, for nodes that join later). With more than one,
    /// the archive is spooled to a temporary file first (streamed, never
    /// held in memory) and sent to each in turn.
    pub async fn import(&self, name: &str, archive: ByteStream) -> Result<ImageInfo, ApiError> {
        let nodes = reachable(&self.nodes)?;
        if let [node] = nodes.as_slice() {
            let image = node
                .api
                .image_import(name, to_node(archive))
                .await
                .map_err(node_error)?;
            // Nodes that join later pull it from there.
            self.publish(node.api.as_ref(), name).await?;
            return Ok(image);
        }
        let spool = spool(archive).await?;
        let mut last = None;
        for node in &nodes {
            let file = tokio::fs::File::open(spool.path())
                .await
                .map_err(|e| ApiError::internal(format!("reading the spooled archive: {e}")))?;
            let body = tokio_util::io::ReaderStream::new(file)
                .map(|r| {
                    r.map_err(|e| ApiError::internal(format!("reading the spooled archive: {e}")))
                })
                .boxed();
            let image = node
                .api
                .image_import(name, to_node(body))
                .await
                .map_err(|e| prefixed(&node.name, e))?;
            last = Some(image);
        }
        self.publish(nodes[0].api.as_ref(), name).await?;
        last.ok_or_else(|| ApiError::internal("no node imported the image"))
    }

    /// A registry pull onto every reachable node, one after another: each
    /// node's progress, then the image (or the first error).
    pub async fn pull(&self, reference: &str) -> Result<BoxStream<'static, PullUpdate>, ApiError> {
        let nodes = reachable(&self.nodes)?;
        let count = nodes.len();
        let reference = reference.to_string();
        let per_node =
            futures_util::stream::iter(nodes.into_iter().enumerate()).then(move |(i, node)| {
                let reference = reference.clone();
                async move {
                    let last = i + 1 == count;
                    match node.api.image_pull(&reference).await {
                        // Only the last node's image ends the stream.
                        Ok(updates) => updates
                            .filter(move |u| {
                                std::future::ready(last || !matches!(u, PullUpdate::Image { .. }))
                            })
                            .boxed(),
                        Err(error) => {
                            futures_util::stream::once(async move { PullUpdate::Error { error } })
                                .boxed()
                        }
                    }
                }
            });
        let mut failed = false;
        Ok(per_node
            .flatten()
            .take_while(move |u| {
                let go = !failed;
                failed |= matches!(u, PullUpdate::Error { .. });
                std::future::ready(go)
            })
            .boxed())
    }

    /// Pushes from the first node that holds the source image.
    pub async fn push(&self, reference: &str, source: Option<&str>) -> Result<Pushed, ApiError> {
        needs_registry(reference)?;
        let mut not_found = None;
        for node in reachable(&self.nodes)? {
            match node.api.image_push(reference, source).await {
                Err(e) if e.kind == ErrorKind::NotFound => not_found = Some(e),
                other => return other.map_err(node_error),
            }
        }
        Err(node_error(not_found.unwrap_or_else(|| {
            NodeError::new(ErrorKind::NotFound, "no node holds the image")
        })))
    }

    /// Collects unused images on every reachable node; what each removed,
    /// together.
    pub async fn gc(&self, budget: Option<u64>) -> Result<GcReport, ApiError> {
        let mut all = GcReport::default();
        for node in reachable(&self.nodes)? {
            let r = node.api.image_gc(budget).await.map_err(node_error)?;
            all.removed.extend(r.removed);
            all.used_before += r.used_before;
            all.used_after += r.used_after;
        }
        Ok(all)
    }

    /// Pulls `reference` onto `nodes` (every reachable node carrying the
    /// selector's labels when empty) ahead of the sandboxes that will run
    /// it, side by side; what each node now holds.
    pub async fn prewarm(
        &self,
        reference: &str,
        nodes: &[String],
        selector: &warren_core::Labels,
    ) -> Result<Vec<(String, ImageInfo)>, ApiError> {
        let targets = if nodes.is_empty() {
            let matching: Vec<_> = reachable(&self.nodes)?
                .into_iter()
                .filter(|n| crate::placement::selects(selector, &n.view().info.labels))
                .collect();
            if matching.is_empty() {
                return Err(ApiError::bad_request(
                    "no reachable node carries the --node-selector labels; see `warren node ls`",
                ));
            }
            matching
        } else {
            let mut targets = Vec::new();
            for name in nodes {
                let Some(node) = self.nodes.get(name) else {
                    let known: Vec<String> =
                        self.nodes.all().iter().map(|n| n.name.clone()).collect();
                    return Err(ApiError::bad_request(format!(
                        "unknown node {name:?}; this cluster has {known:?} (see `warren node ls`), nothing was pulled"
                    )));
                };
                targets.push(node);
            }
            targets
        };
        let pulls = targets.iter().map(|node| async move {
            self.resolve_any(node.api.as_ref(), reference)
                .await
                .map(|r| r.image)
                .map(|image| (node.name.clone(), image))
                .map_err(|e| prefixed(&node.name, e))
        });
        futures_util::future::join_all(pulls)
            .await
            .into_iter()
            .collect()
    }

    /// Removes an image from every reachable node that has it.
    async fn remove_everywhere(&self, reference: &str) -> Result<ImageInfo, ApiError> {
        let mut removed = None;
        let mut not_found = None;
        for node in reachable(&self.nodes)? {
            match node.api.image_remove(reference).await {
                Ok(image) => removed = Some(image),
                Err(e) if e.kind == ErrorKind::NotFound => not_found = Some(e),
                Err(e) => return Err(prefixed(&node.name, e)),
            }
        }
        match (removed, not_found) {
            (Some(image), _) => Ok(image),
            (None, Some(e)) => Err(node_error(e)),
            (None, None) => Err(ApiError::internal("no node answered")),
        }
    }
}

/// A node's error, saying which node (a cluster has several).
pub(crate) fn prefixed(node: &str, mut e: NodeError) -> ApiError {
    e.message = format!("node {node}: {}", e.message);
    node_error(e)
}

/// Writes a stream to an anonymous temporary file.
async fn spool(mut archive: ByteStream) -> Result<tempfile::NamedTempFile, ApiError> {
    use tokio::io::AsyncWriteExt;
    let spool = tempfile::NamedTempFile::new()
        .map_err(|e| ApiError::internal(format!("a temporary file for the archive: {e}")))?;
    let file = spool
        .reopen()
        .map_err(|e| ApiError::internal(format!("a temporary file for the archive: {e}")))?;
    let mut file = tokio::fs::File::from_std(file);
    while let Some(chunk) = archive.next().await {
        let chunk =
            chunk.map_err(|e| ApiError::bad_request(format!("reading the archive: {e}")))?;
        file.write_all(&chunk)
            .await
            .map_err(|e| ApiError::internal(format!("spooling the archive: {e}")))?;
    }
    file.flush()
        .await
        .map_err(|e| ApiError::internal(format!("spooling the archive: {e}")))?;
    Ok(spool)
}

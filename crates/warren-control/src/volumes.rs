//! Volumes, as the control plane sees them: each lives on one node (made on
//! one that carries the request's labels), its name is unique in the
//! cluster, and a sandbox that mounts volumes is placed on their node.

use std::sync::Arc;

use warren_core::files::{PathEntry, PathOp, VolumeWrite};
use warren_core::volume::{VolumeInfo, VolumeMount, VolumeName, VolumeRequest};
use warren_core::ApiError;
use warren_node_api::NodeApi;

use crate::images::{prefixed, reachable, resolving_node};
use crate::node_errors::node_error;
use crate::nodes::{NodeEntry, Nodes};
use crate::streams::to_node;
use crate::streams::{file_read, ByteStream, FileRead};

/// The volumes service: the cluster's volumes, each kept by its node.
pub struct Volumes {
    /// The nodes, shared with the control plane.
    nodes: Arc<Nodes>,
}

/// The volume a name was asked for does not exist.
fn not_found(name: &VolumeName) -> ApiError {
    ApiError::not_found(format!(
        "volume {name} does not exist (see `warren volume ls`)"
    ))
}

impl Volumes {
    pub(crate) fn new(nodes: Arc<Nodes>) -> Volumes {
        Volumes { nodes }
    }

    /// Every volume on every reachable node, by name, with that node.
    async fn listed(&self) -> Result<Vec<(VolumeInfo, Arc<NodeEntry>)>, ApiError> {
        let mut all = Vec::new();
        for node in reachable(&self.nodes)? {
            let listed = node
                .api
                .volume_list()
                .await
                .map_err(|e| prefixed(&node.name, e))?;
            all.extend(listed.into_iter().map(|v| {
                let v = VolumeInfo {
                    node: node.name.clone(),
                    ..v
                };
                (v, node.clone())
            }));
        }
        all.sort_by(|(a, _), (b, _)| a.name.cmp(&b.name));
        Ok(all)
    }

    /// Every volume on every reachable node, by name.
    pub async fn list(&self) -> Result<Vec<VolumeInfo>, ApiError> {
        Ok(self.listed().await?.into_iter().map(|(v, _)| v).collect())
    }

    /// The volume of that name, wherever it is, with its node.
    async fn find(
        &self,
        name: &VolumeName,
    ) -> Result<Option<(VolumeInfo, Arc<NodeEntry>)>, ApiError> {
        Ok(self
            .listed()
            .await?
            .into_iter()
            .find(|(v, _)| &v.name == name))
    }

    /// The volume of that name; NotFound when no reachable node has it.
    pub async fn info(&self, name: &VolumeName) -> Result<VolumeInfo, ApiError> {
        self.find(name)
            .await?
            .map(|(v, _)| v)
            .ok_or_else(|| not_found(name))
    }

    /// A volume's files, read and written without a sandbox, on its node
    /// (NotFound when no reachable node has it).
    pub async fn files(&self, name: &VolumeName) -> Result<VolumeFiles, ApiError> {
        let (info, node) = self.find(name).await?.ok_or_else(|| not_found(name))?;
        Ok(VolumeFiles {
            info,
            api: node.api.clone(),
        })
    }

    /// Makes a volume on a node carrying the request's labels; a name any
    /// node already has is refused.
    pub async fn create(&self, req: VolumeRequest) -> Result<VolumeInfo, ApiError> {
        if let Some((v, _)) = self.find(&req.name).await? {
            return Err(ApiError::conflict(format!(
                "volume {} already exists (on node {})",
                v.name, v.node
            )));
        }
        let node = resolving_node(&self.nodes, &req.node_selector)?;
        let made = node
            .api
            .volume_create(req)
            .await
            .map_err(|e| prefixed(&node.name, e))?;
        Ok(VolumeInfo {
            node: node.name.clone(),
            ..made
        })
    }

    /// Removes a volume no sandbox mounts, with its files.
    pub async fn remove(&self, name: &VolumeName) -> Result<VolumeInfo, ApiError> {
        let Some((v, node)) = self.find(name).await? else {
            return Err(not_found(name));
        };
        let removed = node.api.volume_remove(name).await.map_err(node_error)?;
        Ok(VolumeInfo {
            node: v.node,
            ..removed
        })
    }

    /// The node holding every volume of `mounts`; None without mounts.
    pub(crate) async fn node_of(&self, mounts: &[VolumeMount]) -> Result<Option<String>, ApiError> {
        if mounts.is_empty() {
            return Ok(None);
        }
        let all = self.list().await?;
        let mut node: Option<&str> = None;
        for m in mounts {
            let Some(v) = all.iter().find(|v| v.name == m.name) else {
                return Err(ApiError::not_found(format!(
                    "volume {} does not exist (`warren volume create {} --size SIZE` makes it)",
                    m.name, m.name
                )));
            };
            match node {
                Some(n) if n != v.node => {
                    return Err(ApiError::bad_request(format!(
                        "volumes {} and {} are on different nodes ({n} and {}); a sandbox mounts volumes of one node",
                        mounts[0].name, m.name, v.node
                    )))
                }
                _ => node = Some(&v.node),
            }
        }
        Ok(node.map(str::to_string))
    }
}

/// A volume's files, on the node that holds it: what E2B's volume content
/// API reads and writes. The node resolves every path inside the volume.
pub struct VolumeFiles {
    pub info: VolumeInfo,
    api: Arc<dyn NodeApi>,
}

impl VolumeFiles {
    /// Writes one file from `body` (see [`VolumeWrite`]); answers it.
    pub async fn write(&self, req: VolumeWrite, body: ByteStream) -> Result<PathEntry, ApiError> {
        self.api
            .volume_write(&self.info.name, req, to_node(body))
            .await
            .map_err(node_error)
    }

    pub async fn read(&self, path: &str) -> Result<FileRead, ApiError> {
        self.api
            .volume_read(&self.info.name, path)
            .await
            .map(file_read)
            .map_err(node_error)
    }

    pub async fn path_op(&self, op: PathOp) -> Result<Vec<PathEntry>, ApiError> {
        self.api
            .volume_path_op(&self.info.name, op)
            .await
            .map_err(node_error)
    }
}

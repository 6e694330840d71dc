//! Volumes, as the control plane sees them: each lives on one node (made on
//! one that carries the request's labels), its name is unique in the
//! cluster, a sandbox that mounts volumes is placed on their node, and each
//! belongs to the tenant that made it (kept in the store: the node knows
//! nothing of tenants). Another tenant's volume answers as one that does
//! not exist.

use std::collections::HashMap;
use std::sync::Arc;

use warren_core::files::{PathEntry, PathOp, VolumeWrite};
use warren_core::tenant::{Principal, TenantName};
use warren_core::volume::{VolumeInfo, VolumeMount, VolumeName, VolumeRequest};
use warren_core::ApiError;
use warren_node_api::NodeApi;

use crate::images::{prefixed, reachable, resolving_node};
use crate::node_errors::node_error;
use crate::nodes::{NodeEntry, Nodes};
use crate::store::{OwnedName, Store};
use crate::streams::to_node;
use crate::streams::{file_read, ByteStream, FileRead};

/// The volumes service: the cluster's volumes, each kept by its node.
pub struct Volumes {
    /// The nodes, shared with the control plane.
    nodes: Arc<Nodes>,
    /// Who owns each volume.
    store: Arc<dyn Store>,
}

/// The volume a name was asked for does not exist.
fn not_found(name: &VolumeName) -> ApiError {
    ApiError::not_found(format!(
        "volume {name} does not exist (see `warren volume ls`)"
    ))
}

impl Volumes {
    pub(crate) fn new(nodes: Arc<Nodes>, store: Arc<dyn Store>) -> Volumes {
        Volumes { nodes, store }
    }

    /// Every volume's owner by name (one without a record is the default
    /// tenant's: made before volumes had owners).
    async fn owners(&self) -> Result<HashMap<String, TenantName>, ApiError> {
        Ok(self
            .store
            .owners(OwnedName::Volume)
            .await?
            .into_iter()
            .collect())
    }

    /// The tenant that owns volume `name`.
    pub(crate) async fn owner(&self, name: &str) -> Result<TenantName, ApiError> {
        Ok(self
            .store
            .owner(OwnedName::Volume, name)
            .await?
            .unwrap_or_default())
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

    /// Every volume `who` reaches on every reachable node, by name.
    pub async fn list(&self, who: &Principal) -> Result<Vec<VolumeInfo>, ApiError> {
        let owners = self.owners().await?;
        Ok(self
            .listed()
            .await?
            .into_iter()
            .map(|(v, _)| v)
            .filter(|v| who.reaches(&owners.get(v.name.as_str()).cloned().unwrap_or_default()))
            .collect())
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

    /// The volume of that name that `who` reaches, with its node.
    async fn find_for(
        &self,
        who: &Principal,
        name: &VolumeName,
    ) -> Result<(VolumeInfo, Arc<NodeEntry>), ApiError> {
        match self.find(name).await? {
            Some(found) if who.reaches(&self.owner(name.as_str()).await?) => Ok(found),
            _ => Err(not_found(name)),
        }
    }

    /// The volume of that name; NotFound when no reachable node has it or
    /// it is another tenant's.
    pub async fn info(&self, who: &Principal, name: &VolumeName) -> Result<VolumeInfo, ApiError> {
        Ok(self.find_for(who, name).await?.0)
    }

    /// A volume's files, read and written without a sandbox, on its node
    /// (NotFound when no reachable node has it). Whoever holds the
    /// volume's own token reaches them (E2B's volume content API).
    pub async fn files(&self, name: &VolumeName) -> Result<VolumeFiles, ApiError> {
        let (info, node) = self.find(name).await?.ok_or_else(|| not_found(name))?;
        Ok(VolumeFiles {
            info,
            api: node.api.clone(),
        })
    }

    /// Makes a volume for `who`'s tenant on a node carrying the request's
    /// labels; a name any node already has is refused (names are the
    /// cluster's: one another tenant holds is refused without saying whose).
    pub async fn create(
        &self,
        who: &Principal,
        req: VolumeRequest,
    ) -> Result<VolumeInfo, ApiError> {
        let tenant = crate::access::changer(who)?;
        if let Some((v, _)) = self.find(&req.name).await? {
            let on = match who.reaches(&self.owner(v.name.as_str()).await?) {
                true => format!(" (on node {})", v.node),
                false => String::new(),
            };
            return Err(ApiError::conflict(format!(
                "volume {} already exists{on}",
                v.name
            )));
        }
        let node = resolving_node(&self.nodes, &req.node_selector)?;
        // Owned before it exists: a crash in between leaves a record that
        // the next volume of that name takes over.
        let name = req.name.clone();
        self.store
            .put_owner(OwnedName::Volume, name.as_str(), &tenant)
            .await?;
        let made = match node.api.volume_create(req).await {
            Ok(made) => made,
            Err(e) => {
                if let Err(gone) = self
                    .store
                    .delete_owner(OwnedName::Volume, name.as_str())
                    .await
                {
                    tracing::warn!(volume = %name, error = %gone, "forgetting a volume that was not made");
                }
                return Err(prefixed(&node.name, e));
            }
        };
        Ok(VolumeInfo {
            node: node.name.clone(),
            ..made
        })
    }

    /// Removes a volume of `who`'s that no sandbox mounts, with its files.
    pub async fn remove(&self, who: &Principal, name: &VolumeName) -> Result<VolumeInfo, ApiError> {
        if !who.may_change() {
            return Err(crate::access::read_only());
        }
        let (v, node) = self.find_for(who, name).await?;
        let removed = node.api.volume_remove(name).await.map_err(node_error)?;
        self.store
            .delete_owner(OwnedName::Volume, name.as_str())
            .await?;
        Ok(VolumeInfo {
            node: v.node,
            ..removed
        })
    }

    /// The node holding every volume of `mounts`, all of which `tenant`
    /// must own; None without mounts.
    pub(crate) async fn node_of(
        &self,
        tenant: &TenantName,
        mounts: &[VolumeMount],
    ) -> Result<Option<String>, ApiError> {
        if mounts.is_empty() {
            return Ok(None);
        }
        let owners = self.owners().await?;
        let all: Vec<VolumeInfo> = self
            .listed()
            .await?
            .into_iter()
            .map(|(v, _)| v)
            .filter(|v| tenant.is_default() || owners.get(v.name.as_str()) == Some(tenant))
            .collect();
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

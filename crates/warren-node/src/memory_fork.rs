//! A gVisor fork with processes on the node: the source is saved (its
//! memory and processes, into an image beside its fork layer) and so
//! stopped, its files are copied while nothing runs, and it is resumed
//! under its own id on a new sentry; each child then resumes the same image
//! on its own copy of the files (see `warren_runtime::Runtime::checkpoint`).

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use warren_core::secret::Delivery;
use warren_node_api::{CreateSandbox, Phase};
use warren_runtime::CreateRequest;

use crate::{Live, Node, NodeError};

impl Node {
    /// Refuses a source that cannot be saved and resumed, before anything
    /// happens to it.
    pub(crate) fn check_saveable(&self, id: &str, live: &Live) -> Result<(), NodeError> {
        if live.phase() != Phase::Running {
            return Err(NodeError::Conflict(format!(
                "sandbox {id} is paused; resume it before forking it with its processes"
            )));
        }
        if !live.create().spec.volumes.is_empty() {
            return Err(NodeError::BadRequest(format!(
                "sandbox {id} mounts volumes; a fork with processes cannot carry them yet (fork without --with-processes)"
            )));
        }
        Ok(())
    }

    /// Saves the running sandbox `id` into `image` (which stops it).
    /// Meanwhile its init's death is expected, not reported; should the
    /// save fail and the sandbox be gone, its death is reported after all.
    pub(crate) async fn save(
        self: &Arc<Self>,
        id: &str,
        live: &Arc<Live>,
        image: &Path,
    ) -> Result<(), NodeError> {
        live.saving.store(true, Ordering::Release);
        let saved = self.runtime.checkpoint(id, image).await;
        if let Err(e) = saved {
            live.saving.store(false, Ordering::Release);
            if !warren_runtime::owns_pid(live.pid, &live.cgroup_path) {
                self.init_died(id, live.pid);
            }
            return Err(e.into());
        }
        Ok(())
    }

    /// Resumes a saved sandbox under its own id from `image`: a new sentry
    /// on its root (mounted anew, with the upper directory it had), taking
    /// its place in the table and journal; then the node re-attaches to its
    /// main process. A sandbox that cannot be resumed is destroyed.
    pub(crate) async fn resume_in_place(
        self: &Arc<Self>,
        id: &str,
        old: &Arc<Live>,
        image: &Path,
    ) -> Result<(), NodeError> {
        let create = old.create();
        let resumed = async {
            let mut layers = self.forks.paths(create.spec.fork.as_ref());
            layers.extend(self.images.lower_dirs(&old.image).await?);
            let req = restore_request(&create, layers, image);
            Ok::<_, NodeError>(self.runtime.restore_in_place(req).await?)
        }
        .await;
        let handle = match resumed {
            Ok(h) => h,
            Err(e) => {
                // Its end is reported as any sandbox's whose init died.
                old.saving.store(false, Ordering::Release);
                self.init_died(id, old.pid);
                return Err(NodeError::Internal(format!(
                    "sandbox {id} was saved but could not be resumed, and ends: {e}"
                )));
            }
        };
        let lifetime = warren_core::sync::lock(&old.lifetime).clone();
        let live = self.register(
            create,
            handle.pid,
            Phase::Running,
            &old.image,
            old.log.clone(),
            lifetime,
        );
        self.journal(&live)?;
        self.attach_main(id, &live).await
    }

    /// The runtime's request for a child that resumes the fork's memory.
    pub(crate) fn memory_of(
        &self,
        create: &CreateSandbox,
    ) -> Result<Option<std::path::PathBuf>, NodeError> {
        let Some(fork) = create.spec.fork.as_ref().filter(|f| f.processes) else {
            return Ok(None);
        };
        let top = fork.layers.first().ok_or_else(|| {
            NodeError::BadRequest("a fork's child needs the layers it is built on".into())
        })?;
        let image = self.forks.memory_path(top);
        if !image.is_dir() {
            return Err(NodeError::Conflict(format!(
                "fork layer {top} holds no saved processes: fork the source again with processes"
            )));
        }
        Ok(Some(image))
    }
}

/// The files at /run/secrets a sandbox's create delivers.
pub(crate) fn secret_files(create: &CreateSandbox) -> Vec<warren_runtime::SecretFileData> {
    create
        .secrets
        .iter()
        .filter_map(|s| match &s.delivery {
            Delivery::File(f) => Some(warren_runtime::SecretFileData {
                name: f.name().to_string(),
                data: s.value.clone(),
            }),
            Delivery::Env(_) => None,
        })
        .collect()
}

fn restore_request(
    create: &CreateSandbox,
    layers: Vec<std::path::PathBuf>,
    image: &Path,
) -> CreateRequest {
    CreateRequest {
        id: create.id.clone(),
        lower_dirs: layers,
        volumes: vec![],
        secret_files: secret_files(create),
        resources: create.resources.clone(),
        devices: Default::default(),
        isolation: warren_core::Isolation::Gvisor,
        proxied_network: false,
        restore: Some(image.to_path_buf()),
    }
}

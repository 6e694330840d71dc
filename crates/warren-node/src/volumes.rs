//! The node's volumes: each an ext4 file system of its own size in
//! `<home>/volumes/<name>/disk.img` (with a journal: what a sandbox wrote
//! survives a crash of the host), mounted at `<name>/fs` while the node
//! runs, and mounted into the sandboxes that name it. A read-write mount is
//! the only one while it lasts; read-only mounts share. Which sandbox
//! holds which is claimed at create and released at destroy.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use warren_core::sync::lock;
use warren_core::volume::{VolumeInfo, VolumeMount, VolumeName, VolumeRequest};
use warren_runtime::disk;

use crate::NodeError;

/// What is kept of a volume besides its file system.
#[derive(Serialize, Deserialize)]
struct Record {
    name: VolumeName,
    size: u64,
    created_at: String,
}

const RECORD: &str = "volume.json";

pub struct Volumes {
    dir: PathBuf,
    node: String,
    /// The mounts each sandbox holds.
    claims: Mutex<HashMap<String, Vec<VolumeMount>>>,
    /// Creates and removals one at a time (a name is checked, then made).
    changing: Mutex<()>,
}

impl Volumes {
    pub fn open(home: &Path, node: &str) -> Result<Volumes, NodeError> {
        let dir = home.join("volumes");
        std::fs::create_dir_all(&dir)
            .map_err(|e| NodeError::Internal(format!("create {}: {e}", dir.display())))?;
        Ok(Volumes {
            dir,
            node: node.to_string(),
            claims: Mutex::default(),
            changing: Mutex::default(),
        })
    }

    fn path(&self, name: &VolumeName) -> PathBuf {
        self.dir.join(name.as_str())
    }

    fn record(&self, name: &VolumeName) -> Result<Record, NodeError> {
        let path = self.path(name).join(RECORD);
        let bytes = std::fs::read(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => NodeError::NotFound(format!(
                "volume {name} does not exist on node {} (`warren volume ls`; `warren volume create {name} --size SIZE` makes it)",
                self.node
            )),
            _ => NodeError::Internal(format!("reading {}: {e}", path.display())),
        })?;
        serde_json::from_slice(&bytes)
            .map_err(|e| NodeError::Internal(format!("{} is not valid: {e}", path.display())))
    }

    /// Makes a volume: its file system made and mounted, then its record
    /// written (a volume without one is a half-made one, removed again).
    pub fn create(&self, req: &VolumeRequest) -> Result<VolumeInfo, NodeError> {
        let _one = lock(&self.changing);
        let dir = self.path(&req.name);
        if dir.join(RECORD).exists() {
            return Err(NodeError::Conflict(format!(
                "volume {} already exists on node {}",
                req.name, self.node
            )));
        }
        // A create that stopped half way left this.
        self.discard(&dir);
        std::fs::create_dir(&dir)
            .map_err(|e| NodeError::Internal(format!("create {}: {e}", dir.display())))?;
        let made = (|| -> Result<(), NodeError> {
            disk::make(&dir, req.size.bytes(), disk::Journal::With)?;
            let fs = disk::mount(&dir)?;
            // The volume's root is its users' (`lost+found` is the file
            // system's, not theirs; fsck makes it again if it needs it).
            let _ = std::fs::remove_dir(fs.join("lost+found"));
            let record = Record {
                name: req.name.clone(),
                size: req.size.bytes(),
                created_at: warren_core::clock::now_rfc3339(),
            };
            let bytes = serde_json::to_vec_pretty(&record)
                .map_err(|e| NodeError::Internal(e.to_string()))?;
            let tmp = dir.join(format!(".{RECORD}.tmp"));
            std::fs::write(&tmp, bytes)
                .and_then(|()| std::fs::File::open(&tmp)?.sync_all())
                .and_then(|()| std::fs::rename(&tmp, dir.join(RECORD)))
                .map_err(|e| NodeError::Internal(format!("writing the volume record: {e}")))?;
            Ok(())
        })();
        if let Err(e) = made {
            self.discard(&dir);
            return Err(e);
        }
        self.info(&req.name)
    }

    /// Unmounts and deletes what is at `dir` (no error if nothing is).
    fn discard(&self, dir: &Path) {
        if !dir.exists() {
            return;
        }
        let _ = disk::remove(dir);
        if let Err(e) = std::fs::remove_dir_all(dir) {
            tracing::warn!(dir = %dir.display(), "removing a volume's files: {e}");
        }
    }

    /// Every volume on this node, by name.
    pub fn list(&self) -> Result<Vec<VolumeInfo>, NodeError> {
        let entries = std::fs::read_dir(&self.dir)
            .map_err(|e| NodeError::Internal(format!("listing {}: {e}", self.dir.display())))?;
        let mut names: Vec<VolumeName> = entries
            .flatten()
            .filter_map(|e| VolumeName::try_from(e.file_name().to_string_lossy().into_owned()).ok())
            .filter(|n| self.path(n).join(RECORD).exists())
            .collect();
        names.sort();
        names.iter().map(|n| self.info(n)).collect()
    }

    fn info(&self, name: &VolumeName) -> Result<VolumeInfo, NodeError> {
        let record = self.record(name)?;
        let fs = self.path(name).join("fs");
        // Blocks the files take, when mounted (else the image's own).
        let used = match disk::device(&self.path(name)) {
            Some(_) => rustix::fs::statvfs(&fs)
                .map(|s| (s.f_blocks - s.f_bfree) * s.f_frsize)
                .unwrap_or(0),
            None => 0,
        };
        let mut mounted_by: Vec<String> = lock(&self.claims)
            .iter()
            .filter(|(_, mounts)| mounts.iter().any(|m| &m.name == name))
            .map(|(id, _)| id.clone())
            .collect();
        mounted_by.sort();
        Ok(VolumeInfo {
            name: record.name,
            size: record.size,
            used,
            node: self.node.clone(),
            created_at: record.created_at,
            mounted_by,
        })
    }

    /// Removes a volume no live sandbox mounts, with everything in it.
    pub fn remove(&self, name: &VolumeName) -> Result<VolumeInfo, NodeError> {
        let _one = lock(&self.changing);
        let info = self.info(name)?;
        if !info.mounted_by.is_empty() {
            return Err(NodeError::Conflict(format!(
                "volume {name} is mounted by {}; remove those sandboxes first",
                info.mounted_by.join(", ")
            )));
        }
        let dir = self.path(name);
        disk::remove(&dir)?;
        std::fs::remove_dir_all(&dir)
            .map_err(|e| NodeError::Internal(format!("removing {}: {e}", dir.display())))?;
        Ok(info)
    }

    /// The root directory of a volume's file system on the host, opened
    /// (`O_PATH`) for the volume API's reads and writes, which resolve
    /// every path inside it; the file system is mounted first if no
    /// sandbox has needed it since the node started. A sandbox mounting
    /// the volume shares that file system, so each sees what the other
    /// writes.
    pub fn root(&self, name: &VolumeName) -> Result<std::os::fd::OwnedFd, NodeError> {
        let _one = lock(&self.changing);
        self.record(name)?;
        let dir = self.path(name);
        if disk::device(&dir).is_none() {
            disk::mount(&dir)?;
            if disk::device(&dir).is_none() {
                return Err(NodeError::Internal(format!(
                    "volume {name} is not mounted after mount"
                )));
            }
        }
        let fs = dir.join("fs");
        rustix::fs::open(
            &fs,
            rustix::fs::OFlags::PATH
                | rustix::fs::OFlags::DIRECTORY
                | rustix::fs::OFlags::NOFOLLOW
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| NodeError::Internal(format!("opening {}: {e}", fs.display())))
    }

    /// Claims `mounts` for sandbox `id` and says where each file system
    /// is: refused when a volume does not exist here, or a read-write
    /// mount meets any other.
    pub fn claim(
        &self,
        id: &str,
        mounts: &[VolumeMount],
    ) -> Result<Vec<warren_runtime::VolumeBind>, NodeError> {
        if mounts.is_empty() {
            return Ok(Vec::new());
        }
        let _one = lock(&self.changing);
        let mut binds = Vec::with_capacity(mounts.len());
        for m in mounts {
            self.record(&m.name)?;
            let dir = self.path(&m.name);
            // Mounted at the first use after the node (or host) started.
            let device = match disk::device(&dir) {
                Some(d) => d,
                None => {
                    disk::mount(&dir)?;
                    disk::device(&dir).ok_or_else(|| {
                        NodeError::Internal(format!("volume {} is not mounted after mount", m.name))
                    })?
                }
            };
            binds.push(warren_runtime::VolumeBind {
                device,
                target: m.path.as_str().to_string(),
                read_only: m.read_only,
            });
        }
        let mut claims = lock(&self.claims);
        for m in mounts {
            let holders: Vec<(&String, bool)> = claims
                .iter()
                .flat_map(|(holder, held)| {
                    held.iter()
                        .filter(|h| h.name == m.name)
                        .map(move |h| (holder, h.read_only))
                })
                .collect();
            if let Some((holder, _)) = holders.iter().find(|(_, ro)| !m.read_only || !ro) {
                let how = if m.read_only { "read-write" } else { "already" };
                return Err(NodeError::Conflict(format!(
                    "volume {} is {how} mounted by sandbox {holder}: a read-write mount is the only one while it lasts (mount it read-only, `:ro`, to share it)",
                    m.name
                )));
            }
        }
        claims.insert(id.to_string(), mounts.to_vec());
        Ok(binds)
    }

    /// The mounts of a sandbox taken over after a restart.
    pub fn adopt(&self, id: &str, mounts: &[VolumeMount]) {
        if !mounts.is_empty() {
            lock(&self.claims).insert(id.to_string(), mounts.to_vec());
        }
    }

    pub fn release(&self, id: &str) {
        lock(&self.claims).remove(id);
    }

    /// Unmounts from the host every volume no live sandbox mounts (the
    /// node stops). One still mounted stays so: mounted again at the next
    /// start it would be a second loop device, a second file system on the
    /// same image beside the sandbox's.
    pub fn unmount_all(&self) {
        let held: std::collections::HashSet<String> = lock(&self.claims)
            .values()
            .flatten()
            .map(|m| m.name.to_string())
            .collect();
        if let Ok(entries) = std::fs::read_dir(&self.dir) {
            for e in entries.flatten() {
                if held.contains(e.file_name().to_string_lossy().as_ref()) {
                    continue;
                }
                if let Err(err) = disk::remove(&e.path()) {
                    tracing::warn!(volume = %e.path().display(), "unmounting: {err}");
                }
            }
        }
    }
}

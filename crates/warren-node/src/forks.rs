//! Forks: a sandbox's filesystem changes copied once into a read-only fork
//! layer (`<home>/forks/<name>`), which the sandboxes forked from it are
//! built on, each with its own empty upper directory, above the image's
//! layers (see `warren_runtime::fork_layer`).
//!
//! A layer lives while something uses it: the control plane, from the copy
//! until `release_fork_layer` (it may still be making children), every
//! sandbox built on it, and every layer copied from one of those sandboxes
//! (a fork of a fork is built on both). When the last user goes, so does
//! the layer. After a restart the journal's sandboxes claim their layers
//! again and the rest are swept.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use warren_core::spec::ForkOrigin;
use warren_core::sync::lock;
use warren_node_api::{ForkLayer, Phase};

use crate::{Node, NodeError};

const STAGING_PREFIX: &str = "new-";
const DOOMED_PREFIX: &str = "rm-";
/// A layer's saved memory and processes (a fork with processes), beside it
/// and not in it: the layer is what children see of the filesystem.
const MEMORY_PREFIX: &str = "mem-";

struct Layer {
    /// Sandboxes built on it whose topmost layer it is, and layers copied
    /// from such sandboxes.
    users: usize,
    /// The control plane may still make sandboxes on it.
    held: bool,
    /// The layer below it (its source was a fork itself).
    parent: Option<String>,
}

#[derive(Default)]
struct State {
    layers: HashMap<String, Layer>,
    /// The topmost layer of each sandbox built on one.
    children: HashMap<String, String>,
}

impl State {
    /// Drops one use of `name`; layers left without users, and their
    /// parents in turn, are removed from the table and returned.
    fn unuse(&mut self, name: &str, doomed: &mut Vec<String>) {
        let mut next = Some(name.to_string());
        while let Some(name) = next.take() {
            let Some(layer) = self.layers.get_mut(&name) else {
                return;
            };
            layer.users = layer.users.saturating_sub(1);
            if layer.users == 0 && !layer.held {
                next = layer.parent.clone();
                self.layers.remove(&name);
                doomed.push(name);
            }
        }
    }
}

pub(crate) struct ForkLayers {
    dir: PathBuf,
    state: Mutex<State>,
    /// One copy at a time: a copy freezes and thaws its source, and two
    /// copies of one source must not thaw it under each other.
    copying: tokio::sync::Mutex<()>,
}

/// `fk-` and 12 lowercase letters or digits: a name that is safe in a path.
pub(crate) fn valid_name(name: &str) -> bool {
    name.strip_prefix("fk-").is_some_and(|rest| {
        rest.len() == 12
            && rest
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
    })
}

fn new_name() -> String {
    const ALPHABET: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut bytes = [0u8; 12];
    if rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty()).is_err() {
        // Unique enough within one home: the clock, in nanoseconds.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (nanos >> (i * 6)) as u8;
        }
    }
    let suffix: String = bytes
        .iter()
        .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
        .collect();
    format!("fk-{suffix}")
}

fn remove_dir(path: &Path) {
    match std::fs::remove_dir_all(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "could not remove a fork layer; it is swept at the next start")
        }
    }
}

impl ForkLayers {
    pub(crate) fn open(home: &Path) -> Result<ForkLayers, NodeError> {
        use std::os::unix::fs::PermissionsExt;
        let dir = home.join("forks");
        std::fs::create_dir_all(&dir)
            .map_err(|e| NodeError::Internal(format!("create {}: {e}", dir.display())))?;
        // Layers hold the sandbox's files as it owned them (setuid
        // binaries of its root included): no other user may reach them.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| NodeError::Internal(format!("restrict {}: {e}", dir.display())))?;
        Ok(ForkLayers {
            dir,
            state: Mutex::new(State::default()),
            copying: tokio::sync::Mutex::new(()),
        })
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Where the memory image saved with layer `name` is, if any.
    pub(crate) fn memory_path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{MEMORY_PREFIX}{name}"))
    }

    /// The directories of the layers a sandbox is built on, topmost first,
    /// for a sandbox that uses them already (a resume in place).
    pub(crate) fn paths(&self, fork: Option<&ForkOrigin>) -> Vec<PathBuf> {
        fork.map(|f| f.layers.iter().map(|l| self.path(l)).collect())
            .unwrap_or_default()
    }

    /// The directories of the layers a sandbox is built on, topmost first;
    /// the sandbox now uses its topmost layer (until `release_child`).
    pub(crate) fn acquire(
        &self,
        child: &str,
        fork: Option<&ForkOrigin>,
    ) -> Result<Vec<PathBuf>, NodeError> {
        let Some(fork) = fork else {
            return Ok(vec![]);
        };
        if let Some(bad) = fork.layers.iter().find(|l| !valid_name(l)) {
            return Err(NodeError::BadRequest(format!(
                "fork layer {bad:?} is not a fork layer name"
            )));
        }
        let Some(top) = fork.layers.first() else {
            return Err(NodeError::BadRequest(
                "a fork's child needs the layers it is built on".into(),
            ));
        };
        let mut s = lock(&self.state);
        if s.children.contains_key(child) {
            return Err(NodeError::Conflict(format!(
                "sandbox {child} already exists on this node"
            )));
        }
        let layer = s.layers.get_mut(top).ok_or_else(|| {
            NodeError::Conflict(format!(
                "fork layer {top} of sandbox {} is gone from this node (its children were all \
                 destroyed, or the node restarted before this one was made): fork the source again",
                fork.source
            ))
        })?;
        layer.users += 1;
        s.children.insert(child.to_string(), top.clone());
        Ok(fork.layers.iter().map(|l| self.path(l)).collect())
    }

    /// A sandbox built on layers was destroyed (or not made after all):
    /// the layers it alone kept are removed.
    pub(crate) async fn release_child(&self, child: &str) {
        let mut doomed = Vec::new();
        {
            let mut s = lock(&self.state);
            if let Some(top) = s.children.remove(child) {
                s.unuse(&top, &mut doomed);
            }
        }
        self.remove(doomed).await;
    }

    /// The control plane makes no more sandboxes on `name`.
    pub(crate) async fn release_hold(&self, name: &str) {
        let mut doomed = Vec::new();
        {
            let mut s = lock(&self.state);
            let Some(layer) = s.layers.get_mut(name) else {
                return;
            };
            if !layer.held {
                return;
            }
            layer.held = false;
            // `unuse` takes one use away; count the hold as one here.
            layer.users += 1;
            s.unuse(name, &mut doomed);
        }
        self.remove(doomed).await;
    }

    /// After a restart: a journaled sandbox built on `fork` claims its
    /// layers again (the control plane's holds died with the old daemon).
    pub(crate) fn adopt(&self, child: &str, fork: Option<&ForkOrigin>) {
        let Some(fork) = fork else { return };
        if fork.layers.is_empty() || !fork.layers.iter().all(|l| valid_name(l)) {
            return;
        }
        let mut s = lock(&self.state);
        for (i, name) in fork.layers.iter().enumerate().rev() {
            if !s.layers.contains_key(name) {
                let parent = fork.layers.get(i + 1).cloned();
                if let Some(p) = parent.as_ref().and_then(|p| s.layers.get_mut(p)) {
                    p.users += 1;
                }
                s.layers.insert(
                    name.clone(),
                    Layer {
                        users: 0,
                        held: false,
                        parent,
                    },
                );
            }
        }
        if let Some(top) = s.layers.get_mut(&fork.layers[0]) {
            top.users += 1;
        }
        s.children.insert(child.to_string(), fork.layers[0].clone());
    }

    /// Removes what no sandbox claims: layers of a daemon that stopped,
    /// and half-made or half-removed ones.
    pub(crate) async fn sweep(self: &Arc<Self>) {
        let this = self.clone();
        let _ = tokio::task::spawn_blocking(move || {
            let Ok(entries) = std::fs::read_dir(&this.dir) else {
                return;
            };
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let layer = name.strip_prefix(MEMORY_PREFIX).unwrap_or(&name);
                let claimed = lock(&this.state).layers.contains_key(layer);
                let ours = valid_name(layer)
                    || name.starts_with(STAGING_PREFIX)
                    || name.starts_with(DOOMED_PREFIX);
                if ours && !claimed {
                    tracing::info!(layer = %name, "removing a fork layer no sandbox uses");
                    remove_dir(&e.path());
                }
            }
        })
        .await;
    }

    async fn remove(&self, doomed: Vec<String>) {
        if doomed.is_empty() {
            return;
        }
        let paths: Vec<(PathBuf, PathBuf)> = doomed
            .iter()
            .flat_map(|n| {
                [
                    (self.path(n), self.dir.join(format!("{DOOMED_PREFIX}{n}"))),
                    (
                        self.memory_path(n),
                        self.dir.join(format!("{DOOMED_PREFIX}{MEMORY_PREFIX}{n}")),
                    ),
                ]
            })
            .filter(|(path, _)| path.exists())
            .collect();
        let _ = tokio::task::spawn_blocking(move || {
            for (path, gone) in paths {
                // Renamed first: a crash half-way leaves no half layer
                // under a name a journal could claim.
                match std::fs::rename(&path, &gone) {
                    Ok(()) => remove_dir(&gone),
                    Err(_) => remove_dir(&path),
                }
            }
        })
        .await;
        for name in doomed {
            tracing::info!(layer = %name, "fork layer removed: nothing uses it any more");
        }
    }

    /// Registers a layer just copied, held by the control plane.
    fn add(&self, name: &str, parent: Option<String>) {
        let mut s = lock(&self.state);
        if let Some(p) = parent.as_ref().and_then(|p| s.layers.get_mut(p)) {
            p.users += 1;
        }
        s.layers.insert(
            name.to_string(),
            Layer {
                users: 0,
                held: true,
                parent,
            },
        );
    }

    /// Whether the directory of a layer exists (tests, and the API's
    /// answer to a fork of a sandbox whose layers are gone).
    pub fn exists(&self, name: &str) -> bool {
        valid_name(name) && self.path(name).is_dir()
    }
}

impl Node {
    /// Copies a running or paused sandbox's filesystem changes into a new
    /// fork layer, the sandbox frozen meanwhile (a paused one already is).
    /// With `processes`, the sandbox is saved beside the layer instead
    /// (which stops it), copied, and resumed (see memory_fork).
    pub async fn fork_layer(
        self: &Arc<Self>,
        id: &str,
        processes: bool,
    ) -> Result<ForkLayer, NodeError> {
        let live = self.get(id)?;
        if live.destroying.load(std::sync::atomic::Ordering::Acquire) {
            return Err(NodeError::NotRunning(id.to_string()));
        }
        let phase = live.phase();
        if phase == Phase::Held {
            return Err(NodeError::Conflict(format!(
                "sandbox {id} has finished and is held; only a running or paused sandbox can be forked"
            )));
        }
        let upper = self.runtime.upper_dir(id).ok_or_else(|| {
            NodeError::BadRequest(format!(
                "sandbox {id} has a disk limit; its changes live on its own file system, \
                 which a fork cannot read yet: fork a sandbox created without --disk \
                 (its children may have one)"
            ))
        })?;
        let parent = live
            .create()
            .spec
            .fork
            .and_then(|f| f.layers.first().cloned());
        if processes {
            self.check_saveable(id, &live)?;
        }
        // A fork layer may take the free space above the disk floor.
        let budget = self.meter.pressure.disk_headroom();
        let ids = self.runtime.id_range(id);
        let name = new_name();
        let staging = self.forks.dir.join(format!("{STAGING_PREFIX}{name}"));
        let memory = self.forks.memory_path(&name);
        let _one = self.forks.copying.lock().await;
        let freeze = phase == Phase::Running && !processes;
        if freeze {
            self.freeze(id, true).await?;
        }
        let started = Instant::now();
        if processes {
            if let Err(e) = self.save(id, &live, &memory).await {
                remove_dir(&memory);
                return Err(e);
            }
        }
        let saved_at = started.elapsed();
        let copy = {
            let staging = staging.clone();
            tokio::task::spawn_blocking(move || {
                warren_runtime::fork_layer::copy_upper(&upper, ids, &staging, budget)
            })
            .await
        };
        let frozen_ms = if freeze {
            let frozen = started.elapsed().as_millis() as u64;
            if let Err(e) = self.freeze(id, false).await {
                tracing::warn!(sandbox = %id, error = %e, "could not thaw the sandbox after copying its fork layer");
            }
            frozen
        } else if processes {
            let resumed = self.resume_in_place(id, &live, &memory).await;
            if let Err(e) = resumed {
                remove_dir(&staging);
                remove_dir(&memory);
                return Err(e);
            }
            started.elapsed().as_millis() as u64
        } else {
            0
        };
        let copied = match copy.map_err(|e| NodeError::Internal(format!("fork layer task: {e}")))? {
            Ok(c) => c,
            Err(e) => {
                remove_dir(&memory);
                return Err(e.into());
            }
        };
        // The parent must still be there: the source holds it while it
        // lives, and it lives (its lock is held by the control plane).
        if let Some(p) = &parent {
            if !lock(&self.forks.state).layers.contains_key(p) {
                remove_dir(&staging);
                remove_dir(&memory);
                return Err(NodeError::Conflict(format!(
                    "sandbox {id} is being destroyed; its fork layer {p} is gone"
                )));
            }
        }
        let path = self.forks.path(&name);
        if let Err(e) = std::fs::rename(&staging, &path) {
            remove_dir(&staging);
            remove_dir(&memory);
            return Err(NodeError::Internal(format!(
                "rename {} to {}: {e}",
                staging.display(),
                path.display()
            )));
        }
        self.forks.add(&name, parent.clone());
        let mut layers = vec![name];
        if let Some(f) = live.create().spec.fork {
            layers.extend(f.layers);
        }
        let state = match live.phase() {
            Phase::Paused => "paused",
            _ => "running",
        };
        let memory_bytes = if processes { dir_bytes(&memory) } else { 0 };
        let how = if processes {
            format!(
                "saved with its processes ({memory_bytes} bytes of memory image in {} ms) and \
                 resumed; stopped {frozen_ms} ms",
                saved_at.as_millis()
            )
        } else {
            format!("frozen {frozen_ms} ms")
        };
        live.log.event(
            state,
            warren_core::state::reason::FORKED,
            &format!(
                "copied into fork layer {} ({} bytes, {} entries; {how})",
                layers[0], copied.bytes, copied.entries
            ),
        );
        Ok(ForkLayer {
            layers,
            bytes: copied.bytes,
            entries: copied.entries,
            frozen_ms,
            memory_bytes,
        })
    }

    pub async fn release_fork_layer(&self, name: &str) {
        self.forks.release_hold(name).await;
    }

    /// Whether a fork layer's directory exists on this node.
    pub fn has_fork_layer(&self, name: &str) -> bool {
        self.forks.exists(name)
    }
}

/// Bytes of the files directly in `dir` (a memory image is flat).
fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

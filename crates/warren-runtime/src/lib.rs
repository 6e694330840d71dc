//! Linux isolation for Warren sandboxes.
//!
//! One [`Runtime`] per node. It lays out each sandbox under
//! `<home>/sandboxes/<id>/` (overlay upper and work, the OCI bundle, its uid
//! range, init's socket; the merged root is mounted only in the spawner's
//! namespace, under [`ROOTS_DIR`]), asks a single-threaded spawner process to set
//! the sandbox up (Warren's own [`setup`] on cgroup v1 hosts, youki's
//! libcontainer on v2), and talks to the sandbox's own
//! init for every exec. Destroy removes processes, cgroups, mounts and
//! directories.

pub mod cdi;
pub mod cgroup_parent;
pub mod cgroup_tuning;
pub mod check;
mod checkpoint;
pub mod class;
pub mod device_program;
pub mod disk;
pub mod exec;
pub mod exec_cgroup;
pub mod file_ops;
pub mod files;
pub mod floor;
pub mod fork_layer;
pub mod gvisor;
pub mod host;
pub mod host_tables;
pub mod init;
pub mod netns;
pub mod oci;
pub mod os_error;
mod pool;
pub mod proto;
pub mod pty;
pub mod rootfs;
mod secrets;
mod setup;
pub mod spawner;
pub mod syscall_filter;
mod trash;
pub mod userns;
mod volumes;
pub mod watch;

use std::path::{Path, PathBuf};

pub use exec::{ExecIo, ExecOutcome, ExecSignal, ExitWait, RunningExec, Stdin};
use nix::sys::resource::Resource;
pub use proto::{ExecSpec, TermSize};
pub use pty::Pty;
use warren_core::ResolvedResources;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("create failed: {0}")]
    Create(String),
    #[error("destroy failed: {0}")]
    Destroy(String),
    #[error("exec failed: {0}")]
    Exec(String),
    #[error("{0}")]
    Files(String),
    #[error("{0}")]
    NotFound(String),
    #[error("invalid path {0}")]
    BadPath(String),
    /// Something is in the way (a directory to make exists already).
    #[error("{0}")]
    Exists(String),
    /// The image cannot be run safely as it is.
    #[error("{0}")]
    BadImage(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("internal protocol error: {0}")]
    Proto(#[from] proto::ProtoError),
    /// A sandbox process (init, a spawner) did not answer in time.
    #[error("{0}")]
    Unresponsive(String),
    /// The node's disk has no room for it.
    #[error("{0}")]
    NoRoom(String),
    /// A create step failed at a system call: what it was, and the errno.
    #[error("create failed: {what}: {source}")]
    CreateIo {
        what: String,
        source: std::io::Error,
    },
    /// A destroy step failed at a system call: what it was, and the errno.
    #[error("destroy failed: {what}: {source}")]
    DestroyIo {
        what: String,
        source: std::io::Error,
    },
    /// A blocking task (a create or destroy step off the async threads)
    /// panicked or was cancelled.
    #[error("{what}: {source}")]
    Task {
        what: &'static str,
        source: tokio::task::JoinError,
    },
    #[error("create failed: serialise config: {0}")]
    Config(#[source] serde_json::Error),
    /// Not possible in this sandbox's isolation class, or on this node.
    #[error("{0}")]
    Unsupported(String),
}

impl RuntimeError {
    pub fn io(what: &str) -> impl Fn(std::io::Error) -> RuntimeError + '_ {
        move |source| RuntimeError::Io {
            what: what.to_string(),
            source,
        }
    }
    pub fn nix(what: &str) -> impl Fn(nix::Error) -> RuntimeError + '_ {
        move |e| RuntimeError::Io {
            what: what.to_string(),
            source: e.into(),
        }
    }
    /// `e` (an I/O error, or nix's or rustix's errno) while doing `what`.
    pub fn os(what: impl Into<String>, e: impl Into<std::io::Error>) -> RuntimeError {
        RuntimeError::Io {
            what: what.into(),
            source: e.into(),
        }
    }
    /// [`RuntimeError::os`] in a create: the message says the create failed.
    pub fn create_os(what: impl Into<String>, e: impl Into<std::io::Error>) -> RuntimeError {
        RuntimeError::CreateIo {
            what: what.into(),
            source: e.into(),
        }
    }
    /// [`RuntimeError::os`] in a destroy: the message says the destroy failed.
    pub fn destroy_os(what: impl Into<String>, e: impl Into<std::io::Error>) -> RuntimeError {
        RuntimeError::DestroyIo {
            what: what.into(),
            source: e.into(),
        }
    }
    /// A blocking task that did not finish, named `what`.
    pub fn task(what: &'static str) -> impl Fn(tokio::task::JoinError) -> RuntimeError {
        move |source| RuntimeError::Task { what, source }
    }
}

pub struct RuntimeConfig {
    /// Warren's home; sandboxes live under `<home>/sandboxes`.
    pub home: PathBuf,
    /// Program and arguments that start a spawner (`warren spawner`).
    pub spawner_exe: PathBuf,
    pub spawner_args: Vec<String>,
    pub spawners: usize,
    /// Parent cgroup of every sandbox, relative to each hierarchy's root.
    pub cgroup_parent: cgroup_parent::CgroupParent,
    /// Each sandbox in its own user namespace (root inside is an
    /// unprivileged host uid range); see [`userns`].
    pub userns: bool,
    /// The runsc that runs `gvisor` sandboxes; None: the class is not
    /// offered.
    pub runsc: Option<gvisor::Runsc>,
}

pub use secrets::SecretFileData;

pub struct CreateRequest {
    pub id: String,
    /// Image layer directories, topmost first.
    pub lower_dirs: Vec<PathBuf>,
    /// Volumes mounted into its root.
    pub volumes: Vec<VolumeBind>,
    /// Files at /run/secrets.
    pub secret_files: Vec<SecretFileData>,
    pub resources: ResolvedResources,
    /// Device nodes, mounts and cgroup rules of its CDI devices.
    pub devices: cdi::Injection,
    pub isolation: warren_core::Isolation,
    /// Whether the sandbox reaches anything beyond its loopback (a gVisor
    /// sandbox without gets gVisor's own network stack).
    pub proxied_network: bool,
    /// A checkpoint's memory image it resumes from instead of booting (a
    /// gVisor fork with processes: see [`Runtime::checkpoint`]).
    pub restore: Option<PathBuf>,
}

/// A volume mounted into a sandbox: its file system's block device (the
/// node keeps it mounted, so the spawner's mount of the same device shares
/// its superblock), and where and how it appears.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VolumeBind {
    pub device: PathBuf,
    /// An absolute path in the sandbox.
    pub target: String,
    pub read_only: bool,
}

/// What a sandbox's root is made of.
pub(crate) struct RootMounts<'a> {
    /// Image layer directories, topmost first.
    pub lower: &'a [PathBuf],
    /// Size of the sandbox's own disk; 0 = none.
    pub disk: u64,
    pub volumes: &'a [VolumeBind],
    pub secrets: &'a [SecretFileData],
}

/// Where a created sandbox lives on the host.
#[derive(Debug, Clone)]
pub struct SandboxHandle {
    pub id: String,
    /// Host PID of the sandbox's init.
    pub pid: i32,
    pub dir: PathBuf,
    pub socket: PathBuf,
    pub cgroup_path: String,
    /// The process whose `/proc/<pid>/root` is the sandbox's root as its
    /// own processes see it (init's, or in gVisor the gofer's), for the file
    /// API and user lookups.
    pub root_pid: i32,
    /// What the node needs to know of its class to serve it.
    pub traits: class::Traits,
    /// Each phase of its create, when it began and how long it took
    /// (`runtime_prepare`: id range, bundle and config; `runtime_spawn`:
    /// the spawner's mounts, namespaces, cgroup and init ready, then the
    /// spawner's own phases within it); empty for a handle not made by a
    /// create.
    pub phases: Vec<(String, std::time::Instant, std::time::Duration)>,
}

pub struct Runtime {
    cfg: RuntimeConfig,
    /// Every class this runtime knows, offered or not (see [`class`]).
    container: std::sync::Arc<class::Container>,
    gvisor: std::sync::Arc<class::Gvisor>,
    pool: pool::SpawnerPool,
    /// libcontainer's state of this home's sandboxes (see [`STATE_DIR`]).
    state_root: PathBuf,
    /// Where destroyed sandboxes' directories go to be removed.
    trash: std::sync::Arc<trash::Trash>,
}

impl Runtime {
    pub fn new(cfg: RuntimeConfig) -> Result<Runtime, RuntimeError> {
        std::fs::create_dir_all(cfg.home.join("sandboxes"))
            .map_err(RuntimeError::io("create runtime dirs"))?;
        sweep_state_roots();
        let state_root = state_root_of(&cfg.home);
        std::fs::create_dir_all(&state_root).map_err(RuntimeError::io("create runtime dirs"))?;
        let home = std::fs::canonicalize(&cfg.home).unwrap_or_else(|_| cfg.home.clone());
        std::fs::write(state_root.join("home"), home.as_os_str().as_encoded_bytes())
            .map_err(RuntimeError::io("record the state directory's home"))?;
        userns::sweep(&cfg.home.join("sandboxes"));
        let trash = std::sync::Arc::new(trash::Trash::open(cfg.home.join("trash"))?);
        if cfg.runsc.is_some() {
            gvisor::install_init(&cfg.home)
                .map_err(RuntimeError::io("install warren-init for gVisor sandboxes"))?;
        }
        let pool =
            pool::SpawnerPool::new(&cfg.spawner_exe, &cfg.spawner_args, cfg.spawners.max(1))?;
        let container = std::sync::Arc::new(class::Container { userns: cfg.userns });
        let gvisor = std::sync::Arc::new(class::Gvisor {
            runsc: cfg.runsc.clone(),
            home: cfg.home.clone(),
            state_root: state_root.clone(),
            userns: cfg.userns,
        });
        Ok(Runtime {
            cfg,
            container,
            gvisor,
            pool,
            state_root,
            trash,
        })
    }

    /// Whether this node can run sandboxes of `class`.
    pub fn offers(&self, class: warren_core::Isolation) -> bool {
        self.class(class).offered()
    }

    fn class(
        &self,
        isolation: warren_core::Isolation,
    ) -> std::sync::Arc<dyn class::IsolationClass> {
        match isolation {
            warren_core::Isolation::Container => self.container.clone(),
            warren_core::Isolation::Gvisor => self.gvisor.clone(),
        }
    }

    /// Whether destroyed sandboxes' files are still being removed (their
    /// disk space is on its way back).
    pub fn freeing_disk(&self) -> bool {
        self.trash.emptying()
    }

    pub fn sandbox_dir(&self, id: &str) -> PathBuf {
        self.cfg.home.join("sandboxes").join(id)
    }

    /// The overlay upper directory (the sandbox's filesystem changes) as the
    /// daemon sees it. None for a sandbox with a disk limit: its upper
    /// directory is on a file system mounted only in the spawner's mount
    /// namespace.
    pub fn upper_dir(&self, id: &str) -> Option<PathBuf> {
        let dir = self.sandbox_dir(id);
        if dir.join("disk.img").exists() {
            return None;
        }
        Some(dir.join("upper")).filter(|u| u.is_dir())
    }

    fn state_root(&self) -> PathBuf {
        self.state_root.clone()
    }

    /// Where a Warren before the state moved to [`STATE_DIR`] kept it: its
    /// sandboxes are still destroyed and swept after an upgrade.
    fn legacy_state_root(&self) -> PathBuf {
        self.cfg.home.join("run")
    }

    pub fn cgroup_path(&self, id: &str) -> String {
        format!("/{}/{}", self.cfg.cgroup_parent, id)
    }

    pub fn cgroup_parent(&self) -> &cgroup_parent::CgroupParent {
        &self.cfg.cgroup_parent
    }

    /// Removes the node's own cgroup parent where it is empty, as the node
    /// stops: nothing of it is left on the host. The default parent is
    /// shared by every node told none, so it stays.
    pub fn release_cgroup_parent(&self) {
        if !self.cfg.cgroup_parent.is_default() {
            cgroups::remove_empty(&format!("/{}", self.cfg.cgroup_parent));
        }
    }

    /// Stops the spawners as the node stops (see [`pool::SpawnerPool::close`]).
    pub fn stop_spawners(&self) {
        self.pool.close();
    }

    pub fn handle(&self, id: &str, pid: i32) -> SandboxHandle {
        let isolation = class::recorded(&self.sandbox_dir(id));
        self.handle_of(id, pid, isolation)
    }

    fn handle_of(&self, id: &str, pid: i32, isolation: warren_core::Isolation) -> SandboxHandle {
        let dir = self.sandbox_dir(id);
        let class = self.class(isolation);
        let cgroup_path = self.cgroup_path(id);
        SandboxHandle {
            id: id.to_string(),
            pid,
            socket: class.socket(&dir),
            traits: class.traits(&dir),
            // Not known before the create: opening the root then fails
            // with "open sandbox root".
            root_pid: class.root_pid(&dir, pid, &cgroup_path).unwrap_or(0),
            dir,
            cgroup_path,
            phases: Vec::new(),
        }
    }

    /// Creates and starts a sandbox; on failure nothing of it remains.
    pub async fn create(&self, req: CreateRequest) -> Result<SandboxHandle, RuntimeError> {
        let handle = self.handle_of(&req.id, 0, req.isolation);
        let class = self.class(req.isolation);
        class.check(&req)?;
        if req.restore.is_some() && req.isolation != warren_core::Isolation::Gvisor {
            return Err(RuntimeError::Unsupported(
                "only a gvisor sandbox can be restored from memory".into(),
            ));
        }
        let preparing = std::time::Instant::now();
        let prepared = {
            let handle = handle.clone();
            let input = class::PrepareInput {
                resources: req.resources.clone(),
                devices: req.devices.clone(),
                proxied_network: req.proxied_network,
            };
            tokio::task::spawn_blocking(move || class.prepare(&handle, &input))
                .await
                .map_err(RuntimeError::task("prepare task"))?
        };
        let prepared = match prepared {
            Ok(p) => p,
            Err(e) => {
                let _ = self.cleanup_dirs(&handle).await;
                return Err(e);
            }
        };
        warren_crashpoint::hit("create:prepared");
        let prepare_took = preparing.elapsed();
        let spawning = std::time::Instant::now();
        let created = self
            .pool
            .create(proto::SpawnerRequest::Create {
                id: req.id.clone(),
                bundle: handle.dir.clone(),
                state_root: self.state_root(),
                socket: handle.socket.clone(),
                lower: req.lower_dirs.clone(),
                disk: req.resources.disk,
                id_base: prepared.id_base,
                volumes: req.volumes.clone(),
                secrets: req.secret_files.clone(),
                start: match (prepared.start, &req.restore) {
                    (proto::Start::Runsc(run), Some(image)) => proto::Start::RunscRestore {
                        run,
                        image: image.clone(),
                    },
                    (start, _) => start,
                },
            })
            .await;
        match created {
            Ok((pid, spawner_phases)) => {
                warren_crashpoint::hit("create:spawned");
                let answered = std::time::Instant::now();
                let mut phases = vec![
                    ("runtime_prepare".to_string(), preparing, prepare_took),
                    ("runtime_spawn".to_string(), spawning, answered - spawning),
                ];
                phases.extend(spawner_timeline(spawner_phases, answered));
                Ok(SandboxHandle {
                    pid,
                    phases,
                    // A gVisor sandbox's socket is reached through its
                    // gofer, known now.
                    ..self.handle_of(&req.id, pid, req.isolation)
                })
            }
            Err(e) => {
                // The spawner may have got as far as starting init (it
                // failed later, or stopped answering and was killed).
                let _ = self.destroy(&req.id, None).await;
                Err(e)
            }
        }
    }

    /// Kills every process, removes cgroups, mounts and directories. Safe to
    /// call on a half-created or already destroyed sandbox.
    /// `init_pid`, when known, lets destroy kill the whole PID namespace at
    /// once instead of freezing and signalling every process.
    pub async fn destroy(&self, id: &str, init_pid: Option<i32>) -> Result<(), RuntimeError> {
        let states = [
            self.state_root().join(id),
            self.legacy_state_root().join(id),
        ];
        let cgroup_path = self.cgroup_path(id);
        tokio::task::spawn_blocking(move || remove_container(init_pid, &states, &cgroup_path))
            .await
            .map_err(RuntimeError::task("destroy task"))??;
        self.cleanup_dirs(&self.handle(id, 0)).await
    }

    /// The sandbox's host id range, if it has a user namespace.
    pub fn id_range(&self, id: &str) -> Option<userns::IdRange> {
        userns::recorded(&self.sandbox_dir(id))
    }

    async fn cleanup_dirs(&self, handle: &SandboxHandle) -> Result<(), RuntimeError> {
        let dir = handle.dir.clone();
        let id = handle.id.clone();
        let trash = self.trash.clone();
        tokio::task::spawn_blocking(move || {
            // Nothing is mounted in the host's namespace any more; this only
            // matters for sandboxes created by an older Warren.
            unmount_root(&dir, &id)?;
            let ids = userns::recorded(&dir);
            trash.discard(&dir)?;
            warren_crashpoint::hit("destroy:trashed");
            // Given back once the directory has left its path: the
            // sandbox's processes are gone, and what it left in the trash
            // is out of reach of the range's next holder (see `trash`).
            match ids {
                Some(ids) => userns::release(&dir, ids),
                None => userns::release_unrecorded(&dir),
            }
            Ok(())
        })
        .await
        .map_err(RuntimeError::task("cleanup task"))?
    }

    /// Ids of sandboxes that have a directory on this host.
    /// Sandbox ids that have a directory or libcontainer state in this home.
    /// Only names shaped like Warren's ids count, so look-alike entries are
    /// never touched. Cgroups are not listed on their own: the cgroup parent
    /// is shared by every Warren home on the host, and a sandbox's cgroup
    /// never outlives its directory (made before it, removed after it).
    pub fn list_host_sandboxes(&self) -> Vec<String> {
        let places = [
            self.cfg.home.join("sandboxes"),
            self.state_root(),
            self.legacy_state_root(),
        ];
        let mut ids: Vec<String> = places
            .iter()
            .filter_map(|p| std::fs::read_dir(p).ok())
            .flat_map(|rd| rd.filter_map(|e| e.ok()))
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|name| is_sandbox_id(name))
            .collect();
        ids.sort();
        ids.dedup();
        ids
    }
}

/// Refuses images whose /proc, /dev or /sys is a symlink: the runtime mounts
/// over those paths, and a link could aim the mount at the host (the runc
/// CVE-2023-27561 / 2025-31133 class). The topmost layer that has the entry
/// decides, as in the merged overlay.
pub fn check_system_dirs(lower: &[PathBuf]) -> Result<(), RuntimeError> {
    for name in ["proc", "dev", "sys"] {
        for layer in lower {
            let Ok(meta) = std::fs::symlink_metadata(layer.join(name)) else {
                continue;
            };
            if meta.file_type().is_symlink() {
                let target = std::fs::read_link(layer.join(name)).unwrap_or_default();
                return Err(RuntimeError::BadImage(format!(
                    "the image's /{name} is a symlink (to {}); /proc, /dev and /sys must be directories or absent: rebuild the image",
                    target.display()
                )));
            }
            break;
        }
    }
    Ok(())
}

/// `sbx-` followed by 12 lowercase letters or digits.
pub fn is_sandbox_id(name: &str) -> bool {
    name.strip_prefix("sbx-").is_some_and(|rest| {
        rest.len() == 12
            && rest
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
    })
}

/// libcontainer's state of each sandbox (`state.json`, its config, its
/// notify socket), under `/run` (a tmpfs on systemd hosts), as runc keeps
/// its own in `/run/runc`: made and
/// removed with every sandbox, in the home it cost the file system four new
/// inodes a create. One directory per Warren home, named by the hash of the
/// home's path, so one home's sweep never sees another's sandboxes.
pub const STATE_DIR: &str = "/run/warren/state";

/// `STATE_DIR/<first 16 hex digits of the SHA-256 of the home's absolute path>`.
pub fn state_root_of(home: &Path) -> PathBuf {
    use sha2::Digest;
    let home = std::fs::canonicalize(home).unwrap_or_else(|_| home.to_path_buf());
    let digest = sha2::Sha256::digest(home.as_os_str().as_encoded_bytes());
    Path::new(STATE_DIR).join(&hex::encode(digest)[..16])
}

/// Removes the state directories of Warren homes that no longer exist and
/// hold no sandbox's state: each records its home's path in `home`, so a
/// deleted home leaves nothing in `/run` past the next start of any Warren
/// on the host.
pub fn sweep_state_roots() {
    use std::os::unix::ffi::OsStringExt;
    let Ok(entries) = std::fs::read_dir(STATE_DIR) else {
        return;
    };
    for dir in entries.flatten().map(|e| e.path()) {
        let Ok(owner) = std::fs::read(dir.join("home")) else {
            continue;
        };
        let owner = PathBuf::from(std::ffi::OsString::from_vec(owner));
        let only_record = std::fs::read_dir(&dir).is_ok_and(|rd| {
            rd.flatten()
                .all(|e| e.file_name() == std::ffi::OsStr::new("home"))
        });
        if !owner.exists() && only_record {
            let _ = std::fs::remove_file(dir.join("home"));
            let _ = std::fs::remove_dir(&dir);
        }
    }
}

/// Where the spawner mounts sandbox roots: a tmpfs of its own (mounted over
/// this host directory in its private mount namespace), reachable by every
/// uid, because a sandbox's root in its user namespace must be able to walk
/// to its rootfs and the Warren home may be private (0700).
pub const ROOTS_DIR: &str = "/run/warren/roots";

pub(crate) fn root_mount(id: &str) -> PathBuf {
    Path::new(ROOTS_DIR).join(id)
}

/// Id-mapped layer mounts of a sandbox, in the spawner's namespace.
fn lower_mounts(id: &str) -> PathBuf {
    Path::new(ROOTS_DIR).join(format!("{id}.lower"))
}

/// A bind of the directory holding the sandbox's upper and work
/// directories: the overlay is given these paths, and the sandbox reads
/// them back in its mountinfo, so they must not name the Warren home.
fn rw_mount(id: &str) -> PathBuf {
    Path::new(ROOTS_DIR).join(format!("{id}.rw"))
}

/// Lays out the sandbox directory and its OCI config, and claims its id
/// range. The file systems themselves are mounted by the spawner, in its
/// own mount namespace.
pub(crate) fn prepare(
    handle: &SandboxHandle,
    resources: &ResolvedResources,
    devices: &cdi::Injection,
    userns: bool,
) -> Result<Option<userns::IdRange>, RuntimeError> {
    let dir = &handle.dir;
    std::fs::create_dir(dir)
        .map_err(|e| RuntimeError::Create(format!("sandbox directory {}: {e}", dir.display())))?;
    let ids = if userns {
        Some(userns::allocate(dir)?)
    } else {
        None
    };
    let config = oci::config(&oci::ConfigInput {
        id: &handle.id,
        rootfs: &root_mount(&handle.id),
        cgroup_path: &handle.cgroup_path,
        resources,
        nofile: capped_limit(Resource::RLIMIT_NOFILE, 65536, 1024),
        memlock: capped_limit(Resource::RLIMIT_MEMLOCK, 8 << 20, 64 << 10),
        ids,
        devices,
    });
    let bytes = serde_json::to_vec(&config).map_err(RuntimeError::Config)?;
    std::fs::write(dir.join("config.json"), bytes)
        .map_err(RuntimeError::io("write config.json"))?;
    Ok(ids)
}

/// Mounts the sandbox's root: its own disk when it has a limit, then the
/// overlay of image layers and a fresh upper directory. Called by the
/// spawner in its private mount namespace, right before the clone.
pub(crate) fn mount_root(
    id: &str,
    dir: &Path,
    mounts: &RootMounts,
    ids: Option<userns::IdRange>,
) -> Result<(), RuntimeError> {
    let lower = mounts.lower;
    // With a disk limit, upper and work live on the sandbox's own file system.
    let base = if mounts.disk > 0 {
        disk::create(dir, mounts.disk)?
    } else {
        dir.to_path_buf()
    };
    // A sandbox restored in place (see `Runtime::restore_in_place`) keeps
    // the upper directory it has; the work directory is scratch, and one
    // a volatile overlay used must go before another mount takes it.
    let work = base.join("work");
    if work.exists() {
        std::fs::remove_dir_all(&work).map_err(RuntimeError::io("clear the work directory"))?;
    }
    for sub in [base.join("upper"), work] {
        match std::fs::create_dir(sub) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                return Err(RuntimeError::io("create sandbox dirs")(e))
            }
            _ => {}
        }
    }
    let rw = rw_mount(id);
    std::fs::create_dir(&rw).map_err(RuntimeError::io("create the upper mount point"))?;
    nix::mount::mount(
        Some(&base),
        &rw,
        None::<&str>,
        nix::mount::MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(RuntimeError::nix("bind the upper directory"))?;
    let (upper, work) = (rw.join("upper"), rw.join("work"));
    let lower = match ids {
        Some(ids) => {
            // The overlay's root directory is the upper directory: root in
            // the sandbox owns it.
            let host = Some(nix::unistd::Uid::from_raw(ids.base));
            nix::unistd::chown(&upper, host, Some(nix::unistd::Gid::from_raw(ids.base)))
                .map_err(RuntimeError::nix("chown the upper directory"))?;
            idmapped_lowers(id, lower, ids)?
        }
        None => lower.to_vec(),
    };
    let root = root_mount(id);
    std::fs::create_dir(&root).map_err(RuntimeError::io("create the root mount point"))?;
    rootfs::mount_overlay(&lower, &upper, &work, &root)?;
    volumes::mount_all(id, &root, mounts.volumes, ids)?;
    secrets::mount(&root, mounts.secrets, ids)
}

/// Id-mapped read-only binds of the image layers, shown to the sandbox as
/// owned by its own root.
fn idmapped_lowers(
    id: &str,
    lower: &[PathBuf],
    ids: userns::IdRange,
) -> Result<Vec<PathBuf>, RuntimeError> {
    let userns_fd = userns::namespace_fd(ids)?;
    let mounts = lower_mounts(id);
    std::fs::create_dir(&mounts).map_err(RuntimeError::io("create layer mount points"))?;
    lower
        .iter()
        .enumerate()
        .map(|(i, layer)| {
            let at = mounts.join(i.to_string());
            std::fs::create_dir(&at).map_err(RuntimeError::io("create layer mount points"))?;
            userns::idmapped_bind(layer, &userns_fd, &at)?;
            Ok(at)
        })
        .collect()
}

/// Detaches the mounts `mount_root` made from the calling namespace; the
/// sandbox's own namespace keeps its copies until its last process exits.
pub(crate) fn unmount_root(dir: &Path, id: &str) -> Result<(), RuntimeError> {
    for mount in [root_mount(id), rw_mount(id)] {
        rootfs::unmount(&mount)?;
        let _ = std::fs::remove_dir(&mount);
    }
    volumes::unmount_staging(id);
    gvisor::spawn::unmount_helpers(id);
    let mounts = lower_mounts(id);
    if let Ok(entries) = std::fs::read_dir(&mounts) {
        for e in entries.flatten() {
            rootfs::unmount(&e.path())?;
            let _ = std::fs::remove_dir(e.path());
        }
        let _ = std::fs::remove_dir(&mounts);
    }
    disk::remove(dir)
}

/// `wanted`, or the daemon's hard limit when that is lower: a sandbox's
/// config may only lower a limit (raising one needs CAP_SYS_RESOURCE in the
/// host's user namespace, which the sandbox's init does not have).
pub(crate) fn capped_limit(resource: Resource, wanted: u64, fallback: u64) -> u64 {
    match nix::sys::resource::getrlimit(resource) {
        Ok((_, hard)) => hard.min(wanted),
        Err(_) => fallback,
    }
}

fn remove_container(
    init_pid: Option<i32>,
    states: &[PathBuf],
    cgroup_path: &str,
) -> Result<(), RuntimeError> {
    // Frozen processes (a kept or paused sandbox) cannot act on SIGKILL,
    // and throttled ones take long to exit. The thaw goes through libcgroups
    // (1.4 ms on v1), so only a sandbox that is frozen pays for it.
    if cgroups::exists(cgroup_path) {
        if cgroups::is_frozen(cgroup_path) {
            let _ = cgroups::freeze(cgroup_path, false);
        }
        cgroups::unthrottle(cgroup_path);
    }
    if let Some(pid) = init_pid {
        kill_init(pid, cgroup_path);
        warren_crashpoint::hit("destroy:killed");
    }
    // Stragglers (or a sandbox whose init we could not identify) are killed
    // through the cgroup, which is then removed, exec cgroups first.
    exec_cgroup::remove_all(cgroup_path);
    cgroups::kill_and_remove(cgroup_path)?;
    warren_crashpoint::hit("destroy:cgroups");
    states
        .iter()
        .try_for_each(|state| trash::remove_tree(state))
}

/// Whether `pid` is a live process in the sandbox cgroup `cgroup_path`, so a
/// recycled pid is never mistaken for a sandbox's init.
pub fn owns_pid(pid: i32, cgroup_path: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .map(|c| c.lines().any(|l| l.ends_with(cgroup_path)))
        .unwrap_or(false)
}

/// SIGKILLs a sandbox's init, which makes the kernel kill every process of
/// its PID namespace, and waits until they are gone. The pid is checked to
/// still belong to the sandbox's cgroup, so a recycled pid is never hit.
fn kill_init(pid: i32, cgroup_path: &str) {
    use rustix::event::{poll, PollFd, PollFlags};
    use rustix::process::{pidfd_open, pidfd_send_signal, Pid, PidfdFlags, Signal};
    let Some(p) = Pid::from_raw(pid) else { return };
    let Ok(fd) = pidfd_open(p, PidfdFlags::empty()) else {
        return;
    };
    if !owns_pid(pid, cgroup_path) || pidfd_send_signal(&fd, Signal::KILL).is_err() {
        return;
    }
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    let timeout = rustix::time::Timespec {
        tv_sec: 5,
        tv_nsec: 0,
    };
    let _ = poll(&mut fds, Some(&timeout));
}

/// The spawner's phases (name, microseconds) on this process's clock: they
/// run end to end and the last ends as the spawner answers, so each one's
/// start is counted back from `answered` (the spawner's clock is not this
/// process's `Instant`; the answer's trip is the only error, microseconds).
fn spawner_timeline(
    phases: Vec<(String, u64)>,
    answered: std::time::Instant,
) -> Vec<(String, std::time::Instant, std::time::Duration)> {
    let total: u64 = phases.iter().map(|(_, micros)| micros).sum();
    let mut start = answered
        .checked_sub(std::time::Duration::from_micros(total))
        .unwrap_or(answered);
    phases
        .into_iter()
        .map(|(name, micros)| {
            let took = std::time::Duration::from_micros(micros);
            let phase = (name, start, took);
            start += took;
            phase
        })
        .collect()
}

pub mod cgroups;

//! Warren's node agent: everything that happens on one host. It owns the
//! image store and the runtime, supervises live sandboxes (their main process,
//! init, logs), journals them and takes them over again after a restart, and
//! reports what happens to them on a sequenced event feed. The control plane
//! drives it only through the node contract ([`warren_node_api::NodeApi`],
//! implemented by [`LocalNode`]), in `warren up` and in a cluster.

mod commit;
mod contract;
mod create;
mod devices;
mod dir_watch;
mod errors;
mod exec;
pub mod exec_stream;
mod execs;
mod feed;
mod file_access;
mod forks;
pub mod gpu;
mod image_calls;
mod images;
mod in_flight;
mod journal;
mod lifecycle;
pub mod lifetime;
mod log_dir;
pub mod logs;
mod memory_fork;
mod monitor;
mod network;
mod offer;
mod pressure;
mod reports;
pub mod sampler;
mod settings;
pub mod ship_journal;
mod take_over;
mod tasks;
mod torn;
mod usage;
pub mod user;
mod volumes;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use warren_image::{ImageRecord, ImageStore, Pin, Puller};
use warren_node_api::{CreateSandbox, Phase};
use warren_runtime::{files, Runtime, RuntimeConfig, RuntimeError};

pub use contract::LocalNode;
pub use errors::contract_error;
use exec::ExecDefaults;
pub use exec_stream::ExitInfo;
use images::Images;
use logs::SandboxLog;
pub use pressure::{SATURATION, SATURATION_AFTER};
use settings::host_memory;
pub use settings::{NodeConfig, NodeSettings, DEFAULT_DISK, DEFAULT_GPU_KIND};
use tasks::{enforce_lifetimes, expire_logs};
use usage::sample_usage;
use warren_core::sync::lock;

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("sandbox {0} is not running on this node")]
    NotRunning(String),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error(transparent)]
    Image(#[from] warren_image::ImageError),
    #[error(transparent)]
    Net(#[from] warren_net::NetError),
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    NotFound(String),
    /// Short of disk or memory: no sandbox starts until some is freed.
    #[error("{0}")]
    NoRoom(String),
    /// A create whose image this node does not have and cannot get.
    #[error("image {image:?}: {why}")]
    NoImage {
        image: String,
        why: Box<image_calls::NoImage>,
    },
    #[error("the client went away")]
    ClientGone,
    /// A blocking task (an image or cgroup step off the async threads)
    /// panicked or was cancelled.
    #[error(transparent)]
    Task(#[from] tokio::task::JoinError),
    #[error("{0}")]
    Internal(String),
}

/// Blob downloads running at once on a node, across all pulls: enough to
/// fill a link from a nearby registry without starving sandboxes' traffic.
const MAX_DOWNLOADS: usize = 6;

struct Live {
    /// What the control plane asked for, with its network rules as they
    /// are now (journaled with what follows).
    create: Mutex<CreateSandbox>,
    phase: Mutex<Phase>,
    pid: i32,
    /// Whose `/proc/<pid>/root` is the sandbox's root (see
    /// warren_runtime::SandboxHandle::root_pid).
    root_pid: i32,
    socket: PathBuf,
    cgroup_path: String,
    /// What its isolation class means for serving it (exec cgroups,
    /// terminals, ports).
    traits: warren_runtime::class::Traits,
    /// What every exec starts with unless it says otherwise; a pool
    /// member takes its claimer's.
    exec_defaults: Mutex<ExecDefaults>,
    image_digest: String,
    /// Keeps the image's layers while the sandbox runs, even when its name
    /// is pulled anew and points at another digest.
    _image_pin: Pin,
    /// The image it runs (a commit adds a layer on top of it).
    image: ImageRecord,
    main_cmd: Option<Vec<String>>,
    log: Arc<SandboxLog>,
    destroying: AtomicBool,
    /// Being saved for a fork with processes (which stops its init).
    saving: AtomicBool,
    /// Adopted while frozen with its main process running: the daemon
    /// re-attaches to the main process's output when it is thawed (a frozen
    /// init cannot answer).
    main_detached: AtomicBool,
    lifetime: Mutex<lifetime::Lifetime>,
    usage: Mutex<sampler::UsageTracker>,
    /// Bytes its writable layer may take on the node's disk; 0 = no limit
    /// of its own (a sandbox with its own disk is bounded by its size).
    disk_limit: u64,
    /// A disk overrun has been reported (once per sandbox).
    disk_reported: AtomicBool,
    /// What it reserved: under host memory pressure the sandbox furthest
    /// above it goes first.
    memory_request: u64,
    memory_reported: AtomicBool,
}

pub struct Node {
    /// What the node is and lends, and its defaults.
    offer: offer::Offer,
    initializing: tokio::sync::Semaphore,
    journal: journal::Journal,
    /// True once the sandboxes of the journal are taken over (after a start).
    ready: watch::Sender<bool>,
    runtime: Runtime,
    /// The image store and its puller.
    images: Arc<Images>,
    live: Mutex<HashMap<String, Arc<Live>>>,
    /// Creates under way: a destroy of one of them waits for it.
    creating: in_flight::InFlight,
    /// Sandboxes' logs, kept past their sandboxes for a while.
    logs: log_dir::LogDir,
    /// Samples of what sandboxes use, and the disk and memory guards.
    meter: usage::Meter,
    feed: Arc<feed::Feed>,
    /// Running execs: their ids, input, and the kept sandboxes they thaw.
    execs: execs::Execs,
    egress: Arc<warren_net::Egress>,
    /// Read-only copies of sandboxes' changes that forks are built on.
    forks: Arc<forks::ForkLayers>,
    /// CDI devices and which sandbox holds each.
    devices: devices::Devices,
    /// Volumes and which sandboxes mount each.
    pub(crate) volumes: volumes::Volumes,
}

impl Node {
    /// Opens the node's home and takes over the sandboxes its journal
    /// lists, in the background (`inventory` answers once that is done).
    pub fn start(cfg: NodeConfig) -> Result<Arc<Node>, NodeError> {
        for d in ["logs", "images"] {
            std::fs::create_dir_all(cfg.home.join(d))
                .map_err(|e| NodeError::Internal(format!("create {d} dir: {e}")))?;
        }
        // Sandbox inits are the spawners' children; if a spawner dies they are
        // re-parented to us rather than to the host's init, and the monitor
        // reaps them.
        // SAFETY: prctl(PR_SET_CHILD_SUBREAPER) takes plain integers.
        unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
        let store = Arc::new(ImageStore::open(&cfg.home.join("images"))?);
        let cgroup_parent = warren_runtime::cgroup_parent::CgroupParent::for_home(
            &cfg.home,
            cfg.settings.cgroup_parent.clone(),
        )
        .map_err(|e| NodeError::BadRequest(e.to_string()))?;
        let runsc = match cfg.settings.runsc.probe() {
            Ok(runsc) => {
                tracing::info!(runsc = %runsc.path.display(), version = %runsc.version, "the gvisor isolation class is offered");
                Some(runsc)
            }
            Err(e) if cfg.settings.default_isolation == warren_core::Isolation::Gvisor => {
                return Err(NodeError::BadRequest(format!(
                    "the default isolation class is gvisor, but {e}"
                )));
            }
            Err(e) => {
                tracing::debug!(error = %e, "the gvisor isolation class is not offered");
                None
            }
        };
        let runtime = Runtime::new(RuntimeConfig {
            runsc,
            home: cfg.home.clone(),
            spawner_exe: cfg.spawner_exe,
            spawner_args: cfg.spawner_args,
            spawners: cfg.spawners,
            cgroup_parent,
            userns: cfg.settings.userns,
        })?;
        let journal = journal::Journal::open(&cfg.home)
            .map_err(|e| NodeError::Internal(format!("open the node journal: {e}")))?;
        let ship = cfg
            .settings
            .log_shipping
            .then(|| ship_journal::ShipJournal::open(&cfg.home.join("ship"), cfg.settings.ship_max))
            .transpose()
            .map_err(|e| NodeError::Internal(e.to_string()))?
            .map(Arc::new);
        let cap = &cfg.settings;
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1) as u64;
        let total = cap.allocatable(
            cap.capacity.0.unwrap_or(cores * 1000),
            cap.capacity.1.unwrap_or_else(host_memory),
        );
        // Host-wide tables (see warren_runtime::host_tables): warned about,
        // not fatal, where the host does not let us set them.
        let max_pids = warren_runtime::host_tables::pid_budget();
        if let Err(e) =
            warren_runtime::host_tables::cap_pids(runtime.cgroup_parent().as_str(), max_pids)
        {
            tracing::warn!(error = %e, "could not cap the processes of all sandboxes together");
        }
        if cap.favor_dynmods {
            match warren_runtime::cgroup_tuning::favor_dynmods() {
                Ok(Some(at)) => {
                    tracing::info!(mount = %at.display(), "turned on favordynmods on the cgroup2 mount: moving a process between cgroups no longer waits for an RCU grace period (until the host restarts)")
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "could not turn on favordynmods; creates wait for an RCU grace period each")
                }
            }
        }
        match warren_runtime::host_tables::size_file_table(total.memory) {
            Ok(Some((old, new))) => tracing::info!(old, new, "raised fs.file-max so that sandbox memory, not the host's file table, bounds open files"),
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "could not size the host's open-file table"),
        }
        let registries = cfg.home.join(warren_image::REGISTRY_CONFIG_FILE);
        let forks = Arc::new(forks::ForkLayers::open(&cfg.home)?);
        let devices = devices::Devices::new(cap.cdi_dirs.clone(), cap.gpu_kind.clone());
        let volumes = volumes::Volumes::open(&cfg.home, &cfg.name)?;
        let gpu_reader = match gpu::Nvml::load() {
            Ok(nvml) => {
                tracing::info!(nvml = %nvml.describe(), "GPU use is sampled per sandbox");
                Some(Box::new(nvml) as Box<dyn gpu::GpuReader>)
            }
            Err(e) => {
                tracing::debug!(error = %e, "no NVML: GPU use is not sampled");
                None
            }
        };
        // Sequence numbers grow across node restarts on one boot.
        let feed = Arc::new(feed::Feed::new(lifetime::boot_ms().max(1) as u64 * 1000));
        let images = Arc::new(Images::new(
            store.clone(),
            Puller::new(
                store,
                registries,
                MAX_DOWNLOADS,
                (cores as usize).div_ceil(2),
            ),
            cfg.settings.image_budget,
            cfg.home.join("tmp"),
            feed.clone(),
        ));
        let pressure = pressure::Pressure::new(
            cfg.home.clone(),
            cfg.settings.disk_floor,
            cfg.settings
                .memory_floor
                .unwrap_or_else(|| settings::default_memory_floor(host_memory())),
            feed.clone(),
        );
        let node = Arc::new(Node {
            offer: offer::Offer {
                name: cfg.name,
                labels: cfg.labels,
                allocatable: total,
                max_pids,
                default_isolation: cfg.settings.default_isolation,
                default_disk: cfg.settings.default_disk,
            },
            journal,
            ready: watch::Sender::new(false),
            initializing: tokio::sync::Semaphore::new(cap.max_initializing.max(1)),
            runtime,
            images,
            live: Mutex::new(HashMap::new()),
            creating: Default::default(),
            logs: log_dir::LogDir::new(cfg.home.join("logs"), cfg.settings.log_max, ship),
            meter: usage::Meter::new(pressure, gpu_reader, feed.clone()),
            feed,
            // Exec ids name cgroups that can outlive a daemon (an exec left
            // running, or one a crash interrupted while it was being
            // killed): they must never repeat, so they count on from the
            // boot clock, not from zero at every start.
            execs: execs::Execs::new(lifetime::boot_ms().max(0) as u64 * 1000),
            egress: warren_net::Egress::new(cap.egress.clone()),
            forks,
            devices,
            volumes,
        });
        tokio::spawn(enforce_lifetimes(Arc::downgrade(&node)));
        tokio::spawn(sample_usage(
            Arc::downgrade(&node),
            cfg.settings.sample_interval,
        ));
        tokio::spawn(expire_logs(
            Arc::downgrade(&node),
            cfg.settings.log_retention,
        ));
        tokio::spawn(node.clone().take_over());
        Ok(node)
    }

    pub fn name(&self) -> &str {
        &self.offer.name
    }

    fn get(&self, id: &str) -> Result<Arc<Live>, NodeError> {
        lock(&self.live)
            .get(id)
            .cloned()
            .ok_or_else(|| NodeError::NotRunning(id.to_string()))
    }

    pub fn is_live(&self, id: &str) -> bool {
        self.get(id).is_ok()
    }

    /// Image digests used by live sandboxes (they must not be removed).
    pub fn images_in_use(&self) -> Vec<String> {
        lock(&self.live)
            .values()
            .map(|l| l.image_digest.clone())
            .collect()
    }

    /// Takes the registries a cluster's control plane gives at join
    /// beneath this node's own `registries.toml` (None: none).
    pub fn set_cluster_registries(&self, text: Option<&str>) -> Result<(), NodeError> {
        self.images.set_cluster_registries(text)
    }

    /// What the node leaves on the host as it stops: its spawners exit,
    /// reaping the inits of the sandboxes destroyed last (without this the
    /// daemon could exit first, and a caller could find such an init a
    /// zombie for a moment); its own cgroup parent goes where no sandbox is
    /// left below it.
    pub fn release_host(&self) {
        self.runtime.stop_spawners();
        self.runtime.release_cgroup_parent();
        self.volumes.unmount_all();
    }

    /// Records the sandbox in the node's journal as it stands now.
    fn journal(&self, live: &Live) -> Result<(), NodeError> {
        let entry = journal::Entry {
            create: live.create(),
            pid: live.pid,
            phase: live.phase(),
            ends_boot_ms: lifetime::boot_ms()
                + lock(&live.lifetime).ttl_remaining().as_millis() as i64,
        };
        self.journal
            .write(&entry)
            .map_err(|e| NodeError::Internal(format!("journal sandbox {}: {e}", live.create().id)))
    }

    fn log(&self, id: &str) -> Option<Arc<SandboxLog>> {
        self.get(id).ok().map(|l| l.log.clone())
    }

    /// The sandbox's root directory, for the confined file API.
    pub(crate) fn root(&self, id: &str) -> Result<std::os::fd::OwnedFd, NodeError> {
        let live = self.get(id)?;
        Ok(files::open_root(live.root_pid)?)
    }

    /// Host id of root in the sandbox, if it has a user namespace.
    pub(crate) fn host_id_base(&self, id: &str) -> Option<u32> {
        self.runtime.id_range(id).map(|r| r.base)
    }
}

impl Live {
    fn create(&self) -> CreateSandbox {
        lock(&self.create).clone()
    }
    fn phase(&self) -> Phase {
        *lock(&self.phase)
    }
    fn set_phase(&self, phase: Phase) {
        {
            let mut p = lock(&self.phase);
            *p = phase;
        }
    }
}

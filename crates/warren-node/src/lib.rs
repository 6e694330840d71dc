//! Warren's node agent: everything that happens on one host. It owns the
//! image store and the runtime, supervises live sandboxes (their main process,
//! init, logs), journals them and takes them over again after a restart, and
//! reports what happens to them on a sequenced event feed. The control plane
//! drives it only through the node contract ([`warren_node_api::NodeApi`],
//! implemented by [`LocalNode`]), in `warren up` and in a cluster.

mod contract;
pub mod exec_stream;
mod feed;
mod journal;
pub mod lifetime;
pub mod logs;
mod monitor;
pub mod sampler;
pub mod user;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, watch};
use warren_core::{ExecEvent, ExecRequest, SandboxSpec, Usage};
use warren_image::{ImageRecord, ImageStore, Pin, Progress, Puller};
use warren_node_api::{CreateSandbox, NodeEvent, Phase, Resources};
use warren_runtime::{files, CreateRequest, ExecSpec, Runtime, RuntimeConfig, RuntimeError};

pub use contract::LocalNode;
pub use exec_stream::ExitInfo;
use logs::SandboxLog;

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
    #[error("the client went away")]
    ClientGone,
    #[error("{0}")]
    Internal(String),
}

/// The disk a sandbox that names none may fill (see NodeSettings).
pub const DEFAULT_DISK: u64 = 10 << 30;

/// Blob downloads running at once on a node, across all pulls: enough to
/// fill a link from a nearby registry without starving sandboxes' traffic.
const MAX_DOWNLOADS: usize = 6;

pub struct NodeConfig {
    pub home: PathBuf,
    pub name: String,
    pub spawner_exe: PathBuf,
    pub spawner_args: Vec<String>,
    pub spawners: usize,
    pub settings: NodeSettings,
}

/// How much of the host the node lends to sandboxes.
#[derive(Debug, Clone)]
pub struct NodeSettings {
    /// CPU is compressible (each sandbox is capped by its quota), so the sum
    /// of sandbox CPU limits may exceed the cores by this factor.
    pub cpu_overcommit: f64,
    /// Kept back for the system and Warren itself.
    pub reserve_cpu_millis: u64,
    pub reserve_memory: u64,
    pub max_sandboxes: u32,
    /// Sandboxes initialising at once (the node's start queue).
    pub max_initializing: usize,
    /// How long the log of a finished sandbox is kept.
    pub log_retention: std::time::Duration,
    /// Most bytes one sandbox's log keeps on disk (its newest lines).
    pub log_max: u64,
    /// Disk limit of a sandbox that asks for none: its writable layer is
    /// measured every few seconds and the sandbox stopped past it
    /// (`disk_exceeded`). 0: no limit of its own (the node floor still holds).
    pub default_disk: u64,
    /// Free space under the home the node keeps: below it, creates are
    /// refused and the sandbox writing the most is stopped. None: the larger
    /// of 1 GiB and 5% of the file system.
    pub disk_floor: Option<u64>,
    /// How often every sandbox's cgroup is sampled.
    pub sample_interval: std::time::Duration,
    /// The egress proxy: global allowlist, fixed name resolution, limits.
    pub egress: warren_net::Settings,
    /// Most bytes the image store may hold; after a pull that downloaded
    /// something, registry images no sandbox uses are removed (oldest
    /// first) until it fits. None: only unreferenced content is collected.
    pub image_budget: Option<u64>,
    /// Each sandbox in its own user namespace (see warren_runtime::userns).
    pub userns: bool,
}

impl NodeSettings {
    /// What the node lends to sandboxes on a host of this size. The
    /// `warren simulate` replay uses the same computation.
    pub fn allocatable(&self, host_cpu_millis: u64, host_memory: u64) -> Resources {
        Resources {
            cpu_millis: ((host_cpu_millis as f64 * self.cpu_overcommit) as u64)
                .saturating_sub(self.reserve_cpu_millis),
            memory: host_memory.saturating_sub(self.reserve_memory),
            slots: self.max_sandboxes,
        }
    }
}

impl Default for NodeSettings {
    fn default() -> Self {
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        NodeSettings {
            cpu_overcommit: 8.0,
            reserve_cpu_millis: 250,
            reserve_memory: 512 << 20,
            max_sandboxes: 4096,
            max_initializing: 8 * cores,
            log_retention: std::time::Duration::from_secs(7 * 86400),
            log_max: logs::DEFAULT_MAX,
            default_disk: DEFAULT_DISK,
            disk_floor: None,
            sample_interval: sampler::DEFAULT_INTERVAL,
            egress: warren_net::Settings::default(),
            image_budget: None,
            userns: true,
        }
    }
}

struct Live {
    /// What the control plane asked for, with its network rules as they
    /// are now (journaled with what follows).
    create: Mutex<CreateSandbox>,
    phase: Mutex<Phase>,
    pid: i32,
    socket: PathBuf,
    cgroup_path: String,
    env: BTreeMap<String, String>,
    cwd: String,
    user: String,
    image_digest: String,
    /// Keeps the image's layers while the sandbox runs, even when its name
    /// is pulled anew and points at another digest.
    _image_pin: Pin,
    /// The image it runs (a commit adds a layer on top of it).
    image: ImageRecord,
    main_cmd: Option<Vec<String>>,
    log: Arc<SandboxLog>,
    destroying: AtomicBool,
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
}

pub struct Node {
    cpu: Mutex<CpuBusy>,
    checked_images: Mutex<std::collections::HashSet<String>>,
    name: String,
    allocatable: Resources,
    /// Most processes all sandboxes together may run.
    max_pids: u32,
    initializing: tokio::sync::Semaphore,
    journal: journal::Journal,
    /// True once the sandboxes of the journal are taken over (after a start).
    ready: watch::Sender<bool>,
    home: PathBuf,
    runtime: Runtime,
    images: Arc<ImageStore>,
    puller: Puller,
    image_budget: Option<u64>,
    live: Mutex<HashMap<String, Arc<Live>>>,
    log_max: u64,
    default_disk: u64,
    disk_floor: Option<u64>,
    /// Free space under the home is below the floor: no new sandboxes.
    disk_pressure: AtomicBool,
    feed: Arc<feed::Feed>,
    exec_seq: AtomicU64,
    egress: Arc<warren_net::Egress>,
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
        let images = Arc::new(ImageStore::open(&cfg.home.join("images"))?);
        let runtime = Runtime::new(RuntimeConfig {
            home: cfg.home.clone(),
            spawner_exe: cfg.spawner_exe,
            spawner_args: cfg.spawner_args,
            spawners: cfg.spawners,
            cgroup_parent: warren_core::RESOURCE_PREFIX.to_string(),
            userns: cfg.settings.userns,
        })?;
        let journal = journal::Journal::open(&cfg.home)
            .map_err(|e| NodeError::Internal(format!("open the node journal: {e}")))?;
        let cap = &cfg.settings;
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1) as u64;
        let total = cap.allocatable(cores * 1000, host_memory());
        // Host-wide tables (see warren_runtime::host_tables): warned about,
        // not fatal, where the host does not let us set them.
        let max_pids = warren_runtime::host_tables::pid_budget();
        if let Err(e) =
            warren_runtime::host_tables::cap_pids(warren_core::RESOURCE_PREFIX, max_pids)
        {
            tracing::warn!(error = %e, "could not cap the processes of all sandboxes together");
        }
        match warren_runtime::host_tables::size_file_table(total.memory) {
            Ok(Some((old, new))) => tracing::info!(old, new, "raised fs.file-max so that sandbox memory, not the host's file table, bounds open files"),
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "could not size the host's open-file table"),
        }
        let registries = cfg.home.join(warren_image::REGISTRY_CONFIG_FILE);
        let node = Arc::new(Node {
            cpu: Mutex::new(CpuBusy::default()),
            checked_images: Mutex::new(std::collections::HashSet::new()),
            allocatable: total,
            max_pids,
            journal,
            ready: watch::Sender::new(false),
            initializing: tokio::sync::Semaphore::new(cap.max_initializing.max(1)),
            name: cfg.name,
            home: cfg.home,
            runtime,
            puller: Puller::new(
                images.clone(),
                registries,
                MAX_DOWNLOADS,
                (cores as usize).div_ceil(2),
            ),
            image_budget: cfg.settings.image_budget,
            images,
            live: Mutex::new(HashMap::new()),
            log_max: cfg.settings.log_max,
            default_disk: cfg.settings.default_disk,
            disk_floor: cfg.settings.disk_floor,
            disk_pressure: AtomicBool::new(false),
            // Sequence numbers grow across node restarts on one boot.
            feed: Arc::new(feed::Feed::new(lifetime::boot_ms().max(1) as u64 * 1000)),
            // Exec ids name cgroups that can outlive a daemon (an exec left
            // running, or one a crash interrupted while it was being
            // killed): they must never repeat, so they count on from the
            // boot clock, not from zero at every start.
            exec_seq: AtomicU64::new(lifetime::boot_ms().max(0) as u64 * 1000),
            egress: warren_net::Egress::new(cap.egress.clone()),
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
        &self.name
    }

    /// The sandbox's JSON-lines log, opened for appending.
    fn open_log(&self, id: &str) -> Result<Arc<SandboxLog>, NodeError> {
        SandboxLog::open(&self.home.join("logs"), id, self.log_max)
            .map(Arc::new)
            .map_err(|e| NodeError::Internal(format!("open log: {e}")))
    }

    /// Whether the node has a log for the sandbox.
    pub fn has_log(&self, id: &str) -> bool {
        logs::files(&self.home.join("logs"), id)
            .iter()
            .any(|f| f.exists())
    }

    /// The sandbox's log as whole JSON lines, oldest first. With `over`, the
    /// stream follows the log until `over` says the sandbox has ended.
    pub fn log_stream(
        &self,
        id: &str,
        over: Option<Box<dyn FnMut() -> futures_util::future::BoxFuture<'static, bool> + Send>>,
    ) -> impl futures_util::Stream<Item = std::io::Result<bytes::Bytes>> + Send + 'static {
        let follow = over.map(|over| logs::Follow {
            changes: self.log(id).map(|l| l.subscribe()),
            over,
        });
        logs::stream(&self.home.join("logs"), id, follow)
    }

    fn get(&self, id: &str) -> Result<Arc<Live>, NodeError> {
        self.live
            .lock()
            .map_err(|_| NodeError::Internal("node state lock poisoned".into()))?
            .get(id)
            .cloned()
            .ok_or_else(|| NodeError::NotRunning(id.to_string()))
    }

    pub fn is_live(&self, id: &str) -> bool {
        self.get(id).is_ok()
    }

    /// Image digests used by live sandboxes (they must not be removed).
    pub fn images_in_use(&self) -> Vec<String> {
        self.live
            .lock()
            .map(|m| m.values().map(|l| l.image_digest.clone()).collect())
            .unwrap_or_default()
    }

    pub async fn resolve_image(&self, reference: &str) -> Result<ImageRecord, NodeError> {
        let images = self.images.clone();
        let r = reference.to_string();
        Ok(tokio::task::spawn_blocking(move || images.resolve(&r))
            .await
            .map_err(|e| NodeError::Internal(e.to_string()))??)
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
            if let Ok(mut f) = counter.lock() {
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
        let (layers, bytes, cached) = fetched.lock().map(|f| *f).unwrap_or_default();
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
    fn enforce_image_budget(&self, budget: u64, pulled: &ImageRecord) {
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
        Ok(tokio::task::spawn_blocking(move || images.prune(budget))
            .await
            .map_err(|e| NodeError::Internal(e.to_string()))??)
    }

    /// The image a new sandbox runs: a registry reference is resolved at
    /// the registry every time (a tag may have moved) and pulled when the
    /// store lacks that digest; anything else names an image in the store.
    pub async fn image_for_create(&self, reference: &str) -> Result<ImageRecord, NodeError> {
        if warren_image::registry_host(reference).is_some() {
            self.pull_image(reference, None).await
        } else {
            self.resolve_image(reference).await
        }
    }

    /// Refuses images a sandbox cannot safely be made from (see
    /// `warren_runtime::check_system_dirs`), before anything is recorded.
    pub async fn check_image(&self, image: &ImageRecord) -> Result<(), NodeError> {
        // Layers are immutable: an image that passed once passes again.
        if self
            .checked_images
            .lock()
            .is_ok_and(|c| c.contains(&image.digest))
        {
            return Ok(());
        }
        let images = self.images.clone();
        let record = image.clone();
        tokio::task::spawn_blocking(move || -> Result<(), NodeError> {
            let lower = images.lower_dirs(&record)?;
            Ok(warren_runtime::check_system_dirs(&lower)?)
        })
        .await
        .map_err(|e| NodeError::Internal(e.to_string()))??;
        if let Ok(mut c) = self.checked_images.lock() {
            c.insert(image.digest.clone());
        }
        Ok(())
    }

    /// Creates a sandbox and, if the spec names one, starts its main process.
    /// Returns once an exec into it would succeed.
    pub async fn create(
        self: &Arc<Self>,
        req: CreateSandbox,
        image: &ImageRecord,
    ) -> Result<i32, NodeError> {
        let (id, spec, resources) = (&req.id, &req.spec, &req.resources);
        if self.is_live(id) {
            return Err(NodeError::Conflict(format!(
                "sandbox {id} already exists on this node"
            )));
        }
        let lower_dirs = {
            let images = self.images.clone();
            let image = image.clone();
            tokio::task::spawn_blocking(move || images.lower_dirs(&image))
                .await
                .map_err(|e| NodeError::Internal(e.to_string()))??
        };
        let log = self.open_log(id)?;
        log.event("creating", warren_core::state::reason::CREATED, "");
        let permit = self
            .initializing
            .acquire()
            .await
            .map_err(|_| NodeError::Internal("node is shutting down".into()))?;
        let handle = self
            .runtime
            .create(CreateRequest {
                id: id.to_string(),
                lower_dirs,
                resources: resources.clone(),
            })
            .await?;
        drop(permit);
        if let Err(e) = self.attach_network(id, handle.pid, spec, &log).await {
            let _ = self.runtime.destroy(id, Some(handle.pid)).await;
            return Err(e);
        }
        let lifetime = lifetime::Lifetime::new(spec.ttl(), spec.lease.map(|l| l.0));
        let live = self.register(
            req.clone(),
            handle.pid,
            Phase::Running,
            image,
            log,
            lifetime,
        );
        // Resolve the main process's user now, so a bad one fails the create.
        let checked = match &spec.cmd {
            Some(cmd) => self
                .exec_job(id, &live, &main_request(cmd), true)
                .map(|_| ()),
            None => Ok(()),
        };
        if let Err(e) = checked.and_then(|()| self.journal(&live)) {
            let _ = self
                .destroy(id, warren_core::state::reason::CREATE_FAILED)
                .await;
            return Err(e);
        }
        Ok(handle.pid)
    }

    /// Records the sandbox in the node's journal as it stands now.
    fn journal(&self, live: &Live) -> Result<(), NodeError> {
        let entry = journal::Entry {
            create: live.create(),
            pid: live.pid,
            phase: live.phase(),
            ends_boot_ms: lifetime::boot_ms()
                + live
                    .lifetime
                    .lock()
                    .map(|l| l.ttl_remaining().as_millis() as i64)
                    .unwrap_or(0),
        };
        self.journal
            .write(&entry)
            .map_err(|e| NodeError::Internal(format!("journal sandbox {}: {e}", live.create().id)))
    }

    /// Starts the spec's main process, if it has one. The control plane
    /// calls this once the sandbox is recorded as running, so the main
    /// process's exit is never reported for a sandbox still `creating`.
    pub fn start_main(self: &Arc<Self>, id: &str) -> Result<(), NodeError> {
        let live = self.get(id)?;
        let Some(cmd) = live.main_cmd.clone() else {
            return Ok(());
        };
        let job = self.exec_job(id, &live, &main_request(&cmd), true)?;
        self.supervise_main(id, async move |tx| exec_stream::run(job, tx).await);
        Ok(())
    }

    /// Gives an `allowlist` sandbox its proxy, DNS stub and transparent
    /// listeners; `none` needs nothing (its namespace has only loopback).
    async fn attach_network(
        &self,
        id: &str,
        pid: i32,
        spec: &SandboxSpec,
        log: &Arc<SandboxLog>,
    ) -> Result<(), NodeError> {
        if spec.network.mode != warren_core::spec::NetworkMode::Allowlist {
            return Ok(());
        }
        let log = log.clone();
        let sink: warren_net::LogFn = Arc::new(move |line| log.record("net", line));
        self.egress
            .attach(id, pid, &spec.network.allow, &spec.network.deny, sink)
            .await?;
        Ok(())
    }

    /// Replaces a running sandbox's network rules; says which connections
    /// the change closed and which ports got no transparent listener.
    pub async fn update_network(
        &self,
        id: &str,
        network: &warren_core::spec::NetworkSpec,
    ) -> Result<warren_net::PolicyChange, NodeError> {
        let live = self.get(id)?;
        let change = self
            .egress
            .update(id, &network.allow, &network.deny)
            .await?;
        if let Ok(mut c) = live.create.lock() {
            c.spec.network = network.clone();
        }
        self.journal(&live)?;
        Ok(change)
    }

    /// Checks rules against the node's global defaults.
    pub fn check_network(&self, network: &warren_core::spec::NetworkSpec) -> Result<(), NodeError> {
        if network.mode == warren_core::spec::NetworkMode::Allowlist {
            self.egress.parse(&network.allow, &network.deny)?;
        }
        Ok(())
    }

    /// Inbound: a connection to `port` on the sandbox's loopback.
    pub async fn connect_port(
        &self,
        id: &str,
        port: u16,
    ) -> Result<tokio::net::TcpStream, NodeError> {
        let live = self.get(id)?;
        // A frozen sandbox with a full listen backlog would hold the
        // connect forever.
        let connect = warren_net::connect_in(live.pid, port);
        match tokio::time::timeout(warren_runtime::exec::INIT_DEADLINE, connect).await {
            Ok(r) => r.map_err(|e| {
                NodeError::Conflict(format!(
                    "nothing accepts connections on port {port} in sandbox {id}: {e}"
                ))
            }),
            Err(_) => Err(NodeError::Conflict(format!(
                "port {port} in sandbox {id} did not accept the connection within {}s (is the sandbox paused?)",
                warren_runtime::exec::INIT_DEADLINE.as_secs()
            ))),
        }
    }

    /// After a start: takes over every sandbox of the journal (those whose
    /// init is gone are removed), then sweeps what no entry claims (left by
    /// a crash between a create's first step and its journal entry).
    async fn take_over(self: Arc<Self>) {
        use futures_util::StreamExt;
        let entries = {
            let journal = journal::Journal::open(&self.home);
            tokio::task::spawn_blocking(move || journal.map(|j| j.load()).unwrap_or_default())
                .await
                .unwrap_or_default()
        };
        futures_util::stream::iter(entries)
            .for_each_concurrent(TAKE_OVER_PARALLELISM, |entry| {
                let node = self.clone();
                async move {
                    let id = entry.create.id.clone();
                    match node.adopt(entry).await {
                        Ok(()) => tracing::info!(sandbox = %id, "taken over after a restart"),
                        Err(e) => {
                            tracing::warn!(sandbox = %id, error = %e, "could not take the sandbox over; removing its remains");
                            node.journal.remove(&id);
                        }
                    }
                }
            })
            .await;
        for id in self.runtime.list_host_sandboxes() {
            if !self.is_live(&id) && self.runtime.destroy(&id, None).await.is_ok() {
                tracing::info!(sandbox = %id, "swept orphaned sandbox resources");
            }
        }
        self.ready.send_replace(true);
    }

    /// Waits until the journal's sandboxes are taken over.
    async fn wait_ready(&self) {
        let mut rx = self.ready.subscribe();
        let _ = rx.wait_for(|r| *r).await;
    }

    /// Takes over a sandbox that outlived a daemon restart: its init must
    /// still be alive and in the sandbox's cgroup. Nothing here waits on
    /// the sandbox's processes: its main process's output, which init held
    /// while no daemon was reading, is re-attached in the background, and
    /// only once the sandbox is not frozen.
    async fn adopt(self: &Arc<Self>, entry: journal::Entry) -> Result<(), NodeError> {
        let id = entry.create.id.clone();
        let id = id.as_str();
        let image = self.resolve_image(&entry.create.image_digest).await?;
        let cgroup_path = self.runtime.cgroup_path(id);
        if !warren_runtime::owns_pid(entry.pid, &cgroup_path) {
            return Err(NodeError::NotRunning(id.to_string()));
        }
        // A crash between a freeze (or thaw) and its journal entry: the
        // entry is what the control plane was told, so the freezer follows.
        let path = cgroup_path.clone();
        let frozen = entry.phase != Phase::Running;
        tokio::task::spawn_blocking(move || {
            if warren_runtime::cgroups::is_frozen(&path) != frozen {
                warren_runtime::cgroups::freeze(&path, frozen)
            } else {
                Ok(())
            }
        })
        .await
        .map_err(|e| NodeError::Internal(e.to_string()))??;
        let log = self.open_log(id)?;
        log.event(
            "running",
            "adopted",
            "the daemon restarted and took the sandbox over",
        );
        // The old daemon's proxy sockets died with it, so egress has failed
        // closed since; new ones restore it with the journaled policy.
        if let Err(e) = self
            .attach_network(id, entry.pid, &entry.create.spec, &log)
            .await
        {
            log.event("running", "network_unavailable", &e.to_string());
        }
        // A held sandbox's lifetime is its hold; its main process has been
        // dealt with.
        let working = entry.phase != Phase::Held;
        let remaining = (entry.ends_boot_ms - lifetime::boot_ms()).max(0) as u64;
        let lifetime = lifetime::Lifetime::new(
            std::time::Duration::from_millis(remaining),
            entry.create.spec.lease.map(|l| l.0).filter(|_| working),
        );
        let has_main = entry.create.spec.cmd.is_some();
        let live = self.register(entry.create, entry.pid, entry.phase, &image, log, lifetime);
        // Execs that were running died with their streams (their cgroups
        // go), and a kill the crash interrupted is finished.
        let path = cgroup_path.clone();
        let _ = tokio::task::spawn_blocking(move || {
            warren_runtime::exec_cgroup::settle(&path);
        })
        .await;
        if has_main && working {
            if frozen {
                live.main_detached.store(true, Ordering::Release);
            } else {
                self.spawn_attach_main(id);
            }
        }
        Ok(())
    }

    /// Re-attaches to the main process of an adopted sandbox, retrying while
    /// its init does not answer (a busy host), until the sandbox is frozen
    /// again (the thaw retries) or gone.
    fn spawn_attach_main(self: &Arc<Self>, id: &str) {
        let node = self.clone();
        let id = id.to_string();
        tokio::spawn(async move {
            let mut wait = std::time::Duration::from_millis(200);
            loop {
                let Ok(live) = node.get(&id) else { return };
                if live.destroying.load(Ordering::Acquire) {
                    return;
                }
                match node.attach_main(&id, &live).await {
                    Ok(()) => return,
                    Err(e) => {
                        let path = live.cgroup_path.clone();
                        let frozen = tokio::task::spawn_blocking(move || {
                            warren_runtime::cgroups::is_frozen(&path)
                        })
                        .await
                        .unwrap_or(false);
                        if frozen {
                            live.main_detached.store(true, Ordering::Release);
                            return;
                        }
                        tracing::warn!(sandbox = %id, error = %e, "re-attaching to the main process; retrying");
                        tokio::time::sleep(wait).await;
                        wait = (wait * 2).min(std::time::Duration::from_secs(30));
                    }
                }
            }
        });
    }

    async fn attach_main(self: &Arc<Self>, id: &str, live: &Arc<Live>) -> Result<(), NodeError> {
        match warren_runtime::exec::attach_main(&live.socket).await? {
            warren_runtime::exec::MainAttach::Running {
                pid: main_pid,
                stdout,
                stderr,
                exit,
            } => {
                let cmd = live.main_cmd.clone().unwrap_or_default();
                let job = self.exec_job(id, live, &main_request(&cmd), true)?;
                let cgroup =
                    warren_runtime::exec_cgroup::ExecCgroup::existing(&live.cgroup_path, "main");
                self.supervise_main(id, async move |tx| {
                    let started = std::time::Instant::now();
                    exec_stream::pump(
                        &job, main_pid, stdout, stderr, exit, None, cgroup, tx, started,
                    )
                    .await
                });
            }
            warren_runtime::exec::MainAttach::Exited { code, signal } => {
                let exit = ExitInfo {
                    code,
                    signal,
                    timed_out: false,
                };
                let oom_killed = self.oom_kills(id) > 0;
                self.feed.push(NodeEvent::MainExited {
                    id: id.to_string(),
                    exit,
                    oom_killed,
                });
            }
            warren_runtime::exec::MainAttach::NoMain => {}
        }
        Ok(())
    }

    fn register(
        self: &Arc<Self>,
        create: CreateSandbox,
        pid: i32,
        phase: Phase,
        image: &ImageRecord,
        log: Arc<SandboxLog>,
        lifetime: lifetime::Lifetime,
    ) -> Arc<Live> {
        let (id, spec, resources) = (create.id.clone(), &create.spec, &create.resources);
        let mut env =
            warren_core::spec::sandbox_env(&image.config.env, resources.cpu_millis, &spec.env);
        if spec.network.mode == warren_core::spec::NetworkMode::Allowlist {
            for (k, v) in warren_net::proxy_env() {
                env.entry(k).or_insert(v);
            }
        }
        let cwd = spec
            .cwd
            .clone()
            .or_else(|| Some(image.config.working_dir.clone()).filter(|w| w.starts_with('/')))
            .unwrap_or_else(|| "/".into());
        let user = spec
            .user
            .clone()
            .unwrap_or_else(|| image.config.user.clone());
        let handle = self.runtime.handle(&id, pid);
        let disk_limit = if resources.disk > 0 {
            0
        } else {
            self.default_disk
        };
        let main_cmd = spec.cmd.clone();
        let live = Arc::new(Live {
            create: Mutex::new(create),
            phase: Mutex::new(phase),
            pid,
            socket: handle.socket,
            cgroup_path: handle.cgroup_path,
            env,
            cwd,
            user,
            image_digest: image.digest.clone(),
            _image_pin: self.images.pin_image(image),
            image: image.clone(),
            main_cmd,
            log,
            destroying: AtomicBool::new(false),
            main_detached: AtomicBool::new(false),
            lifetime: Mutex::new(lifetime),
            usage: Mutex::new(sampler::UsageTracker::new()),
            disk_limit,
            disk_reported: AtomicBool::new(false),
        });
        if let Ok(mut m) = self.live.lock() {
            m.insert(id.clone(), live.clone());
        }
        monitor::watch_init(self.clone(), id, pid);
        live
    }

    /// Runs the main process's event pump and reports its exit. Nobody
    /// consumes its events here: output goes to the log, which `warren logs`
    /// and `warren run` follow.
    fn supervise_main<F, Fut>(self: &Arc<Self>, id: &str, pump: F)
    where
        F: FnOnce(mpsc::Sender<ExecEvent>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<ExitInfo, NodeError>> + Send,
    {
        let node = self.clone();
        let id = id.to_string();
        tokio::spawn(async move {
            let (tx, mut rx) = mpsc::channel(64);
            tokio::spawn(async move { while rx.recv().await.is_some() {} });
            if let Ok(exit) = pump(tx).await {
                let oom_killed = node.oom_kills(&id) > 0;
                node.feed.push(NodeEvent::MainExited {
                    id,
                    exit,
                    oom_killed,
                });
            }
        });
    }

    fn exec_job(
        &self,
        id: &str,
        live: &Live,
        req: &ExecRequest,
        main: bool,
    ) -> Result<exec_stream::ExecJob, NodeError> {
        let stdin = req
            .validate()
            .map_err(|e| NodeError::BadRequest(e.to_string()))?;
        let mut env = live.env.clone();
        env.extend(req.env.clone());
        let root = files::open_root(live.pid)?;
        let user_spec = req.user.clone().unwrap_or_else(|| live.user.clone());
        let user = user::resolve(&root, &user_spec).map_err(NodeError::BadRequest)?;
        let seq = self.exec_seq.fetch_add(1, Ordering::Relaxed);
        Ok(exec_stream::ExecJob {
            socket: live.socket.clone(),
            sandbox_cgroup: live.cgroup_path.clone(),
            spec: ExecSpec {
                argv: req.cmd.clone(),
                env: env.into_iter().map(|(k, v)| format!("{k}={v}")).collect(),
                cwd: req.cwd.clone().unwrap_or_else(|| live.cwd.clone()),
                uid: user.uid,
                gid: user.gid,
                groups: vec![],
                main,
                cgroup: false,
            },
            stdin,
            timeout: req.timeout.map(|t| t.0),
            exec_id: if main {
                "main".into()
            } else {
                format!("ex-{id}-{seq}")
            },
            log: Some(live.log.clone()),
        })
    }

    /// Starts an exec; its events arrive on the returned channel. Dropping
    /// the receiver kills the exec's process tree.
    pub async fn exec(
        &self,
        id: &str,
        req: &ExecRequest,
    ) -> Result<mpsc::Receiver<ExecEvent>, NodeError> {
        let live = self.get(id)?;
        if live.destroying.load(Ordering::Acquire) {
            return Err(NodeError::NotRunning(id.to_string()));
        }
        let job = self.exec_job(id, &live, req, false)?;
        let (tx, rx) = mpsc::channel(64);
        // Surface "cannot start" errors synchronously so the API can answer 409.
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let (inner_tx, mut inner_rx) = mpsc::channel::<ExecEvent>(64);
            let fwd = tokio::spawn(async move {
                let mut first = Some(started_tx);
                while let Some(ev) = inner_rx.recv().await {
                    if let Some(s) = first.take() {
                        let _ = s.send(Ok(()));
                    }
                    if tx.send(ev).await.is_err() {
                        break;
                    }
                }
                first
            });
            let result = exec_stream::run(job, inner_tx).await;
            if let (Err(e), Ok(Some(s))) = (result, fwd.await) {
                let _ = s.send(Err(e));
            }
        });
        match started_rx.await {
            Ok(Ok(())) => Ok(rx),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(NodeError::Internal("exec task ended early".into())),
        }
    }

    /// Kills and removes everything of the sandbox, `why` being the last
    /// line of its log. Idempotent. Returns the sandbox's final usage when
    /// it was live here.
    pub async fn destroy(&self, id: &str, why: &str) -> Result<Option<Usage>, NodeError> {
        let mut last_usage = None;
        let live = self.get(id).ok();
        let pid = live.as_ref().map(|live| {
            live.destroying.store(true, Ordering::Release);
            // The resource summary, read while the cgroup still exists.
            self.sample_one(id, live, true);
            if let Ok(u) = live.usage.lock() {
                let usage = u.usage();
                live.log
                    .record("summary", serde_json::json!({ "usage": usage }));
                last_usage = Some(usage);
            }
            live.pid
        });
        self.egress.detach(id);
        self.runtime.destroy(id, pid).await?;
        self.journal.remove(id);
        if let Some(live) = live {
            // Before it leaves the table, so a log follower reads it.
            live.log.event("destroyed", why, "");
        }
        if let Ok(mut m) = self.live.lock() {
            m.remove(id);
        }
        Ok(last_usage)
    }

    /// Renews the sandbox's lease (heartbeat, or any API call on it).
    pub fn renew_lease(&self, id: &str) {
        if let Ok(live) = self.get(id) {
            if let Ok(mut l) = live.lifetime.lock() {
                l.renew();
            }
        }
    }

    /// Lets the sandbox live `ttl` from now.
    pub fn set_ttl(&self, id: &str, ttl: std::time::Duration) -> Result<(), NodeError> {
        let live = self.get(id)?;
        live.lifetime
            .lock()
            .map_err(|_| NodeError::Internal("lifetime lock".into()))?
            .set_ttl(ttl);
        self.journal(&live)
    }

    /// Freezes a finished sandbox and holds it for `hold_for` (a new
    /// lifetime without lease: a kept sandbox's own expiry, or a grace
    /// period). Answers the usage of its run.
    pub async fn hold(
        self: &Arc<Self>,
        id: &str,
        hold_for: std::time::Duration,
        note: &warren_node_api::LogNote,
    ) -> Result<Option<Usage>, NodeError> {
        if let Err(e) = self.freeze(id, true).await {
            tracing::warn!(sandbox = %id, error = %e, "freezing a finished sandbox");
        }
        let live = self.get(id)?;
        if let Ok(mut l) = live.lifetime.lock() {
            l.restart(hold_for);
        }
        live.set_phase(Phase::Held);
        self.journal(&live)?;
        live.log.event(&note.state, &note.reason, &note.message);
        Ok(self.usage(id))
    }

    /// Remaining TTL and lease, in milliseconds.
    pub fn remaining(&self, id: &str) -> Option<(u64, Option<u64>)> {
        let live = self.get(id).ok()?;
        let l = live.lifetime.lock().ok()?;
        Some((
            l.ttl_remaining().as_millis() as u64,
            l.lease_remaining().map(|d| d.as_millis() as u64),
        ))
    }

    /// Records the sandbox's filesystem changes as a new layer on top of its
    /// image, under `name`. With `freeze`, its processes are frozen while
    /// the layer is written (so files are not caught half-changed) and
    /// thawed after; a paused or kept sandbox is already frozen.
    pub async fn commit(self: &Arc<Self>, id: &str, name: &str) -> Result<ImageRecord, NodeError> {
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
        let (name, comment) = (name.to_string(), format!("warren commit {id}"));
        let owners = warren_image::Owners {
            root: self.runtime.id_range(id).map(|r| r.base),
        };
        let result = tokio::task::spawn_blocking(move || {
            images.commit_changes(&base, &upper, owners, &name, &comment)
        })
        .await;
        if freeze {
            if let Err(e) = self.freeze(id, false).await {
                tracing::warn!(id, error = %e, "could not thaw the sandbox after commit");
            }
        }
        Ok(result.map_err(|e| NodeError::Internal(e.to_string()))??)
    }

    /// Pauses (freezes) or resumes (thaws) the sandbox, journaled.
    pub async fn set_paused(self: &Arc<Self>, id: &str, paused: bool) -> Result<(), NodeError> {
        let live = self.get(id)?;
        if live.phase() == Phase::Held {
            return Err(NodeError::Conflict(format!(
                "sandbox {id} has finished and is held; it cannot be paused or resumed"
            )));
        }
        self.freeze(id, paused).await?;
        live.set_phase(if paused {
            Phase::Paused
        } else {
            Phase::Running
        });
        self.journal(&live)
    }

    /// Freezes (or thaws) every process of the sandbox with the cgroup freezer.
    async fn freeze(self: &Arc<Self>, id: &str, frozen: bool) -> Result<(), NodeError> {
        let live = self.get(id)?;
        let path = live.cgroup_path.clone();
        tokio::task::spawn_blocking(move || warren_runtime::cgroups::freeze(&path, frozen))
            .await
            .map_err(|e| NodeError::Internal(e.to_string()))??;
        if !frozen && live.main_detached.swap(false, Ordering::AcqRel) {
            self.spawn_attach_main(id);
        }
        Ok(())
    }

    fn log(&self, id: &str) -> Option<Arc<SandboxLog>> {
        self.get(id).ok().map(|l| l.log.clone())
    }

    /// Usage as sampled, refreshed with a reading taken now.
    pub fn usage(&self, id: &str) -> Option<Usage> {
        let live = self.get(id).ok()?;
        self.sample_one(id, &live, false);
        live.usage.lock().ok().map(|u| u.usage())
    }

    fn sample_one(&self, id: &str, live: &Live, with_disk: bool) {
        let at = std::time::Instant::now();
        let Ok(sample) = warren_runtime::cgroups::sample(&live.cgroup_path) else {
            return;
        };
        let Ok(mut u) = live.usage.lock() else { return };
        let disk = (with_disk && u.wants_disk())
            .then(|| sampler::disk_bytes(&self.runtime.sandbox_dir(id)));
        u.add(at, sample, disk);
        drop(u);
        if let Some(used) = disk {
            if live.disk_limit > 0 && used > live.disk_limit {
                self.report_disk(id, live, used, live.disk_limit, false);
            }
        }
    }

    fn report_disk(&self, id: &str, live: &Live, used: u64, limit: u64, node_full: bool) {
        if live.disk_reported.swap(true, Ordering::AcqRel) {
            return;
        }
        self.feed.push(NodeEvent::DiskExceeded {
            id: id.to_string(),
            used,
            limit,
            node_full,
        });
    }

    /// Whether free space under the home is below the floor (creates are
    /// refused meanwhile).
    pub fn disk_pressure(&self) -> bool {
        self.disk_pressure.load(Ordering::Acquire)
    }

    /// Checks free space under the home; below the floor, measures every
    /// sandbox's writable layer and reports the largest (one per check: its
    /// removal may be enough).
    fn check_disk_floor(&self, live: &[(String, Arc<Live>)]) {
        let Ok(st) = rustix::fs::statvfs(&self.home) else {
            return;
        };
        let block = st.f_frsize.max(1);
        let free = st.f_bavail.saturating_mul(block);
        let size = st.f_blocks.saturating_mul(block);
        let floor = self.disk_floor.unwrap_or((size / 20).max(1 << 30));
        let pressure = free < floor;
        if self.disk_pressure.swap(pressure, Ordering::AcqRel) != pressure {
            if pressure {
                tracing::warn!(free, floor, "disk under the home is below its floor: creates refused, the largest writer is stopped");
            } else {
                tracing::info!(free, floor, "disk under the home is above its floor again");
            }
        }
        if !pressure {
            return;
        }
        let largest = live
            .iter()
            .filter(|(_, l)| {
                !l.destroying.load(Ordering::Acquire) && !l.disk_reported.load(Ordering::Acquire)
            })
            .map(|(id, l)| (sampler::disk_bytes(&self.runtime.sandbox_dir(id)), id, l))
            .max_by_key(|(used, _, _)| *used);
        if let Some((used, id, l)) = largest {
            self.report_disk(id, l, used, l.disk_limit, true);
        }
    }

    pub fn oom_kills(&self, id: &str) -> u64 {
        self.get(id)
            .map(|l| warren_runtime::cgroups::oom_kills(&l.cgroup_path))
            .unwrap_or(0)
    }

    /// The sandbox's root directory, for the confined file API.
    fn root(&self, id: &str) -> Result<std::os::fd::OwnedFd, NodeError> {
        let live = self.get(id)?;
        Ok(files::open_root(live.pid)?)
    }

    /// Host id of root in the sandbox, if it has a user namespace.
    fn host_id_base(&self, id: &str) -> Option<u32> {
        self.runtime.id_range(id).map(|r| r.base)
    }

    fn init_died(&self, id: &str) {
        let Ok(live) = self.get(id) else { return };
        if live.destroying.load(Ordering::Acquire) {
            return;
        }
        let oom_killed = warren_runtime::cgroups::oom_kills(&live.cgroup_path) > 0;
        self.feed.push(NodeEvent::InitDied {
            id: id.to_string(),
            oom_killed,
        });
    }
}

impl Live {
    fn create(&self) -> CreateSandbox {
        self.create
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
    fn phase(&self) -> Phase {
        self.phase.lock().map(|p| *p).unwrap_or(Phase::Running)
    }
    fn set_phase(&self, phase: Phase) {
        if let Ok(mut p) = self.phase.lock() {
            *p = phase;
        }
    }
}

/// Journal entries taken over at once after a restart.
const TAKE_OVER_PARALLELISM: usize = 32;

fn host_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}

/// The node's CPU busy share between samples, from /proc/stat.
#[derive(Debug, Default)]
struct CpuBusy {
    last: Option<(u64, u64)>,
    busy: f64,
    high_since: Option<std::time::Instant>,
    reported: bool,
}

pub const SATURATION: f64 = 0.85;
pub const SATURATION_AFTER: std::time::Duration = std::time::Duration::from_secs(30);

fn proc_stat_cpu() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let fields: Vec<u64> = text
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    let total: u64 = fields.iter().sum();
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    Some((total, idle))
}

impl Node {
    /// Share of the node's CPU time spent busy over the last sample interval.
    pub fn cpu_busy(&self) -> f64 {
        self.cpu.lock().map(|c| c.busy).unwrap_or(0.0)
    }

    fn sample_cpu(&self) {
        let Some((total, idle)) = proc_stat_cpu() else {
            return;
        };
        let Ok(mut c) = self.cpu.lock() else { return };
        if let Some((t0, i0)) = c.last {
            let dt = total.saturating_sub(t0);
            if dt > 0 {
                c.busy = 1.0 - idle.saturating_sub(i0) as f64 / dt as f64;
            }
        }
        c.last = Some((total, idle));
        if c.busy > SATURATION {
            let since = *c.high_since.get_or_insert_with(std::time::Instant::now);
            if since.elapsed() >= SATURATION_AFTER && !c.reported {
                c.reported = true;
                self.feed.push(NodeEvent::CpuSaturated { busy: c.busy });
            }
        } else {
            c.high_since = None;
            c.reported = false;
        }
    }
}

/// Samples every live sandbox's cgroup once per `interval`.
async fn sample_usage(node: std::sync::Weak<Node>, interval: std::time::Duration) {
    loop {
        tokio::time::sleep(interval).await;
        let Some(n) = node.upgrade() else { return };
        let live: Vec<(String, Arc<Live>)> = n
            .live
            .lock()
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default();
        let _ = tokio::task::spawn_blocking(move || {
            n.sample_cpu();
            for (id, l) in &live {
                if !l.destroying.load(Ordering::Acquire) {
                    n.sample_one(id, l, true);
                }
            }
            n.check_disk_floor(&live);
        })
        .await;
    }
}

/// Removes the logs of sandboxes that are gone and were last written
/// longer ago than `retention`.
async fn expire_logs(node: std::sync::Weak<Node>, retention: std::time::Duration) {
    let tick = (retention / 2).clamp(
        std::time::Duration::from_millis(200),
        std::time::Duration::from_secs(60),
    );
    loop {
        let Some(n) = node.upgrade() else { return };
        let dir = n.home.join("logs");
        let live: Vec<String> = n
            .live
            .lock()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default();
        drop(n);
        let _ = tokio::task::spawn_blocking(move || {
            let Ok(rd) = std::fs::read_dir(&dir) else {
                return;
            };
            for entry in rd.filter_map(|e| e.ok()) {
                let name = entry.file_name().to_string_lossy().into_owned();
                let Some(id) = logs::owner(&name) else {
                    continue;
                };
                let old = entry
                    .metadata()
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .is_some_and(|age| age > retention);
                if old && !live.iter().any(|l| l == id) {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        })
        .await;
        tokio::time::sleep(tick).await;
    }
}

fn main_request(cmd: &[String]) -> ExecRequest {
    ExecRequest {
        cmd: cmd.to_vec(),
        ..Default::default()
    }
}

/// Checks every live sandbox's TTL and lease on the monotonic clock and
/// reports the ones that ran out. Runs until the node is dropped.
async fn enforce_lifetimes(node: std::sync::Weak<Node>) {
    const TICK: std::time::Duration = std::time::Duration::from_millis(50);
    loop {
        tokio::time::sleep(TICK).await;
        let Some(node) = node.upgrade() else { return };
        let now = tokio::time::Instant::now();
        let expired: Vec<(String, &'static str)> = match node.live.lock() {
            Ok(live) => live
                .iter()
                .filter(|(_, l)| !l.destroying.load(Ordering::Acquire))
                .filter_map(|(id, l)| {
                    let why = l.lifetime.lock().ok()?.take_expiry(now)?;
                    Some((id.clone(), why))
                })
                .collect(),
            Err(_) => continue,
        };
        for (id, reason) in expired {
            node.feed.push(NodeEvent::Expired {
                id,
                reason: reason.into(),
            });
        }
    }
}

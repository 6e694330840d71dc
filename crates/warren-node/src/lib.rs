//! Warren's node agent: everything that happens on one host. It owns the
//! image store and the runtime, supervises live sandboxes (their main process,
//! init, logs), journals them and takes them over again after a restart, and
//! reports what happens to them on a sequenced event feed. The control plane
//! drives it only through the node contract ([`warren_node_api::NodeApi`],
//! implemented by [`LocalNode`]), in `warren up` and in a cluster.

mod contract;
mod devices;
pub mod exec_stream;
mod feed;
mod forks;
pub mod gpu;
mod images;
mod journal;
pub mod lifetime;
pub mod logs;
mod monitor;
pub mod sampler;
mod settings;
mod take_over;
mod tasks;
mod usage;
pub mod user;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, watch};
use warren_core::{ExecEvent, ExecRequest, SandboxSpec, Usage, WindowSize};
use warren_image::{ImageRecord, ImageStore, Pin, Puller};
use warren_node_api::{CreateSandbox, NodeEvent, Phase, Resources};
use warren_runtime::{files, CreateRequest, ExecSpec, Runtime, RuntimeConfig, RuntimeError};

pub use contract::LocalNode;
pub use exec_stream::ExitInfo;
use logs::SandboxLog;
use settings::host_memory;
pub use settings::{NodeConfig, NodeSettings, DEFAULT_DISK, DEFAULT_GPU_KIND};
use tasks::{enforce_lifetimes, expire_logs};
use usage::{sample_usage, CpuBusy};
pub use usage::{SATURATION, SATURATION_AFTER};
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
    #[error("the client went away")]
    ClientGone,
    #[error("{0}")]
    Internal(String),
}

/// Blob downloads running at once on a node, across all pulls: enough to
/// fill a link from a nearby registry without starving sandboxes' traffic.
const MAX_DOWNLOADS: usize = 6;

/// How the API reaches a running exec after its start (every exec but
/// the main process has one while it runs).
struct ExecControl {
    /// Where its further input and resizes go, when it takes any.
    input: Option<mpsc::Sender<exec_stream::ExecInput>>,
    /// It was started with `stdin_open`, and its stdin was not closed yet.
    stdin: bool,
    tty: bool,
}

/// The environment, working directory and user an exec inherits.
struct ExecDefaults {
    env: BTreeMap<String, String>,
    cwd: String,
    user: String,
}

impl ExecDefaults {
    /// The image's settings under the spec's; the environment its CDI
    /// devices set goes over the image's and under the spec's.
    fn of(
        image: &ImageRecord,
        spec: &SandboxSpec,
        cpu_millis: u64,
        device_env: &BTreeMap<String, String>,
    ) -> ExecDefaults {
        let mut env = warren_core::spec::sandbox_env(&image.config.env, cpu_millis, &spec.env);
        for (k, v) in device_env {
            if !spec.env.contains_key(k) {
                env.insert(k.clone(), v.clone());
            }
        }
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
        ExecDefaults { env, cwd, user }
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
    cpu: Mutex<CpuBusy>,
    checked_images: Mutex<std::collections::HashSet<String>>,
    name: String,
    labels: std::collections::BTreeMap<String, String>,
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
    /// Host memory the node keeps available (see NodeSettings).
    memory_floor: u64,
    memory_pressure: AtomicBool,
    feed: Arc<feed::Feed>,
    exec_seq: AtomicU64,
    /// Where more stdin goes, for execs started with `stdin_open`, by
    /// sandbox and exec id; gone when the exec ends.
    exec_controls: Mutex<HashMap<(String, String), ExecControl>>,
    /// Execs running in each kept (held, frozen) sandbox: it is thawed
    /// while there is one, so a person can look at its scene in a terminal.
    held_execs: tokio::sync::Mutex<HashMap<String, usize>>,
    egress: Arc<warren_net::Egress>,
    /// Read-only copies of sandboxes' changes that forks are built on.
    forks: Arc<forks::ForkLayers>,
    /// CDI devices and which sandbox holds each.
    devices: devices::Devices,
    /// NVML, where it loads: GPU use per sandbox.
    gpu_reader: Option<Box<dyn gpu::GpuReader>>,
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
        let total = cap.allocatable(
            cap.capacity.0.unwrap_or(cores * 1000),
            cap.capacity.1.unwrap_or_else(host_memory),
        );
        // Host-wide tables (see warren_runtime::host_tables): warned about,
        // not fatal, where the host does not let us set them.
        let max_pids = warren_runtime::host_tables::pid_budget();
        if let Err(e) =
            warren_runtime::host_tables::cap_pids(warren_core::RESOURCE_PREFIX, max_pids)
        {
            tracing::warn!(error = %e, "could not cap the processes of all sandboxes together");
        }
        match warren_runtime::cgroup_tuning::clone_cpusets(warren_core::RESOURCE_PREFIX) {
            Ok(true) => tracing::info!("new sandbox cpusets now take their parent's CPUs and memory nodes when made (cgroup.clone_children)"),
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "could not set up the sandboxes' parent cpuset"),
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
        let node = Arc::new(Node {
            cpu: Mutex::new(CpuBusy::default()),
            checked_images: Mutex::new(std::collections::HashSet::new()),
            allocatable: total,
            max_pids,
            journal,
            ready: watch::Sender::new(false),
            initializing: tokio::sync::Semaphore::new(cap.max_initializing.max(1)),
            name: cfg.name,
            labels: cfg.labels,
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
            memory_floor: cfg
                .settings
                .memory_floor
                .unwrap_or_else(|| settings::default_memory_floor(host_memory())),
            memory_pressure: AtomicBool::new(false),
            // Sequence numbers grow across node restarts on one boot.
            feed: Arc::new(feed::Feed::new(lifetime::boot_ms().max(1) as u64 * 1000)),
            // Exec ids name cgroups that can outlive a daemon (an exec left
            // running, or one a crash interrupted while it was being
            // killed): they must never repeat, so they count on from the
            // boot clock, not from zero at every start.
            exec_seq: AtomicU64::new(lifetime::boot_ms().max(0) as u64 * 1000),
            exec_controls: Default::default(),
            held_execs: Default::default(),
            egress: warren_net::Egress::new(cap.egress.clone()),
            forks,
            devices,
            gpu_reader,
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
        lock(&self.live)
            .get(id)
            .cloned()
            .ok_or_else(|| NodeError::NotRunning(id.to_string()))
    }

    pub fn is_live(&self, id: &str) -> bool {
        self.get(id).is_ok()
    }

    /// Creates a sandbox and, if the spec names one, starts its main process.
    /// Returns once an exec into it would succeed.
    pub async fn create(
        self: &Arc<Self>,
        req: CreateSandbox,
        image: &ImageRecord,
    ) -> Result<(i32, Vec<warren_node_api::PhaseTiming>), NodeError> {
        if self.is_live(&req.id) {
            return Err(NodeError::Conflict(format!(
                "sandbox {} already exists on this node",
                req.id
            )));
        }
        let (devices, injection) =
            self.devices
                .claim(&req.id, &req.spec.devices, req.resources.gpus)?;
        let req = CreateSandbox {
            devices,
            device_env: injection.env.clone(),
            ..req
        };
        let id = req.id.clone();
        let created = self.create_holding(req, image, injection).await;
        if created.is_err() {
            // Only this create holds devices under its id: one for a live
            // sandbox's id was refused before the claim.
            self.devices.release(&id);
        }
        created
    }

    async fn create_holding(
        self: &Arc<Self>,
        req: CreateSandbox,
        image: &ImageRecord,
        injection: warren_runtime::cdi::Injection,
    ) -> Result<(i32, Vec<warren_node_api::PhaseTiming>), NodeError> {
        let (id, spec, resources) = (&req.id, &req.spec, &req.resources);
        let mut phases = Vec::new();
        let mut phase = std::time::Instant::now();
        let lower_dirs = {
            let images = self.images.clone();
            let image = image.clone();
            tokio::task::spawn_blocking(move || images.lower_dirs(&image))
                .await
                .map_err(|e| NodeError::Internal(e.to_string()))??
        };
        took(&mut phases, "node_layers", &mut phase);
        let log = self.open_log(id)?;
        log.event("creating", warren_core::state::reason::CREATED, "");
        let permit = self
            .initializing
            .acquire()
            .await
            .map_err(|_| NodeError::Internal("node is shutting down".into()))?;
        // A fork's child: the source's fork layers above the image's.
        let mut layers = self.forks.acquire(id, spec.fork.as_ref())?;
        layers.extend(lower_dirs);
        took(&mut phases, "node_slot_wait", &mut phase);
        let created = self
            .runtime
            .create(CreateRequest {
                id: id.to_string(),
                lower_dirs: layers,
                resources: resources.clone(),
                devices: injection,
            })
            .await;
        drop(permit);
        let handle = match created {
            Ok(handle) => handle,
            Err(e) => {
                self.forks.release_child(id).await;
                return Err(e.into());
            }
        };
        phases.extend(
            handle
                .phases
                .iter()
                .map(|(name, d)| warren_node_api::PhaseTiming::new(name, *d)),
        );
        phase = std::time::Instant::now();
        if let Err(e) = self.attach_network(id, handle.pid, spec, &log).await {
            let _ = self.runtime.destroy(id, Some(handle.pid)).await;
            self.forks.release_child(id).await;
            return Err(e);
        }
        took(&mut phases, "node_network", &mut phase);
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
        took(&mut phases, "node_register", &mut phase);
        Ok((handle.pid, phases))
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
        {
            let mut c = lock(&live.create);
            c.spec.network = network.clone();
        }
        self.journal(&live)?;
        Ok(change)
    }

    /// A warm pool's sandbox taken by a create: from now on it is that
    /// create's (environment, working directory and user of its execs, TTL,
    /// lease, network policy), journaled. Its resources stay (the control
    /// plane only claims a member whose resources match).
    pub async fn claim(&self, id: &str, spec: SandboxSpec) -> Result<(), NodeError> {
        let live = self.get(id)?;
        let cpu_millis = live.create().resources.cpu_millis;
        let device_env = live.create().device_env;
        *lock(&live.exec_defaults) = ExecDefaults::of(&live.image, &spec, cpu_millis, &device_env);
        *lock(&live.lifetime) = lifetime::Lifetime::new(spec.ttl(), spec.lease.map(|l| l.0));
        let network = spec.network.clone();
        {
            let mut c = lock(&live.create);
            let old_network = std::mem::take(&mut c.spec.network);
            c.spec = SandboxSpec {
                network: old_network,
                ..spec
            };
        }
        if network != lock(&live.create).spec.network {
            self.update_network(id, &network).await?;
        } else {
            self.journal(&live)?;
        }
        Ok(())
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
        let exec_defaults = ExecDefaults::of(image, spec, resources.cpu_millis, &create.device_env);
        let handle = self.runtime.handle(&id, pid);
        let disk_limit = if resources.disk > 0 {
            0
        } else {
            self.default_disk
        };
        let main_cmd = spec.cmd.clone();
        let memory_request = resources.memory_request();
        let live = Arc::new(Live {
            create: Mutex::new(create),
            phase: Mutex::new(phase),
            pid,
            socket: handle.socket,
            cgroup_path: handle.cgroup_path,
            exec_defaults: Mutex::new(exec_defaults),
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
            memory_request,
            memory_reported: AtomicBool::new(false),
        });
        {
            let mut m = lock(&self.live);
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
        let (mut env, default_cwd, default_user) = {
            let d = lock(&live.exec_defaults);
            (d.env.clone(), d.cwd.clone(), d.user.clone())
        };
        env.extend(req.env.clone());
        if req.tty {
            env.entry("TERM".into())
                .or_insert_with(|| "xterm-256color".into());
        }
        let root = files::open_root(live.pid)?;
        let user_spec = req.user.clone().unwrap_or(default_user);
        let user = user::resolve(&root, &user_spec).map_err(NodeError::BadRequest)?;
        let seq = self.exec_seq.fetch_add(1, Ordering::Relaxed);
        Ok(exec_stream::ExecJob {
            socket: live.socket.clone(),
            sandbox_cgroup: live.cgroup_path.clone(),
            spec: ExecSpec {
                argv: req.cmd.clone(),
                env: env.into_iter().map(|(k, v)| format!("{k}={v}")).collect(),
                cwd: req.cwd.clone().unwrap_or(default_cwd),
                uid: user.uid,
                gid: user.gid,
                groups: vec![],
                main,
                cgroup: false,
                tty: req.tty.then(|| req.window_size()),
            },
            stdin,
            more_stdin: None,
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
        self: &Arc<Self>,
        id: &str,
        req: &ExecRequest,
    ) -> Result<mpsc::Receiver<ExecEvent>, NodeError> {
        let live = self.get(id)?;
        if live.destroying.load(Ordering::Acquire) {
            return Err(NodeError::NotRunning(id.to_string()));
        }
        let held = live.phase() == Phase::Held;
        if held {
            self.thaw_held(id).await?;
        }
        let mut job = match self.exec_job(id, &live, req, false) {
            Ok(job) => job,
            Err(e) => {
                if held {
                    self.refreeze_held(id).await;
                }
                return Err(e);
            }
        };
        // Removed when the exec ends, which closes its stdin.
        let input = (req.stdin_open || req.tty).then(|| {
            let (input_tx, input_rx) = mpsc::channel(16);
            job.more_stdin = Some(input_rx);
            input_tx
        });
        let control_key = (id.to_string(), job.exec_id.clone());
        lock(&self.exec_controls).insert(
            control_key.clone(),
            ExecControl {
                input,
                stdin: req.stdin_open,
                tty: req.tty,
            },
        );
        let senders = Arc::downgrade(self);
        let (tx, rx) = mpsc::channel(64);
        // Surface "cannot start" errors synchronously so the API can answer 409.
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let (inner_tx, mut inner_rx) = mpsc::channel::<ExecEvent>(64);
            let fwd = tokio::spawn(async move {
                let mut first = Some(started_tx);
                loop {
                    // A client that drops the stream is noticed now (the
                    // exec then dies of it), not at its next event.
                    let ev = tokio::select! {
                        ev = inner_rx.recv() => ev,
                        _ = tx.closed() => None,
                    };
                    let Some(ev) = ev else { break };
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
            if let Some(node) = senders.upgrade() {
                lock(&node.exec_controls).remove(&control_key);
                if held {
                    node.refreeze_held(&control_key.0).await;
                }
            }
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

    /// Thaws a kept sandbox for an exec (the first of its execs does).
    async fn thaw_held(self: &Arc<Self>, id: &str) -> Result<(), NodeError> {
        let mut held = self.held_execs.lock().await;
        let n = held.get(id).copied().unwrap_or(0);
        if n == 0 {
            self.freeze(id, false).await?;
        }
        held.insert(id.to_string(), n + 1);
        Ok(())
    }

    /// Freezes a kept sandbox again when its last exec has ended (unless
    /// it has gone meanwhile).
    async fn refreeze_held(self: &Arc<Self>, id: &str) {
        let mut held = self.held_execs.lock().await;
        match held.get(id).copied() {
            Some(n) if n > 1 => {
                held.insert(id.to_string(), n - 1);
            }
            Some(_) => {
                held.remove(id);
                let still_held = self.get(id).is_ok_and(|l| l.phase() == Phase::Held);
                if still_held {
                    if let Err(e) = self.freeze(id, true).await {
                        tracing::warn!(sandbox = %id, error = %e, "freezing a kept sandbox again after an exec");
                    }
                }
            }
            None => {}
        }
    }

    /// Sends more stdin to a running exec started with `stdin_open`;
    /// `close` ends its stdin after `data`.
    pub async fn exec_input(
        &self,
        id: &str,
        exec_id: &str,
        data: bytes::Bytes,
        close: bool,
    ) -> Result<(), NodeError> {
        use exec_stream::ExecInput;
        let key = (id.to_string(), exec_id.to_string());
        let sender = {
            let mut controls = lock(&self.exec_controls);
            let open = controls.get_mut(&key).filter(|c| c.stdin).and_then(|c| {
                // Closed now: a later send finds it closed, in order.
                c.stdin = !close;
                c.input.clone()
            });
            open.ok_or_else(|| {
                NodeError::Runtime(RuntimeError::NotFound(format!(
                    "no exec {exec_id} with an open stdin in sandbox {id}: start it with stdin_open, and send while it runs"
                )))
            })?
        };
        let gone = || NodeError::Conflict(format!("exec {exec_id} has ended; its stdin is closed"));
        if !data.is_empty() {
            sender
                .send(ExecInput::Data(data))
                .await
                .map_err(|_| gone())?;
        }
        if close {
            sender.send(ExecInput::Close).await.map_err(|_| gone())?;
        }
        Ok(())
    }

    /// Sets the window size of a running exec's terminal.
    pub async fn exec_resize(
        &self,
        id: &str,
        exec_id: &str,
        size: WindowSize,
    ) -> Result<(), NodeError> {
        size.validate()
            .map_err(|e| NodeError::BadRequest(e.to_string()))?;
        let key = (id.to_string(), exec_id.to_string());
        let sender = {
            let controls = lock(&self.exec_controls);
            let control = controls.get(&key).ok_or_else(|| {
                NodeError::Runtime(RuntimeError::NotFound(format!(
                    "no running exec {exec_id} in sandbox {id} (it has ended, or never ran)"
                )))
            })?;
            match (&control.input, control.tty) {
                (Some(input), true) => input.clone(),
                _ => {
                    return Err(NodeError::Conflict(format!(
                        "exec {exec_id} has no terminal to resize: start it with \"tty\": true"
                    )))
                }
            }
        };
        sender
            .send(exec_stream::ExecInput::Resize(size))
            .await
            .map_err(|_| {
                NodeError::Runtime(RuntimeError::NotFound(format!(
                    "exec {exec_id} in sandbox {id} has ended"
                )))
            })
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
            {
                let u = lock(&live.usage);
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
        {
            let mut m = lock(&self.live);
            m.remove(id);
        }
        // The fork layers only it kept go with it.
        self.forks.release_child(id).await;
        // Its devices are free once nothing of it is left to use them.
        self.devices.release(id);
        Ok(last_usage)
    }

    /// Renews the sandbox's lease (heartbeat, or any API call on it).
    pub fn renew_lease(&self, id: &str) {
        if let Ok(live) = self.get(id) {
            {
                let mut l = lock(&live.lifetime);
                l.renew();
            }
        }
    }

    /// Lets the sandbox live `ttl` from now.
    pub fn set_ttl(&self, id: &str, ttl: std::time::Duration) -> Result<(), NodeError> {
        let live = self.get(id)?;
        lock(&live.lifetime).set_ttl(ttl);
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
        {
            let mut l = lock(&live.lifetime);
            l.restart(hold_for);
        }
        live.set_phase(Phase::Held);
        self.journal(&live)?;
        live.log.event(&note.state, &note.reason, &note.message);
        Ok(self.usage(id))
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

    /// The sandbox's root directory, for the confined file API.
    pub(crate) fn root(&self, id: &str) -> Result<std::os::fd::OwnedFd, NodeError> {
        let live = self.get(id)?;
        Ok(files::open_root(live.pid)?)
    }

    /// Host id of root in the sandbox, if it has a user namespace.
    pub(crate) fn host_id_base(&self, id: &str) -> Option<u32> {
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

fn main_request(cmd: &[String]) -> ExecRequest {
    ExecRequest {
        cmd: cmd.to_vec(),
        ..Default::default()
    }
}

/// Records how long a create's phase took since `since`, and starts the next.
fn took(
    phases: &mut Vec<warren_node_api::PhaseTiming>,
    name: &str,
    since: &mut std::time::Instant,
) {
    phases.push(warren_node_api::PhaseTiming::new(name, since.elapsed()));
    *since = std::time::Instant::now();
}

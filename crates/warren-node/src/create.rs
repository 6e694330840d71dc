//! Making a sandbox: its CDI devices, the runtime's create under the
//! node's cap on sandboxes initializing at once, the journal entry and its
//! registration as live; and a warm pool member's claim by a create.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use warren_core::sync::lock;
use warren_core::SandboxSpec;
use warren_image::ImageRecord;
use warren_node_api::{CreateSandbox, Phase, Phases, SandboxStatus};
use warren_runtime::CreateRequest;

use crate::exec::{main_request, ExecDefaults};
use crate::logs::SandboxLog;
use crate::{lifetime, monitor, sampler, Live, Node, NodeError};

/// Why no sandbox starts while the node is short of disk or memory.
const NO_DISK: &str = "the node's disk is below its free-space floor; no sandboxes start until space is freed (see `warren ps` and docs/configuration.md)";
const NO_MEMORY: &str = "the host's available memory is below the node's floor; no sandboxes start until memory is freed (see docs/configuration.md, \"Requests and limits\")";

impl Node {
    /// The contract's create: refused while the node is short of disk or
    /// memory; the image resolved (or fetched); the sandbox made in a task
    /// of its own, so that a caller that goes away (a control plane killed
    /// mid-create) leaves no sandbox half made; answers its status with
    /// the phases it took.
    pub(crate) async fn create_sandbox(
        self: &Arc<Self>,
        req: CreateSandbox,
    ) -> Result<SandboxStatus, NodeError> {
        // Never beside the sweep that follows a start.
        self.wait_ready().await;
        if self.meter.pressure.disk() {
            return Err(NodeError::NoRoom(NO_DISK.into()));
        }
        if self.meter.pressure.memory() {
            return Err(NodeError::NoRoom(NO_MEMORY.into()));
        }
        let id = req.id.clone();
        let mut phases = Phases::begin();
        let mut resolving = std::time::Instant::now();
        let image = self
            .images
            .for_sandbox(&req)
            .await
            .map_err(|why| NodeError::NoImage {
                image: req.spec.image.clone(),
                why: Box::new(why),
            })?;
        phases.took("node_image", &mut resolving);
        let node = self.clone();
        let (created, phases) = tokio::spawn(async move {
            let created = node.create(req, &image, &mut phases).await;
            (created, phases)
        })
        .await?;
        created?;
        let mut status = self.status_of(&id, false).ok_or_else(|| {
            NodeError::Conflict(format!("sandbox {id} was destroyed as it was created"))
        })?;
        status.phases = phases.into_vec();
        Ok(status)
    }

    /// Creates a sandbox and, if the spec names one, starts its main process;
    /// its phases are added to `phases`. Returns once an exec into it would
    /// succeed. Not cancel safe: the
    /// runtime's work goes on in blocking threads when this is dropped, so
    /// callers that may vanish run it in a task of its own.
    async fn create(
        self: &Arc<Self>,
        req: CreateSandbox,
        image: &ImageRecord,
        phases: &mut Phases,
    ) -> Result<i32, NodeError> {
        let Some(_making) = self.creating.begin(&req.id) else {
            return Err(NodeError::Conflict(format!(
                "a create of sandbox {} is already under way on this node",
                req.id
            )));
        };
        if self.is_live(&req.id) {
            return Err(NodeError::Conflict(format!(
                "sandbox {} already exists on this node",
                req.id
            )));
        }
        let binds = self.volumes.claim(&req.id, &req.spec.volumes)?;
        let (devices, injection) =
            match self
                .devices
                .claim(&req.id, &req.spec.devices, req.resources.gpus)
            {
                Ok(claimed) => claimed,
                Err(e) => {
                    self.volumes.release(&req.id);
                    return Err(e);
                }
            };
        let req = CreateSandbox {
            devices,
            device_env: injection.env.clone(),
            ..req
        };
        let id = req.id.clone();
        let created = self
            .create_holding(req, image, injection, binds, phases)
            .await;
        if created.is_err() {
            // Only this create holds devices and volumes under its id: one
            // for a live sandbox's id was refused before the claims.
            self.devices.release(&id);
            self.volumes.release(&id);
        }
        created
    }

    async fn create_holding(
        self: &Arc<Self>,
        req: CreateSandbox,
        image: &ImageRecord,
        injection: warren_runtime::cdi::Injection,
        volumes: Vec<warren_runtime::VolumeBind>,
        phases: &mut Phases,
    ) -> Result<i32, NodeError> {
        let (id, spec, resources) = (&req.id, &req.spec, &req.resources);
        let mut phase = std::time::Instant::now();
        let lower_dirs = self.images.lower_dirs(image).await?;
        phases.took("node_layers", &mut phase);
        let log = self.logs.open(id)?;
        log.event("creating", warren_core::state::reason::CREATED, "");
        let permit = self
            .initializing
            .acquire()
            .await
            .map_err(|_| NodeError::Internal("node is shutting down".into()))?;
        // A fork's child: the source's fork layers above the image's, and
        // its saved processes where the fork took them.
        let restore = self.memory_of(&req)?;
        let mut layers = self.forks.acquire(id, spec.fork.as_ref())?;
        layers.extend(lower_dirs);
        phases.took("node_slot_wait", &mut phase);
        let created = self
            .runtime
            .create(CreateRequest {
                id: id.to_string(),
                lower_dirs: layers,
                volumes,
                secret_files: crate::memory_fork::secret_files(&req),
                resources: resources.clone(),
                devices: injection,
                isolation: self.isolation_of(spec),
                proxied_network: spec.network.mode.is_proxied(),
                restore,
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
        for (name, start, took) in &handle.phases {
            phases.record(name, *start, *took);
        }
        phase = std::time::Instant::now();
        if let Err(e) = self.attach_network(id, handle.pid, spec, &log).await {
            let _ = self.runtime.destroy(id, Some(handle.pid)).await;
            self.forks.release_child(id).await;
            return Err(e);
        }
        phases.took("node_network", &mut phase);
        let lifetime = lifetime::Lifetime::new(spec.ttl(), spec.lease.map(|l| l.get()));
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
                .destroy_now(id, warren_core::state::reason::CREATE_FAILED)
                .await;
            return Err(e);
        }
        phases.took("node_register", &mut phase);
        Ok(handle.pid)
    }

    /// A warm pool's sandbox taken by a create: from now on it is that
    /// create's (environment, working directory and user of its execs, TTL,
    /// lease, network policy), journaled. Its resources stay (the control
    /// plane only claims a member whose resources match).
    pub async fn claim(&self, id: &str, spec: SandboxSpec) -> Result<(), NodeError> {
        let live = self.get(id)?;
        let cpu_millis = live.create().resources.cpu_millis;
        let device_env = live.create().device_env;
        // A pool serves no create that names secrets (`PoolSpec::serves`).
        *lock(&live.exec_defaults) =
            ExecDefaults::of(&live.image, &spec, cpu_millis, &device_env, &[]);
        *lock(&live.lifetime) = lifetime::Lifetime::new(spec.ttl(), spec.lease.map(|l| l.get()));
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

    pub(crate) fn register(
        self: &Arc<Self>,
        create: CreateSandbox,
        pid: i32,
        phase: Phase,
        image: &ImageRecord,
        log: Arc<SandboxLog>,
        lifetime: lifetime::Lifetime,
    ) -> Arc<Live> {
        let (id, spec, resources) = (create.id.clone(), &create.spec, &create.resources);
        let exec_defaults = ExecDefaults::of(
            image,
            spec,
            resources.cpu_millis,
            &create.device_env,
            &create.secrets,
        );
        let handle = self.runtime.handle(&id, pid);
        let disk_limit = if resources.disk > 0 {
            0
        } else {
            self.offer.default_disk
        };
        let main_cmd = spec.cmd.clone();
        let memory_request = resources.memory_request();
        let live = Arc::new(Live {
            create: Mutex::new(create),
            phase: Mutex::new(phase),
            pid,
            root_pid: handle.root_pid,
            socket: handle.socket,
            cgroup_path: handle.cgroup_path,
            traits: handle.traits,
            exec_defaults: Mutex::new(exec_defaults),
            image_digest: image.digest.clone(),
            _image_pin: self.images.pin(image),
            image: image.clone(),
            main_cmd,
            log,
            destroying: AtomicBool::new(false),
            saving: AtomicBool::new(false),
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
}

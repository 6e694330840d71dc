//! What crosses the node contract: requests, answers and events. Plain
//! serializable data: no host descriptor, path or socket.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use warren_core::{ResolvedResources, SandboxSpec, Usage};

pub use warren_core::files::{
    FileKind, Owner, PathEntry, PathKind, PathOp, VolumeWrite, WriteFile,
};
pub use warren_core::image::{CommitImage, ImageInfo, ImageTarget};

/// What a node lends, in the units the scheduler counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Resources {
    pub cpu_millis: u64,
    pub memory: u64,
    pub slots: u32,
    /// Devices of the node's GPU kind (`gpus` requests; a device named
    /// with `devices` is the node's to check). Absent from older peers: 0.
    #[serde(default)]
    pub gpus: u32,
}

impl Resources {
    /// What one sandbox holds: its requests, not its limits.
    pub fn of(r: &ResolvedResources) -> Resources {
        Resources {
            cpu_millis: r.cpu_request(),
            memory: r.memory_request(),
            slots: 1,
            gpus: r.gpus,
        }
    }
}

/// The CDI devices of one kind a node has (see docs/gpu.md).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct DeviceClass {
    /// `vendor/class`, e.g. `nvidia.com/gpu`.
    pub kind: String,
    /// Qualified names (`vendor/class=name`) of every device of the kind.
    pub devices: Vec<String>,
    /// Those a live sandbox holds now.
    #[serde(default)]
    pub used: Vec<String>,
    /// The kind `gpus` requests take on this node.
    #[serde(default)]
    pub gpu: bool,
}

/// A node as it describes itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub name: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// What the node lends to sandboxes (host capacity × overcommit, less
    /// its reserve).
    pub allocatable: Resources,
    /// Most processes one sandbox may ask for.
    pub max_pids: u32,
    pub load: Load,
    /// Digests of the images it holds (placement prefers a node that needs
    /// no download).
    #[serde(default)]
    pub images: Vec<String>,
    /// Its CDI devices by kind.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<DeviceClass>,
    /// The isolation classes it runs, its default first (placement puts a
    /// sandbox that names a class only on nodes that offer it). Empty from
    /// a node older than classes: `container` alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub isolation: Vec<warren_core::Isolation>,
}

/// How busy the node is now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Load {
    /// Share of the node's CPU time spent busy over the last sample.
    pub cpu_busy: f64,
    /// Free space under the node's home is below its floor: it starts no
    /// sandbox until there is room again.
    pub disk_pressure: bool,
    /// The host's available memory is below the node's floor: it starts no
    /// sandbox, and stops the ones furthest above their memory request.
    #[serde(default)]
    pub memory_pressure: bool,
    /// Sandboxes it holds.
    pub sandboxes: u32,
}

/// Run a new sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CreateSandbox {
    pub id: String,
    pub spec: SandboxSpec,
    pub resources: ResolvedResources,
    /// The image's manifest digest (`sha256:…`), resolved by the control
    /// plane: every sandbox of a batch runs the same one.
    pub image_digest: String,
    /// Where a node that lacks `image_digest` pulls it: a registry
    /// reference pinned to that digest (the spec's own registry, or the
    /// cluster registry a local name was published to). None: the image
    /// is local to each node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_source: Option<String>,
    /// The CDI devices the node gave it (those the spec names, and its
    /// `gpus`): filled in by the node and journaled with the rest, so a
    /// restarted node knows which devices are taken. Empty from the
    /// control plane.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<String>,
    /// The environment those devices' CDI specs set.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub device_env: BTreeMap<String, String>,
    /// The values of the secrets its spec names, resolved by the control
    /// plane at each create (the spec holds only their names).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<warren_core::secret::Resolved>,
}

/// Where a sandbox stands on its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Running,
    /// Frozen by a pause.
    Paused,
    /// Frozen after it finished, for its `keep_for` (kept, or the grace
    /// period of `delay`); destroyed by its node when that ends.
    Held,
}

/// One sandbox of a node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxStatus {
    pub id: String,
    pub phase: Phase,
    pub image_digest: String,
    /// Host PID of its init (for host tools; node-local).
    pub pid: i32,
    /// Host uid of root in its user namespace, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_id_base: Option<u32>,
    /// Until its TTL (or, when held, its hold) ends it.
    pub ttl_remaining_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_remaining_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// On a create's answer: how long each of the node's phases took
    /// (observed into `warren_create_phase_seconds`); empty elsewhere.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub phases: Vec<PhaseTiming>,
}

/// How long one phase of a create took on the node, and when it began.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhaseTiming {
    pub phase: String,
    pub micros: u64,
    /// When it began, in microseconds after the node began the create
    /// (a node that does not say is read as running its phases end to
    /// end). Relative, not a wall-clock time: the control plane places
    /// the phases inside its own span of the call, so a node whose clock
    /// is off still draws them where they ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_micros: Option<u64>,
}

fn micros(d: std::time::Duration) -> u64 {
    d.as_micros().min(u64::MAX as u128) as u64
}

/// A create's phases as the node measures them, against the instant it
/// began the create.
#[derive(Debug, Clone)]
pub struct Phases {
    origin: std::time::Instant,
    list: Vec<PhaseTiming>,
}

impl Phases {
    /// The create begins now.
    pub fn begin() -> Phases {
        Phases {
            origin: std::time::Instant::now(),
            list: Vec::new(),
        }
    }

    /// A phase that began at `start` and took `took`.
    pub fn record(&mut self, phase: &str, start: std::time::Instant, took: std::time::Duration) {
        // Both ends rounded down on the same scale, so that a phase that
        // ends where another ends (or begins) does so in microseconds too.
        let from = micros(start.saturating_duration_since(self.origin));
        let to = micros((start + took).saturating_duration_since(self.origin));
        self.list.push(PhaseTiming {
            phase: phase.to_string(),
            micros: to - from,
            start_micros: Some(from),
        });
    }

    /// A phase that began at `since` and ends now; the next begins now.
    pub fn took(&mut self, phase: &str, since: &mut std::time::Instant) {
        self.record(phase, *since, since.elapsed());
        *since = std::time::Instant::now();
    }

    pub fn into_vec(self) -> Vec<PhaseTiming> {
        self.list
    }
}

/// A line the control plane adds to a sandbox's log (its state changes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogNote {
    pub state: String,
    pub reason: String,
    #[serde(default)]
    pub message: String,
}

/// How a sandbox's main process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exit {
    pub code: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    #[serde(default)]
    pub timed_out: bool,
}

/// What a node reports about its sandboxes and itself, in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum NodeEvent {
    MainExited {
        id: String,
        exit: Exit,
        oom_killed: bool,
    },
    /// The TTL, the lease, or a hold ran out (`reason` says which).
    Expired {
        id: String,
        reason: String,
    },
    InitDied {
        id: String,
        oom_killed: bool,
    },
    /// The sandbox's writable layer outgrew its disk limit, or the node's
    /// disk fell under its floor and this sandbox writes the most there
    /// (`node_full`: it must go, not be kept).
    DiskExceeded {
        id: String,
        used: u64,
        limit: u64,
        node_full: bool,
    },
    /// The host's available memory fell under the node's floor and this
    /// sandbox uses the most above its memory request: it must go (a kept,
    /// frozen sandbox would still hold its memory).
    MemoryPressure {
        id: String,
        used: u64,
        request: u64,
        available: u64,
    },
    /// The node's CPU stayed above 85% busy; once per episode.
    CpuSaturated {
        busy: f64,
    },
    /// A registry pull ended (`reason` `image_pulled` or `image_pull_failed`).
    ImagePull {
        reason: String,
        message: String,
    },
}

impl NodeEvent {
    /// The sandbox the event is about, if any.
    pub fn sandbox(&self) -> Option<&str> {
        match self {
            NodeEvent::MainExited { id, .. }
            | NodeEvent::Expired { id, .. }
            | NodeEvent::InitDied { id, .. }
            | NodeEvent::DiskExceeded { id, .. }
            | NodeEvent::MemoryPressure { id, .. } => Some(id),
            NodeEvent::CpuSaturated { .. } | NodeEvent::ImagePull { .. } => None,
        }
    }
}

/// A sandbox's filesystem changes, copied once into a read-only layer that
/// the sandboxes forked from it are built on (see [`crate::NodeApi::fork_layer`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForkLayer {
    /// What a child's `spec.fork.layers` names: the new layer, then the
    /// source's own fork layers (it may be a fork itself), topmost first.
    pub layers: Vec<String>,
    /// Bytes of file data copied.
    pub bytes: u64,
    /// Files, directories, links and whiteouts copied.
    pub entries: u64,
    /// How long the source was frozen for the copy (0: it was paused); with
    /// processes, how long it was stopped (saved, copied and resumed).
    pub frozen_ms: u64,
    /// Bytes of the saved memory image (0: files only).
    #[serde(default)]
    pub memory_bytes: u64,
}

/// An event with its place in the node's feed: a consumer that saw `seq`
/// asks for what came after it, and loses nothing across a gap.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sequenced {
    pub seq: u64,
    pub event: NodeEvent,
}

/// What a rule change did besides switching the rules.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyChange {
    /// Live connections the new rules refuse, now closed (`host:port`).
    pub closed: Vec<String>,
    /// Ports the new rules name that a server in the sandbox already
    /// listens on: reachable through the explicit proxy only.
    pub unlistened: Vec<u16>,
}

/// An image made from a stored one without a new layer (`image_derive`):
/// its config changed by `settings` with a history entry `created_by`, or
/// with neither, the same image under one more name (a tag).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeriveImage {
    /// A reference to an image the node holds (no pull), or `scratch`:
    /// the empty image.
    pub base: String,
    pub into: ImageTarget,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings: Option<warren_core::build::ImageSettings>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_by: Option<String>,
}

/// What `image_gc` removed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct GcReport {
    pub removed: Vec<String>,
    pub used_before: u64,
    pub used_after: u64,
}

/// What `image_push` did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pushed {
    pub image: ImageInfo,
    pub uploaded: usize,
    pub mounted: usize,
}

/// A node asks to join a cluster (`POST /v1/nodes/join` on the control
/// plane, with the join token).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JoinRequest {
    /// Where the control plane reaches the node's API (`https://host:port`,
    /// or `http://` for a node without TLS).
    pub url: String,
    /// The node as it describes itself (name, labels, what it lends).
    pub info: NodeInfo,
    /// The SHA-256 (hex) of the certificate the node's API presents: the
    /// control plane accepts that one only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_fingerprint: Option<String>,
    /// That the node holds the key of that certificate: a name, once
    /// joined, stays bound to its key (a join-token holder cannot take
    /// over a node's name and credential).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_proof: Option<KeyProof>,
}

/// A signature, with the key of the node's certificate, over
/// [`join_statement`]: what proves a join comes from the key's holder.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyProof {
    /// The certificate (DER, base64): its SHA-256 is the fingerprint.
    pub certificate: String,
    /// Unix seconds when it was signed (a join is accepted within minutes).
    pub signed_at: i64,
    /// The signature (base64) and its TLS scheme name (`ECDSA_NISTP256_SHA256`).
    pub signature: String,
    pub scheme: String,
}

/// The bytes a [`KeyProof`] signs: everything the join binds to the key.
pub fn join_statement(name: &str, url: &str, fingerprint: &str, signed_at: i64) -> Vec<u8> {
    format!("warren node join\n{name}\n{url}\n{fingerprint}\n{signed_at}").into_bytes()
}

/// The control plane's answer to a join: the credential it will show the
/// node from now on, and with which the node's heartbeats are sent
/// (`POST /v1/nodes/{name}/heartbeat`, body `NodeInfo`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Joined {
    pub credential: String,
    /// What of the control plane's `registries.toml` every node takes
    /// beneath its own (search registries, mirrors such as the cluster's
    /// pull-through cache, `insecure`; never credentials), as TOML.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registries: Option<String>,
}

/// What a node's shipping journal holds: a sandbox's log line, or a
/// sample of its usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShippedKind {
    /// One JSON line of the sandbox's log, as `logs` answers it.
    Log,
    /// A `Usage` as JSON.
    Usage,
}

/// One entry of a node's shipping journal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shipped {
    /// Node-wide and consecutive within one journal.
    pub seq: u64,
    pub sandbox_id: String,
    pub kind: ShippedKind,
    /// When the node wrote it (Unix milliseconds).
    pub time_ms: i64,
    /// The log line (no newline) or the usage, as JSON.
    pub body: String,
}

/// The answer of `ship`: entries after the caller's cursor, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShipBatch {
    /// The journal the sequence numbers belong to. A node whose home was
    /// replaced starts a new one, numbered from 1 again.
    pub journal: String,
    pub entries: Vec<Shipped>,
    /// The caller's cursor after this batch: the last entry's `seq`, or
    /// past entries the node no longer has.
    pub last: u64,
    /// Entries after the cursor asked from that the node dropped before
    /// anyone took them (its journal is bounded).
    #[serde(default)]
    pub dropped: u64,
}

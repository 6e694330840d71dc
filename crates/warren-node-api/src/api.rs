//! The trait the control plane drives a node through. Every method is a
//! request and an answer, or a stream; the in-process transport calls the
//! node directly, the HTTP transport carries the same values.

use std::time::Duration;

use bytes::Bytes;
use futures_util::stream::BoxStream;
use serde::{Deserialize, Serialize};
use warren_core::spec::NetworkSpec;
use warren_core::volume::{VolumeInfo, VolumeName, VolumeRequest};
use warren_core::{ExecEvent, ExecRequest, SandboxSpec, Usage, WindowSize};

use crate::error::{NodeError, NodeResult};
use crate::types::*;

/// Bytes in either direction (a file, an archive, a log).
pub type ByteStream = BoxStream<'static, NodeResult<Bytes>>;

/// A raw connection to a port inside a sandbox.
pub trait Tunnel: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> Tunnel for T {}

/// A pull's progress, then how it ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum PullUpdate {
    /// One of the image store's pull events (`resolved`, `manifest`,
    /// `progress`, `layer`, `done`), as it reports it.
    Progress {
        event: serde_json::Value,
    },
    Image {
        image: ImageInfo,
    },
    Error {
        error: NodeError,
    },
}

/// What happened to an entry of a watched directory (inotify's events as
/// Go's fsnotify names them, which E2B's envd reports).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WatchKind {
    /// Made, or moved in.
    Create,
    Write,
    Remove,
    /// Moved away (its new name, if inside, comes as a `Create`).
    Rename,
    /// Permissions or other attributes changed.
    Chmod,
}

/// One line of a directory watch: an event, or the error that ended it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WatchEvent {
    /// `name` is relative to the watched directory (`sub/file` when
    /// watching recursively).
    Event {
        name: String,
        kind: WatchKind,
    },
    Error {
        error: NodeError,
    },
}

/// A read of a sandbox path: what it is, then its bytes.
pub struct FileRead {
    pub kind: FileKind,
    pub body: ByteStream,
}

/// Everything the control plane asks of a node. A node owns its sandboxes'
/// processes, files, logs, network state and images, journals them and
/// takes them over again when it restarts, and enforces their lifetimes
/// itself; the control plane owns intent (specs, states, placement, the
/// queue) and learns what happens from `events`.
#[async_trait::async_trait]
pub trait NodeApi: Send + Sync {
    /// Name, capacity and load.
    async fn info(&self) -> NodeResult<NodeInfo>;

    /// Every sandbox the node holds, as it stands. After a node start it
    /// answers once the node has taken over what it held before.
    async fn inventory(&self) -> NodeResult<Vec<SandboxStatus>>;

    /// One sandbox; NotFound when the node does not hold it. Its usage is
    /// read now with `read_usage` (inspect, batch totals), otherwise it is
    /// the last periodic sample's (an answer that shows no usage need not
    /// read the sandbox's cgroup files).
    async fn status(&self, id: &str, read_usage: bool) -> NodeResult<SandboxStatus>;

    /// Events after `since` (0: all it still has), then new ones as they
    /// happen. A consumer remembers the last `seq` it handled.
    async fn events(&self, since: u64) -> NodeResult<BoxStream<'static, Sequenced>>;

    /// Creates a sandbox; answers, with its status, once an exec into it
    /// would succeed. Its main process, if the spec has one, starts with
    /// `start_main`. A node short of disk answers `no_room`. A create whose
    /// caller stops waiting (drops the future) must not leave a sandbox
    /// half made: the node's implementations run it to its end regardless.
    async fn create(&self, req: CreateSandbox) -> NodeResult<SandboxStatus>;

    /// The control plane recorded the sandbox as running: the node notes
    /// it in the sandbox's log and starts the spec's main process, if it
    /// has one (so an exit is never reported before).
    async fn start_main(&self, id: &str) -> NodeResult<()>;

    /// Kills and removes everything of the sandbox, noting `why` as the
    /// last line of its log; idempotent. Its final usage when the node
    /// held it.
    async fn destroy(&self, id: &str, why: &str) -> NodeResult<Option<Usage>>;

    /// Freezes (pause) or thaws (resume) every process of the sandbox.
    async fn set_paused(&self, id: &str, paused: bool) -> NodeResult<()>;

    /// Freezes a finished sandbox and holds it for `hold_for` (kept, or a
    /// `delay` grace period), noting `note` in its log; `Expired` is
    /// reported when the hold ends. Answers the usage of its run.
    async fn hold(&self, id: &str, hold_for: Duration, note: LogNote) -> NodeResult<Option<Usage>>;

    /// The sandbox may live `ttl` from now.
    async fn set_ttl(&self, id: &str, ttl: Duration) -> NodeResult<()>;

    /// A warm pool's sandbox taken by a create: it becomes `spec`'s (exec
    /// environment, working directory and user, TTL and lease from now,
    /// network policy); its resources stay. Answers its status as `status`
    /// without `read_usage` would, so that the create's answer needs no
    /// second call.
    async fn claim(&self, id: &str, spec: SandboxSpec) -> NodeResult<SandboxStatus>;

    /// Renews the sandbox's lease; a sandbox the node does not hold is no
    /// error (there is nothing to keep alive). Exec, file and port calls,
    /// TTL changes and commits renew it on their own.
    async fn renew_lease(&self, id: &str) -> NodeResult<()>;

    /// Adds a state change to the sandbox's log.
    async fn note(&self, id: &str, note: LogNote) -> NodeResult<()>;

    /// Runs a command; its events as they happen. Dropping the stream kills
    /// the command's whole process tree.
    async fn exec(&self, id: &str, req: ExecRequest) -> NodeResult<BoxStream<'static, ExecEvent>>;

    /// More stdin for a running exec started with `stdin_open` (named by
    /// the `exec_id` of its start event); `close` ends its stdin.
    async fn exec_input(&self, id: &str, exec_id: &str, data: Bytes, close: bool)
        -> NodeResult<()>;

    /// Sets the window size of a running exec's terminal (one started with
    /// `tty`): NotFound when no such exec runs, Conflict when it has no
    /// terminal, Invalid for a zero size.
    async fn exec_resize(&self, id: &str, exec_id: &str, size: WindowSize) -> NodeResult<()>;

    /// Writes a file (or unpacks a tar archive) from `body`, all or nothing.
    async fn write_file(&self, id: &str, req: WriteFile, body: ByteStream) -> NodeResult<()>;

    /// Reads a file (raw) or a directory (a tar archive).
    async fn read_file(&self, id: &str, path: &str) -> NodeResult<FileRead>;

    /// Looks at or changes paths: the entries looked at or made (one for
    /// stat, make_dir and rename; a directory's for list; none for remove).
    async fn path_op(&self, id: &str, op: PathOp) -> NodeResult<Vec<PathEntry>>;

    /// Events of the directory `path` in the sandbox (and, with
    /// `recursive`, of its subdirectories, up to a bound) as they happen.
    /// NotFound for a missing path, Invalid for one that is not a
    /// directory. It ends when the stream is dropped or the directory (or
    /// the sandbox) goes; an error that ends it early is its last item.
    async fn watch(
        &self,
        id: &str,
        path: &str,
        recursive: bool,
    ) -> NodeResult<BoxStream<'static, WatchEvent>>;

    /// The sandbox's log as whole JSON lines; with `follow`, until the
    /// sandbox is over (destroyed, or held after it finished).
    async fn logs(&self, id: &str, follow: bool) -> NodeResult<ByteStream>;

    /// A connection to `port` on the sandbox's loopback.
    async fn connect_port(&self, id: &str, port: u16) -> NodeResult<Box<dyn Tunnel>>;

    /// Checks network rules against the node's own defaults.
    async fn check_network(&self, network: NetworkSpec) -> NodeResult<()>;

    /// Replaces a running sandbox's network rules.
    async fn set_network(&self, id: &str, network: NetworkSpec) -> NodeResult<PolicyChange>;

    /// The sandbox's filesystem changes as a new image (a running sandbox
    /// is frozen while the layer is written).
    async fn commit(&self, id: &str, req: CommitImage) -> NodeResult<ImageInfo>;

    /// Copies the sandbox's filesystem changes once into a new read-only
    /// fork layer (a running sandbox is frozen meanwhile; its processes are
    /// not copied). A create whose `spec.fork.layers` are the answer's is
    /// built on it, with its own empty upper directory. The node keeps the
    /// layer until `release_fork_layer` and its last such sandbox is gone.
    async fn fork_layer(&self, id: &str) -> NodeResult<ForkLayer>;

    /// No more sandboxes will be made on the fork layer: it goes once the
    /// last one built on it is destroyed. An unknown layer is no error.
    async fn release_fork_layer(&self, layer: &str) -> NodeResult<()>;

    async fn image_list(&self) -> NodeResult<Vec<ImageInfo>>;

    /// The image a create of `reference` runs: pulled first for a registry
    /// reference (its tag resolved to a digest at the registry), checked
    /// to be runnable.
    async fn image_for_create(&self, reference: &str) -> NodeResult<ImageInfo>;

    /// Pulls from a registry; progress, then the image or the error. The
    /// pull runs to its end even if the stream is dropped.
    async fn image_pull(&self, reference: &str) -> NodeResult<BoxStream<'static, PullUpdate>>;

    /// An image made from one the node holds, without a new layer: its
    /// config changed, or the same image under another name.
    async fn image_derive(&self, req: DeriveImage) -> NodeResult<ImageInfo>;

    /// The image the step cache holds under `key`, if any.
    async fn image_step(&self, key: &str) -> NodeResult<Option<ImageInfo>>;

    /// Imports an OCI image-layout or docker-archive tar.
    async fn image_import(&self, name: &str, archive: ByteStream) -> NodeResult<ImageInfo>;

    async fn image_push(&self, reference: &str, source: Option<&str>) -> NodeResult<Pushed>;

    /// Removes an image (Conflict while a sandbox runs it).
    async fn image_remove(&self, reference: &str) -> NodeResult<ImageInfo>;

    async fn image_gc(&self, budget: Option<u64>) -> NodeResult<GcReport>;

    /// Makes a volume (Conflict if the name is taken on this node).
    async fn volume_create(&self, req: VolumeRequest) -> NodeResult<VolumeInfo>;

    async fn volume_list(&self) -> NodeResult<Vec<VolumeInfo>>;

    /// Removes a volume and its files (Conflict while a sandbox mounts it).
    async fn volume_remove(&self, name: &VolumeName) -> NodeResult<VolumeInfo>;

    /// Writes a file into a volume from `body`, all or nothing, without a
    /// sandbox (a running sandbox that mounts it sees it at once); answers
    /// the file written. Paths are resolved inside the volume.
    async fn volume_write(
        &self,
        volume: &VolumeName,
        req: VolumeWrite,
        body: ByteStream,
    ) -> NodeResult<PathEntry>;

    /// Reads a file (raw) or a directory (a tar archive) of a volume.
    async fn volume_read(&self, volume: &VolumeName, path: &str) -> NodeResult<FileRead>;

    /// Looks at or changes paths in a volume, as `path_op` in a sandbox
    /// (ids as the volume's sandboxes see them).
    async fn volume_path_op(&self, volume: &VolumeName, op: PathOp) -> NodeResult<Vec<PathEntry>>;
}

/// A stream that yields one error: for transports that fail before any
/// byte moved.
pub fn failed_stream(e: NodeError) -> ByteStream {
    Box::pin(futures_util::stream::once(async move { Err(e) }))
}

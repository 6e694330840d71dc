//! The node contract's calls, declared once. [`node_calls!`] hands the
//! list to a macro of the caller's; the trait [`crate::NodeApi`] is made
//! from it here, and the HTTP transport makes its client methods, its
//! argument bodies and its server dispatch from the same list, and each
//! node implements it with [`crate::node_impl!`], a body for each call.
//! Adding a call is one entry here, then its body in each node.
//!
//! An entry reads
//!
//! ```text
//! /// What it does.
//! SHAPE DEADLINE fn NAME(ARG: TYPE [=> WIRE], …[; BODY: ByteStream]) -> REPLY;
//! ```
//!
//! - `SHAPE`, how a transport carries it: `unary` (arguments in, one
//!   answer out), `stream` (the answer is values as they happen), `bytes`
//!   (the answer is raw bytes), `file` (raw bytes that are a file or a
//!   directory's archive), `upload` (the last argument is a byte stream
//!   sent as it is read), `tunnel` (the answer is a connection).
//! - `DEADLINE`: `Quick` for a call that only reads or flips node state
//!   (a node that takes longer is stuck), `Open` for one that may take as
//!   long as it takes (a pull, a create, a stream).
//! - `=> WIRE`: the owned type an argument crosses a transport as, where
//!   the trait takes a borrow (`&str => String`) or carries it in another
//!   form ([`WireBytes`], [`Port`]); converted with [`Own`] and [`Lend`].
//!
//! Type names in the list resolve where the caller's macro expands:
//! callers bring [`prelude`] into scope.

use bytes::Bytes;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Everything the call list names, for the macros that expand it.
pub mod prelude {
    pub use super::{Port, WireBytes};
    pub use crate::api::{ByteStream, FileRead, PullUpdate, Tunnel, WatchEvent};
    pub use crate::types::*;
    pub use bytes::Bytes;
    pub use futures_util::stream::BoxStream;
    pub use std::time::Duration;
    pub use warren_core::spec::NetworkSpec;
    pub use warren_core::volume::{VolumeInfo, VolumeName, VolumeRequest};
    pub use warren_core::{ExecEvent, ExecRequest, SandboxSpec, Usage, WindowSize};
}

/// Expands `$then! { …every call… }`: the one list of the node contract
/// (after `$pre`, tokens of the caller's own, if any).
#[macro_export]
macro_rules! node_calls {
    ($then:ident $($pre:tt)*) => {
        $then! {
            $($pre)*
            /// Name, capacity and load.
            unary Quick fn info() -> NodeInfo;

            /// Every sandbox the node holds, as it stands. After a node start it
            /// answers once the node has taken over what it held before (so no
            /// deadline).
            unary Open fn inventory() -> Vec<SandboxStatus>;

            /// One sandbox; NotFound when the node does not hold it. Its usage is
            /// read now with `read_usage` (inspect, batch totals), otherwise it is
            /// the last periodic sample's (an answer that shows no usage need not
            /// read the sandbox's cgroup files).
            unary Quick fn status(id: &str => String, read_usage: bool) -> SandboxStatus;

            /// Events after `since` (0: all it still has), then new ones as they
            /// happen. A consumer remembers the last `seq` it handled.
            stream Open fn events(since: u64) -> BoxStream<'static, Sequenced>;

            /// Creates a sandbox; answers, with its status, once an exec into it
            /// would succeed. Its main process, if the spec has one, starts with
            /// `start_main`. A node short of disk answers `no_room`. A create whose
            /// caller stops waiting (drops the future) must not leave a sandbox
            /// half made: the node's implementations run it to its end regardless.
            unary Open fn create(req: CreateSandbox) -> SandboxStatus;

            /// The control plane recorded the sandbox as running: the node notes
            /// it in the sandbox's log and starts the spec's main process, if it
            /// has one (so an exit is never reported before).
            unary Quick fn start_main(id: &str => String) -> ();

            /// Kills and removes everything of the sandbox, noting `why` as the
            /// last line of its log; idempotent. Its final usage when the node
            /// held it.
            unary Open fn destroy(id: &str => String, why: &str => String) -> Option<Usage>;

            /// Freezes (pause) or thaws (resume) every process of the sandbox.
            unary Quick fn set_paused(id: &str => String, paused: bool) -> ();

            /// Freezes a finished sandbox and holds it for `hold_for` (kept, or a
            /// `delay` grace period), noting `note` in its log; `Expired` is
            /// reported when the hold ends. Answers the usage of its run.
            unary Open fn hold(id: &str => String, hold_for: Duration, note: LogNote)
                -> Option<Usage>;

            /// The sandbox may live `ttl` from now.
            unary Quick fn set_ttl(id: &str => String, ttl: Duration) -> ();

            /// A warm pool's sandbox taken by a create: it becomes `spec`'s (exec
            /// environment, working directory and user, TTL and lease from now,
            /// network policy); its resources stay. Answers its status as `status`
            /// without `read_usage` would, so that the create's answer needs no
            /// second call.
            unary Quick fn claim(id: &str => String, spec: SandboxSpec) -> SandboxStatus;

            /// Renews the sandbox's lease; a sandbox the node does not hold is no
            /// error (there is nothing to keep alive). Exec, file and port calls,
            /// TTL changes and commits renew it on their own.
            unary Quick fn renew_lease(id: &str => String) -> ();

            /// Adds a state change to the sandbox's log.
            unary Quick fn note(id: &str => String, note: LogNote) -> ();

            /// Runs a command; its events as they happen. Dropping the stream kills
            /// the command's whole process tree.
            stream Open fn exec(id: &str => String, req: ExecRequest)
                -> BoxStream<'static, ExecEvent>;

            /// More stdin for a running exec started with `stdin_open` (named by
            /// the `exec_id` of its start event); `close` ends its stdin.
            unary Quick fn exec_input(
                id: &str => String,
                exec_id: &str => String,
                data: Bytes => WireBytes,
                close: bool
            ) -> ();

            /// Sets the window size of a running exec's terminal (one started with
            /// `tty`): NotFound when no such exec runs, Conflict when it has no
            /// terminal, Invalid for a zero size.
            unary Quick fn exec_resize(id: &str => String, exec_id: &str => String, size: WindowSize)
                -> ();

            /// Writes a file (or unpacks a tar archive) from `body`, all or nothing.
            upload Open fn write_file(id: &str => String, req: WriteFile; body: ByteStream) -> ();

            /// Reads a file (raw) or a directory (a tar archive).
            file Open fn read_file(id: &str => String, path: &str => String) -> FileRead;

            /// Looks at or changes paths: the entries looked at or made (one for
            /// stat, make_dir and rename; a directory's for list; none for remove).
            unary Quick fn path_op(id: &str => String, op: PathOp) -> Vec<PathEntry>;

            /// Events of the directory `path` in the sandbox (and, with
            /// `recursive`, of its subdirectories, up to a bound) as they happen.
            /// NotFound for a missing path, Invalid for one that is not a
            /// directory. It ends when the stream is dropped or the directory (or
            /// the sandbox) goes; an error that ends it early is its last item.
            stream Open fn watch(id: &str => String, path: &str => String, recursive: bool)
                -> BoxStream<'static, WatchEvent>;

            /// The sandbox's log as whole JSON lines; with `follow`, until the
            /// sandbox is over (destroyed, or held after it finished).
            bytes Open fn logs(id: &str => String, follow: bool) -> ByteStream;

            /// The node's shipping journal (every sandbox's log lines and usage
            /// samples, numbered node-wide) after `after`, at most `max` entries,
            /// waiting up to `wait` for one when there is none. `journal` names the
            /// journal `after` counts in (None, or another: from the start); the
            /// node may forget what is at or before `after` in its own journal
            /// (the caller has it kept).
            unary Quick fn ship(journal: Option<&str> => Option<String>, after: u64, max: u32, wait: Duration)
                -> ShipBatch;

            /// A connection to `port` on the sandbox's loopback. Only opening it
            /// has the quick deadline, not the life of the connection.
            tunnel Quick fn connect_port(id: &str => String, port: u16 => Port) -> Box<dyn Tunnel>;

            /// Checks network rules against the node's own defaults.
            unary Quick fn check_network(network: NetworkSpec) -> ();

            /// Replaces a running sandbox's network rules.
            unary Quick fn set_network(id: &str => String, network: NetworkSpec) -> PolicyChange;

            /// The sandbox's filesystem changes as a new image (a running sandbox
            /// is frozen while the layer is written).
            unary Open fn commit(id: &str => String, req: CommitImage) -> ImageInfo;

            /// Copies the sandbox's filesystem changes once into a new read-only
            /// fork layer (a running sandbox is frozen meanwhile). A create whose
            /// `spec.fork.layers` are the answer's is built on it, with its own
            /// empty upper directory. The node keeps the layer until
            /// `release_fork_layer` and its last such sandbox is gone. With
            /// `processes` (a gVisor sandbox on network `none`), the sandbox's
            /// memory and processes are saved with the layer and it is resumed;
            /// a create whose `spec.fork.processes` is set resumes them too.
            unary Open fn fork_layer(id: &str => String, processes: bool) -> ForkLayer;

            /// No more sandboxes will be made on the fork layer: it goes once the
            /// last one built on it is destroyed. An unknown layer is no error.
            unary Open fn release_fork_layer(layer: &str => String) -> ();

            /// The images the node holds.
            unary Open fn image_list() -> Vec<ImageInfo>;

            /// The image a create of `reference` runs: pulled first for a registry
            /// reference (its tag resolved to a digest at the registry), checked
            /// to be runnable.
            unary Open fn image_for_create(reference: &str => String) -> ImageInfo;

            /// Pulls from a registry; progress, then the image or the error. The
            /// pull runs to its end even if the stream is dropped.
            stream Open fn image_pull(reference: &str => String) -> BoxStream<'static, PullUpdate>;

            /// An image made from one the node holds, without a new layer: its
            /// config changed, or the same image under another name.
            unary Open fn image_derive(req: DeriveImage) -> ImageInfo;

            /// The image the step cache holds under `key`, if any.
            unary Quick fn image_step(key: &str => String) -> Option<ImageInfo>;

            /// Imports an OCI image-layout or docker-archive tar.
            upload Open fn image_import(name: &str => String; archive: ByteStream) -> ImageInfo;

            /// Pushes an image (`source`, or `reference` itself) to `reference`.
            unary Open fn image_push(reference: &str => String, source: Option<&str> => Option<String>)
                -> Pushed;

            /// Removes an image (Conflict while a sandbox runs it).
            unary Open fn image_remove(reference: &str => String) -> ImageInfo;

            /// Removes unused images, down to `budget` bytes if given.
            unary Open fn image_gc(budget: Option<u64>) -> GcReport;

            /// Makes a volume (Conflict if the name is taken on this node).
            unary Open fn volume_create(req: VolumeRequest) -> VolumeInfo;

            /// The volumes the node holds.
            unary Quick fn volume_list() -> Vec<VolumeInfo>;

            /// Removes a volume and its files (Conflict while a sandbox mounts it).
            unary Open fn volume_remove(name: &VolumeName => VolumeName) -> VolumeInfo;

            /// Writes a file into a volume from `body`, all or nothing, without a
            /// sandbox (a running sandbox that mounts it sees it at once); answers
            /// the file written. Paths are resolved inside the volume.
            upload Open fn volume_write(volume: &VolumeName => VolumeName, req: VolumeWrite; body: ByteStream)
                -> PathEntry;

            /// Reads a file (raw) or a directory (a tar archive) of a volume.
            file Open fn volume_read(volume: &VolumeName => VolumeName, path: &str => String) -> FileRead;

            /// Looks at or changes paths in a volume, as `path_op` in a sandbox
            /// (ids as the volume's sandboxes see them).
            unary Quick fn volume_path_op(volume: &VolumeName => VolumeName, op: PathOp)
                -> Vec<PathEntry>;
        }
    };
}

/// The type an argument crosses a transport as: its `=> WIRE` if it has
/// one, else its own.
#[macro_export]
#[doc(hidden)]
macro_rules! wire_type {
    ($ty:ty) => {
        $ty
    };
    ($ty:ty, $wire:ty) => {
        $wire
    };
}

/// An argument as it is sent: owned, in its wire form.
#[macro_export]
#[doc(hidden)]
macro_rules! wire_own {
    ($arg:expr) => {
        $arg
    };
    ($arg:expr, $wire:ty) => {
        <_ as $crate::calls::Own<$wire>>::own($arg)
    };
}

/// An argument as received, handed to the trait: borrowed from its wire
/// form where the trait takes a borrow, moved otherwise.
#[macro_export]
#[doc(hidden)]
macro_rules! wire_lend {
    ($arg:expr) => {
        $arg
    };
    ($arg:expr, $wire:ty) => {
        $crate::calls::Lend::lend(&$arg)
    };
}

/// An argument of the trait as its owned wire form (the sending side).
pub trait Own<W> {
    fn own(self) -> W;
}

impl Own<String> for &str {
    fn own(self) -> String {
        self.to_owned()
    }
}

impl<T: Clone> Own<T> for &T {
    fn own(self) -> T {
        self.clone()
    }
}

impl Own<Option<String>> for Option<&str> {
    fn own(self) -> Option<String> {
        self.map(str::to_owned)
    }
}

impl Own<WireBytes> for Bytes {
    fn own(self) -> WireBytes {
        WireBytes(self)
    }
}

impl Own<Port> for u16 {
    fn own(self) -> Port {
        Port(self)
    }
}

/// A wire value as the trait's argument (the receiving side).
pub trait Lend<'a, T> {
    fn lend(&'a self) -> T;
}

impl<'a> Lend<'a, &'a str> for String {
    fn lend(&'a self) -> &'a str {
        self
    }
}

impl<'a, T> Lend<'a, &'a T> for T {
    fn lend(&'a self) -> &'a T {
        self
    }
}

impl<'a> Lend<'a, Option<&'a str>> for Option<String> {
    fn lend(&'a self) -> Option<&'a str> {
        self.as_deref()
    }
}

impl Lend<'_, Bytes> for WireBytes {
    fn lend(&self) -> Bytes {
        // A reference count, not a copy.
        self.0.clone()
    }
}

impl Lend<'_, u16> for Port {
    fn lend(&self) -> u16 {
        self.0
    }
}

/// Bytes inside a JSON body, as base64 (a third larger, where serde's own
/// form, an array of numbers, is three to four times larger).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireBytes(pub Bytes);

impl Serialize for WireBytes {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use base64::Engine;
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(&self.0))
    }
}

impl<'de> Deserialize<'de> for WireBytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use base64::Engine;
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(text.as_bytes())
            .map(|b| WireBytes(b.into()))
            .map_err(|e| serde::de::Error::custom(format!("not base64: {e}")))
    }
}

/// A port to connect to: refused when read if it is 0, so a receiving
/// transport answers Invalid before it asks the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Port(pub u16);

impl<'de> Deserialize<'de> for Port {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match u16::deserialize(d)? {
            0 => Err(serde::de::Error::custom("port 0: a port is 1 to 65535")),
            port => Ok(Port(port)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_bytes_are_base64_both_ways() {
        let b = WireBytes(Bytes::from_static(b"\x00\xffhi"));
        let json = serde_json::to_string(&b).unwrap();
        assert_eq!(json, "\"AP9oaQ==\"");
        assert_eq!(serde_json::from_str::<WireBytes>(&json).unwrap(), b);
        assert!(serde_json::from_str::<WireBytes>("\"*\"").is_err());
    }

    #[test]
    fn port_zero_is_refused_when_read() {
        assert_eq!(serde_json::from_str::<Port>("8080").unwrap(), Port(8080));
        let e = serde_json::from_str::<Port>("0").unwrap_err();
        assert!(e.to_string().contains("1 to 65535"), "{e}");
    }

    #[test]
    fn borrowed_arguments_round_trip() {
        let owned: Option<String> = Own::own(Some("a"));
        let back: Option<&str> = owned.lend();
        assert_eq!(back, Some("a"));
        let s: String = Own::own("x");
        let t: &str = s.lend();
        assert_eq!(t, "x");
    }
}

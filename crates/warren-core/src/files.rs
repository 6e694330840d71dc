//! Files and paths in a sandbox or a volume as every layer names them: what
//! a client asks (write, look at, change, watch) and what it gets back. The
//! node contract carries them; the control plane's facade hands them to
//! the front doors unchanged.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// How to write a file into a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteFile {
    pub path: String,
    /// Permission bits of a regular file.
    pub mode: u32,
    /// The body is a tar archive to unpack into directory `path`.
    #[serde(default)]
    pub tar: bool,
    /// Extended attributes (`user.` names) the written file gets; it keeps
    /// none of the old file's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub xattrs: BTreeMap<String, String>,
}

/// Who a file or directory made through the contract belongs to, as the
/// target's processes see ids (a volume's: as every sandbox mounting it
/// sees them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
}

/// How to write a file into a volume, without a sandbox (E2B's volume
/// content API): a [`WriteFile`] (no tar) with an owner. It never makes
/// parent directories (a missing parent is NotFound), and a directory at
/// the path is Conflict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeWrite {
    #[serde(flatten)]
    pub file: WriteFile,
    #[serde(default)]
    pub owner: Owner,
    /// Replace a regular file at the path; without, anything there is
    /// Conflict.
    #[serde(default)]
    pub replace: bool,
}

/// A look at, or a change to, paths in a sandbox besides reading and
/// writing files (what E2B's filesystem service and file browsers need).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum PathOp {
    /// What the path is (a final symlink described, not followed).
    Stat { path: String },
    /// A directory's entries, down to `depth` levels (1: its own).
    List {
        path: String,
        #[serde(default = "one")]
        depth: u32,
    },
    /// Makes a directory and its parents; conflict if the path exists.
    MakeDir { path: String },
    /// Renames `from` to `to`, making `to`'s parents.
    Rename { from: String, to: String },
    /// Removes a file, link, or a directory with all it holds.
    Remove { path: String },
    /// Makes directory `path` with an owner and permission bits (E2B's
    /// volume `make_dir`): its missing parents too with `parents` (each
    /// alike; without, a missing parent is NotFound), an existing directory
    /// answered as it is with `exist_ok`; anything else in the way is
    /// Conflict.
    MakeDirAs {
        path: String,
        owner: Owner,
        mode: u32,
        #[serde(default)]
        parents: bool,
        #[serde(default)]
        exist_ok: bool,
    },
    /// Changes the owner, group and/or permission bits of `path`; a final
    /// symlink's own owner, never its target's (a symlink has no mode).
    SetAttrs {
        path: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        uid: Option<u32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        gid: Option<u32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mode: Option<u32>,
    },
}

fn one() -> u32 {
    1
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum PathKind {
    File,
    Dir,
    Symlink,
    Other,
}

/// A path in a sandbox as its processes see it (owner ids inside its user
/// namespace).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PathEntry {
    pub path: String,
    pub kind: PathKind,
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Last modification, Unix time in milliseconds.
    pub modified_ms: i64,
    /// Last access and last inode change (ctime), Unix milliseconds, where
    /// the node reports them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accessed_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changed_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
    /// A regular file's extended attributes in the `user.` namespace.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub xattrs: BTreeMap<String, String>,
}

/// What a read of a sandbox path found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum FileKind {
    /// A regular file of exactly `size` bytes.
    File { size: u64 },
    /// A directory, sent as a tar archive.
    Dir,
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

/// One line of a directory watch: an event, or the error that ended it
/// (`E`: the error type of the layer that carries it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WatchEvent<E> {
    /// `name` is relative to the watched directory (`sub/file` when
    /// watching recursively).
    Event {
        name: String,
        kind: WatchKind,
    },
    Error {
        error: E,
    },
}

/// A read of a path: what it is, then its bytes (`B`: the byte stream of
/// the layer that carries it).
pub struct FileRead<B> {
    pub kind: FileKind,
    pub body: B,
}

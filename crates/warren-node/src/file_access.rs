//! Sandbox and volume files as the node contract sees them: path
//! operations with owner ids mapped to and from a sandbox's user
//! namespace, reads as a file's bytes or a directory's archive, and
//! all-or-nothing writes from a byte stream.
//!
//! A volume's calls answer `Result<Result<T, RuntimeError>, NodeError>`:
//! the outer error is finding the volume, the inner one the file work,
//! which the contract words for a volume (the runtime speaks of
//! sandboxes).

use std::os::fd::OwnedFd;

use bytes::Bytes;
use futures_util::StreamExt;
use warren_core::volume::VolumeName;
use warren_node_api::{
    ByteStream, FileKind, FileRead, PathEntry, PathKind, PathOp, VolumeWrite, WriteFile,
};
use warren_runtime::{file_ops, files, RuntimeError};

use crate::{Node, NodeError};

/// What a volume call answers (see the module's note).
pub(crate) type InVolume<T> = Result<Result<T, RuntimeError>, NodeError>;

impl Node {
    /// Looks at or changes paths of a running sandbox.
    pub(crate) async fn path_op(&self, id: &str, op: PathOp) -> Result<Vec<PathEntry>, NodeError> {
        self.renew_lease(id);
        let root = self.root(id)?;
        let base = self.host_id_base(id);
        let stats = blocking(move || run_path_op(&root, op, base)).await??;
        Ok(stats.into_iter().map(|s| path_entry(s, base)).collect())
    }

    /// Opens a sandbox's file or directory for reading.
    pub(crate) async fn read_file(&self, id: &str, path: &str) -> Result<FileRead, NodeError> {
        self.renew_lease(id);
        let root = self.root(id)?;
        let path = path.to_string();
        let entry = blocking(move || files::open_read(&root, &path)).await??;
        Ok(file_read(entry))
    }

    /// Writes a file (or unpacks a tar archive) into a sandbox.
    pub(crate) async fn write_file(
        self: &std::sync::Arc<Self>,
        id: &str,
        req: WriteFile,
        body: ByteStream,
    ) -> Result<(), NodeError> {
        self.renew_lease(id);
        let root = self.root(id)?;
        let mut reader = sync_reader(body);
        let written = blocking(move || {
            if req.tar {
                files::unpack_tar(&root, &req.path, &mut reader).map(drop)
            } else {
                files::write_file(&root, &req.path, req.mode, &req.xattrs, &mut reader).map(drop)
            }
        })
        .await?;
        // The root stays reachable through its descriptor after a destroy,
        // so a write can have failed in, or landed in, a sandbox that is gone.
        if !self.is_live(id) {
            return Err(NodeError::Conflict(format!(
                "sandbox {id} was destroyed while the upload ran; nothing was kept"
            )));
        }
        if written.is_ok() {
            let (node, id) = (self.clone(), id.to_string());
            let _ = tokio::task::spawn_blocking(move || node.written_into(&id)).await;
        }
        Ok(written?)
    }

    /// Writes one file into a volume; answers the file written.
    pub(crate) async fn volume_write(
        self: &std::sync::Arc<Self>,
        volume: &VolumeName,
        req: VolumeWrite,
        body: ByteStream,
    ) -> InVolume<PathEntry> {
        if req.file.tar {
            return Err(NodeError::BadRequest(
                "a volume takes files one by one, not tar archives".into(),
            ));
        }
        let root = self.volume_root(volume).await?;
        let mut reader = sync_reader(body);
        let written = blocking(move || {
            let path = &req.file.path;
            // A directory in the way is a conflict here (a sandbox's write
            // calls it a bad path).
            if let Ok(st) = file_ops::stat(&root, path) {
                if st.kind == file_ops::Kind::Dir {
                    return Err(RuntimeError::Exists(format!("{path}: is a directory")));
                }
            }
            let opts = files::WriteOptions {
                parents: false,
                replace: req.replace,
                owner: Some((req.owner.uid, req.owner.gid)),
            };
            let (mode, xattrs) = (req.file.mode, &req.file.xattrs);
            files::write_file_with(&root, path, mode, xattrs, opts, &mut reader)?;
            file_ops::stat(&root, path)
        })
        .await?;
        Ok(written.map(|stat| path_entry(stat, None)))
    }

    /// Opens a volume's file or directory for reading.
    pub(crate) async fn volume_read(
        self: &std::sync::Arc<Self>,
        volume: &VolumeName,
        path: &str,
    ) -> InVolume<FileRead> {
        let root = self.volume_root(volume).await?;
        let path = path.to_string();
        let entry = blocking(move || files::open_read(&root, &path)).await?;
        Ok(entry.map(file_read))
    }

    /// Looks at or changes paths of a volume (ids as the host's).
    pub(crate) async fn volume_path_op(
        self: &std::sync::Arc<Self>,
        volume: &VolumeName,
        op: PathOp,
    ) -> InVolume<Vec<PathEntry>> {
        let root = self.volume_root(volume).await?;
        let stats = blocking(move || run_path_op(&root, op, None)).await?;
        Ok(stats.map(|s| s.into_iter().map(|s| path_entry(s, None)).collect()))
    }

    /// The root of a volume's file system, mounted on the host if it is
    /// not.
    async fn volume_root(
        self: &std::sync::Arc<Self>,
        volume: &VolumeName,
    ) -> Result<OwnedFd, NodeError> {
        let (node, volume) = (self.clone(), volume.clone());
        blocking(move || node.volumes.root(&volume)).await?
    }
}

/// Runs file work off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, NodeError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| NodeError::Internal(format!("node task: {e}")))
}

/// An upload as a blocking reader, for the file functions.
fn sync_reader(body: ByteStream) -> impl std::io::Read + Send + 'static {
    let stream = body.map(|r| r.map_err(std::io::Error::other));
    tokio_util::io::SyncIoBridge::new(tokio_util::io::StreamReader::new(stream))
}

/// A path as the sandbox's processes see it: host owner ids mapped back
/// into its user namespace (an id outside its range shows as nobody).
fn path_entry(s: file_ops::Stat, id_base: Option<u32>) -> PathEntry {
    use file_ops::Kind;
    let inside = |host: u32| match id_base {
        None => host,
        Some(base) if (base..base + 65536).contains(&host) => host - base,
        Some(_) => 65534,
    };
    PathEntry {
        path: s.path,
        kind: match s.kind {
            Kind::File => PathKind::File,
            Kind::Dir => PathKind::Dir,
            Kind::Symlink => PathKind::Symlink,
            Kind::Other => PathKind::Other,
        },
        size: s.size,
        mode: s.mode,
        uid: inside(s.uid),
        gid: inside(s.gid),
        modified_ms: (s.modified_unix_ns / 1_000_000) as i64,
        accessed_ms: Some((s.accessed_unix_ns / 1_000_000) as i64),
        changed_ms: Some((s.changed_unix_ns / 1_000_000) as i64),
        symlink_target: s.symlink_target,
        xattrs: s.xattrs,
    }
}

/// Runs a path operation in `root`; ids given are as the target's
/// processes see them (0 to 65535, what a sandbox has, wherever it runs),
/// `id_base` the first host id of a sandbox's user namespace (None: the
/// ids are the host's, as in a volume or a sandbox without one).
fn run_path_op(
    root: &OwnedFd,
    op: PathOp,
    id_base: Option<u32>,
) -> Result<Vec<file_ops::Stat>, RuntimeError> {
    let host = |id: u32| match id_base {
        _ if id >= 65536 => Err(RuntimeError::BadPath(format!(
            "owner {id}: a sandbox has the ids 0 to 65535"
        ))),
        None => Ok(id),
        Some(base) => base.checked_add(id).ok_or_else(|| {
            RuntimeError::Files(format!("owner {id}: beyond the host's ids from {base}"))
        }),
    };
    Ok(match op {
        PathOp::Stat { path } => vec![file_ops::stat(root, &path)?],
        PathOp::List { path, depth } => file_ops::list(root, &path, depth)?,
        PathOp::MakeDir { path } => vec![file_ops::make_dir(root, &path)?],
        PathOp::Rename { from, to } => vec![file_ops::rename(root, &from, &to)?],
        PathOp::Remove { path } => {
            file_ops::remove(root, &path)?;
            vec![]
        }
        PathOp::MakeDirAs {
            path,
            owner,
            mode,
            parents,
            exist_ok,
        } => {
            let opts = file_ops::DirOptions {
                owner: (host(owner.uid)?, host(owner.gid)?),
                mode,
                parents,
                exist_ok,
            };
            vec![file_ops::make_dir_as(root, &path, opts)?]
        }
        PathOp::SetAttrs {
            path,
            uid,
            gid,
            mode,
        } => {
            let uid = uid.map(host).transpose()?;
            let gid = gid.map(host).transpose()?;
            vec![file_ops::set_attrs(root, &path, uid, gid, mode)?]
        }
    })
}

/// A read's answer: a file's bytes (never more than its length when
/// opened), or a directory packed as a tar archive as it is read.
fn file_read(entry: files::Entry) -> FileRead {
    let io = |r: std::io::Result<Bytes>| {
        r.map_err(|e| warren_node_api::NodeError::internal(e.to_string()))
    };
    match entry {
        files::Entry::File(f, size) => {
            // The sandbox may write to the file meanwhile: never send
            // more than the length announced (a file that shrinks ends
            // the stream early, which a client sees as a short body).
            use tokio::io::AsyncReadExt;
            let file = tokio::fs::File::from_std(f).take(size);
            FileRead {
                kind: FileKind::File { size },
                body: tokio_util::io::ReaderStream::new(file).map(io).boxed(),
            }
        }
        files::Entry::Dir(dir) => {
            let (reader, writer) = tokio::io::duplex(256 * 1024);
            tokio::task::spawn_blocking(move || {
                let mut w = tokio_util::io::SyncIoBridge::new(writer);
                if let Err(e) = files::pack_dir(dir, &mut w) {
                    tracing::warn!(error = %e, "packing directory");
                }
            });
            FileRead {
                kind: FileKind::Dir,
                body: tokio_util::io::ReaderStream::new(reader).map(io).boxed(),
            }
        }
    }
}

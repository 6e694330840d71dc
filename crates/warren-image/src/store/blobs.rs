//! The content store: blobs named by their sha256. Only verified bytes are
//! moved in, so a blob's name always matches its content.

use std::fs::{self, File};
use std::io::Read;
use std::path::{Path, PathBuf};

use super::assemble::StagedLayer;
use super::ImageStore;
use crate::compress::{self, Compression};
use crate::digest::sha256_hex;
use crate::error::{ImageError, IoContext};
use crate::fsutil::{fsync_dir, remove_path, write_atomic};

impl ImageStore {
    /// The bytes of a blob in the content store.
    pub(crate) fn read_blob(&self, digest: &str) -> Result<Vec<u8>, ImageError> {
        let Some(hex) = sha256_hex(digest) else {
            return Err(ImageError::InvalidImage(format!(
                "{digest:?} is not a sha256 digest"
            )));
        };
        let path = self.blob_dir().join(hex);
        fs::read(&path).ctx(|| {
            format!(
                "reading blob {digest} ({}); the store is damaged, pull or import the image again",
                path.display()
            )
        })
    }

    pub(crate) fn has_blob(&self, hex: &str) -> bool {
        self.blob_dir().join(hex).is_file()
    }

    pub(crate) fn blob_path(&self, hex: &str) -> PathBuf {
        self.blob_dir().join(hex)
    }

    /// Moves a verified download into the content store. The caller has
    /// pinned it, or GC could remove it before a record names it.
    pub(crate) fn commit_blob(&self, from: &Path, hex: &str) -> Result<(), ImageError> {
        let dest = self.blob_dir().join(hex);
        fs::rename(from, &dest)
            .ctx(|| format!("moving {} to {}", from.display(), dest.display()))?;
        fsync_dir(&self.blob_dir())
    }

    pub(super) fn commit_staged(&self, blob: &StagedLayer) -> Result<(), ImageError> {
        let hex = sha256_hex(&blob.digest).unwrap_or_default();
        let dest = self.blob_dir().join(hex);
        if dest.is_file() {
            return remove_path(&blob.path).ctx(|| format!("removing {}", blob.path.display()));
        }
        fs::rename(&blob.path, &dest)
            .ctx(|| format!("moving {} to {}", blob.path.display(), dest.display()))
    }

    pub(super) fn put_blob(&self, digest: &str, bytes: &[u8]) -> Result<(), ImageError> {
        let Some(hex) = sha256_hex(digest) else {
            return Err(ImageError::InvalidArchive(format!(
                "digest {digest:?} is not a sha256 digest"
            )));
        };
        let dest = self.blob_dir().join(hex);
        if dest.is_file() {
            return Ok(());
        }
        write_atomic(&dest, bytes, &self.tmp_dir())
    }
}

/// Size and compression of a stored blob.
pub(super) fn blob_facts(path: &Path) -> Result<(u64, Compression), ImageError> {
    let mut file = File::open(path).ctx(|| format!("opening {}", path.display()))?;
    let size = file
        .metadata()
        .ctx(|| format!("reading metadata of {}", path.display()))?
        .len();
    let mut magic = Vec::with_capacity(6);
    (&mut file)
        .take(6)
        .read_to_end(&mut magic)
        .ctx(|| format!("reading {}", path.display()))?;
    let compression = compress::sniff(&magic).map_err(|name| {
        ImageError::InvalidArchive(format!(
            "layer blob {} is {name}-compressed; only gzip, zstd and plain tar layers are supported",
            path.display()
        ))
    })?;
    Ok((size, compression))
}

//! Importing OCI image-layout and docker-archive tars. Every blob is copied
//! out and verified before any layer is unpacked, so a corrupt archive
//! leaves nothing behind.

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};

use super::assemble::{Assembled, StagedLayer};
use super::blobs::blob_facts;
use super::ImageStore;
use crate::archive::SourceArchive;
use crate::digest::{copy_hashed, sha256_hex, CopyError};
use crate::error::{ImageError, IoContext};
use crate::fsutil::{remove_path, unique_name};
use crate::layout::{self, Format};
use crate::record::ImageRecord;
use crate::reference::normalize_name;

/// Scratch directory of one import, removed however the import ends.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Err(e) = remove_path(&self.0) {
            tracing::warn!(path = %self.0.display(), error = %e, "could not remove import scratch; it is removed at the next open");
        }
    }
}

impl ImageStore {
    /// Imports an OCI image-layout tar or a docker-archive tar (format
    /// detected from its contents; the tar itself may be gzip/zstd
    /// compressed) under `name` (`repo[:tag]`, `:latest` added when absent).
    /// Every blob is verified against its digest and every layer against its
    /// diffID before anything becomes visible. An existing record of the same
    /// name is replaced, and layers only it used are collected.
    pub fn import_archive(&self, archive: &Path, name: &str) -> Result<ImageRecord, ImageError> {
        let name = normalize_name(name)?;
        let scratch = Scratch(self.tmp_dir().join(unique_name("import-")));
        fs::create_dir(&scratch.0).ctx(|| format!("creating {}", scratch.0.display()))?;

        let mut dirty = false;
        let result = {
            let _importing = self.read_lock();
            self.import_locked(archive, &name, &scratch.0, &mut dirty)
        };
        self.after_write(result, dirty)
    }

    fn import_locked(
        &self,
        archive: &Path,
        name: &str,
        scratch: &Path,
        dirty: &mut bool,
    ) -> Result<(ImageRecord, bool), ImageError> {
        let src = SourceArchive::open(archive, scratch)?;
        let image = layout::resolve(&src, name)?;
        let count = image.layers.len();

        // Phase 1: copy and verify every layer blob before unpacking any, so
        // a corrupt archive leaves nothing behind.
        let mut staged = Vec::with_capacity(count);
        for (i, layer) in image.layers.iter().enumerate() {
            let what = format!(
                "layer {}/{count} ({}) of {}",
                i + 1,
                layer.digest.as_deref().unwrap_or(&layer.member),
                src.display()
            );
            staged.push(self.stage_layer(
                &src,
                layer,
                scratch.join(format!("layer-{i}")),
                &what,
            )?);
        }

        let (config_digest, config_bytes) = (image.config.digest, image.config.bytes);
        let manifest = match (image.format, image.manifest) {
            (Format::OciLayout, Some(m)) => Some((m.digest, m.bytes)),
            _ => None,
        };
        self.assemble(
            Assembled {
                name,
                origin: src.display(),
                staged,
                config_digest,
                config_bytes,
                config: image.config_parsed,
                manifest,
                index_digest: None,
                source: None,
            },
            dirty,
        )
    }

    fn stage_layer(
        &self,
        src: &SourceArchive,
        layer: &layout::LayerSource,
        dest: PathBuf,
        what: &str,
    ) -> Result<StagedLayer, ImageError> {
        if let Some(hex) = layer.digest.as_deref().and_then(sha256_hex) {
            let existing = self.blob_dir().join(hex);
            if existing.is_file() {
                // The store already has this blob, but the archive's copy must
                // still match its digest: a corrupt archive is refused even
                // when we would not need its bytes.
                let mut reader = src.open_member(&layer.member)?;
                let (digest, _) = copy_hashed(&mut reader, &mut io::sink()).map_err(|e| {
                    ImageError::InvalidArchive(format!(
                        "{what}: reading the blob failed ({e:?}); the archive is truncated, re-export it"
                    ))
                })?;
                if layer.digest.as_deref() != Some(digest.as_str()) {
                    return Err(ImageError::DigestMismatch {
                        what: format!("{what}: the blob's sha256"),
                        expected: layer.digest.clone().unwrap_or_default(),
                        actual: digest,
                    });
                }
                let (size, compression) = blob_facts(&existing)?;
                return Ok(StagedLayer {
                    path: existing,
                    digest: format!("sha256:{hex}"),
                    size,
                    compression,
                    in_content: true,
                    check_diff_id: false,
                });
            }
        }
        let mut reader = src.open_member(&layer.member)?;
        let mut file = File::create_new(&dest).ctx(|| format!("creating {}", dest.display()))?;
        let (digest, size) = copy_hashed(&mut reader, &mut file).map_err(|e| match e {
            CopyError::Read(e) => ImageError::InvalidArchive(format!(
                "{what}: reading the blob failed ({e}); the archive is truncated, re-export it"
            )),
            CopyError::Write(e) => ImageError::io(
                format!(
                    "{what}: copying the blob to {} (is the disk full?)",
                    dest.display()
                ),
                e,
            ),
        })?;
        file.sync_all()
            .ctx(|| format!("syncing {}", dest.display()))?;
        if let Some(expected) = &layer.digest {
            if *expected != digest {
                return Err(ImageError::DigestMismatch {
                    what: format!("{what}: the blob's sha256"),
                    expected: expected.clone(),
                    actual: digest,
                });
            }
        }
        if let Some(expected) = layer.size {
            if expected != size {
                return Err(ImageError::InvalidArchive(format!(
                    "{what}: the blob is {size} bytes but the manifest says {expected}; the \
                     archive is corrupt, re-export it"
                )));
            }
        }
        let (_, compression) = blob_facts(&dest)?;
        Ok(StagedLayer {
            path: dest,
            digest,
            size,
            compression,
            in_content: false,
            check_diff_id: true,
        })
    }
}

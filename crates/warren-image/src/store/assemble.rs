//! The last phases every way into the store shares (archive import, pull,
//! commit): unpack each layer once per ChainID, check it against its
//! diffID, commit the blobs, then write the record. One path for all three,
//! so a pulled or committed image is verified exactly like an imported one.

use std::fs::File;
use std::io::{self, BufReader};
use std::path::{Path, PathBuf};

use oci_spec::image::{DescriptorBuilder, ImageConfiguration, ImageManifestBuilder, MediaType};

use super::ImageStore;
use crate::compress::{self, Compression};
use crate::digest::{chain_ids, sha256_digest, HashingReader};
use crate::error::{ImageError, IoContext};
use crate::fsutil::fsync_dir;
use crate::record::{ImageConfig, ImageRecord, LayerRecord};
use crate::unpack::unpack_layer;

/// A layer blob ready to be committed to the content store.
pub(super) struct StagedLayer {
    pub(super) path: PathBuf,
    pub(super) digest: String,
    pub(super) size: u64,
    pub(super) compression: Compression,
    /// Already in `content/`, nothing to move.
    pub(super) in_content: bool,
    /// Check the blob against its diffID even when the layer's snapshot
    /// already exists: its bytes were never matched to that diffID.
    pub(super) check_diff_id: bool,
}

/// Everything the last phases of an import or pull need: the verified
/// config and manifest, and the layer blobs, staged or in the content store.
pub(super) struct Assembled<'a> {
    pub(super) name: &'a str,
    /// Where the image came from, for messages: an archive path or a
    /// registry reference.
    pub(super) origin: &'a str,
    pub(super) staged: Vec<StagedLayer>,
    pub(super) config_digest: String,
    pub(super) config_bytes: Vec<u8>,
    pub(super) config: ImageConfiguration,
    /// None for a docker-archive: a canonical OCI manifest is synthesised.
    pub(super) manifest: Option<(String, Vec<u8>)>,
    pub(super) index_digest: Option<String>,
    pub(super) source: Option<String>,
}

impl ImageStore {
    /// Ends an import, pull or commit: the boolean says whether it replaced
    /// an older record (whose content may now be unreferenced). Snapshots or
    /// blobs a failed write committed are referenced by nothing unless a
    /// concurrent write reused them; GC sorts that out under the exclusive
    /// lock.
    pub(super) fn after_write<T>(
        &self,
        result: Result<(T, bool), ImageError>,
        dirty: bool,
    ) -> Result<T, ImageError> {
        match &result {
            Ok((_, true)) => self.collect_garbage(),
            Err(_) if dirty => self.collect_garbage(),
            _ => {}
        }
        result.map(|(record, _)| record)
    }

    /// Phases 2 and 3 of an import or pull: unpack each layer once per
    /// ChainID (checking its diffID), commit the blobs, then write the
    /// record. The bool says whether the record replaced another digest.
    pub(super) fn assemble(
        &self,
        a: Assembled<'_>,
        dirty: &mut bool,
    ) -> Result<(ImageRecord, bool), ImageError> {
        let Assembled {
            name,
            origin,
            staged,
            config_digest,
            config_bytes,
            config,
            manifest,
            index_digest,
            source,
        } = a;
        let diff_ids = config.rootfs().diff_ids().clone();
        let chains = chain_ids(&diff_ids);
        let count = staged.len();
        let mut layers = Vec::with_capacity(count);
        for (i, blob) in staged.iter().enumerate() {
            let (diff_id, chain_id) = (&diff_ids[i], &chains[i]);
            let what = format!("layer {}/{count} ({}) of {origin}", i + 1, blob.digest);
            let mismatch = |actual: String| ImageError::DigestMismatch {
                what: format!(
                    "{what}: its diffID (sha256 of the uncompressed tar) does not match \
                     rootfs.diff_ids[{i}] of image config {config_digest}"
                ),
                expected: diff_id.clone(),
                actual,
            };
            let (snapshot, built) =
                self.snapshots
                    .ensure(chain_id, diff_id, &self.tmp_dir(), |fs_dir| {
                        let file = File::open(&blob.path)
                            .ctx(|| format!("opening {}", blob.path.display()))?;
                        let stats = unpack_layer(BufReader::new(file), fs_dir, &what)?;
                        if &stats.diff_id != diff_id {
                            return Err(mismatch(stats.diff_id));
                        }
                        Ok(stats.size)
                    })?;
            *dirty |= built;
            if !built && blob.check_diff_id {
                // The snapshot came from another image; still make sure this
                // blob really is that layer before recording it as such.
                let actual = diff_id_of(&blob.path, &what)?;
                if &actual != diff_id {
                    return Err(mismatch(actual));
                }
            }
            layers.push(LayerRecord {
                digest: blob.digest.clone(),
                diff_id: diff_id.clone(),
                chain_id: chain_id.clone(),
                snapshot: snapshot.id,
                size: snapshot.meta.size,
            });
        }

        // Phase 3: commit blobs, then the record that references them.
        let (manifest_digest, manifest_bytes) = match manifest {
            Some(m) => m,
            None => synthesize_manifest(&config_digest, config_bytes.len(), &staged)?,
        };
        *dirty = true;
        for blob in &staged {
            if !blob.in_content {
                self.commit_staged(blob)?;
            }
        }
        self.put_blob(&config_digest, &config_bytes)?;
        self.put_blob(&manifest_digest, &manifest_bytes)?;
        fsync_dir(&self.blob_dir())?;

        let record = ImageRecord {
            name: name.to_string(),
            digest: manifest_digest,
            config_digest: config_digest.clone(),
            size: layers.iter().map(|l| l.size).sum(),
            created: crate::time::now_rfc3339(),
            layers,
            config: ImageConfig::from_oci(&config),
            index_digest,
            source,
        };
        let replaced = self.write_record(&record)?;
        tracing::info!(name, digest = %record.digest, layers = record.layers.len(), "image stored");
        Ok((record, replaced))
    }
}

/// diffID of a layer blob without unpacking it.
fn diff_id_of(path: &Path, what: &str) -> Result<String, ImageError> {
    let file = File::open(path).ctx(|| format!("opening {}", path.display()))?;
    let bad = |e: io::Error| {
        ImageError::InvalidArchive(format!(
            "{what}: the layer data cannot be decompressed ({e}); the archive is corrupt, \
             re-export it"
        ))
    };
    let (_, reader) = compress::decompress(BufReader::new(file)).map_err(bad)?;
    HashingReader::new(reader)
        .finish()
        .map(|(digest, _)| digest)
        .map_err(bad)
}

/// The canonical OCI manifest for a docker-archive image: its digest is the
/// image's identity in the store, as if it had been pushed as OCI.
fn synthesize_manifest(
    config_digest: &str,
    config_size: usize,
    layers: &[StagedLayer],
) -> Result<(String, Vec<u8>), ImageError> {
    let build_err = |e: oci_spec::OciSpecError| {
        ImageError::InvalidArchive(format!("cannot build an OCI manifest for the image: {e}"))
    };
    let digest = |d: &str| {
        d.parse::<oci_spec::image::Digest>()
            .map_err(|e| ImageError::InvalidArchive(format!("bad digest {d}: {e}")))
    };
    let config = DescriptorBuilder::default()
        .media_type(MediaType::ImageConfig)
        .digest(digest(config_digest)?)
        .size(config_size as u64)
        .build()
        .map_err(build_err)?;
    let mut descriptors = Vec::with_capacity(layers.len());
    for l in layers {
        descriptors.push(
            DescriptorBuilder::default()
                .media_type(MediaType::from(l.compression.layer_media_type()))
                .digest(digest(&l.digest)?)
                .size(l.size)
                .build()
                .map_err(build_err)?,
        );
    }
    let manifest = ImageManifestBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageManifest)
        .config(config)
        .layers(descriptors)
        .build()
        .map_err(build_err)?;
    let bytes = serde_json::to_vec(&manifest)
        .map_err(|e| ImageError::io("encoding synthesised manifest", io::Error::other(e)))?;
    Ok((sha256_digest(&bytes), bytes))
}

//! Recording images a pull brought: their blobs are already in the content
//! store, or the store holds the image under another name.

use oci_spec::image::ImageConfiguration;

use super::assemble::{Assembled, StagedLayer};
use super::blobs::blob_facts;
use super::ImageStore;
use crate::digest::sha256_hex;
use crate::error::ImageError;
use crate::record::ImageRecord;
use crate::reference::normalize_name;

/// An image whose blobs a pull has put in the content store (verified
/// against their digests); see [`ImageStore::commit_pulled`].
pub(crate) struct PulledImage {
    pub name: String,
    pub origin: String,
    pub manifest_digest: String,
    pub manifest_bytes: Vec<u8>,
    pub config_digest: String,
    pub config_bytes: Vec<u8>,
    pub config: ImageConfiguration,
    /// Layer blob digests, base first, and whether this pull downloaded
    /// each (rather than finding it in the store).
    pub layers: Vec<(String, bool)>,
    pub index_digest: Option<String>,
    /// `registry/repository` it was pulled from.
    pub source: String,
}

impl ImageStore {
    /// Records a pulled image whose blobs are in the content store:
    /// unpacks (and diffID-checks) its layers and writes the record. On
    /// failure, blobs and snapshots only it brought are collected.
    pub(crate) fn commit_pulled(&self, image: PulledImage) -> Result<ImageRecord, ImageError> {
        let name = normalize_name(&image.name)?;
        let mut dirty = false;
        let result = {
            let _pulling = self.read_lock();
            let mut staged = Vec::with_capacity(image.layers.len());
            let mut ok = Ok(());
            for (digest, downloaded) in &image.layers {
                let Some(hex) = sha256_hex(digest) else {
                    ok = Err(ImageError::Registry(format!(
                        "{}: layer digest {digest:?} is not a sha256 digest",
                        image.origin
                    )));
                    break;
                };
                let path = self.blob_dir().join(hex);
                match blob_facts(&path) {
                    Ok((size, compression)) => staged.push(StagedLayer {
                        path,
                        digest: digest.clone(),
                        size,
                        compression,
                        in_content: true,
                        check_diff_id: *downloaded,
                    }),
                    Err(e) => {
                        ok = Err(e);
                        break;
                    }
                }
            }
            ok.and_then(|()| {
                self.assemble(
                    Assembled {
                        name: &name,
                        origin: &image.origin,
                        staged,
                        config_digest: image.config_digest,
                        config_bytes: image.config_bytes,
                        config: image.config,
                        manifest: Some((image.manifest_digest, image.manifest_bytes)),
                        index_digest: image.index_digest,
                        source: Some(image.source),
                    },
                    &mut dirty,
                )
            })
        };
        self.after_write(result, dirty)
    }

    /// When the store already holds the image `digest` names (a manifest
    /// digest, or the manifest list it was chosen from) with every layer
    /// unpacked, records it under `name` too and returns it: a pull that
    /// needs no download.
    pub(crate) fn tag_existing(
        &self,
        name: &str,
        digest: &str,
    ) -> Result<Option<ImageRecord>, ImageError> {
        let name = normalize_name(name)?;
        let replaced = {
            let _pulling = self.read_lock();
            if let Some(current) = self.read_record(&name)? {
                let same =
                    current.digest == digest || current.index_digest.as_deref() == Some(digest);
                if same && self.lower_dirs(&current).is_ok() {
                    return Ok(Some(current));
                }
            }
            let found = self.load_records(false)?.into_iter().find(|r| {
                (r.digest == digest || r.index_digest.as_deref() == Some(digest))
                    && self.lower_dirs(r).is_ok()
            });
            let Some(mut record) = found else {
                return Ok(None);
            };
            record.name = name;
            record.created = crate::time::now_rfc3339();
            let replaced = self.write_record(&record)?;
            (record, replaced)
        };
        if replaced.1 {
            self.collect_garbage();
        }
        Ok(Some(replaced.0))
    }
}

//! Recording an image made from a stored one plus at most one new layer
//! (a sandbox commit, a build step).

use std::path::PathBuf;

use oci_spec::image::ImageConfiguration;

use super::assemble::{Assembled, StagedLayer};
use super::blobs::blob_facts;
use super::ImageStore;
use crate::digest::sha256_hex;
use crate::error::ImageError;
use crate::record::ImageRecord;
use crate::reference::normalize_name;

/// An image made of a stored image plus at most one new layer; see
/// [`ImageStore::commit_derived`].
pub(crate) struct DerivedImage {
    pub name: String,
    pub origin: String,
    pub base: ImageRecord,
    /// The new layer's blob (in the store's `tmp/`) and digest; None for
    /// a change of config alone.
    pub layer: Option<(PathBuf, String)>,
    pub config_digest: String,
    pub config_bytes: Vec<u8>,
    pub config: ImageConfiguration,
    pub manifest_digest: String,
    pub manifest_bytes: Vec<u8>,
}

impl ImageStore {
    /// `base` under one more name (the same digest).
    pub fn tag(&self, base: &ImageRecord, name: &str) -> Result<ImageRecord, ImageError> {
        let record = ImageRecord {
            name: crate::reference::normalize_name(name)?,
            ..base.clone()
        };
        let result = {
            let _writing = self.read_lock();
            self.write_record(&record)
                .map(|replaced| (record, replaced))
        };
        self.after_write(result, false)
    }

    /// Records an image made of `base` plus one new layer (a blob in the
    /// store's `tmp/`, uncompressed or gzip): the layer is unpacked and
    /// checked against its diffID like any other, then the record written.
    pub(crate) fn commit_derived(&self, d: DerivedImage) -> Result<ImageRecord, ImageError> {
        let name = normalize_name(&d.name)?;
        let mut dirty = false;
        let result = {
            let _committing = self.read_lock();
            let mut staged = Vec::with_capacity(d.base.layers.len() + 1);
            let mut ok = Ok(());
            for layer in &d.base.layers {
                let path = self
                    .blob_dir()
                    .join(sha256_hex(&layer.digest).unwrap_or_default());
                match blob_facts(&path) {
                    Ok((size, compression)) => staged.push(StagedLayer {
                        path,
                        digest: layer.digest.clone(),
                        size,
                        compression,
                        in_content: true,
                        check_diff_id: false,
                    }),
                    Err(e) => {
                        ok = Err(e);
                        break;
                    }
                }
            }
            ok.and_then(|()| {
                if let Some((path, digest)) = d.layer {
                    let (size, compression) = blob_facts(&path)?;
                    staged.push(StagedLayer {
                        path,
                        digest,
                        size,
                        compression,
                        in_content: false,
                        check_diff_id: true,
                    });
                }
                self.assemble(
                    Assembled {
                        name: &name,
                        origin: &d.origin,
                        staged,
                        config_digest: d.config_digest,
                        config_bytes: d.config_bytes,
                        config: d.config,
                        manifest: Some((d.manifest_digest, d.manifest_bytes)),
                        index_digest: None,
                        source: d.base.source.clone(),
                    },
                    &mut dirty,
                )
            })
        };
        self.after_write(result, dirty)
    }
}

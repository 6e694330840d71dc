//! Recording an image made from a stored one plus one new layer (a
//! sandbox commit).

use std::path::PathBuf;

use oci_spec::image::ImageConfiguration;

use super::assemble::{Assembled, StagedLayer};
use super::blobs::blob_facts;
use super::ImageStore;
use crate::digest::sha256_hex;
use crate::error::ImageError;
use crate::record::ImageRecord;
use crate::reference::normalize_name;

/// An image made of a stored image plus one new layer; see
/// [`ImageStore::commit_derived`].
pub(crate) struct DerivedImage {
    pub name: String,
    pub origin: String,
    pub base: ImageRecord,
    /// The new layer's blob, in the store's `tmp/`.
    pub layer_path: PathBuf,
    pub layer_digest: String,
    pub config_digest: String,
    pub config_bytes: Vec<u8>,
    pub config: ImageConfiguration,
    pub manifest_digest: String,
    pub manifest_bytes: Vec<u8>,
}

impl ImageStore {
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
                let (size, compression) = blob_facts(&d.layer_path)?;
                staged.push(StagedLayer {
                    path: d.layer_path,
                    digest: d.layer_digest,
                    size,
                    compression,
                    in_content: false,
                    check_diff_id: true,
                });
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

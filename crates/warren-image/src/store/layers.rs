//! Where an image's unpacked layers are, for overlay mounts.

use std::path::PathBuf;

use super::ImageStore;
use crate::error::ImageError;
use crate::record::ImageRecord;

impl ImageStore {
    /// Absolute paths of the image's unpacked layers for overlay `lowerdir`,
    /// topmost layer first. Empty for an image without layers.
    pub fn lower_dirs(&self, image: &ImageRecord) -> Result<Vec<PathBuf>, ImageError> {
        let mut dirs = Vec::with_capacity(image.layers.len());
        for layer in image.layers.iter().rev() {
            let path = self
                .snapshots
                .get(&layer.chain_id)
                .map(|s| self.snapshots.fs_path(s.id))
                .filter(|p| p.is_dir())
                .ok_or_else(|| {
                    ImageError::NotFound(format!(
                        "layer {} of image {} (chain {}) is not unpacked in the store; the \
                         image was removed meanwhile or the store is damaged, re-import it",
                        layer.digest, image.name, layer.chain_id
                    ))
                })?;
            dirs.push(path);
        }
        Ok(dirs)
    }
}

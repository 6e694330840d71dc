//! `FROM scratch`: the empty image a build may start from. It has one
//! empty layer (a sandbox needs a lower directory to stand on) and a config
//! with nothing set; it is made once per store, as an OCI layout archive
//! imported like any other, and kept as a build step.

use std::fs;
use std::io;

use crate::digest::sha256_digest;
use crate::error::{ImageError, IoContext};
use crate::fsutil::unique_name;
use crate::record::ImageRecord;
use crate::store::ImageStore;

/// The OCI name of this machine's architecture.
fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

impl ImageStore {
    /// The empty image, made the first time it is asked for.
    pub fn scratch(&self) -> Result<ImageRecord, ImageError> {
        // Keyed like a build step by what it is: the same on every node.
        let key = sha256_digest(b"warren scratch v1")
            .trim_start_matches("sha256:")
            .to_string();
        let name = crate::steps::step_name(&key).unwrap_or_default();
        if let Ok(record) = self.resolve(&name) {
            return Ok(record);
        }
        let layer = tar::Builder::new(Vec::new())
            .into_inner()
            .map_err(|e| ImageError::io("making the empty layer", e))?;
        let layer_digest = sha256_digest(&layer);
        let config = serde_json::json!({
            "architecture": oci_arch(),
            "os": "linux",
            "config": {},
            "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
            "history": [{"created_by": "FROM scratch", "comment": "warren build"}],
        });
        let config = serde_json::to_vec(&config)
            .map_err(|e| ImageError::io("encoding the scratch config", io::Error::other(e)))?;
        let config_digest = sha256_digest(&config);
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config.len()},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_digest, "size": layer.len()}],
        });
        let manifest = serde_json::to_vec(&manifest)
            .map_err(|e| ImageError::io("encoding the scratch manifest", io::Error::other(e)))?;
        let manifest_digest = sha256_digest(&manifest);
        let index = serde_json::json!({
            "schemaVersion": 2,
            "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": manifest_digest, "size": manifest.len()}],
        });
        let mut archive = tar::Builder::new(Vec::new());
        let index = serde_json::to_vec(&index)
            .map_err(|e| ImageError::io("encoding the scratch index", io::Error::other(e)))?;
        let files: [(String, &[u8]); 5] = [
            ("oci-layout".into(), br#"{"imageLayoutVersion":"1.0.0"}"#),
            ("index.json".into(), &index),
            (blob_path(&layer_digest), &layer),
            (blob_path(&config_digest), &config),
            (blob_path(&manifest_digest), &manifest),
        ];
        for (path, bytes) in files {
            let mut h = tar::Header::new_gnu();
            h.set_size(bytes.len() as u64);
            h.set_mode(0o644);
            archive
                .append_data(&mut h, path, bytes)
                .map_err(|e| ImageError::io("making the scratch archive", e))?;
        }
        let bytes = archive
            .into_inner()
            .map_err(|e| ImageError::io("making the scratch archive", e))?;
        let path = self.tmp_dir().join(unique_name("scratch-"));
        fs::write(&path, bytes).ctx(|| format!("writing {}", path.display()))?;
        let result = self.import_archive(&path, &name);
        let _ = fs::remove_file(&path);
        result
    }
}

fn blob_path(digest: &str) -> String {
    format!("blobs/sha256/{}", digest.trim_start_matches("sha256:"))
}

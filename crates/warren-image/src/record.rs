//! The JSON records the store keeps per image name.

use oci_spec::image::ImageConfiguration;
use serde::{Deserialize, Serialize};

/// One imported image under one name.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct ImageRecord {
    /// Normalised `repo:tag`.
    pub name: String,
    /// Manifest digest `sha256:...`. For a docker-archive, the digest of the
    /// canonical OCI manifest synthesised at import.
    pub digest: String,
    /// Image config digest `sha256:...` (Docker's "image ID").
    pub config_digest: String,
    /// Sum of the unpacked layers' regular-file bytes.
    pub size: u64,
    /// RFC 3339 time of the import.
    pub created: String,
    /// Base layer first, as in the manifest.
    pub layers: Vec<LayerRecord>,
    pub config: ImageConfig,
    /// For an image pulled through a manifest list (a multi-platform tag),
    /// the list's digest: what the tag resolves to at the registry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index_digest: Option<String>,
    /// `registry/repository` the layers came from (a pull's, or for a
    /// commit its base image's): a push to another repository of that
    /// registry mounts them from there instead of uploading them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct LayerRecord {
    /// Digest of the layer blob as stored (compressed or not).
    pub digest: String,
    /// sha256 of the uncompressed layer tar.
    pub diff_id: String,
    pub chain_id: String,
    /// Snapshot number: the layer is unpacked at `snapshots/<n>/fs`.
    pub snapshot: u64,
    /// Regular-file bytes in this layer once unpacked.
    pub size: u64,
}

/// The runtime defaults from the image config that a sandbox needs.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct ImageConfig {
    pub env: Vec<String>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    pub working_dir: String,
    pub user: String,
}

impl ImageConfig {
    pub(crate) fn from_oci(config: &ImageConfiguration) -> ImageConfig {
        let Some(c) = config.config() else {
            return ImageConfig::default();
        };
        ImageConfig {
            env: c.env().clone().unwrap_or_default(),
            entrypoint: c.entrypoint().clone().unwrap_or_default(),
            cmd: c.cmd().clone().unwrap_or_default(),
            working_dir: c.working_dir().clone().unwrap_or_default(),
            user: c.user().clone().unwrap_or_default(),
        }
    }
}

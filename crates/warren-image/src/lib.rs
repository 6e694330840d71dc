//! Warren's image store: imports OCI image-layout and docker-archive tars,
//! pulls from OCI Distribution registries (see [`Puller`]),
//! verifies every blob and layer against its digest, unpacks each layer once
//! per ChainID into an overlayfs-ready directory (whiteouts converted, unsafe
//! entries refused) and keeps one JSON record per image name.
//!
//! The API is synchronous; async callers run it in `spawn_blocking`.
//! Unpacking needs root (whiteouts are device nodes, opaque directories use
//! `trusted.*` xattrs).
//!
//! ```no_run
//! use std::path::Path;
//! use warren_image::ImageStore;
//!
//! let store = ImageStore::open(Path::new("/var/lib/warren/images"))?;
//! let image = store.import_archive(Path::new("python.tar"), "python:3.12")?;
//! // Topmost layer first, ready for `lowerdir=` (joined with ':').
//! let lowers = store.lower_dirs(&store.resolve("python:3.12")?)?;
//! assert_eq!(lowers.len(), image.layers.len());
//! # Ok::<(), warren_image::ImageError>(())
//! ```

#![forbid(unsafe_code)]

mod archive;
mod commit;
mod compress;
mod confine;
mod digest;
mod error;
mod fsutil;
mod layout;
mod pull;
mod push;
mod record;
mod reference;
mod registry;
mod scratch;
mod session;
mod snapshot;
mod steps;
mod store;
mod time;
mod unpack;
mod whiteout;

pub use commit::{Derivation, Owners};
pub use error::{ErrorKind, ImageError};
pub use pull::{Progress, PullEvent, Puller};
pub use push::Pushed;
pub use record::{ImageConfig, ImageRecord, LayerRecord};
pub use registry::{RegistryConfig, CONFIG_FILE as REGISTRY_CONFIG_FILE};
pub use session::install_tls_provider;
pub use steps::{is_step_name, step_name};
pub use store::{ImageStore, Pin, PruneReport};

/// Entry points for the fuzz targets in `fuzz/`; not a stable API.
#[doc(hidden)]
pub mod fuzzing {
    use std::io::Read;
    use std::path::Path;

    use crate::ImageError;

    /// Applies one (gzip, zstd or plain) layer tar to the empty directory
    /// `dest` exactly as an import does; returns the layer's diffID.
    pub fn unpack_layer<R: Read>(blob: R, dest: &Path) -> Result<String, ImageError> {
        crate::unpack::unpack_layer(blob, dest, "fuzzed layer").map(|s| s.diff_id)
    }
}

//! The image store: content-addressed blobs, per-chain snapshots and one
//! JSON record per image name.
//!
//! ```text
//! <root>/lock                  flock'ed by the owning process
//! <root>/content/sha256/<hex>  verified blobs (manifests, configs, layers)
//! <root>/snapshots/<n>/fs      unpacked layers (overlay lowerdirs)
//! <root>/images/<name>.json    image records, name %-escaped
//! <root>/tmp/                  scratch; emptied at open
//! ```
//!
//! Imports run concurrently with each other; removal and garbage collection
//! exclude them (a `RwLock`: imports read, GC writes), so GC never deletes
//! a snapshot or blob that an import in flight is about to reference.

use std::collections::{HashMap, HashSet};
use std::fs::{self, File};
use std::io::{self, BufReader, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use oci_spec::image::{DescriptorBuilder, ImageConfiguration, ImageManifestBuilder, MediaType};

use crate::archive::SourceArchive;
use crate::compress::{self, Compression};
use crate::digest::{chain_ids, copy_hashed, sha256_digest, sha256_hex, CopyError, HashingReader};
use crate::error::{ImageError, IoContext};
use crate::fsutil::{fsync_dir, remove_path, unique_name, write_atomic};
use crate::layout::{self, Format};
use crate::record::{ImageConfig, ImageRecord, LayerRecord};
use crate::reference::{escape_name, normalize_name, parse_reference, Reference};
use crate::snapshot::Snapshots;
use crate::unpack::unpack_layer;

/// Content-addressed image store rooted at one directory. All methods block;
/// async callers should use `spawn_blocking`. One process may open a root
/// at a time.
pub struct ImageStore {
    root: PathBuf,
    snapshots: Snapshots,
    gc_lock: RwLock<()>,
    /// Blobs (`blob:<hex>`) and snapshots (`chain:<id>`) that garbage
    /// collection must keep although no record names them: content of a
    /// pull in flight, and images live sandboxes run after their name moved
    /// on to a new digest. Counted, since several holders can share a key.
    pins: Mutex<HashMap<String, usize>>,
    /// Held for the store's lifetime: the flock lives as long as the fd.
    _lock_file: File,
}

/// A layer blob ready to be committed to the content store.
struct StagedLayer {
    path: PathBuf,
    digest: String,
    size: u64,
    compression: Compression,
    /// Already in `content/`, nothing to move.
    in_content: bool,
    /// Check the blob against its diffID even when the layer's snapshot
    /// already exists: its bytes were never matched to that diffID.
    check_diff_id: bool,
}

/// Everything the last phases of an import or pull need: the verified
/// config and manifest, and the layer blobs, staged or in the content store.
struct Assembled<'a> {
    name: &'a str,
    /// Where the image came from, for messages: an archive path or a
    /// registry reference.
    origin: &'a str,
    staged: Vec<StagedLayer>,
    config_digest: String,
    config_bytes: Vec<u8>,
    config: ImageConfiguration,
    /// None for a docker-archive: a canonical OCI manifest is synthesised.
    manifest: Option<(String, Vec<u8>)>,
    index_digest: Option<String>,
    source: Option<String>,
}

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

/// What [`ImageStore::prune`] did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PruneReport {
    /// Image names removed to meet the budget, oldest first.
    pub removed: Vec<String>,
    pub used_before: u64,
    pub used_after: u64,
}

/// Keeps content from garbage collection while it lives.
pub struct Pin {
    store: Arc<ImageStore>,
    keys: Vec<String>,
}

impl Drop for Pin {
    fn drop(&mut self) {
        let mut pins = self.store.pins.lock().unwrap_or_else(|p| p.into_inner());
        for key in &self.keys {
            if let Some(n) = pins.get_mut(key) {
                *n -= 1;
                if *n == 0 {
                    pins.remove(key);
                }
            }
        }
    }
}

pub(crate) fn blob_key(hex: &str) -> String {
    format!("blob:{hex}")
}

fn chain_key(chain_id: &str) -> String {
    format!("chain:{chain_id}")
}

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
    /// Opens (creating if needed) the store at `root` and recovers from a
    /// crash: scratch files and half-built snapshots are deleted, and
    /// snapshots and blobs no image references are collected.
    pub fn open(root: &Path) -> Result<ImageStore, ImageError> {
        let created = !root.exists();
        fs::create_dir_all(root).ctx(|| format!("creating image store root {}", root.display()))?;
        let root = root
            .canonicalize()
            .ctx(|| format!("resolving image store root {}", root.display()))?;
        for sub in ["content/sha256", "snapshots", "images", "tmp"] {
            let dir = root.join(sub);
            fs::create_dir_all(&dir).ctx(|| format!("creating {}", dir.display()))?;
        }
        // Unpacked layers hold setuid binaries and device-free but otherwise
        // arbitrary trees: keep unprivileged users out of them.
        let mut private = vec![root.join("snapshots"), root.join("tmp")];
        if created {
            private.push(root.clone());
        }
        for dir in private {
            fs::set_permissions(&dir, fs::Permissions::from_mode(0o700))
                .ctx(|| format!("restricting permissions of {}", dir.display()))?;
        }

        let lock_path = root.join("lock");
        let lock_file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .ctx(|| format!("opening {}", lock_path.display()))?;
        match rustix::fs::flock(
            &lock_file,
            rustix::fs::FlockOperation::NonBlockingLockExclusive,
        ) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => {
                return Err(ImageError::Conflict(format!(
                    "image store {} is in use by another process or store instance (lock {}); \
                     stop it or use a different root",
                    root.display(),
                    lock_path.display()
                )))
            }
            Err(e) => {
                return Err(ImageError::io(
                    format!("locking {}", lock_path.display()),
                    e.into(),
                ))
            }
        }

        let tmp = root.join("tmp");
        for entry in fs::read_dir(&tmp).ctx(|| format!("listing {}", tmp.display()))? {
            let path = entry.ctx(|| format!("listing {}", tmp.display()))?.path();
            remove_path(&path).ctx(|| format!("removing leftover {}", path.display()))?;
        }
        let snapshots = Snapshots::load(&root.join("snapshots"))?;
        let store = ImageStore {
            root,
            snapshots,
            gc_lock: RwLock::new(()),
            pins: Mutex::new(HashMap::new()),
            _lock_file: lock_file,
        };
        store.collect_garbage();
        Ok(store)
    }

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

    /// Ends an import, pull or commit: the boolean says whether it replaced
    /// an older record (whose content may now be unreferenced). Snapshots or
    /// blobs a failed write committed are referenced by nothing unless a
    /// concurrent write reused them; GC sorts that out under the exclusive
    /// lock.
    fn after_write<T>(
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

    /// All images, sorted by name. Unreadable records are skipped (and
    /// logged) so one damaged file does not hide every image.
    pub fn list(&self) -> Result<Vec<ImageRecord>, ImageError> {
        self.load_records(false)
    }

    /// Finds an image by `repo:tag`, `repo` (= `repo:latest`), `sha256:<hex>`
    /// or a unique digest prefix of at least 12 hex digits (with or without
    /// `sha256:`). When several names share a digest, the first by name is
    /// returned.
    pub fn resolve(&self, reference: &str) -> Result<ImageRecord, ImageError> {
        self.lookup(reference).map(|(record, _)| record)
    }

    /// Removes the image name, then every blob and snapshot that no
    /// remaining image references. A digest reference that matches several
    /// names is refused: remove the names one by one.
    pub fn remove(&self, reference: &str) -> Result<ImageRecord, ImageError> {
        let _exclusive = self.write_lock();
        let (record, by_digest) = self.lookup(reference)?;
        if by_digest {
            let names: Vec<String> = self
                .load_records(false)?
                .into_iter()
                .filter(|r| r.digest == record.digest)
                .map(|r| r.name)
                .collect();
            if names.len() > 1 {
                return Err(ImageError::Conflict(format!(
                    "image {} is tagged {}; remove each name instead of the digest",
                    record.digest,
                    names.join(", ")
                )));
            }
        }
        let path = self.record_path(&record.name);
        fs::remove_file(&path).ctx(|| format!("removing image record {}", path.display()))?;
        fsync_dir(&self.images_dir())?;
        if let Err(e) = self.gc_locked() {
            tracing::warn!(error = %e, "image removed but garbage collection failed; it is retried at the next open or removal");
        }
        Ok(record)
    }

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

    /// Phases 2 and 3 of an import or pull: unpack each layer once per
    /// ChainID (checking its diffID), commit the blobs, then write the
    /// record. The bool says whether the record replaced another digest.
    fn assemble(
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

    /// Writes `record` under its name; true when that replaced a record of
    /// another digest (whose content may now be garbage).
    fn write_record(&self, record: &ImageRecord) -> Result<bool, ImageError> {
        let previous = self.read_record(&record.name).ok().flatten();
        let bytes = serde_json::to_vec_pretty(record)
            .map_err(|e| ImageError::io("encoding image record", io::Error::other(e)))?;
        write_atomic(&self.record_path(&record.name), &bytes, &self.tmp_dir())?;
        let Some(previous) = previous.filter(|p| p.digest != record.digest) else {
            return Ok(false);
        };
        // A sandbox still runs the image the name named until now: keep it
        // reachable as repo@digest, so a restart (whose pins start empty)
        // neither collects its layers nor fails to adopt the sandbox.
        if self.is_pinned(&previous.digest) && !previous.name.contains('@') {
            let repo = previous
                .name
                .rsplit_once(':')
                .map_or(previous.name.as_str(), |(repo, _)| repo);
            let kept = ImageRecord {
                name: format!("{repo}@{}", previous.digest),
                ..previous.clone()
            };
            let bytes = serde_json::to_vec_pretty(&kept)
                .map_err(|e| ImageError::io("encoding image record", io::Error::other(e)))?;
            write_atomic(&self.record_path(&kept.name), &bytes, &self.tmp_dir())?;
            tracing::info!(name = %kept.name, "image still in use kept under its digest");
        }
        Ok(true)
    }

    fn is_pinned(&self, digest: &str) -> bool {
        sha256_hex(digest).is_some_and(|hex| {
            self.pins
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains_key(&blob_key(hex))
        })
    }

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

    /// Keeps `record`'s layers and blobs from garbage collection while the
    /// returned pin lives, even once no name refers to that digest.
    pub fn pin_image(self: &Arc<Self>, record: &ImageRecord) -> Pin {
        let mut keys: Vec<String> = record
            .layers
            .iter()
            .map(|l| chain_key(&l.chain_id))
            .collect();
        for d in record
            .layers
            .iter()
            .map(|l| &l.digest)
            .chain([&record.digest, &record.config_digest])
        {
            if let Some(hex) = sha256_hex(d) {
                keys.push(blob_key(hex));
            }
        }
        self.pin_keys(keys)
    }

    /// Pins keys (see `pins`). Taken under the GC lock, so a collection
    /// either finished before (and the caller sees what it removed) or
    /// starts after and sees the pin.
    pub(crate) fn pin_keys(self: &Arc<Self>, keys: Vec<String>) -> Pin {
        let _no_gc = self.read_lock();
        let mut pins = self.pins.lock().unwrap_or_else(|p| p.into_inner());
        for key in &keys {
            *pins.entry(key.clone()).or_insert(0) += 1;
        }
        drop(pins);
        Pin {
            store: self.clone(),
            keys,
        }
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

    fn commit_staged(&self, blob: &StagedLayer) -> Result<(), ImageError> {
        let hex = sha256_hex(&blob.digest).unwrap_or_default();
        let dest = self.blob_dir().join(hex);
        if dest.is_file() {
            return remove_path(&blob.path).ctx(|| format!("removing {}", blob.path.display()));
        }
        fs::rename(&blob.path, &dest)
            .ctx(|| format!("moving {} to {}", blob.path.display(), dest.display()))
    }

    fn put_blob(&self, digest: &str, bytes: &[u8]) -> Result<(), ImageError> {
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

    /// The record a reference names, and whether it was found by digest.
    fn lookup(&self, reference: &str) -> Result<(ImageRecord, bool), ImageError> {
        match parse_reference(reference)? {
            Reference::Name(name) => self
                .read_record(&name)?
                .map(|r| (r, false))
                .ok_or_else(|| not_found(reference)),
            Reference::Digest(hex) => Ok((self.by_digest(&hex, reference)?, true)),
            Reference::NameOrDigest(name, hex) => match self.read_record(&name)? {
                Some(record) => Ok((record, false)),
                None => Ok((self.by_digest(&hex, reference)?, true)),
            },
        }
    }

    fn by_digest(&self, prefix: &str, reference: &str) -> Result<ImageRecord, ImageError> {
        let matches: Vec<ImageRecord> = self
            .load_records(false)?
            .into_iter()
            .filter(|r| sha256_hex(&r.digest).is_some_and(|h| h.starts_with(prefix)))
            .collect();
        let digests: HashSet<&str> = matches.iter().map(|r| r.digest.as_str()).collect();
        if digests.len() > 1 {
            let mut listed: Vec<&str> = digests.into_iter().collect();
            listed.sort_unstable();
            return Err(ImageError::Conflict(format!(
                "{reference} matches several images ({}); give more digits",
                listed.join(", ")
            )));
        }
        // load_records sorts by name, so this is the first name.
        matches
            .into_iter()
            .next()
            .ok_or_else(|| not_found(reference))
    }

    fn read_record(&self, name: &str) -> Result<Option<ImageRecord>, ImageError> {
        let path = self.record_path(name);
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(ImageError::io(format!("reading {}", path.display()), e)),
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|source| ImageError::CorruptStore {
                context: format!(
                    "image record {} is damaged; remove the file and re-import the image",
                    path.display()
                ),
                source,
            })
    }

    /// Records sorted by name. `strict` fails on a damaged record (GC must
    /// know every reference); otherwise damaged records are skipped.
    fn load_records(&self, strict: bool) -> Result<Vec<ImageRecord>, ImageError> {
        let dir = self.images_dir();
        let mut records = Vec::new();
        for entry in fs::read_dir(&dir).ctx(|| format!("listing {}", dir.display()))? {
            let path = entry.ctx(|| format!("listing {}", dir.display()))?.path();
            if path.extension().is_none_or(|e| e != "json") {
                continue;
            }
            let parsed = fs::read(&path)
                .ctx(|| format!("reading {}", path.display()))
                .and_then(|b| {
                    serde_json::from_slice::<ImageRecord>(&b).map_err(|source| {
                        ImageError::CorruptStore {
                            context: format!(
                                "image record {} is damaged; remove the file and re-import the \
                                 image",
                                path.display()
                            ),
                            source,
                        }
                    })
                });
            match parsed {
                Ok(r) => records.push(r),
                Err(e) if strict => return Err(e),
                Err(e) => tracing::warn!(error = %e, "skipping unreadable image record"),
            }
        }
        records.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(records)
    }

    /// Bytes the store holds: blob files plus the regular-file bytes of the
    /// unpacked layers.
    pub fn disk_usage(&self) -> Result<u64, ImageError> {
        let dir = self.blob_dir();
        let mut total = 0;
        for entry in fs::read_dir(&dir).ctx(|| format!("listing {}", dir.display()))? {
            let entry = entry.ctx(|| format!("listing {}", dir.display()))?;
            total += entry.metadata().map(|m| m.len()).unwrap_or(0);
        }
        Ok(total
            + self
                .snapshots
                .all()
                .iter()
                .map(|s| s.meta.size)
                .sum::<u64>())
    }

    /// Collects unreferenced content, then, while the store holds more than
    /// `budget` bytes, removes registry images (they can be pulled again)
    /// oldest first; images that live sandboxes run and imported images
    /// (no registry to pull them back from) are never removed.
    pub fn prune(&self, budget: Option<u64>) -> Result<PruneReport, ImageError> {
        let _exclusive = self.write_lock();
        let used_before = self.disk_usage()?;
        self.gc_locked()?;
        let mut removed = Vec::new();
        if let Some(budget) = budget {
            let pinned: HashSet<String> = self.pinned();
            let mut candidates: Vec<ImageRecord> = self
                .load_records(true)?
                .into_iter()
                // Registry images can be pulled again; `repo@digest` records
                // are retired names kept for a sandbox that has since ended.
                .filter(|r| {
                    crate::registry::registry_host(&r.name).is_some() || r.name.contains('@')
                })
                .filter(|r| {
                    sha256_hex(&r.digest).is_some_and(|hex| !pinned.contains(&blob_key(hex)))
                })
                .collect();
            candidates.sort_by(|a, b| a.created.cmp(&b.created));
            for record in candidates {
                if self.disk_usage()? <= budget {
                    break;
                }
                let path = self.record_path(&record.name);
                fs::remove_file(&path)
                    .ctx(|| format!("removing image record {}", path.display()))?;
                fsync_dir(&self.images_dir())?;
                self.gc_locked()?;
                tracing::info!(name = %record.name, digest = %record.digest, "image pruned to meet the disk budget");
                removed.push(record.name);
            }
        }
        Ok(PruneReport {
            removed,
            used_before,
            used_after: self.disk_usage()?,
        })
    }

    /// Removes blobs and snapshots that no record and no pin refers to.
    pub fn collect_garbage(&self) {
        let _exclusive = self.write_lock();
        if let Err(e) = self.gc_locked() {
            tracing::warn!(error = %e, "garbage collection failed; it is retried at the next open or removal");
        }
    }

    /// Names of images a live or kept sandbox uses.
    fn pinned(&self) -> HashSet<String> {
        self.pins
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect()
    }

    /// Deletes snapshots and blobs no record references. Callers hold the
    /// exclusive lock.
    fn gc_locked(&self) -> Result<(), ImageError> {
        let records = self.load_records(true)?;
        let pinned: HashSet<String> = self.pinned();
        let mut chains = HashSet::new();
        let mut blobs = HashSet::new();
        for r in &records {
            for d in [&r.digest, &r.config_digest] {
                if let Some(hex) = sha256_hex(d) {
                    blobs.insert(hex.to_string());
                }
            }
            for l in &r.layers {
                chains.insert(l.chain_id.clone());
                if let Some(hex) = sha256_hex(&l.digest) {
                    blobs.insert(hex.to_string());
                }
            }
        }
        for snapshot in self.snapshots.all() {
            if !chains.contains(&snapshot.meta.chain_id)
                && !pinned.contains(&chain_key(&snapshot.meta.chain_id))
            {
                tracing::info!(chain = %snapshot.meta.chain_id, id = snapshot.id, "removing unreferenced snapshot");
                self.snapshots.remove(&snapshot.meta.chain_id)?;
            }
        }
        let dir = self.blob_dir();
        for entry in fs::read_dir(&dir).ctx(|| format!("listing {}", dir.display()))? {
            let entry = entry.ctx(|| format!("listing {}", dir.display()))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if !blobs.contains(&name) && !pinned.contains(&blob_key(&name)) {
                let path = entry.path();
                remove_path(&path)
                    .ctx(|| format!("removing unreferenced blob {}", path.display()))?;
            }
        }
        Ok(())
    }

    fn read_lock(&self) -> RwLockReadGuard<'_, ()> {
        self.gc_lock.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write_lock(&self) -> RwLockWriteGuard<'_, ()> {
        self.gc_lock.write().unwrap_or_else(|p| p.into_inner())
    }

    fn blob_dir(&self) -> PathBuf {
        self.root.join("content/sha256")
    }

    fn images_dir(&self) -> PathBuf {
        self.root.join("images")
    }

    pub(crate) fn tmp_dir(&self) -> PathBuf {
        self.root.join("tmp")
    }

    fn record_path(&self, name: &str) -> PathBuf {
        self.images_dir()
            .join(format!("{}.json", escape_name(name)))
    }
}

fn not_found(reference: &str) -> ImageError {
    ImageError::NotFound(format!(
        "image {reference:?} not found in the store; import it first or check the name"
    ))
}

/// Size and compression of a stored blob.
fn blob_facts(path: &Path) -> Result<(u64, Compression), ImageError> {
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

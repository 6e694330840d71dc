//! Task images: a sandbox's filesystem changes (its overlay upper
//! directory) become one new layer on top of its image.
//!
//! The upper directory is overlayfs' own record of the changes: a 0:0
//! character device means "deleted" and `trusted.overlay.opaque=y` means
//! "replaces the lower directory". They are written back as OCI whiteouts
//! (`.wh.<name>`, `.wh..wh..opq`), the inverse of what unpacking does, so
//! the layer means the same on any runtime. The layer is gzip-compressed
//! (the format every registry and runtime accepts) at the fastest level:
//! a commit is on the path of a task loop, a push happens once.

use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use flate2::write::GzEncoder;
use sha2::{Digest as _, Sha256};

use crate::digest::sha256_digest;
use crate::error::{ImageError, IoContext};
use crate::fsutil::unique_name;
use crate::layout::parse_config_from;
use crate::record::ImageRecord;
use crate::store::{DerivedImage, ImageStore};
use crate::whiteout::OPAQUE_XATTR;
use warren_core::build::ImageSettings;

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const OCI_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// Hashes and counts what passes through to `inner`.
struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    count: u64,
}

impl<W: Write> HashingWriter<W> {
    fn new(inner: W) -> Self {
        HashingWriter {
            inner,
            hasher: Sha256::new(),
            count: 0,
        }
    }

    fn finish(self) -> (W, String, u64) {
        let digest = format!("sha256:{}", hex::encode(self.hasher.finalize()));
        (self.inner, digest, self.count)
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// What a layer blob written by [`write_layer`] is.
pub(crate) struct LayerBlob {
    pub digest: String,
    pub diff_id: String,
    pub size: u64,
}

/// How the upper directory's host owners become the layer's owners.
#[derive(Clone, Copy, Debug)]
pub struct Owners {
    /// Host uid and gid of the sandbox's root when it ran in a user
    /// namespace (its range is 65536 ids from there); None when it shared
    /// the host's ids.
    pub root: Option<u32>,
}

impl Owners {
    pub const HOST: Owners = Owners { root: None };

    /// The id the sandbox saw: a host id outside its range showed as the
    /// overflow id 65534 (nobody), and is written so.
    fn inside(&self, host: u32) -> u64 {
        match self.root {
            None => host.into(),
            Some(root) => match host.checked_sub(root) {
                Some(id) if id < 65536 => id.into(),
                _ => 65534,
            },
        }
    }
}

/// Writes `upper` as a gzip layer tar to `dest`.
pub(crate) fn write_layer(
    upper: &Path,
    owners: Owners,
    dest: &Path,
) -> Result<LayerBlob, ImageError> {
    let file = File::create_new(dest).ctx(|| format!("creating {}", dest.display()))?;
    let compressed = HashingWriter::new(io::BufWriter::new(file));
    let gz = GzEncoder::new(compressed, flate2::Compression::fast());
    let mut tar = tar::Builder::new(HashingWriter::new(gz));
    tar.mode(tar::HeaderMode::Complete);
    tar.follow_symlinks(false);
    append_dir(&mut tar, upper, Path::new(""), owners)?;
    let write_err = |e: io::Error| ImageError::io(format!("writing layer {}", dest.display()), e);
    let (gz, diff_id, _) = tar.into_inner().map_err(write_err)?.finish();
    let (buffered, digest, size) = gz.finish().map_err(write_err)?.finish();
    let file = buffered
        .into_inner()
        .map_err(|e| write_err(e.into_error()))?;
    file.sync_all()
        .ctx(|| format!("syncing {}", dest.display()))?;
    Ok(LayerBlob {
        digest,
        diff_id,
        size,
    })
}

/// Appends the children of `dir` (at `rel` in the layer), sorted so the
/// same changes always make the same layer.
fn append_dir<W: Write>(
    tar: &mut tar::Builder<W>,
    dir: &Path,
    rel: &Path,
    owners: Owners,
) -> Result<(), ImageError> {
    let mut entries: Vec<PathBuf> = fs::read_dir(dir)
        .ctx(|| format!("listing {}", dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .ctx(|| format!("listing {}", dir.display()))?;
    entries.sort();
    let write_err = |path: &Path, e: io::Error| {
        ImageError::io(format!("adding {} to the layer", path.display()), e)
    };
    for path in entries {
        let Some(name) = path.file_name() else {
            continue;
        };
        let at = rel.join(name);
        let meta = fs::symlink_metadata(&path).ctx(|| format!("reading {}", path.display()))?;
        let ft = meta.file_type();
        let mut header = tar::Header::new_gnu();
        header.set_metadata_in_mode(&meta, tar::HeaderMode::Complete);
        header.set_uid(owners.inside(meta.uid()));
        header.set_gid(owners.inside(meta.gid()));
        if ft.is_char_device() && meta.rdev() == 0 {
            // overlayfs' whiteout: the lower file is deleted.
            let mut wh_name = std::ffi::OsString::from(".wh.");
            wh_name.push(name);
            header.set_entry_type(tar::EntryType::Regular);
            header.set_size(0);
            header.set_mode(0o600);
            tar.append_data(&mut header, rel.join(wh_name), io::empty())
                .map_err(|e| write_err(&path, e))?;
        } else if ft.is_dir() {
            tar.append_data(&mut header, &at, io::empty())
                .map_err(|e| write_err(&path, e))?;
            if is_opaque(&path)? {
                let mut opq = tar::Header::new_gnu();
                opq.set_entry_type(tar::EntryType::Regular);
                opq.set_size(0);
                opq.set_mode(0o600);
                opq.set_uid(0);
                opq.set_gid(0);
                opq.set_mtime(meta.mtime().max(0) as u64);
                tar.append_data(&mut opq, at.join(".wh..wh..opq"), io::empty())
                    .map_err(|e| write_err(&path, e))?;
            }
            append_dir(tar, &path, &at, owners)?;
        } else if ft.is_file() {
            let file = File::open(&path).ctx(|| format!("opening {}", path.display()))?;
            tar.append_data(&mut header, &at, file)
                .map_err(|e| write_err(&path, e))?;
        } else if ft.is_symlink() {
            let target = fs::read_link(&path).ctx(|| format!("reading link {}", path.display()))?;
            tar.append_link(&mut header, &at, &target)
                .map_err(|e| write_err(&path, e))?;
        } else if ft.is_fifo() {
            header.set_size(0);
            tar.append_data(&mut header, &at, io::empty())
                .map_err(|e| write_err(&path, e))?;
        } else {
            // Sockets cannot be archived and device nodes would be refused
            // by every unpacker (ours included); the sandbox cannot make
            // the latter anyway (no CAP_MKNOD).
            tracing::warn!(path = %path.display(), "not committed: sockets and device nodes are not part of images");
        }
    }
    Ok(())
}

fn is_opaque(dir: &Path) -> Result<bool, ImageError> {
    let mut buf = [0u8; 8];
    match rustix::fs::lgetxattr(dir, OPAQUE_XATTR, &mut buf) {
        Ok(n) => Ok(&buf[..n] == b"y"),
        Err(rustix::io::Errno::NODATA) | Err(rustix::io::Errno::NOTSUP) => Ok(false),
        Err(e) => Err(ImageError::io(
            format!("reading {OPAQUE_XATTR} of {}", dir.display()),
            e.into(),
        )),
    }
}

/// OCI media type of a base layer descriptor (Docker's names mapped), so
/// the committed image is one consistent OCI manifest.
fn oci_layer_type(media: &str) -> &str {
    match media {
        "application/vnd.docker.image.rootfs.diff.tar.gzip" => OCI_LAYER_GZIP,
        "application/vnd.docker.image.rootfs.diff.tar" => "application/vnd.oci.image.layer.v1.tar",
        other => other,
    }
}

/// How a derived image's config differs from its base's: the settings a
/// build step changes, and the history entry it adds.
pub struct Derivation<'a> {
    pub settings: Option<&'a ImageSettings>,
    /// The history's `created_by`: the command or instruction.
    pub created_by: &'a str,
    /// The history's `comment`: what made it (`warren commit`, `warren build`).
    pub comment: &'a str,
}

impl ImageStore {
    /// Turns `upper` (a sandbox's overlay upper directory, which must not
    /// change meanwhile: pause the sandbox) into a layer on top of `base`
    /// and records the result as `name`.
    pub fn commit_changes(
        &self,
        base: &ImageRecord,
        upper: &Path,
        owners: Owners,
        name: &str,
        how: &Derivation<'_>,
    ) -> Result<ImageRecord, ImageError> {
        let name = crate::reference::normalize_name(name)?;
        let tmp = self.tmp_dir().join(unique_name("commit-"));
        let blob = match write_layer(upper, owners, &tmp) {
            Ok(b) => b,
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                return Err(e);
            }
        };
        let result = self.derive_with(base, Some((tmp.clone(), blob)), how, &name);
        // Moved into content/ on success; left in tmp/ on failure.
        let _ = fs::remove_file(&tmp);
        result
    }

    /// Records `base` with its config changed (no new layer) as `name`.
    pub fn derive(
        &self,
        base: &ImageRecord,
        how: &Derivation<'_>,
        name: &str,
    ) -> Result<ImageRecord, ImageError> {
        let name = crate::reference::normalize_name(name)?;
        self.derive_with(base, None, how, &name)
    }

    fn derive_with(
        &self,
        base: &ImageRecord,
        layer: Option<(PathBuf, LayerBlob)>,
        how: &Derivation<'_>,
        name: &str,
    ) -> Result<ImageRecord, ImageError> {
        let base_config = self.read_blob(&base.config_digest)?;
        let base_manifest = self.read_blob(&base.digest)?;
        let corrupt = |what: &str, e: serde_json::Error| ImageError::CorruptStore {
            context: format!(
                "{what} of image {} in the store is not valid JSON; pull or import it again",
                base.name
            ),
            source: e,
        };
        let mut config: serde_json::Value =
            serde_json::from_slice(&base_config).map_err(|e| corrupt("the config", e))?;
        let manifest: serde_json::Value =
            serde_json::from_slice(&base_manifest).map_err(|e| corrupt("the manifest", e))?;

        let now = crate::time::now_rfc3339();
        config["created"] = now.clone().into();
        if let Some(settings) = how.settings {
            apply_settings(&mut config, settings);
        }
        let mut entry = serde_json::json!({
            "created": now,
            "created_by": how.created_by,
            "comment": how.comment,
        });
        match &layer {
            Some((_, blob)) => config["rootfs"]["diff_ids"]
                .as_array_mut()
                .ok_or_else(|| {
                    ImageError::InvalidImage(format!(
                        "image config {} has no rootfs.diff_ids",
                        base.config_digest
                    ))
                })?
                .push(blob.diff_id.clone().into()),
            None => entry["empty_layer"] = true.into(),
        }
        match config.get_mut("history").and_then(|h| h.as_array_mut()) {
            Some(history) => history.push(entry),
            None => config["history"] = serde_json::json!([entry]),
        }
        let config_bytes = serde_json::to_vec(&config)
            .map_err(|e| ImageError::io("encoding image config", io::Error::other(e)))?;
        let config_digest = sha256_digest(&config_bytes);
        let config_parsed = parse_config_from(&config_bytes, &config_digest, name)?;

        let mut layers: Vec<serde_json::Value> = manifest["layers"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .map(|mut l| {
                let media = l["mediaType"]
                    .as_str()
                    .map(oci_layer_type)
                    .map(str::to_string);
                if let Some(m) = media {
                    l["mediaType"] = m.into();
                }
                l
            })
            .collect();
        if let Some((_, blob)) = &layer {
            layers.push(serde_json::json!({
                "mediaType": OCI_LAYER_GZIP,
                "digest": blob.digest,
                "size": blob.size,
            }));
        }
        let new_manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {
                "mediaType": OCI_CONFIG,
                "digest": config_digest,
                "size": config_bytes.len(),
            },
            "layers": layers,
        });
        let manifest_bytes = serde_json::to_vec(&new_manifest)
            .map_err(|e| ImageError::io("encoding image manifest", io::Error::other(e)))?;
        let manifest_digest = sha256_digest(&manifest_bytes);
        self.commit_derived(DerivedImage {
            name: name.to_string(),
            origin: format!("{} {name}", how.comment),
            base: base.clone(),
            layer: layer.map(|(path, blob)| (path, blob.digest)),
            config_digest,
            config_bytes,
            config: config_parsed,
            manifest_digest,
            manifest_bytes,
        })
    }
}

/// Writes a build step's settings into an OCI image config.
fn apply_settings(config: &mut serde_json::Value, s: &ImageSettings) {
    if !config["config"].is_object() {
        config["config"] = serde_json::json!({});
    }
    let c = &mut config["config"];
    let list = |v: &Vec<String>| serde_json::Value::from(v.clone());
    if let Some(env) = &s.env {
        c["Env"] = list(env);
    }
    if let Some(entrypoint) = &s.entrypoint {
        c["Entrypoint"] = list(entrypoint);
    }
    if let Some(cmd) = &s.cmd {
        c["Cmd"] = list(cmd);
    }
    if let Some(dir) = &s.working_dir {
        c["WorkingDir"] = dir.clone().into();
    }
    if let Some(user) = &s.user {
        c["User"] = user.clone().into();
    }
    for (field, keys) in [
        (
            "Labels",
            s.labels
                .iter()
                .map(|(k, v)| (k, serde_json::Value::from(v.clone())))
                .collect::<Vec<_>>(),
        ),
        (
            "ExposedPorts",
            s.exposed_ports
                .iter()
                .map(|p| (p, serde_json::json!({})))
                .collect(),
        ),
    ] {
        if keys.is_empty() {
            continue;
        }
        if !c[field].is_object() {
            c[field] = serde_json::json!({});
        }
        for (k, v) in keys {
            c[field][k.as_str()] = v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_of_plain_changes_lists_them_sorted() {
        let dir = tempfile::tempdir().unwrap();
        let upper = dir.path().join("upper");
        fs::create_dir_all(upper.join("b/c")).unwrap();
        fs::write(upper.join("b/c/f"), b"hello").unwrap();
        fs::write(upper.join("a"), b"x").unwrap();
        std::os::unix::fs::symlink("a", upper.join("l")).unwrap();
        let dest = dir.path().join("layer.tar.gz");
        let blob = write_layer(&upper, Owners::HOST, &dest).unwrap();
        assert_eq!(blob.size, fs::metadata(&dest).unwrap().len());
        assert_eq!(blob.digest, sha256_digest(&fs::read(&dest).unwrap()));
        let raw = {
            let mut out = Vec::new();
            io::copy(
                &mut flate2::read::GzDecoder::new(File::open(&dest).unwrap()),
                &mut out,
            )
            .unwrap();
            out
        };
        assert_eq!(blob.diff_id, sha256_digest(&raw));
        let mut archive = tar::Archive::new(&raw[..]);
        let names: Vec<String> = archive
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        assert_eq!(names, ["a", "b", "b/c", "b/c/f", "l"]);
        // Same tree, same layer.
        let again = write_layer(&upper, Owners::HOST, &dir.path().join("again")).unwrap();
        assert_eq!(again.diff_id, blob.diff_id);
    }

    #[test]
    fn docker_layer_types_become_oci() {
        assert_eq!(
            oci_layer_type("application/vnd.docker.image.rootfs.diff.tar.gzip"),
            OCI_LAYER_GZIP
        );
        assert_eq!(
            oci_layer_type("application/vnd.oci.image.layer.v1.tar+zstd"),
            "application/vnd.oci.image.layer.v1.tar+zstd"
        );
    }
}

//! Finding the image inside an archive: OCI image layout or docker-archive.
//!
//! The result is a verified manifest (OCI only), a verified config and the
//! archive members holding each layer. Layers themselves are verified later,
//! while they are copied into the store.

use oci_spec::image::{Descriptor, ImageConfiguration, ImageIndex, ImageManifest, MediaType};
use serde::Deserialize;

use crate::archive::{blob_member, normalize, SourceArchive};
use crate::digest::{is_sha256_hex, sha256_digest, sha256_hex};
use crate::error::ImageError;

/// Upper bound for index, manifest and config documents. Real configs with
/// long histories stay far below this.
const JSON_LIMIT: u64 = 16 * 1024 * 1024;

/// Indexes nested deeper than this are refused (real ones nest once).
const MAX_INDEX_DEPTH: usize = 4;

const DOCKER_MANIFEST_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
const DOCKER_MANIFEST_V1: &str = "application/vnd.docker.distribution.manifest.v1+json";
const DOCKER_MANIFEST_V1_SIGNED: &str = "application/vnd.docker.distribution.manifest.v1+prettyjws";
const DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    OciLayout,
    DockerArchive,
}

pub(crate) struct Blob {
    pub digest: String,
    pub bytes: Vec<u8>,
}

pub(crate) struct LayerSource {
    /// Archive member holding the (possibly compressed) layer tar.
    pub member: String,
    /// Digest the stored bytes must have, when the archive states one.
    pub digest: Option<String>,
    /// Size the stored bytes must have, when the archive states one.
    pub size: Option<u64>,
}

pub(crate) struct ResolvedImage {
    pub format: Format,
    /// The manifest as found in an OCI layout; a docker-archive has none, so
    /// the store synthesises one once the layer digests are known.
    pub manifest: Option<Blob>,
    pub config: Blob,
    pub config_parsed: ImageConfiguration,
    pub layers: Vec<LayerSource>,
}

/// Detects the archive format and resolves the single image to import.
/// `name` is the normalised `repo:tag`, used to pick an image from a
/// docker-archive that holds several.
pub(crate) fn resolve(src: &SourceArchive, name: &str) -> Result<ResolvedImage, ImageError> {
    if src.contains("index.json") {
        resolve_oci(src, name)
    } else if src.contains("manifest.json") {
        resolve_docker(src, name)
    } else {
        Err(ImageError::InvalidArchive(format!(
            "{} has neither index.json (OCI image layout) nor manifest.json (docker-archive); \
             export the image with `skopeo copy ... oci-archive:FILE`, `docker save -o FILE` \
             or `podman save -o FILE`",
            src.display()
        )))
    }
}

fn resolve_oci(src: &SourceArchive, name: &str) -> Result<ResolvedImage, ImageError> {
    let index_bytes = src.read_small("index.json", JSON_LIMIT)?;
    let mut index: ImageIndex = parse_json(&index_bytes, "index.json", src)?;
    let mut where_ = "index.json".to_string();
    let mut depth = 0;
    let (manifest_digest, manifest_bytes) = loop {
        let desc = select_manifest(index.manifests(), name, &where_, src)?;
        let digest = desc.digest().to_string();
        let what = format!("manifest {digest} (listed in {where_})");
        let bytes = read_blob(src, &digest, Some(desc.size()), &what)?;
        if !is_index(desc.media_type(), &bytes) {
            break (digest, bytes);
        }
        depth += 1;
        if depth > MAX_INDEX_DEPTH {
            return Err(ImageError::InvalidArchive(format!(
                "{}: image indexes nest more than {MAX_INDEX_DEPTH} levels deep",
                src.display()
            )));
        }
        index = parse_json(&bytes, &format!("index {digest}"), src)?;
        where_ = format!("index {digest}");
    };

    refuse_schema1(&manifest_bytes, &manifest_digest, src)?;
    let manifest: ImageManifest =
        parse_json(&manifest_bytes, &format!("manifest {manifest_digest}"), src)?;

    let config_desc = manifest.config();
    match config_desc.media_type() {
        MediaType::ImageConfig => {}
        MediaType::Other(t) if t == DOCKER_CONFIG => {}
        other => {
            return Err(ImageError::InvalidArchive(format!(
                "{}: manifest {manifest_digest} has a config of type {other}; it is an OCI \
                 artifact, not a container image",
                src.display()
            )))
        }
    }
    let config_digest = config_desc.digest().to_string();
    let config_bytes = read_blob(
        src,
        &config_digest,
        Some(config_desc.size()),
        &format!("image config {config_digest}"),
    )?;
    let config_parsed = parse_config(&config_bytes, &config_digest, src)?;

    let mut layers = Vec::with_capacity(manifest.layers().len());
    for (i, desc) in manifest.layers().iter().enumerate() {
        let digest = desc.digest().to_string();
        let Some(hex) = sha256_hex(&digest) else {
            return Err(ImageError::InvalidArchive(format!(
                "{}: layer {} of manifest {manifest_digest} has digest {digest}; only sha256 \
                 digests are supported",
                src.display(),
                i + 1
            )));
        };
        layers.push(LayerSource {
            member: blob_member(hex),
            digest: Some(digest.clone()),
            size: Some(desc.size()),
        });
    }
    check_layer_count(&config_parsed, layers.len(), &config_digest, src.display())?;

    Ok(ResolvedImage {
        format: Format::OciLayout,
        manifest: Some(Blob {
            digest: manifest_digest,
            bytes: manifest_bytes,
        }),
        config: Blob {
            digest: config_digest,
            bytes: config_bytes,
        },
        config_parsed,
        layers,
    })
}

/// Picks the manifest to import from an index: the only one, else the one
/// tagged like `name` (a layout holding several tags), else the one for
/// this host's platform (linux/amd64 on x86_64).
fn select_manifest<'a>(
    manifests: &'a [Descriptor],
    name: &str,
    where_: &str,
    src: &SourceArchive,
) -> Result<&'a Descriptor, ImageError> {
    // Attestation manifests written by BuildKit sit next to real ones with
    // platform unknown/unknown; they are never what we want.
    let candidates: Vec<&Descriptor> = manifests
        .iter()
        .filter(|d| {
            let attestation = d
                .annotations()
                .as_ref()
                .and_then(|a| a.get("vnd.docker.reference.type"))
                .is_some_and(|t| t == "attestation-manifest");
            let unknown = d
                .platform()
                .as_ref()
                .is_some_and(|p| p.os().to_string() == "unknown");
            !attestation && !unknown
        })
        .collect();
    match candidates.as_slice() {
        [] => Err(ImageError::InvalidArchive(format!(
            "{}: {where_} lists no image manifests",
            src.display()
        ))),
        [only] => Ok(only),
        many => {
            let tagged: Vec<&Descriptor> = many
                .iter()
                .copied()
                .filter(|d| tagged_as(d, name))
                .collect();
            if let [only] = tagged.as_slice() {
                return Ok(only);
            }
            let arch = host_arch();
            many.iter()
                .copied()
                .find(|d| {
                    d.platform().as_ref().is_some_and(|p| {
                        p.os().to_string() == "linux" && p.architecture().to_string() == arch
                    })
                })
                .ok_or_else(|| {
                    let platforms: Vec<String> = many
                        .iter()
                        .map(|d| match d.platform() {
                            Some(p) => format!("{}/{}", p.os(), p.architecture()),
                            None => format!("{} (no platform)", d.digest()),
                        })
                        .collect();
                    ImageError::InvalidArchive(format!(
                        "{}: {where_} lists {} manifests ({}) and none is for linux/{arch}; \
                         export a single-platform image (skopeo copy --override-arch {arch} ...)",
                        src.display(),
                        many.len(),
                        platforms.join(", ")
                    ))
                })
        }
    }
}

/// Whether an index entry carries `name` (`repo:tag`) as its OCI ref name
/// (the tag, as skopeo and umoci write it) or containerd image name.
fn tagged_as(desc: &Descriptor, name: &str) -> bool {
    let Some(annotations) = desc.annotations() else {
        return false;
    };
    let tag = name.rsplit_once(':').map_or(name, |(_, tag)| tag);
    let ref_name = annotations.get("org.opencontainers.image.ref.name");
    let image_name = annotations.get("io.containerd.image.name");
    ref_name.is_some_and(|r| r == tag || r == name)
        || image_name.is_some_and(|n| n == name || n.ends_with(&format!("/{name}")))
}

/// GOARCH name of the architecture we run on.
pub(crate) fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

fn is_index(media_type: &MediaType, bytes: &[u8]) -> bool {
    match media_type {
        MediaType::ImageIndex => true,
        MediaType::Other(t) if t == DOCKER_MANIFEST_LIST => true,
        MediaType::ImageManifest => false,
        // Some writers omit or mislabel the media type: decide by shape.
        _ => serde_json::from_slice::<serde_json::Value>(bytes)
            .map(|v| v.get("manifests").is_some() && v.get("layers").is_none())
            .unwrap_or(false),
    }
}

fn refuse_schema1(bytes: &[u8], digest: &str, src: &SourceArchive) -> Result<(), ImageError> {
    let v: serde_json::Value = serde_json::from_slice(bytes).unwrap_or_default();
    let media = v.get("mediaType").and_then(|m| m.as_str()).unwrap_or("");
    let schema1 = media == DOCKER_MANIFEST_V1
        || media == DOCKER_MANIFEST_V1_SIGNED
        || v.get("schemaVersion").and_then(|s| s.as_u64()) == Some(1);
    if schema1 {
        return Err(ImageError::InvalidArchive(format!(
            "{}: manifest {digest} is a Docker schema 1 manifest, which is not supported; \
             convert it with `skopeo copy --format oci ...`",
            src.display()
        )));
    }
    Ok(())
}

#[derive(Deserialize)]
struct DockerArchiveEntry {
    #[serde(rename = "Config")]
    config: String,
    #[serde(rename = "RepoTags", default)]
    repo_tags: Option<Vec<String>>,
    #[serde(rename = "Layers", default)]
    layers: Vec<String>,
}

fn resolve_docker(src: &SourceArchive, name: &str) -> Result<ResolvedImage, ImageError> {
    let bytes = src.read_small("manifest.json", JSON_LIMIT)?;
    let entries: Vec<DockerArchiveEntry> = parse_json(&bytes, "manifest.json", src)?;
    let entry = match entries.as_slice() {
        [] => {
            return Err(ImageError::InvalidArchive(format!(
                "{}: manifest.json lists no images",
                src.display()
            )))
        }
        [only] => only,
        many => many
            .iter()
            .find(|e| {
                e.repo_tags
                    .as_ref()
                    .is_some_and(|tags| tags.iter().any(|t| t == name))
            })
            .ok_or_else(|| {
                let tags: Vec<String> = many
                    .iter()
                    .flat_map(|e| e.repo_tags.clone().unwrap_or_default())
                    .collect();
                ImageError::InvalidArchive(format!(
                    "{}: manifest.json lists {} images and none is tagged {name} (tags: {}); \
                     import it under one of those names",
                    src.display(),
                    many.len(),
                    tags.join(", ")
                ))
            })?,
    };

    let config_member = member_name(&entry.config, "Config", src)?;
    let config_bytes = src.read_small(&config_member, JSON_LIMIT)?;
    let config_digest = sha256_digest(&config_bytes);
    // docker save names the config after its digest; check it when it does.
    if let Some(expected) = digest_from_member(&config_member) {
        if expected != config_digest {
            return Err(ImageError::DigestMismatch {
                what: format!("image config {config_member} in {}", src.display()),
                expected,
                actual: config_digest,
            });
        }
    }
    let config_parsed = parse_config(&config_bytes, &config_digest, src)?;

    let mut layers = Vec::with_capacity(entry.layers.len());
    for layer in &entry.layers {
        let member = member_name(layer, "Layers", src)?;
        let digest = member
            .strip_prefix("blobs/sha256/")
            .filter(|hex| is_sha256_hex(hex))
            .map(|hex| format!("sha256:{hex}"));
        layers.push(LayerSource {
            member,
            digest,
            size: None,
        });
    }
    check_layer_count(&config_parsed, layers.len(), &config_digest, src.display())?;

    Ok(ResolvedImage {
        format: Format::DockerArchive,
        manifest: None,
        config: Blob {
            digest: config_digest,
            bytes: config_bytes,
        },
        config_parsed,
        layers,
    })
}

fn member_name(raw: &str, field: &str, src: &SourceArchive) -> Result<String, ImageError> {
    normalize(raw.as_bytes()).ok_or_else(|| {
        ImageError::InvalidArchive(format!(
            "{}: manifest.json {field} entry {raw:?} is not a file name",
            src.display()
        ))
    })
}

/// `sha256:<hex>` when a docker-archive member is named after its digest
/// (`<hex>.json`, `blobs/sha256/<hex>`).
fn digest_from_member(member: &str) -> Option<String> {
    let base = member.rsplit('/').next().unwrap_or(member);
    let stem = base.strip_suffix(".json").unwrap_or(base);
    is_sha256_hex(stem).then(|| format!("sha256:{stem}"))
}

fn read_blob(
    src: &SourceArchive,
    digest: &str,
    size: Option<u64>,
    what: &str,
) -> Result<Vec<u8>, ImageError> {
    let Some(hex) = sha256_hex(digest) else {
        return Err(ImageError::InvalidArchive(format!(
            "{}: {what} has digest {digest:?}; only sha256 digests are supported",
            src.display()
        )));
    };
    let bytes = src.read_small(&blob_member(hex), JSON_LIMIT)?;
    let actual = sha256_digest(&bytes);
    if actual != digest {
        return Err(ImageError::DigestMismatch {
            what: format!("{what}, blobs/sha256/{hex} in {}", src.display()),
            expected: digest.to_string(),
            actual,
        });
    }
    if let Some(size) = size {
        if size != bytes.len() as u64 {
            return Err(ImageError::InvalidArchive(format!(
                "{}: {what} is {} bytes but its descriptor says {size}; the archive is corrupt, \
                 re-export it",
                src.display(),
                bytes.len()
            )));
        }
    }
    Ok(bytes)
}

fn parse_json<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    what: &str,
    src: &SourceArchive,
) -> Result<T, ImageError> {
    serde_json::from_slice(bytes).map_err(|e| {
        ImageError::InvalidArchive(format!(
            "{}: {what} is not valid: {e}; re-export the image with a current tool",
            src.display()
        ))
    })
}

/// Parses and checks an image config. `origin` names where it came from
/// (an archive, a registry reference) in messages.
pub(crate) fn parse_config_from(
    bytes: &[u8],
    digest: &str,
    origin: &str,
) -> Result<ImageConfiguration, ImageError> {
    let config: ImageConfiguration = serde_json::from_slice(bytes).map_err(|e| {
        ImageError::InvalidArchive(format!("{origin}: image config {digest} is not valid: {e}"))
    })?;
    check_config(config, digest, origin)
}

fn parse_config(
    bytes: &[u8],
    digest: &str,
    src: &SourceArchive,
) -> Result<ImageConfiguration, ImageError> {
    let config: ImageConfiguration = parse_json(bytes, &format!("image config {digest}"), src)?;
    check_config(config, digest, src.display())
}

fn check_config(
    config: ImageConfiguration,
    digest: &str,
    origin: &str,
) -> Result<ImageConfiguration, ImageError> {
    let os = config.os().to_string();
    if os != "linux" {
        return Err(ImageError::InvalidArchive(format!(
            "{}: image config {digest} is for os {os:?}; only linux images can run here",
            origin
        )));
    }
    let arch = config.architecture().to_string();
    if arch != host_arch() {
        tracing::warn!(
            origin,
            config = digest,
            "image is for architecture {arch}, this host is {}; its binaries may not run",
            host_arch()
        );
    }
    let rootfs = config.rootfs();
    if rootfs.typ() != "layers" {
        return Err(ImageError::InvalidArchive(format!(
            "{}: image config {digest} has rootfs.type {:?}, expected \"layers\"",
            origin,
            rootfs.typ()
        )));
    }
    for diff_id in rootfs.diff_ids() {
        if sha256_hex(diff_id).is_none() {
            return Err(ImageError::InvalidArchive(format!(
                "{}: image config {digest} lists diffID {diff_id:?}; only sha256 digests \
                 are supported",
                origin
            )));
        }
    }
    Ok(config)
}

pub(crate) fn check_layer_count(
    config: &ImageConfiguration,
    layers: usize,
    config_digest: &str,
    origin: &str,
) -> Result<(), ImageError> {
    let diff_ids = config.rootfs().diff_ids().len();
    if diff_ids != layers {
        return Err(ImageError::InvalidArchive(format!(
            "{}: the manifest lists {layers} layers but image config {config_digest} lists \
             {diff_ids} diffIDs; the archive is inconsistent, re-export it",
            origin
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_from_member_names() {
        let hex = "a".repeat(64);
        assert_eq!(
            digest_from_member(&format!("{hex}.json")),
            Some(format!("sha256:{hex}"))
        );
        assert_eq!(
            digest_from_member(&format!("blobs/sha256/{hex}")),
            Some(format!("sha256:{hex}"))
        );
        assert_eq!(digest_from_member("config.json"), None);
    }

    #[test]
    fn index_detection_by_media_type_and_shape() {
        assert!(is_index(&MediaType::ImageIndex, b"{}"));
        assert!(is_index(
            &MediaType::Other(DOCKER_MANIFEST_LIST.into()),
            b"{}"
        ));
        assert!(!is_index(&MediaType::ImageManifest, b"{\"manifests\":[]}"));
        assert!(is_index(
            &MediaType::Other("x".into()),
            b"{\"manifests\":[]}"
        ));
        assert!(!is_index(&MediaType::Other("x".into()), b"{\"layers\":[]}"));
    }
}

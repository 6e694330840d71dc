//! Builders for layer tars, OCI-layout archives and docker-archives.
//!
//! Headers are written by hand (not through `tar::Builder::append_data`)
//! because tar-rs refuses to *write* the hostile names (`../x`, `/abs`)
//! that the store must be tested against.

// Tests may unwrap (clippy.toml covers only #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};
use warren_image::ImageStore;

pub fn sha(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

pub fn hex_of(digest: &str) -> &str {
    digest.strip_prefix("sha256:").expect("sha256 digest")
}

/// A layer tar under construction.
pub struct Layer {
    out: tar::Builder<Vec<u8>>,
}

pub struct Attrs {
    pub mode: u32,
    pub uid: u64,
    pub gid: u64,
    pub mtime: u64,
}

impl Default for Attrs {
    fn default() -> Self {
        Attrs {
            mode: 0o644,
            uid: 0,
            gid: 0,
            mtime: 1_600_000_000,
        }
    }
}

impl Default for Layer {
    fn default() -> Self {
        Self::new()
    }
}

impl Layer {
    pub fn new() -> Layer {
        Layer {
            out: tar::Builder::new(Vec::new()),
        }
    }

    /// Appends one entry with exactly the given name bytes.
    pub fn raw(
        mut self,
        kind: tar::EntryType,
        name: &[u8],
        link: &[u8],
        data: &[u8],
        attrs: &Attrs,
    ) -> Layer {
        let mut h = tar::Header::new_ustar();
        {
            let ustar = h.as_ustar_mut().expect("ustar header");
            assert!(
                name.len() <= 100 && link.len() <= 100,
                "keep test names short"
            );
            ustar.name[..name.len()].copy_from_slice(name);
            ustar.linkname[..link.len()].copy_from_slice(link);
        }
        h.set_entry_type(kind);
        h.set_mode(attrs.mode);
        h.set_uid(attrs.uid);
        h.set_gid(attrs.gid);
        h.set_mtime(attrs.mtime);
        h.set_size(data.len() as u64);
        if matches!(kind, tar::EntryType::Char | tar::EntryType::Block) {
            h.set_device_major(1).unwrap();
            h.set_device_minor(3).unwrap();
        }
        h.set_cksum();
        self.out.append(&h, data).unwrap();
        self
    }

    pub fn dir(self, path: &str) -> Layer {
        self.dir_with(
            path,
            &Attrs {
                mode: 0o755,
                ..Attrs::default()
            },
        )
    }

    pub fn dir_with(self, path: &str, attrs: &Attrs) -> Layer {
        self.raw(tar::EntryType::Directory, path.as_bytes(), b"", b"", attrs)
    }

    pub fn file(self, path: &str, data: &[u8]) -> Layer {
        self.file_with(path, data, &Attrs::default())
    }

    pub fn file_with(self, path: &str, data: &[u8], attrs: &Attrs) -> Layer {
        self.raw(tar::EntryType::Regular, path.as_bytes(), b"", data, attrs)
    }

    pub fn symlink(self, path: &str, target: &str) -> Layer {
        self.raw(
            tar::EntryType::Symlink,
            path.as_bytes(),
            target.as_bytes(),
            b"",
            &Attrs {
                mode: 0o777,
                ..Attrs::default()
            },
        )
    }

    pub fn hardlink(self, path: &str, target: &str) -> Layer {
        self.raw(
            tar::EntryType::Link,
            path.as_bytes(),
            target.as_bytes(),
            b"",
            &Attrs::default(),
        )
    }

    /// A PAX extended header applying to the next entry.
    pub fn pax(self, records: &[(&str, &[u8])]) -> Layer {
        let mut body = Vec::new();
        for (key, value) in records {
            // "<len> <key>=<value>\n", where <len> counts its own digits.
            let rest = key.len() + value.len() + 3;
            let mut len = rest + 1;
            while len != rest + len.to_string().len() {
                len = rest + len.to_string().len();
            }
            body.extend_from_slice(format!("{len} {key}=").as_bytes());
            body.extend_from_slice(value);
            body.push(b'\n');
        }
        self.raw(
            tar::EntryType::XHeader,
            b"PaxHeaders/x",
            b"",
            &body,
            &Attrs::default(),
        )
    }

    pub fn build(mut self) -> Vec<u8> {
        self.out.finish().unwrap();
        self.out.into_inner().unwrap()
    }
}

#[derive(Clone, Copy, Debug)]
pub enum Comp {
    None,
    Gzip,
    Zstd,
}

pub fn compress(tar: &[u8], comp: Comp) -> Vec<u8> {
    match comp {
        Comp::None => tar.to_vec(),
        Comp::Gzip => {
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            gz.write_all(tar).unwrap();
            gz.finish().unwrap()
        }
        Comp::Zstd => zstd::encode_all(tar, 3).unwrap(),
    }
}

pub fn media_type(comp: Comp) -> &'static str {
    match comp {
        Comp::None => "application/vnd.oci.image.layer.v1.tar",
        Comp::Gzip => "application/vnd.oci.image.layer.v1.tar+gzip",
        Comp::Zstd => "application/vnd.oci.image.layer.v1.tar+zstd",
    }
}

pub fn config_json(diff_ids: &[String], arch: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "architecture": arch,
        "os": "linux",
        "config": {
            "Env": ["PATH=/usr/local/bin:/usr/bin:/bin", "GREETING=hello"],
            "Entrypoint": ["/bin/sh", "-c"],
            "Cmd": ["echo $GREETING"],
            "WorkingDir": "/work",
            "User": "1000:1000"
        },
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": [{"created_by": "test"}]
    }))
    .unwrap()
}

/// An OCI image to be written as an image-layout tar.
pub struct Oci {
    /// Uncompressed layer tars and how to store each.
    pub layers: Vec<(Vec<u8>, Comp)>,
    /// Replace diffID i in the config (to test diffID checks).
    pub diff_id_override: Option<(usize, String)>,
    /// Flip a byte of layer blob i after its digest was taken.
    pub corrupt_layer: Option<usize>,
    pub arch: String,
}

/// What was written, for assertions.
pub struct Built {
    pub manifest_digest: String,
    pub config_digest: String,
    pub layer_digests: Vec<String>,
    pub diff_ids: Vec<String>,
}

impl Oci {
    pub fn new(layers: Vec<(Vec<u8>, Comp)>) -> Oci {
        Oci {
            layers,
            diff_id_override: None,
            corrupt_layer: None,
            arch: "amd64".into(),
        }
    }

    /// Blobs (digest, bytes) plus the manifest descriptor facts.
    pub fn blobs(&self) -> (Built, Vec<(String, Vec<u8>)>, usize) {
        let mut blobs = Vec::new();
        let mut diff_ids: Vec<String> = self.layers.iter().map(|(t, _)| sha(t)).collect();
        let mut layer_descs = Vec::new();
        let mut layer_digests = Vec::new();
        for (i, (tar, comp)) in self.layers.iter().enumerate() {
            let mut blob = compress(tar, *comp);
            let digest = sha(&blob);
            layer_descs.push(serde_json::json!({
                "mediaType": media_type(*comp), "digest": digest, "size": blob.len()
            }));
            if self.corrupt_layer == Some(i) {
                let last = blob.len() - 1;
                blob[last] ^= 0xff;
            }
            layer_digests.push(digest.clone());
            blobs.push((digest, blob));
        }
        if let Some((i, d)) = &self.diff_id_override {
            diff_ids[*i] = d.clone();
        }
        let config = config_json(&diff_ids, &self.arch);
        let config_digest = sha(&config);
        let manifest = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": config_digest, "size": config.len()
            },
            "layers": layer_descs
        }))
        .unwrap();
        let manifest_digest = sha(&manifest);
        let manifest_len = manifest.len();
        blobs.push((config_digest.clone(), config));
        blobs.push((manifest_digest.clone(), manifest));
        (
            Built {
                manifest_digest,
                config_digest,
                layer_digests,
                diff_ids,
            },
            blobs,
            manifest_len,
        )
    }

    pub fn write(&self, path: &Path) -> Built {
        let (built, blobs, manifest_len) = self.blobs();
        let index = index_json(&[(
            built.manifest_digest.clone(),
            manifest_len,
            "application/vnd.oci.image.manifest.v1+json",
            None,
        )]);
        write_oci_layout(path, &index, &blobs);
        built
    }
}

/// An index.json body listing (digest, size, mediaType, platform arch).
pub fn index_json(entries: &[(String, usize, &str, Option<&str>)]) -> Vec<u8> {
    let manifests: Vec<serde_json::Value> = entries
        .iter()
        .map(|(d, size, mt, arch)| {
            let mut v = serde_json::json!({"mediaType": mt, "digest": d, "size": size});
            if let Some(arch) = arch {
                v["platform"] = serde_json::json!({"os": "linux", "architecture": arch});
            }
            v
        })
        .collect();
    serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": manifests
    }))
    .unwrap()
}

/// Writes an OCI image-layout tar: oci-layout, index.json, blobs/sha256/*.
pub fn write_oci_layout(path: &Path, index: &[u8], blobs: &[(String, Vec<u8>)]) {
    let mut b = tar::Builder::new(std::fs::File::create(path).unwrap());
    let mut add = |name: &str, data: &[u8]| {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        b.append_data(&mut h, name, data).unwrap();
    };
    add("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#);
    add("index.json", index);
    for (digest, data) in blobs {
        add(&format!("blobs/sha256/{}", hex_of(digest)), data);
    }
    b.finish().unwrap();
}

/// Writes a legacy `docker save` archive: `<n>/layer.tar` per layer (a
/// repeated layer becomes a symlink to the first copy, as docker does),
/// `<config hex>.json` and manifest.json.
pub fn write_docker_archive(path: &Path, layers: &[Vec<u8>], repo_tags: &[&str]) -> Built {
    let diff_ids: Vec<String> = layers.iter().map(|t| sha(t)).collect();
    let config = config_json(&diff_ids, "amd64");
    let config_digest = sha(&config);
    let config_name = format!("{}.json", hex_of(&config_digest));
    let mut b = tar::Builder::new(std::fs::File::create(path).unwrap());
    let mut layer_paths = Vec::new();
    let mut first_copy: Vec<(String, String)> = Vec::new();
    for (i, tar) in layers.iter().enumerate() {
        let name = format!("{i}/layer.tar");
        let d = sha(tar);
        if let Some((_, earlier)) = first_copy.iter().find(|(dd, _)| *dd == d) {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_size(0);
            b.append_link(&mut h, &name, format!("../{earlier}"))
                .unwrap();
        } else {
            let mut h = tar::Header::new_gnu();
            h.set_size(tar.len() as u64);
            h.set_mode(0o644);
            b.append_data(&mut h, &name, &tar[..]).unwrap();
            first_copy.push((d, name.clone()));
        }
        layer_paths.push(name);
    }
    let manifest = serde_json::to_vec(&serde_json::json!([{
        "Config": config_name,
        "RepoTags": repo_tags,
        "Layers": layer_paths
    }]))
    .unwrap();
    for (name, data) in [
        ("manifest.json", &manifest),
        (config_name.as_str(), &config),
    ] {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        b.append_data(&mut h, name, &data[..]).unwrap();
    }
    b.finish().unwrap();
    Built {
        manifest_digest: String::new(),
        config_digest,
        layer_digests: layers.iter().map(|t| sha(t)).collect(),
        diff_ids,
    }
}

/// A store in a fresh temp dir; the TempDir must outlive the store.
pub fn store() -> (tempfile::TempDir, ImageStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = ImageStore::open(&dir.path().join("store")).unwrap();
    (dir, store)
}

pub fn store_root(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("store")
}

/// Names in a directory, sorted.
pub fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Numbered snapshot directories in the store.
pub fn snapshot_ids(root: &Path) -> Vec<String> {
    names(&root.join("snapshots"))
        .into_iter()
        .filter(|n| n.parse::<u64>().is_ok())
        .collect()
}

/// Asserts the store holds nothing at all (no blobs, snapshots, records or
/// scratch files).
pub fn assert_store_empty(root: &Path) {
    for sub in ["content/sha256", "snapshots", "images", "tmp"] {
        assert_eq!(
            names(&root.join(sub)),
            Vec::<String>::new(),
            "{sub} is not empty"
        );
    }
}

//! Importing archives, resolving, removing and garbage collection.

// Tests may unwrap (clippy.toml covers only #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::sync::Arc;

use common::*;
use warren_image::{ErrorKind, ImageError, ImageStore};

fn base_layer() -> Vec<u8> {
    Layer::new()
        .dir("etc")
        .file("etc/hosts", b"127.0.0.1 localhost\n")
        .dir("bin")
        .file_with(
            "bin/su",
            b"#!fake setuid binary",
            &Attrs {
                mode: 0o4755,
                uid: 0,
                gid: 0,
                mtime: 1_500_000_000,
            },
        )
        .dir_with(
            "home",
            &Attrs {
                mode: 0o755,
                mtime: 1_400_000_000,
                ..Attrs::default()
            },
        )
        .file_with(
            "home/user.txt",
            b"owned by 1000",
            &Attrs {
                mode: 0o600,
                uid: 1000,
                gid: 1001,
                mtime: 1_600_000_000,
            },
        )
        .symlink("bin/sh", "/bin/busybox")
        .file("bin/busybox", b"busybox")
        .hardlink("bin/ls", "bin/busybox")
        .pax(&[
            ("SCHILY.xattr.user.note", b"kept"),
            (
                "SCHILY.xattr.security.capability",
                b"\x01\x00\x00\x02\x00\x20\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00",
            ),
        ])
        .file("bin/ping", b"ping")
        .build()
}

fn second_layer() -> Vec<u8> {
    Layer::new()
        .dir("app")
        .file("app/main.py", b"print('hi')\n")
        .build()
}

#[test]
fn oci_archive_with_gzip_and_zstd_layers_imports() {
    let (dir, store) = store();
    let root = store_root(&dir);
    let archive = dir.path().join("image.tar");
    let built = Oci::new(vec![
        (base_layer(), Comp::Gzip),
        (second_layer(), Comp::Zstd),
    ])
    .write(&archive);

    let rec = store.import_archive(&archive, "example/app:1.0").unwrap();
    assert_eq!(rec.name, "example/app:1.0");
    assert_eq!(rec.digest, built.manifest_digest);
    assert_eq!(rec.config_digest, built.config_digest);
    assert_eq!(rec.layers.len(), 2);
    for (i, l) in rec.layers.iter().enumerate() {
        assert_eq!(l.digest, built.layer_digests[i]);
        assert_eq!(l.diff_id, built.diff_ids[i]);
    }
    assert_eq!(rec.layers[0].chain_id, built.diff_ids[0]);
    assert_eq!(
        rec.layers[1].chain_id,
        sha(format!("{} {}", built.diff_ids[0], built.diff_ids[1]).as_bytes())
    );
    assert_eq!(rec.size, rec.layers.iter().map(|l| l.size).sum::<u64>());
    assert!(rec.size > 0);
    assert!(
        rec.created.ends_with('Z') && rec.created.len() == 20,
        "{}",
        rec.created
    );
    assert_eq!(rec.config.entrypoint, vec!["/bin/sh", "-c"]);
    assert_eq!(rec.config.cmd, vec!["echo $GREETING"]);
    assert_eq!(rec.config.working_dir, "/work");
    assert_eq!(rec.config.user, "1000:1000");
    assert!(rec.config.env.contains(&"GREETING=hello".to_string()));

    // Every blob is in the content store under its digest.
    for d in built
        .layer_digests
        .iter()
        .chain([&built.config_digest, &built.manifest_digest])
    {
        let blob = fs::read(root.join("content/sha256").join(hex_of(d))).unwrap();
        assert_eq!(&sha(&blob), d);
    }
    assert_eq!(names(&root.join("tmp")), Vec::<String>::new());

    // Lower dirs: topmost first, short numeric snapshot paths.
    let lowers = store.lower_dirs(&rec).unwrap();
    assert_eq!(lowers.len(), 2);
    assert!(lowers.iter().all(|p| p.is_absolute()));
    assert!(lowers[0].join("app/main.py").is_file());
    assert!(lowers[1].join("etc/hosts").is_file());
    assert_eq!(
        lowers[0],
        root.join("snapshots")
            .canonicalize()
            .unwrap()
            .join(rec.layers[1].snapshot.to_string())
            .join("fs")
    );

    // Metadata survived.
    let base = &lowers[1];
    let su = fs::metadata(base.join("bin/su")).unwrap();
    assert_eq!(su.permissions().mode() & 0o7777, 0o4755, "setuid kept");
    assert_eq!(su.mtime(), 1_500_000_000);
    let user = fs::metadata(base.join("home/user.txt")).unwrap();
    assert_eq!((user.uid(), user.gid()), (1000, 1001));
    assert_eq!(user.permissions().mode() & 0o7777, 0o600);
    assert_eq!(
        fs::metadata(base.join("home")).unwrap().mtime(),
        1_400_000_000
    );
    assert_eq!(
        fs::read_link(base.join("bin/sh")).unwrap().to_str(),
        Some("/bin/busybox")
    );
    let bb = fs::metadata(base.join("bin/busybox")).unwrap();
    let ls = fs::metadata(base.join("bin/ls")).unwrap();
    assert_eq!(bb.ino(), ls.ino(), "hard link kept");
    let ping = base.join("bin/ping");
    let note = rustix::fs::getxattr(&ping, "user.note", &mut [0u8; 64][..]).unwrap();
    assert_eq!(note, 4);
    let mut cap = [0u8; 64];
    let n = rustix::fs::getxattr(&ping, "security.capability", &mut cap[..]).unwrap();
    assert_eq!(n, 20, "file capability kept");

    // The record is persisted and survives a reopen.
    drop(store);
    let store = ImageStore::open(&root).unwrap();
    let again = store.resolve("example/app:1.0").unwrap();
    assert_eq!(again.digest, rec.digest);
    assert_eq!(store.list().unwrap().len(), 1);
    assert_eq!(store.lower_dirs(&again).unwrap(), lowers);
}

#[test]
fn docker_archive_imports_with_synthesised_manifest() {
    let (dir, store) = store();
    let root = store_root(&dir);
    let archive = dir.path().join("docker.tar");
    let base = base_layer();
    // The base layer repeats: docker save stores it once plus a symlink.
    let built = write_docker_archive(
        &archive,
        &[base.clone(), second_layer(), base.clone()],
        &["example/app:v2"],
    );

    let rec = store.import_archive(&archive, "example/app:v2").unwrap();
    assert_eq!(rec.config_digest, built.config_digest);
    assert_eq!(rec.layers.len(), 3);
    assert_eq!(rec.layers[0].digest, rec.layers[2].digest);
    assert_ne!(rec.layers[0].chain_id, rec.layers[2].chain_id);

    // The synthesised manifest is stored and is what the digest names.
    let manifest_bytes = fs::read(root.join("content/sha256").join(hex_of(&rec.digest))).unwrap();
    assert_eq!(sha(&manifest_bytes), rec.digest);
    let manifest: serde_json::Value = serde_json::from_slice(&manifest_bytes).unwrap();
    assert_eq!(manifest["schemaVersion"], 2);
    assert_eq!(
        manifest["mediaType"],
        "application/vnd.oci.image.manifest.v1+json"
    );
    assert_eq!(manifest["config"]["digest"], built.config_digest.as_str());
    assert_eq!(
        manifest["layers"][0]["mediaType"],
        "application/vnd.oci.image.layer.v1.tar"
    );
    assert_eq!(
        manifest["layers"][1]["digest"],
        built.layer_digests[1].as_str()
    );

    // Importing the same archive again yields the same digest (canonical).
    let again = store.import_archive(&archive, "example/app:v2").unwrap();
    assert_eq!(again.digest, rec.digest);
    assert_eq!(store.lower_dirs(&rec).unwrap().len(), 3);
}

#[test]
fn docker_archive_with_several_images_is_picked_by_name() {
    let (dir, store) = store();
    let archive = dir.path().join("multi.tar");
    let one = Layer::new().file("one", b"1").build();
    let two = Layer::new().file("two", b"2").build();
    // Two entries in manifest.json: build each then merge by hand.
    let a = dir.path().join("a.tar");
    let b = dir.path().join("b.tar");
    let ba = write_docker_archive(&a, std::slice::from_ref(&one), &["x/one:1"]);
    let bb = write_docker_archive(&b, std::slice::from_ref(&two), &["x/two:1"]);
    let mut builder = tar::Builder::new(fs::File::create(&archive).unwrap());
    let mut add = |name: &str, data: &[u8]| {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        builder.append_data(&mut h, name, data).unwrap();
    };
    add("one/layer.tar", &one);
    add("two/layer.tar", &two);
    add(
        &format!("{}.json", hex_of(&ba.config_digest)),
        &config_json(&ba.diff_ids, "amd64"),
    );
    add(
        &format!("{}.json", hex_of(&bb.config_digest)),
        &config_json(&bb.diff_ids, "amd64"),
    );
    let manifest = serde_json::json!([
        {"Config": format!("{}.json", hex_of(&ba.config_digest)), "RepoTags": ["x/one:1"], "Layers": ["one/layer.tar"]},
        {"Config": format!("{}.json", hex_of(&bb.config_digest)), "RepoTags": ["x/two:1"], "Layers": ["two/layer.tar"]}
    ]);
    add("manifest.json", &serde_json::to_vec(&manifest).unwrap());
    builder.finish().unwrap();
    drop(builder);

    let rec = store.import_archive(&archive, "x/two:1").unwrap();
    assert_eq!(rec.config_digest, bb.config_digest);
    let err = store.import_archive(&archive, "x/three:1").unwrap_err();
    assert!(matches!(err, ImageError::InvalidArchive(_)), "{err}");
    assert!(err.to_string().contains("x/one:1"), "{err}");
}

#[test]
fn oci_index_picks_host_platform_and_follows_nested_index() {
    let (dir, store) = store();
    let archive = dir.path().join("multi.tar");
    let arm_layer = Layer::new().file("arch", b"arm64").build();
    let amd_layer = Layer::new().file("arch", b"amd64").build();
    let mut arm = Oci::new(vec![(arm_layer, Comp::Gzip)]);
    arm.arch = "arm64".into();
    let amd = Oci::new(vec![(amd_layer, Comp::Gzip)]);
    let (arm_built, mut blobs, arm_len) = arm.blobs();
    let (amd_built, amd_blobs, amd_len) = amd.blobs();
    blobs.extend(amd_blobs);
    let mt = "application/vnd.oci.image.manifest.v1+json";
    let nested = index_json(&[
        (
            arm_built.manifest_digest.clone(),
            arm_len,
            mt,
            Some("arm64"),
        ),
        (
            amd_built.manifest_digest.clone(),
            amd_len,
            mt,
            Some("amd64"),
        ),
    ]);
    let nested_digest = sha(&nested);
    let outer = index_json(&[(
        nested_digest.clone(),
        nested.len(),
        "application/vnd.oci.image.index.v1+json",
        None,
    )]);
    blobs.push((nested_digest, nested));
    write_oci_layout(&archive, &outer, &blobs);

    let rec = store.import_archive(&archive, "multi").unwrap();
    assert_eq!(rec.name, "multi:latest");
    assert_eq!(rec.digest, amd_built.manifest_digest);
    let lowers = store.lower_dirs(&rec).unwrap();
    assert_eq!(fs::read(lowers[0].join("arch")).unwrap(), b"amd64");
}

#[test]
fn resolve_by_name_digest_and_prefix() {
    let (dir, store) = store();
    let archive = dir.path().join("image.tar");
    let built = Oci::new(vec![(second_layer(), Comp::Gzip)]).write(&archive);
    store.import_archive(&archive, "app").unwrap();
    store
        .import_archive(&archive, "registry:5000/team/app:v1")
        .unwrap();

    assert_eq!(store.resolve("app").unwrap().name, "app:latest");
    assert_eq!(store.resolve("app:latest").unwrap().name, "app:latest");
    assert_eq!(
        store.resolve("registry:5000/team/app:v1").unwrap().digest,
        built.manifest_digest
    );
    let hex = hex_of(&built.manifest_digest);
    // Two names share the digest: the first by name wins.
    assert_eq!(
        store.resolve(&built.manifest_digest).unwrap().name,
        "app:latest"
    );
    assert_eq!(
        store
            .resolve(&format!("sha256:{}", &hex[..12]))
            .unwrap()
            .digest,
        built.manifest_digest
    );
    assert_eq!(
        store.resolve(&hex[..16]).unwrap().digest,
        built.manifest_digest
    );

    let err = store.resolve("nope").unwrap_err();
    assert!(err.is_not_found(), "{err}");
    assert_eq!(err.kind().http_status(), 404);
    let err = store.resolve(&format!("sha256:{}", &hex[..8])).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Invalid, "{err}");
    let err = store.resolve("bad name!").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Invalid);

    // Removing by digest is ambiguous while two names share it.
    let err = store.remove(&built.manifest_digest).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict, "{err}");
    store.remove("app").unwrap();
    // Now the digest names one image and removing by it works.
    let removed = store.remove(&format!("sha256:{}", &hex[..12])).unwrap();
    assert_eq!(removed.name, "registry:5000/team/app:v1");
    assert!(store.list().unwrap().is_empty());
    assert_store_empty(&store_root(&dir));
}

#[test]
fn shared_base_layer_is_unpacked_once_and_kept_on_remove() {
    let (dir, store) = store();
    let root = store_root(&dir);
    let a = dir.path().join("a.tar");
    let b = dir.path().join("b.tar");
    let top_a = Layer::new().file("a.txt", b"a").build();
    let top_b = Layer::new().file("b.txt", b"b").build();
    // Same base tar, stored with different compression: same diffID.
    Oci::new(vec![(base_layer(), Comp::Gzip), (top_a, Comp::Gzip)]).write(&a);
    Oci::new(vec![(base_layer(), Comp::Zstd), (top_b, Comp::Gzip)]).write(&b);

    let ra = store.import_archive(&a, "a").unwrap();
    let base_dir = store.lower_dirs(&ra).unwrap()[1].clone();
    let marker = fs::metadata(base_dir.join("etc/hosts")).unwrap().ino();
    let rb = store.import_archive(&b, "b").unwrap();
    assert_eq!(
        ra.layers[0].snapshot, rb.layers[0].snapshot,
        "base unpacked once"
    );
    assert_eq!(snapshot_ids(&root).len(), 3);
    assert_eq!(
        fs::metadata(base_dir.join("etc/hosts")).unwrap().ino(),
        marker,
        "base snapshot was not rebuilt"
    );

    let removed = store.remove("a").unwrap();
    assert_eq!(removed.name, "a:latest");
    assert!(store.resolve("a").unwrap_err().is_not_found());
    // b still works, its base is intact; a's top layer is gone.
    let lowers = store.lower_dirs(&rb).unwrap();
    assert!(lowers[1].join("etc/hosts").is_file());
    assert!(lowers[0].join("b.txt").is_file());
    assert_eq!(snapshot_ids(&root).len(), 2);
    assert!(store.lower_dirs(&ra).unwrap_err().is_not_found());
    // a's gzip base blob is unreferenced now; b's zstd one stays.
    assert!(!root
        .join("content/sha256")
        .join(hex_of(&ra.layers[0].digest))
        .exists());
    assert!(root
        .join("content/sha256")
        .join(hex_of(&rb.layers[0].digest))
        .exists());
    assert!(!root
        .join("content/sha256")
        .join(hex_of(&ra.digest))
        .exists());

    store.remove("b").unwrap();
    assert_store_empty(&root);
}

#[test]
fn concurrent_imports_sharing_a_layer_unpack_it_once() {
    let (dir, store) = store();
    let root = store_root(&dir);
    let store = Arc::new(store);
    // A big-ish base so the imports overlap in time.
    let mut base = Layer::new().dir("data");
    for i in 0..300 {
        base = base.file(&format!("data/f{i}"), &vec![b'x'; 4096]);
    }
    let base = base.build();
    let mut handles = Vec::new();
    for i in 0..4 {
        let path = dir.path().join(format!("img{i}.tar"));
        let top = Layer::new().file(&format!("top{i}"), b"t").build();
        Oci::new(vec![(base.clone(), Comp::Gzip), (top, Comp::Gzip)]).write(&path);
        let store = store.clone();
        handles.push(std::thread::spawn(move || {
            store.import_archive(&path, &format!("img{i}")).unwrap()
        }));
    }
    let records: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let base_ids: std::collections::HashSet<u64> =
        records.iter().map(|r| r.layers[0].snapshot).collect();
    assert_eq!(base_ids.len(), 1, "every image uses one base snapshot");
    assert_eq!(snapshot_ids(&root).len(), 5, "1 shared base + 4 tops");
    assert!(names(&root.join("snapshots"))
        .iter()
        .all(|n| n.parse::<u64>().is_ok()));
}

#[test]
fn reimport_replaces_record_and_collects_old_layers() {
    let (dir, store) = store();
    let root = store_root(&dir);
    let v1 = dir.path().join("v1.tar");
    let v2 = dir.path().join("v2.tar");
    Oci::new(vec![(Layer::new().file("v", b"1").build(), Comp::Gzip)]).write(&v1);
    let b2 = Oci::new(vec![(Layer::new().file("v", b"2").build(), Comp::Gzip)]).write(&v2);

    let r1 = store.import_archive(&v1, "app:stable").unwrap();
    let r2 = store.import_archive(&v2, "app:stable").unwrap();
    assert_eq!(r2.digest, b2.manifest_digest);
    assert_eq!(store.resolve("app:stable").unwrap().digest, r2.digest);
    assert_eq!(store.list().unwrap().len(), 1);
    assert_eq!(snapshot_ids(&root), vec![r2.layers[0].snapshot.to_string()]);
    assert!(!root
        .join("content/sha256")
        .join(hex_of(&r1.digest))
        .exists());
    let lowers = store.lower_dirs(&r2).unwrap();
    assert_eq!(fs::read(lowers[0].join("v")).unwrap(), b"2");
}

#[test]
fn reopen_recovers_from_a_crash_and_locks_the_root() {
    let (dir, store) = store();
    let root = store_root(&dir);
    let archive = dir.path().join("image.tar");
    Oci::new(vec![(second_layer(), Comp::Gzip)]).write(&archive);
    let rec = store.import_archive(&archive, "keep").unwrap();

    // A second instance on the same root is refused while the first lives.
    let err = ImageStore::open(&root)
        .err()
        .expect("second open must fail");
    assert_eq!(err.kind(), ErrorKind::Conflict, "{err}");
    drop(store);

    // What a crash could leave behind.
    fs::create_dir_all(root.join("tmp/import-dead/x")).unwrap();
    fs::create_dir_all(root.join("snapshots/new-dead/fs/etc")).unwrap();
    fs::create_dir_all(root.join("snapshots/rm-dead/fs")).unwrap();
    fs::create_dir_all(root.join("snapshots/99/fs")).unwrap(); // no meta.json
    fs::create_dir_all(root.join("snapshots/98/fs")).unwrap(); // committed, never recorded
    fs::write(
        root.join("snapshots/98/meta.json"),
        br#"{"chain_id":"sha256:orphan","diff_id":"sha256:orphan","size":0,"created":"x"}"#,
    )
    .unwrap();
    fs::write(root.join("content/sha256").join("ab".repeat(32)), b"orphan").unwrap();

    let store = ImageStore::open(&root).unwrap();
    assert_eq!(names(&root.join("tmp")), Vec::<String>::new());
    assert_eq!(
        names(&root.join("snapshots")),
        vec![rec.layers[0].snapshot.to_string()]
    );
    assert!(!root.join("content/sha256").join("ab".repeat(32)).exists());
    let again = store.resolve("keep").unwrap();
    assert!(store.lower_dirs(&again).unwrap()[0]
        .join("app/main.py")
        .is_file());
    // New snapshots never reuse a number seen on disk.
    let other = dir.path().join("other.tar");
    Oci::new(vec![(Layer::new().file("o", b"o").build(), Comp::Gzip)]).write(&other);
    let rec2 = store.import_archive(&other, "other").unwrap();
    assert!(rec2.layers[0].snapshot > 99);
}

#[test]
fn not_an_image_archive() {
    let (dir, store) = store();
    let path = dir.path().join("x.tar");
    let mut b = tar::Builder::new(fs::File::create(&path).unwrap());
    let mut h = tar::Header::new_gnu();
    h.set_size(2);
    b.append_data(&mut h, "hello.txt", &b"hi"[..]).unwrap();
    b.finish().unwrap();
    drop(b);
    let err = store.import_archive(&path, "x").unwrap_err();
    assert!(matches!(err, ImageError::InvalidArchive(_)), "{err}");
    assert!(err.to_string().contains("index.json"), "{err}");
    let err = store
        .import_archive(&dir.path().join("missing.tar"), "x")
        .unwrap_err();
    assert!(err.to_string().contains("missing.tar"), "{err}");
    let err = store.import_archive(&path, "Bad Name").unwrap_err();
    assert!(matches!(err, ImageError::InvalidReference { .. }), "{err}");
    assert_store_empty(&store_root(&dir));
}

#[test]
fn oci_layout_with_several_tags_is_picked_by_tag() {
    let (dir, store) = store();
    let archive = dir.path().join("tags.tar");
    let one = Oci::new(vec![(Layer::new().file("v", b"1").build(), Comp::Gzip)]);
    let two = Oci::new(vec![(Layer::new().file("v", b"2").build(), Comp::Gzip)]);
    let (b1, mut blobs, len1) = one.blobs();
    let (b2, blobs2, len2) = two.blobs();
    blobs.extend(blobs2);
    let mt = "application/vnd.oci.image.manifest.v1+json";
    let index = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "manifests": [
            {"mediaType": mt, "digest": b1.manifest_digest, "size": len1,
             "annotations": {"org.opencontainers.image.ref.name": "t1"}},
            {"mediaType": mt, "digest": b2.manifest_digest, "size": len2,
             "annotations": {"org.opencontainers.image.ref.name": "t2"}}
        ]
    }))
    .unwrap();
    write_oci_layout(&archive, &index, &blobs);
    assert_eq!(
        store.import_archive(&archive, "x:t2").unwrap().digest,
        b2.manifest_digest
    );
    assert_eq!(
        store.import_archive(&archive, "y:t1").unwrap().digest,
        b1.manifest_digest
    );
    let err = store.import_archive(&archive, "z:t3").unwrap_err();
    assert!(matches!(err, ImageError::InvalidArchive(_)), "{err}");
}

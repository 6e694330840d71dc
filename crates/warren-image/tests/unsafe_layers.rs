//! Corrupt and hostile archives: refused, contained, and nothing left behind.

// Tests may unwrap (clippy.toml covers only #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs;
use std::path::Path;

use common::*;
use warren_image::{ErrorKind, ImageError, ImageStore};

/// Imports a single-layer image built from `layer` and returns the error.
fn import_layer_err(layer: Vec<u8>) -> (tempfile::TempDir, ImageError) {
    let (dir, store) = store();
    let archive = dir.path().join("evil.tar");
    Oci::new(vec![(layer, Comp::Gzip)]).write(&archive);
    let err = store
        .import_archive(&archive, "evil")
        .expect_err("hostile layer must be refused");
    assert_eq!(err.kind(), ErrorKind::Invalid, "{err}");
    assert_store_empty(&store_root(&dir));
    drop(store);
    (dir, err)
}

fn assert_unsafe(err: &ImageError, needle: &str) {
    assert!(matches!(err, ImageError::UnsafeLayer(_)), "{err:?}");
    assert!(err.to_string().contains(needle), "{err}");
}

#[test]
fn corrupted_layer_blob_is_refused_and_nothing_is_left() {
    let (dir, store) = store();
    let archive = dir.path().join("corrupt.tar");
    let good = Layer::new().file("a", b"a").build();
    let mut oci = Oci::new(vec![(good.clone(), Comp::Gzip), (good, Comp::Zstd)]);
    oci.corrupt_layer = Some(1);
    let built = oci.write(&archive);
    let err = store.import_archive(&archive, "corrupt").unwrap_err();
    match &err {
        ImageError::DigestMismatch { expected, .. } => {
            assert_eq!(expected, &built.layer_digests[1])
        }
        other => panic!("expected DigestMismatch, got {other:?}"),
    }
    assert!(err.to_string().contains("re-export"), "{err}");
    assert!(err.to_string().contains("corrupt.tar"), "{err}");
    assert_store_empty(&store_root(&dir));
}

#[test]
fn corrupted_config_blob_is_refused() {
    let (dir, store) = store();
    let archive = dir.path().join("badcfg.tar");
    let oci = Oci::new(vec![(Layer::new().file("a", b"a").build(), Comp::Gzip)]);
    let (built, mut blobs, len) = oci.blobs();
    for (d, bytes) in blobs.iter_mut() {
        if *d == built.config_digest {
            bytes[0] = b' ';
        }
    }
    let index = index_json(&[(
        built.manifest_digest.clone(),
        len,
        "application/vnd.oci.image.manifest.v1+json",
        None,
    )]);
    write_oci_layout(&archive, &index, &blobs);
    let err = store.import_archive(&archive, "badcfg").unwrap_err();
    assert!(matches!(err, ImageError::DigestMismatch { .. }), "{err}");
    assert!(err.to_string().contains("image config"), "{err}");
    assert_store_empty(&store_root(&dir));
}

#[test]
fn diff_id_mismatch_is_refused_and_snapshot_discarded() {
    let (dir, store) = store();
    let archive = dir.path().join("diffid.tar");
    let layer = Layer::new().file("a", b"a").build();
    let mut oci = Oci::new(vec![
        (Layer::new().file("base", b"b").build(), Comp::Gzip),
        (layer, Comp::Zstd),
    ]);
    let wrong = sha(b"not the layer");
    oci.diff_id_override = Some((1, wrong.clone()));
    oci.write(&archive);
    let err = store.import_archive(&archive, "diffid").unwrap_err();
    match &err {
        ImageError::DigestMismatch {
            what,
            expected,
            actual,
        } => {
            assert_eq!(expected, &wrong);
            assert_ne!(actual, &wrong);
            assert!(what.contains("diffID"), "{what}");
            assert!(what.contains("layer 2/2"), "{what}");
        }
        other => panic!("expected DigestMismatch, got {other:?}"),
    }
    // The base layer snapshot built before the failure is gone too.
    assert_store_empty(&store_root(&dir));
}

#[test]
fn diff_id_mismatch_is_caught_even_when_the_chain_exists() {
    let (dir, store) = store();
    let good = dir.path().join("good.tar");
    let bad = dir.path().join("bad.tar");
    let real = Layer::new().file("real", b"r").build();
    let built = Oci::new(vec![(real, Comp::Gzip)]).write(&good);
    store.import_archive(&good, "good").unwrap();
    // Same diffID claimed for a different layer blob.
    let mut oci = Oci::new(vec![(Layer::new().file("fake", b"f").build(), Comp::Gzip)]);
    oci.diff_id_override = Some((0, built.diff_ids[0].clone()));
    oci.write(&bad);
    let err = store.import_archive(&bad, "bad").unwrap_err();
    assert!(matches!(err, ImageError::DigestMismatch { .. }), "{err}");
    assert_eq!(store.list().unwrap().len(), 1);
}

#[test]
fn device_nodes_and_fifos_are_refused() {
    for (kind, needle) in [
        (tar::EntryType::Char, "character device"),
        (tar::EntryType::Block, "block device"),
        (tar::EntryType::Fifo, "fifo"),
    ] {
        let layer = Layer::new()
            .dir("dev")
            .raw(kind, b"dev/null", b"", b"", &Attrs::default())
            .build();
        let (_dir, err) = import_layer_err(layer);
        assert_unsafe(&err, needle);
        assert!(err.to_string().contains("dev/null"), "{err}");
    }
}

#[test]
fn privileged_xattrs_are_refused() {
    for name in [
        "trusted.overlay.opaque",
        "trusted.overlay.redirect",
        "security.selinux",
    ] {
        let key = format!("SCHILY.xattr.{name}");
        let layer = Layer::new()
            .dir("etc")
            .pax(&[(key.as_str(), b"y")])
            .dir("etc/sub")
            .build();
        let (_dir, err) = import_layer_err(layer);
        assert_unsafe(&err, name);
    }
}

#[test]
fn dotdot_escapes_are_refused() {
    let outside = tempfile::tempdir().unwrap();
    for name in [
        "../escape",
        "a/../../escape",
        "./../../../../../../../../tmp/escape",
    ] {
        let layer = Layer::new().dir("a").file(name, b"pwned").build();
        let (_dir, err) = import_layer_err(layer);
        assert_unsafe(&err, "climbs out of the layer");
    }
    assert_eq!(names(outside.path()), Vec::<String>::new());
}

#[test]
fn absolute_paths_are_contained_in_the_layer() {
    // Like containerd and tar, a leading '/' means the layer root (ko-built
    // images write such names); it must never reach the host path.
    let outside = tempfile::tempdir().unwrap();
    let host_path = format!("{}/escape", outside.path().display());
    let (dir, store) = store();
    let archive = dir.path().join("abs.tar");
    Oci::new(vec![(
        Layer::new()
            .file(&host_path, b"contained")
            .file("/ko-app", b"app")
            .build(),
        Comp::Gzip,
    )])
    .write(&archive);
    let rec = store.import_archive(&archive, "abs").unwrap();
    let lower = &store.lower_dirs(&rec).unwrap()[0];
    assert_eq!(fs::read(lower.join("ko-app")).unwrap(), b"app");
    let inside = lower.join(host_path.trim_start_matches('/'));
    assert_eq!(fs::read(inside).unwrap(), b"contained");
    assert_eq!(names(outside.path()), Vec::<String>::new());
}

#[test]
fn writes_through_planted_symlinks_stay_inside_the_layer() {
    let outside = tempfile::tempdir().unwrap();
    let host_dir = outside.path().to_str().unwrap().to_string();
    let host_file = outside.path().join("victim");
    fs::write(&host_file, b"original").unwrap();

    // 1. Absolute symlink to a host directory, then a file "inside" it: the
    //    link resolves inside the layer, where that path does not exist.
    let layer = Layer::new()
        .symlink("evil", &host_dir)
        .file("evil/pwned", b"pwned")
        .build();
    let (_d, err) = import_layer_err(layer);
    assert!(
        matches!(err, ImageError::InvalidArchive(_)),
        "dangling in-layer link is refused: {err}"
    );

    // 2. Relative symlink climbing out towards the host directory: resolved
    //    inside the layer, where the target does not exist, so refused.
    let depth = "../".repeat(20);
    let layer = Layer::new()
        .symlink(
            "up",
            &format!("{depth}{}", host_dir.trim_start_matches('/')),
        )
        .file("up/pwned", b"pwned")
        .build();
    let (_d, err) = import_layer_err(layer);
    assert!(matches!(err, ImageError::InvalidArchive(_)), "{err}");

    // 3. Relative symlink climbing above the root: clamped to the layer
    //    root, so the write is contained there.
    let (dir, store) = store();
    let archive = dir.path().join("up.tar");
    Oci::new(vec![(
        Layer::new()
            .symlink("root", &depth)
            .file("root/also", b"contained")
            .build(),
        Comp::Gzip,
    )])
    .write(&archive);
    let rec = store.import_archive(&archive, "up").unwrap();
    let lower = &store.lower_dirs(&rec).unwrap()[0];
    assert_eq!(fs::read(lower.join("also")).unwrap(), b"contained");

    // 4. Symlink as the final component, then a regular file of the same
    //    name: the file replaces the link instead of writing the target.
    let (dir2, store2) = common::store();
    let archive = dir2.path().join("final.tar");
    Oci::new(vec![(
        Layer::new()
            .symlink("victim", host_file.to_str().unwrap())
            .file("victim", b"overwritten?")
            .build(),
        Comp::Gzip,
    )])
    .write(&archive);
    let rec = store2.import_archive(&archive, "final").unwrap();
    let lower = &store2.lower_dirs(&rec).unwrap()[0];
    assert_eq!(fs::read(lower.join("victim")).unwrap(), b"overwritten?");
    assert!(!fs::symlink_metadata(lower.join("victim"))
        .unwrap()
        .is_symlink());

    // Nothing outside was touched.
    assert_eq!(names(outside.path()), vec!["victim".to_string()]);
    assert_eq!(fs::read(&host_file).unwrap(), b"original");
}

#[test]
fn hardlinks_outside_the_layer_are_refused() {
    let cases: [(&str, Layer); 4] = [
        ("absolute", Layer::new().hardlink("x", "/etc/passwd")),
        (
            "dotdot",
            Layer::new().hardlink("x", "../../../../etc/passwd"),
        ),
        ("missing", Layer::new().hardlink("x", "etc/passwd")),
        (
            "via symlink",
            Layer::new()
                .symlink("hostetc", "/etc")
                .hardlink("x", "hostetc/passwd"),
        ),
    ];
    for (case, layer) in cases {
        let (_dir, err) = import_layer_err(layer.build());
        assert!(matches!(err, ImageError::UnsafeLayer(_)), "{case}: {err}");
    }
}

#[test]
fn whiteout_entries_are_converted_not_written() {
    let (dir, store) = store();
    let archive = dir.path().join("wh.tar");
    Oci::new(vec![(
        Layer::new()
            .dir("etc")
            .file_with(
                "etc/.wh.passwd",
                b"",
                &Attrs {
                    uid: 7,
                    gid: 8,
                    ..Attrs::default()
                },
            )
            .dir("usr")
            .file("usr/.wh..wh..opq", b"")
            .file("usr/.wh..wh.plnk", b"")
            .file("usr/new", b"n")
            .build(),
        Comp::None,
    )])
    .write(&archive);
    let rec = store.import_archive(&archive, "wh").unwrap();
    let lower = &store.lower_dirs(&rec).unwrap()[0];
    let wh = rustix::fs::lstat(lower.join("etc/passwd")).unwrap();
    assert_eq!(
        rustix::fs::FileType::from_raw_mode(wh.st_mode),
        rustix::fs::FileType::CharacterDevice
    );
    assert_eq!(wh.st_rdev, 0);
    assert_eq!((wh.st_uid, wh.st_gid), (7, 8));
    let mut buf = [0u8; 8];
    let n =
        rustix::fs::getxattr(lower.join("usr"), "trusted.overlay.opaque", &mut buf[..]).unwrap();
    assert_eq!(&buf[..n], b"y");
    assert_eq!(names(&lower.join("etc")), vec!["passwd".to_string()]);
    assert_eq!(names(&lower.join("usr")), vec!["new".to_string()]);
}

#[test]
fn truncated_archive_is_refused() {
    let (dir, store) = store();
    let archive = dir.path().join("full.tar");
    let mut big = Layer::new();
    for i in 0..50 {
        big = big.file(&format!("f{i}"), &[i as u8; 10_000]);
    }
    Oci::new(vec![(big.build(), Comp::Gzip)]).write(&archive);
    let bytes = fs::read(&archive).unwrap();
    let cut = dir.path().join("cut.tar");
    fs::write(&cut, &bytes[..bytes.len() * 2 / 3]).unwrap();
    let err = store.import_archive(&cut, "cut").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Invalid, "{err}");
    assert_store_empty(&store_root(&dir));
}

#[test]
fn failed_import_does_not_disturb_existing_images() {
    let (dir, store) = store();
    let good = dir.path().join("good.tar");
    Oci::new(vec![(Layer::new().file("ok", b"ok").build(), Comp::Gzip)]).write(&good);
    let rec = store.import_archive(&good, "app").unwrap();
    let evil = dir.path().join("evil.tar");
    Oci::new(vec![(
        Layer::new()
            .raw(tar::EntryType::Char, b"null", b"", b"", &Attrs::default())
            .build(),
        Comp::Gzip,
    )])
    .write(&evil);
    assert!(store.import_archive(&evil, "app").is_err());
    let still = store.resolve("app").unwrap();
    assert_eq!(still.digest, rec.digest);
    assert!(store.lower_dirs(&still).unwrap()[0].join("ok").is_file());
    drop(store);
    assert!(ImageStore::open(Path::new(&store_root(&dir))).is_ok());
}

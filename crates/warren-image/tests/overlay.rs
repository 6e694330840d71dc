//! The unpacked layers work as real overlayfs lower layers (needs root).

// Tests may unwrap (clippy.toml covers only #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs;
use std::path::{Path, PathBuf};

use common::*;
use nix::mount::{mount, umount2, MntFlags, MsFlags};

/// Unmounts on drop so a failed assertion does not leave a mount behind.
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = umount2(&self.0, MntFlags::MNT_DETACH);
    }
}

fn mount_overlay(lowers: &[PathBuf], scratch: &Path) -> Mounted {
    let upper = scratch.join("upper");
    let work = scratch.join("work");
    let target = scratch.join("merged");
    for d in [&upper, &work, &target] {
        fs::create_dir_all(d).unwrap();
    }
    let lowerdir: Vec<String> = lowers.iter().map(|p| p.display().to_string()).collect();
    let options = format!(
        "lowerdir={},upperdir={},workdir={}",
        lowerdir.join(":"),
        upper.display(),
        work.display()
    );
    mount(
        Some("overlay"),
        &target,
        Some("overlay"),
        MsFlags::MS_NODEV | MsFlags::MS_NOSUID,
        Some(options.as_str()),
    )
    .unwrap_or_else(|e| panic!("mounting overlay with {options}: {e}"));
    Mounted(target)
}

#[test]
fn whiteouts_and_opaque_dirs_work_under_overlayfs() {
    let (dir, store) = store();
    let archive = dir.path().join("image.tar");
    let base = Layer::new()
        .dir("etc")
        .file("etc/passwd", b"root:x:0:0\n")
        .file("etc/hosts", b"127.0.0.1\n")
        .dir("usr")
        .file("usr/old.txt", b"old")
        .dir("usr/share")
        .file("usr/share/doc", b"doc")
        .dir("opt")
        .file("opt/a", b"a")
        .build();
    let middle = Layer::new()
        .dir("etc")
        .file("etc/.wh.passwd", b"")
        .dir("usr")
        .file("usr/.wh..wh..opq", b"")
        .file("usr/new.txt", b"new")
        .build();
    let top = Layer::new()
        .dir("opt")
        .file("opt/b", b"b")
        .dir("etc")
        .file("etc/motd", b"hi")
        .build();
    Oci::new(vec![
        (base, Comp::Gzip),
        (middle, Comp::Zstd),
        (top, Comp::None),
    ])
    .write(&archive);
    let rec = store.import_archive(&archive, "overlay:test").unwrap();
    let lowers = store.lower_dirs(&rec).unwrap();
    assert_eq!(lowers.len(), 3);
    assert!(lowers[0].join("opt/b").exists(), "topmost layer first");

    let scratch = tempfile::tempdir().unwrap();
    let merged = mount_overlay(&lowers, scratch.path());
    let m = &merged.0;
    assert!(!m.join("etc/passwd").exists(), "whited-out file is gone");
    assert_eq!(fs::read(m.join("etc/hosts")).unwrap(), b"127.0.0.1\n");
    assert_eq!(fs::read(m.join("etc/motd")).unwrap(), b"hi");
    assert!(
        !m.join("usr/old.txt").exists(),
        "opaque dir hides lower content"
    );
    assert!(
        !m.join("usr/share").exists(),
        "opaque dir hides lower subdirs"
    );
    assert_eq!(fs::read(m.join("usr/new.txt")).unwrap(), b"new");
    assert_eq!(names(&m.join("usr")), vec!["new.txt".to_string()]);
    assert_eq!(
        names(&m.join("opt")),
        vec!["a".to_string(), "b".to_string()]
    );
    assert_eq!(
        names(&m.join("etc")),
        vec!["hosts".to_string(), "motd".to_string()]
    );

    // Writes go to the upper dir, never into the shared snapshots.
    fs::write(m.join("etc/new"), b"x").unwrap();
    fs::remove_file(m.join("etc/hosts")).unwrap();
    drop(merged);
    assert!(scratch.path().join("upper/etc/new").exists());
    assert!(lowers[2].join("etc/hosts").exists());
    assert!(!lowers.iter().any(|l| l.join("etc/new").exists()));
}

//! Archives written by real tools (umoci, skopeo), when they are installed.

// Tests may unwrap (clippy.toml covers only #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs;
use std::path::Path;
use std::process::Command;

use common::*;

fn have(tool: &str) -> bool {
    Command::new("which")
        .arg(tool)
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

fn run(cmd: &mut Command) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn tar_dir(dir: &Path, archive: &Path) {
    run(Command::new("tar")
        .arg("-C")
        .arg(dir)
        .arg("-cf")
        .arg(archive)
        .arg("."));
}

#[test]
fn umoci_built_image_imports_and_converts_with_skopeo() {
    if !have("umoci") {
        println!("SKIPPED: umoci is not installed (apt-get install umoci)");
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let layout = work.path().join("layout");
    let bundle = work.path().join("bundle");
    let image = format!("{}:t", layout.display());

    run(Command::new("umoci")
        .args(["init", "--layout"])
        .arg(&layout));
    run(Command::new("umoci").args(["new", "--image", &image]));
    run(Command::new("umoci")
        .args(["unpack", "--image", &image])
        .arg(&bundle));
    let rootfs = bundle.join("rootfs");
    fs::create_dir_all(rootfs.join("etc")).unwrap();
    fs::write(rootfs.join("etc/config"), b"v1").unwrap();
    fs::write(rootfs.join("hello.txt"), b"hello from umoci").unwrap();
    // --refresh-bundle makes the next repack diff against this layer.
    run(Command::new("umoci")
        .args(["repack", "--refresh-bundle", "--image", &image])
        .arg(&bundle));
    // Second layer: delete a file (a whiteout) and add another.
    fs::remove_file(rootfs.join("etc/config")).unwrap();
    fs::write(rootfs.join("etc/other"), b"v2").unwrap();
    run(Command::new("umoci")
        .args(["repack", "--image", &image])
        .arg(&bundle));
    run(Command::new("umoci").args([
        "config",
        "--image",
        &image,
        "--config.cmd",
        "/bin/true",
        "--config.workingdir",
        "/srv",
    ]));

    let oci_tar = work.path().join("umoci.tar");
    tar_dir(&layout, &oci_tar);

    let (dir, store) = store();
    let rec = store.import_archive(&oci_tar, "umoci/test:t").unwrap();
    assert_eq!(rec.layers.len(), 2);
    assert_eq!(rec.config.cmd, vec!["/bin/true"]);
    assert_eq!(rec.config.working_dir, "/srv");
    let lowers = store.lower_dirs(&rec).unwrap();
    assert_eq!(
        fs::read(lowers[1].join("hello.txt")).unwrap(),
        b"hello from umoci"
    );
    let wh = rustix::fs::lstat(lowers[0].join("etc/config")).unwrap();
    assert_eq!(
        rustix::fs::FileType::from_raw_mode(wh.st_mode),
        rustix::fs::FileType::CharacterDevice,
        "umoci's whiteout became an overlay whiteout"
    );
    assert_eq!(fs::read(lowers[0].join("etc/other")).unwrap(), b"v2");

    if !have("skopeo") {
        println!("SKIPPED (skopeo part): skopeo is not installed");
        return;
    }
    // skopeo's docker-archive and oci-archive of the same image share the
    // layers' diffIDs, so their snapshots are reused, not unpacked again.
    let docker_tar = work.path().join("docker.tar");
    run(Command::new("skopeo")
        .args(["--insecure-policy", "copy", &format!("oci:{image}")])
        .arg(format!(
            "docker-archive:{}:umoci/test:d",
            docker_tar.display()
        )));
    let drec = store.import_archive(&docker_tar, "umoci/test:d").unwrap();
    assert_eq!(
        drec.layers.iter().map(|l| &l.diff_id).collect::<Vec<_>>(),
        rec.layers.iter().map(|l| &l.diff_id).collect::<Vec<_>>()
    );
    assert_eq!(drec.layers[0].snapshot, rec.layers[0].snapshot);
    assert_eq!(drec.config.cmd, vec!["/bin/true"]);

    let oci_archive = work.path().join("skopeo-oci.tar");
    run(Command::new("skopeo")
        .args(["--insecure-policy", "copy", &format!("oci:{image}")])
        .arg(format!("oci-archive:{}:t", oci_archive.display())));
    let orec = store.import_archive(&oci_archive, "umoci/test:o").unwrap();
    assert_eq!(orec.layers.len(), 2);
    assert_eq!(snapshot_ids(&store_root(&dir)).len(), 2);

    assert_eq!(store.list().unwrap().len(), 3);
    store.remove("umoci/test:t").unwrap();
    store.remove("umoci/test:d").unwrap();
    assert_eq!(snapshot_ids(&store_root(&dir)).len(), 2, "still used by :o");
    store.remove("umoci/test:o").unwrap();
    assert_store_empty(&store_root(&dir));
}

//! The layer unpacker: arbitrary bytes (or a tar built from the script
//! language in `src/lib.rs`, for inputs that do not look like an archive)
//! applied to an empty directory by the real import code. Whatever the
//! archive holds, nothing outside that directory may change, and the
//! directory may hold no device node but overlay whiteouts and no
//! `trusted.*` xattr but the opaque marker.
#![no_main]

use std::fs;
use std::os::unix::fs::FileTypeExt;
use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use warren_fuzz::{
    assert_nothing_beside, entries, is_whiteout, outside, snapshot, tar_from_script,
};

const BASE: &str = "/tmp/warren-fuzz-image";

struct Fixture {
    outside: PathBuf,
    before: std::collections::BTreeMap<PathBuf, String>,
    work: PathBuf,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let base = PathBuf::from(BASE);
        let outside = outside(&base).expect("creating the outside tree");
        let before = snapshot(&outside);
        let work = base.join(format!("work-{}", std::process::id()));
        Fixture {
            outside,
            before,
            work,
        }
    })
}

fn looks_like_archive(data: &[u8]) -> bool {
    data.starts_with(&[0x1f, 0x8b])
        || data.starts_with(&[0x28, 0xb5, 0x2f, 0xfd])
        || data.get(257..262) == Some(b"ustar")
}

fuzz_target!(|data: &[u8]| {
    let f = fixture();
    let blob = if looks_like_archive(data) {
        data.to_vec()
    } else {
        tar_from_script(data)
    };
    let _ = fs::remove_dir_all(&f.work);
    let layer = f.work.join("layer");
    fs::create_dir_all(&layer).expect("creating the layer directory");
    let result = warren_image::fuzzing::unpack_layer(&blob[..], &layer);

    assert_eq!(
        snapshot(&f.outside),
        f.before,
        "the tree outside the layer changed ({result:?})"
    );
    assert_nothing_beside(std::path::Path::new(BASE), &f.work, "layer", "the unpack");
    for (path, meta) in entries(&layer) {
        let ft = meta.file_type();
        assert!(
            !(ft.is_block_device()
                || ft.is_fifo()
                || ft.is_socket()
                || (ft.is_char_device() && !is_whiteout(&meta))),
            "{path:?} is a {ft:?} ({result:?})"
        );
        let mut buf = [0u8; 4096];
        if let Ok(n) = rustix::fs::llistxattr(&path, &mut buf) {
            for name in buf[..n].split(|b| *b == 0).filter(|n| !n.is_empty()) {
                let ok = !name.starts_with(b"trusted.")
                    || (name == b"trusted.overlay.opaque" && ft.is_dir());
                assert!(
                    ok,
                    "{path:?} carries xattr {}",
                    String::from_utf8_lossy(name)
                );
            }
        }
    }
});

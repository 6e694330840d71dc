//! The sweep of `/run/warren/state`: the directory of a home that is gone
//! and holds nothing but its record goes; one whose home exists, or that
//! still holds a sandbox's state, or that has no record, stays. Needs root
//! (it writes under /run).

// A test's helpers fail the test on any error, as the test itself does.
#![allow(clippy::expect_used)]

use std::path::{Path, PathBuf};

use warren_runtime::{state_root_of, sweep_state_roots, STATE_DIR};

/// A state directory for `home` as a start would leave it, plus `extra`
/// entries (directories) inside.
fn state_dir(home: &Path, extra: &[&str]) -> PathBuf {
    let dir = state_root_of(home);
    std::fs::create_dir_all(&dir).expect("create the state directory");
    std::fs::write(dir.join("home"), home.as_os_str().as_encoded_bytes()).expect("record the home");
    for name in extra {
        std::fs::create_dir_all(dir.join(name)).expect("create an entry");
    }
    dir
}

#[test]
fn sweep_removes_only_the_directories_of_gone_homes() {
    let base = tempfile::tempdir().expect("temporary directory");
    let live_home = base.path().join("live");
    std::fs::create_dir(&live_home).expect("create a home");
    let gone_home = base.path().join("gone");
    let gone_busy_home = base.path().join("gone-busy");

    let live = state_dir(&live_home, &[]);
    let gone = state_dir(&gone_home, &[]);
    let gone_busy = state_dir(&gone_busy_home, &["sbx-aaaaaaaaaaaa"]);
    let unrecorded = Path::new(STATE_DIR).join(format!("test-{}", std::process::id()));
    std::fs::create_dir_all(&unrecorded).expect("create an unrecorded directory");

    sweep_state_roots();

    let kept = [
        live.exists(),
        gone.exists(),
        gone_busy.exists(),
        unrecorded.exists(),
    ];
    for dir in [&live, &gone_busy] {
        let _ = std::fs::remove_dir_all(dir);
    }
    let _ = std::fs::remove_dir(&unrecorded);
    assert_eq!(
        kept,
        [true, false, true, true],
        "live, gone, gone but busy, unrecorded"
    );
}

#[test]
fn a_home_has_one_state_directory_whatever_path_names_it() {
    let base = tempfile::tempdir().expect("temporary directory");
    let home = base.path().join("home");
    std::fs::create_dir(&home).expect("create a home");
    let roundabout = base.path().join("home/../home");
    assert_eq!(state_root_of(&home), state_root_of(&roundabout));
    assert_ne!(state_root_of(&home), state_root_of(base.path()));
    assert!(state_root_of(&home).starts_with(STATE_DIR));
}

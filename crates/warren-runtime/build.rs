//! Checks that libseccomp can be linked, and builds `warren-init` (the
//! warren-init crate) for `init.rs` to embed: a static executable, because
//! a sandbox's root holds no host `ld.so` or `libc`, and one at a fixed
//! address, because a position-independent one relocates its data in every
//! process (1.9 MB private per sandbox where this one keeps under 100 kB;
//! docs/benchmarks.md). A nested cargo with a target directory of its own:
//! the outer one holds the lock on its own.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    check_libseccomp();
    build_init();
}

fn build_init() {
    let manifest_dir = PathBuf::from(env("CARGO_MANIFEST_DIR"));
    let workspace = manifest_dir
        .parent()
        .and_then(|crates| crates.parent())
        .unwrap_or_else(|| panic!("{} is not in a workspace", manifest_dir.display()))
        .to_path_buf();
    let init_crate = workspace.join("crates/warren-init");
    println!("cargo:rerun-if-changed={}", init_crate.display());
    println!(
        "cargo:rerun-if-changed={}",
        workspace.join("Cargo.lock").display()
    );
    // <target>/<profile>/build/warren-runtime-<hash>/out: share one build of
    // the init between profiles, beside them in the same target directory.
    let out_dir = PathBuf::from(env("OUT_DIR"));
    let target_dir = out_dir
        .ancestors()
        .nth(4)
        .map(|t| t.join("warren-init"))
        .unwrap_or_else(|| out_dir.join("warren-init"));
    let mut cargo = Command::new(env("CARGO"));
    // What the outer build set for its own crates (flags, wrappers such as
    // clippy-driver, a target directory) must not leak into this one.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy().into_owned();
        let keep = matches!(
            key.as_str(),
            "CARGO_HOME" | "CARGO_NET_OFFLINE" | "RUSTUP_HOME" | "RUSTUP_TOOLCHAIN"
        );
        if !keep && (key.starts_with("CARGO") || key.starts_with("RUST")) {
            cargo.env_remove(&key);
        }
    }
    let status = cargo
        .args([
            "rustc",
            "--quiet",
            "--release",
            "--bin",
            "warren-init",
            "--manifest-path",
        ])
        .arg(init_crate.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target_dir)
        .args([
            "--",
            "-C",
            "target-feature=+crt-static",
            "-C",
            "relocation-model=static",
        ])
        .status()
        .unwrap_or_else(|e| panic!("run cargo to build warren-init: {e}"));
    if !status.success() {
        panic!(
            "building warren-init failed ({status}); it links glibc statically, \
             from libc.a (Debian/Ubuntu: apt-get install libc6-dev)"
        );
    }
    let binary = target_dir.join("release/warren-init");
    println!("cargo:rustc-env=WARREN_INIT_BIN={}", binary.display());
}

/// Checks that libseccomp can be linked before anything is compiled:
/// without it a fresh machine got through a long build and then failed at
/// the final link with an `undefined reference` that does not say what to
/// install.
fn check_libseccomp() {
    println!("cargo:rerun-if-env-changed=LIBSECCOMP_LIB_PATH");
    println!("cargo:rerun-if-env-changed=LIBSECCOMP_LINK_TYPE");
    println!("cargo:rerun-if-env-changed=LIBRARY_PATH");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("linux") {
        return;
    }
    let static_link = std::env::var("LIBSECCOMP_LINK_TYPE").as_deref() == Ok("static");
    let file = if static_link {
        "libseccomp.a"
    } else {
        "libseccomp.so"
    };
    if pkg_config_finds() || search_dirs().iter().any(|d| d.join(file).exists()) {
        return;
    }
    eprintln!(
        "\nlibseccomp is missing: Warren links it for its sandboxes' syscall filter, and \
         no {file} was found (pkg-config, LIBSECCOMP_LIB_PATH, LIBRARY_PATH or the \
         system library directories).\n\
         Install it, then build again:\n  \
         Debian/Ubuntu: apt-get install libseccomp-dev pkg-config   (or: scripts/install-deps.sh)\n  \
         Fedora/RHEL:   dnf install libseccomp-devel\n  \
         Alpine:        apk add libseccomp-dev libseccomp-static\n\
         A library elsewhere: LIBSECCOMP_LIB_PATH=/its/dir cargo build\n"
    );
    std::process::exit(1);
}

fn pkg_config_finds() -> bool {
    std::process::Command::new("pkg-config")
        .args(["--exists", "libseccomp"])
        .status()
        .is_ok_and(|s| s.success())
}

fn search_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for var in ["LIBSECCOMP_LIB_PATH", "LIBRARY_PATH"] {
        if let Some(v) = std::env::var_os(var) {
            dirs.extend(std::env::split_paths(&v));
        }
    }
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    for base in ["/usr/lib", "/lib", "/usr/local/lib"] {
        dirs.push(Path::new(base).join(format!("{arch}-linux-gnu")));
        dirs.push(PathBuf::from(base));
    }
    dirs.extend(["/usr/lib64", "/lib64", "/usr/local/lib64"].map(PathBuf::from));
    dirs
}

fn env(key: &str) -> String {
    std::env::var(key).unwrap_or_else(|_| panic!("cargo sets {key} for build scripts"))
}

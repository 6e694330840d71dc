//! Checks that libseccomp can be linked before anything is compiled:
//! without it a fresh machine got through a long build and then failed at
//! the final link with an `undefined reference` that does not say what to
//! install.

use std::path::{Path, PathBuf};

fn main() {
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

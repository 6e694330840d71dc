//! The `gvisor` isolation class: sandboxes run on gVisor's user-space
//! kernel through the `runsc` binary the node is given (or finds on PATH).
//! The node lays out the sandbox as for the container class (the overlay
//! root in the spawner's mount namespace, the cgroup path, the sandbox's
//! directory); the spawner then runs `runsc create` and `runsc start` on an
//! OCI bundle whose PID 1 is warren-init, so exec, stdin, exit codes and
//! tree kill are served the same way. See docs/design/gvisor-runsc.md for
//! what this runsc can and cannot do on a host like ours.

use std::path::{Path, PathBuf};

/// Where runsc is and how it runs sandboxes, as the node was told.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunscSettings {
    /// The runsc binary; None: `runsc` on PATH.
    pub path: Option<PathBuf>,
    /// gVisor's platform (`--platform`); None: runsc's own default.
    pub platform: Option<String>,
}

/// A runsc that answered: its path, version and platform.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Runsc {
    pub path: PathBuf,
    /// The first line of `runsc --version`.
    pub version: String,
    pub platform: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum RunscError {
    #[error("runsc not found: {0} (install Debian's runsc package, or pass --runsc PATH)")]
    NotFound(String),
    #[error("{path}: `runsc --version` failed: {message}")]
    Broken { path: String, message: String },
}

impl RunscSettings {
    /// Finds runsc and asks its version: a node offers the class only when
    /// this answers.
    pub fn probe(&self) -> Result<Runsc, RunscError> {
        let path = match &self.path {
            Some(p) => p.clone(),
            None => {
                on_path("runsc").ok_or_else(|| RunscError::NotFound("no runsc on PATH".into()))?
            }
        };
        if !path.is_file() {
            return Err(RunscError::NotFound(format!(
                "{} is not a file",
                path.display()
            )));
        }
        let out = std::process::Command::new(&path)
            .arg("--version")
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| RunscError::Broken {
                path: path.display().to_string(),
                message: e.to_string(),
            })?;
        if !out.status.success() {
            return Err(RunscError::Broken {
                path: path.display().to_string(),
                message: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        let version = String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap_or_default()
            .trim()
            .to_string();
        Ok(Runsc {
            path,
            version,
            platform: self.platform.clone(),
        })
    }
}

fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")
        .unwrap_or_else(|| "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into());
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

//! `warren doctor`'s checks of the gVisor class: which runsc, and whether
//! its platform actually runs a sandbox here (a platform can be listed and
//! still hang: kvm without working nested virtualization spins forever, so
//! the probe is a timed run, not a look at /dev/kvm).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use super::{Runsc, RunscSettings};
use crate::check::{check, Check, Status};

/// How long the probe sandbox may take: a working platform runs it in a
/// fraction of a second.
const PROBE_WITHIN: Duration = Duration::from_secs(15);

/// The open-file limit below which gVisor's file cache can wedge a sandbox.
const GOFER_NOFILE_FLOOR: u64 = 4096;

pub fn checks(settings: &RunscSettings, scratch: &Path) -> Vec<Check> {
    let runsc = match settings.probe() {
        Ok(r) => r,
        Err(e) => {
            return vec![check(
                "runsc",
                Status::Ok,
                e.to_string(),
                "the gvisor isolation class is not offered; sandboxes run in the container class",
            )]
        }
    };
    let mut out = vec![check(
        "runsc",
        Status::Ok,
        format!("{} ({})", runsc.path.display(), runsc.version),
        "runsc answers: the node offers the gvisor isolation class",
    )];
    // runsc gives the gofer the daemon's open-file limit; gVisor caches
    // 1,000 unused files at 2 gofer descriptors each (docs/security.md).
    let nofile = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map(|(_, hard)| hard)
        .unwrap_or(0);
    if nofile < GOFER_NOFILE_FLOOR {
        out.push(check(
            "gvisor files",
            Status::Degraded,
            format!("open-file limit {nofile}"),
            format!("a gvisor sandbox's gofer gets this limit, and gVisor's cache of unused files alone can take 2,000 of it: raise the hard limit to {GOFER_NOFILE_FLOOR} or more (ulimit -Hn, LimitNOFILE=)"),
        ));
    }
    let platform = runsc
        .platform
        .clone()
        .unwrap_or_else(|| "runsc's default".into());
    out.push(match probe_run(&runsc, scratch) {
        Ok(took) => check(
            "gvisor platform",
            Status::Ok,
            format!("{platform}: a sandbox ran in {} ms", took.as_millis()),
            "gvisor sandboxes start here",
        ),
        Err(e) => check(
            "gvisor platform",
            Status::Degraded,
            format!("{platform}: {e}"),
            "gvisor sandboxes cannot start with this platform: pass another with --runsc-platform (ptrace works wherever ptrace does)",
        ),
    });
    out
}

/// Runs warren-init alone in a throw-away gVisor sandbox (it exits at once,
/// given no socket): proof that runsc, its platform and the host's
/// namespaces and cgroups let a sandbox run.
/// Why the throw-away sandbox did not run.
#[derive(Debug, thiserror::Error)]
enum ProbeError {
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// runsc's own last words (a FATAL line).
    #[error("{0}")]
    Runsc(String),
    #[error("runsc ended by {0}")]
    Ended(std::process::ExitStatus),
    #[error("no sandbox ran within {0}s (the platform hangs here)")]
    Hung(u64),
}

fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> ProbeError {
    move |source| ProbeError::Io { what, source }
}

fn probe_run(runsc: &Runsc, scratch: &Path) -> Result<Duration, ProbeError> {
    let dir = scratch.join(format!("gvisor-probe-{}", std::process::id()));
    let result = (|| {
        let rootfs = dir.join("rootfs");
        std::fs::create_dir_all(&rootfs).map_err(io("making the probe's root"))?;
        let init = dir.join("init");
        std::fs::write(&init, crate::init::PROGRAM).map_err(io("writing init"))?;
        let config = json!({
            "ociVersion": "1.0.2",
            "root": { "path": rootfs, "readonly": true },
            "process": { "user": { "uid": 0, "gid": 0 }, "args": [super::INIT_PATH], "cwd": "/" },
            "mounts": [
                { "destination": "/proc", "type": "proc", "source": "proc" },
                { "destination": super::INIT_PATH, "type": "bind", "source": init,
                  "options": ["rbind", "ro"] }
            ],
            "linux": { "namespaces": [
                { "type": "pid" }, { "type": "mount" }, { "type": "ipc" },
                { "type": "uts" }, { "type": "network" }
            ] }
        });
        std::fs::write(dir.join("config.json"), config.to_string())
            .map_err(io("writing config.json"))?;
        let mut cmd = Command::new(&runsc.path);
        cmd.arg(format!("--root={}", dir.join("state").display()))
            .arg("--network=none");
        if let Some(p) = &runsc.platform {
            cmd.arg(format!("--platform={p}"));
        }
        let started = Instant::now();
        let mut child = cmd
            .args(["run", "--bundle"])
            .arg(&dir)
            .arg("probe")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(io("starting runsc"))?;
        loop {
            match child.try_wait() {
                // warren-init's own exit (no socket to serve) is a run.
                Ok(Some(status)) if status.code().is_some() => {
                    let mut err = String::new();
                    if let Some(mut e) = child.stderr.take() {
                        use std::io::Read;
                        let _ = e.read_to_string(&mut err);
                    }
                    // runsc's own failures name what broke.
                    if err.contains("FATAL") || err.contains("cannot") {
                        let line = err.lines().rev().find(|l| !l.trim().is_empty());
                        let line = line.unwrap_or("runsc failed").trim();
                        return Err(ProbeError::Runsc(line.to_string()));
                    }
                    return Ok(started.elapsed());
                }
                Ok(Some(status)) => return Err(ProbeError::Ended(status)),
                Ok(None) if started.elapsed() > PROBE_WITHIN => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(ProbeError::Hung(PROBE_WITHIN.as_secs()));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(e) => return Err(io("waiting for runsc")(e)),
            }
        }
    })();
    // runsc removes what it made for a sandbox that ran; a killed one may
    // leave its state, which goes with the directory.
    let _ = Command::new(&runsc.path)
        .arg(format!("--root={}", dir.join("state").display()))
        .args(["delete", "--force", "probe"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

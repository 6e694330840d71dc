//! The spawner's part of a gVisor create: with the sandbox's root mounted
//! in the spawner's mount namespace (runsc's gofer serves it from there),
//! `runsc create` and `runsc start`, then wait until warren-init listens.
//! runsc is an external program, so this is plain fork and exec from the
//! single-threaded spawner.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::Invocation;
use crate::os_error::OsError;

/// How long init may take to listen after `runsc start`: gVisor boots in
/// tens of milliseconds; a loaded host can take seconds.
const READY_WITHIN: Duration = Duration::from_secs(20);

#[derive(Debug, thiserror::Error)]
pub enum GvisorStartError {
    #[error(transparent)]
    Os(#[from] OsError),
    #[error("runsc {step} failed: {message}")]
    Runsc { step: &'static str, message: String },
    #[error("the sandbox's init did not listen within {0:?} of runsc start")]
    NotReady(Duration),
    #[error("runsc left no {0}")]
    NoPid(&'static str),
}

/// Starts the gVisor sandbox `id` whose bundle (config.json) and ipc
/// directory are in `dir`; returns the sentry's pid. `ids`: the host range
/// the gofer's user namespace maps root to, which then owns what is made
/// here for the sandbox. `from`: a checkpoint's memory image to restore
/// instead of booting (see [`crate::Runtime::checkpoint`]).
pub(crate) fn start(
    id: &str,
    dir: &Path,
    root: &Path,
    run: &Invocation,
    ids: Option<crate::userns::IdRange>,
    from: Option<&Path>,
    took: &mut dyn FnMut(&str),
) -> Result<i32, GvisorStartError> {
    let init = super::init_mount(id);
    let init_source = complete_config(dir, root, &init, ids)?;
    mount_init(&init_source, &init)?;
    let ipc = super::ipc_mount(id);
    let started = mount_ipc(&ipc, ids)
        .map_err(GvisorStartError::from)
        .and_then(|()| start_mounted(id, dir, &ipc, run, from, took));
    // The gofer's mount namespace holds its own copies from `runsc create`
    // on; these were needed only to make it and to see init listen.
    unmount_helpers(id);
    started
}

/// Lets go of the spawner's mounts of a gVisor sandbox's init and ipc
/// directory, and removes their mount points (a crashed spawner's too,
/// when the sandbox is cleaned up).
pub(crate) fn unmount_helpers(id: &str) {
    let ipc = super::ipc_mount(id);
    let _ = crate::rootfs::unmount(&ipc);
    let _ = std::fs::remove_dir(&ipc);
    let init = super::init_mount(id);
    let _ = crate::rootfs::unmount(&init);
    let _ = std::fs::remove_file(&init);
}

fn start_mounted(
    id: &str,
    dir: &Path,
    ipc: &Path,
    run: &Invocation,
    from: Option<&Path>,
    took: &mut dyn FnMut(&str),
) -> Result<i32, GvisorStartError> {
    let err_file = dir.join("runsc.err");
    let pid_file = dir.join("sentry.pid");
    let _ = std::fs::remove_file(&pid_file);
    let bundle = dir.display().to_string();
    let pid_arg = format!("--pid-file={}", pid_file.display());
    let sentry = match from {
        None => {
            runsc(
                run,
                "create",
                &["--bundle", &bundle, &pid_arg, id],
                &err_file,
            )?;
            took("spawn_runsc_create");
            let sentry: i32 = read_pid(&pid_file).ok_or(GvisorStartError::NoPid("sentry pid"))?;
            // With host networking the sandbox's sockets are host sockets in
            // the sentry's network namespace, whose loopback starts down.
            if !run.own_network_stack() {
                crate::netns::loopback_up(sentry)
                    .map_err(|e| OsError::new("bring up loopback", e))?;
            }
            runsc(run, "start", &[id], &err_file)?;
            took("spawn_runsc_start");
            sentry
        }
        Some(image) => {
            // Restored, init goes on from its quiesce: it listens again
            // when told (see warren_init::LISTEN_AGAIN).
            let image_arg = format!("--image-path={}", image.display());
            runsc(
                run,
                "restore",
                &["--detach", "--bundle", &bundle, &pid_arg, &image_arg, id],
                &err_file,
            )?;
            took("spawn_runsc_restore");
            let sentry: i32 = read_pid(&pid_file).ok_or(GvisorStartError::NoPid("sentry pid"))?;
            runsc(
                run,
                "kill",
                &[id, &warren_init::LISTEN_AGAIN.to_string()],
                &err_file,
            )?;
            sentry
        }
    };
    let socket = ipc.join("init.sock");
    let deadline = Instant::now() + READY_WITHIN;
    // The socket file appears when init binds (runsc's gofer binds the host
    // socket), but connections are refused until the sentry listens on it:
    // ready means a connect succeeds. init drops a connection that sends
    // nothing.
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        if Instant::now() > deadline {
            return Err(GvisorStartError::NotReady(READY_WITHIN));
        }
        if !alive(sentry) {
            return Err(GvisorStartError::Runsc {
                step: "start",
                message: "the sandbox exited before its init listened".into(),
            });
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    took("spawn_init_ready");
    let gofer = gofer_of(run, id).ok_or(GvisorStartError::NoPid("gofer pid"))?;
    std::fs::write(dir.join(super::GOFER_PID), gofer.to_string())
        .map_err(|e| OsError::new("record the gofer's pid", e))?;
    let _ = std::fs::remove_file(&err_file);
    Ok(sentry)
}

/// The annotation in a completed config that names the node's copy of init.
const INIT_SOURCE: &str = "dev.warren.init-source";

/// Completes the config (see bundle.rs) in the spawner's namespace: init's
/// source becomes `init_at` (see [`super::init_mount`]), and a bind of the
/// root's own /tmp is added, made first where the image has none. A /tmp
/// that is not a plain directory (a symlink would be followed on the host
/// when runsc mounts it) is left to gVisor, which resolves it inside the
/// sandbox. Returns the node's copy of init the config named.
fn complete_config(
    dir: &Path,
    root: &Path,
    init_at: &Path,
    ids: Option<crate::userns::IdRange>,
) -> Result<PathBuf, OsError> {
    use std::os::unix::fs::PermissionsExt;
    let tmp = root.join("tmp");
    let share = match std::fs::symlink_metadata(&tmp) {
        Ok(m) => m.file_type().is_dir(),
        Err(_) => {
            std::fs::create_dir(&tmp).map_err(|e| OsError::new("create /tmp in the root", e))?;
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o1777))
                .map_err(|e| OsError::new("make /tmp world-writable", e))?;
            if let Some(ids) = ids {
                std::os::unix::fs::lchown(&tmp, Some(ids.base), Some(ids.base))
                    .map_err(|e| OsError::new("give /tmp to the sandbox's root", e))?;
            }
            true
        }
    };
    let path = dir.join("config.json");
    let read = std::fs::read(&path).map_err(|e| OsError::new("read config.json", e))?;
    let mut config: Value = serde_json::from_slice(&read)
        .map_err(|e| OsError::new("parse config.json", std::io::Error::other(e)))?;
    let mut init_source = None;
    // Completed once already (a sandbox restored in place): the node's copy
    // of init is kept in an annotation.
    let completed = config["annotations"][INIT_SOURCE]
        .as_str()
        .map(PathBuf::from);
    if let Some(mounts) = config["mounts"].as_array_mut() {
        for m in mounts.iter_mut() {
            if m["destination"] == super::INIT_PATH {
                init_source = completed
                    .clone()
                    .or_else(|| m["source"].as_str().map(PathBuf::from));
                m["source"] = json!(init_at);
            }
        }
        if share && completed.is_none() {
            mounts.push(json!({
                "destination": "/tmp", "type": "bind", "source": tmp, "options": ["rbind", "rw"]
            }));
        }
    }
    let init_source = init_source.ok_or_else(|| {
        OsError::new(
            "find init's mount in config.json",
            std::io::Error::from(std::io::ErrorKind::NotFound),
        )
    })?;
    if !config["annotations"].is_object() {
        config["annotations"] = json!({});
    }
    config["annotations"][INIT_SOURCE] = json!(init_source);
    let bytes = serde_json::to_vec(&config)
        .map_err(|e| OsError::new("write config.json", std::io::Error::other(e)))?;
    std::fs::write(&path, bytes).map_err(|e| OsError::new("write config.json", e))?;
    Ok(init_source)
}

/// Binds the node's copy of init, read-only, at `at` (see
/// [`super::init_mount`]).
fn mount_init(source: &Path, at: &Path) -> Result<(), OsError> {
    use nix::mount::{mount, MsFlags};
    std::fs::File::create(at).map_err(|e| OsError::new("create init's mount point", e))?;
    mount(
        Some(source),
        at,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(|e| OsError::new("bind init", e))?;
    mount(
        None::<&str>,
        at,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
        None::<&str>,
    )
    .map_err(|e| OsError::new("make init's bind read-only", e))
}

/// A tmpfs of a few KiB and inodes, root's only (the sandbox's root's,
/// with `ids`), for init's socket: the sandbox's root may write there, so
/// it must not be the node's disk.
fn mount_ipc(at: &Path, ids: Option<crate::userns::IdRange>) -> Result<(), OsError> {
    use nix::mount::{mount, MsFlags};
    std::fs::create_dir(at).map_err(|e| OsError::new("create the ipc mount point", e))?;
    let owner = ids.map_or(0, |r| r.base);
    let options = format!("mode=0700,size=16k,nr_inodes=16,uid={owner},gid={owner}");
    mount(
        Some("tmpfs"),
        at,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some(options.as_str()),
    )
    .map_err(|e| OsError::new("mount the ipc tmpfs", e))
}

fn runsc(
    run: &Invocation,
    step: &'static str,
    args: &[&str],
    err_file: &Path,
) -> Result<(), GvisorStartError> {
    // runsc create's stdio become init's; a pipe would stay open as long
    // as the sandbox runs, so errors go to a file.
    let err = std::fs::File::create(err_file)
        .map_err(|e| OsError::new("create runsc's error file", e))?;
    let status = Command::new(&run.runsc)
        .args(&run.flags)
        .arg(step)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(err))
        .status()
        .map_err(|e| OsError::new(format!("run {}", run.runsc.display()), e))?;
    if status.success() {
        return Ok(());
    }
    let text = std::fs::read_to_string(err_file).unwrap_or_default();
    let message = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("no message")
        .trim()
        .to_string();
    Err(GvisorStartError::Runsc {
        step,
        message: format!("{message} ({status})"),
    })
}

fn read_pid(path: &Path) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn alive(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// The gofer's pid from runsc's state file of the sandbox.
fn gofer_of(run: &Invocation, id: &str) -> Option<i32> {
    let root = run.flags.first()?.strip_prefix("--root=")?;
    let state = Path::new(root).join(format!("{id}_sandbox:{id}.state"));
    let value: Value = serde_json::from_slice(&std::fs::read(state).ok()?).ok()?;
    value["goferPid"]
        .as_i64()
        .and_then(|p| i32::try_from(p).ok())
}

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

pub(crate) mod bundle;
pub mod doctor;
pub(crate) mod spawn;

pub(crate) use bundle::config;

/// Where warren-init is in a gVisor sandbox: a read-only bind of the
/// node's copy ([`Runsc::init_binary`]), on gVisor's own /dev tmpfs so
/// that nothing appears in the sandbox's root. (The container class execs
/// init from a sealed memfd, which cannot cross into gVisor.)
pub const INIT_PATH: &str = "/dev/.warren-init";
/// The directory where init binds its socket: a tiny tmpfs of the
/// sandbox's own, mode 0700 ([`ipc_mount`]), so that nothing the sandbox
/// writes there reaches the node's disk.
pub const IPC_DIR: &str = "/dev/.warren";
/// The sandbox's record that it runs in gVisor: the runsc and flags every
/// runsc call for it must repeat (`<sandbox dir>/gvisor.json`).
pub const RECORD: &str = "gvisor.json";
/// Where the spawner writes the gofer's pid: the host reaches the sandbox's
/// files through it (`/proc/<gofer>/root`; the sentry's root is empty).
pub const GOFER_PID: &str = "gofer.pid";

/// The runsc and flags of one gVisor sandbox, as its directory records
/// them: runsc refuses a call whose flags differ from its create's.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Invocation {
    pub runsc: PathBuf,
    /// Global flags, `--root` first.
    pub flags: Vec<String>,
}

const HOST_NETWORK: &str = "--network=host";
const OWN_NETWORK: &str = "--network=none";

impl Invocation {
    /// gVisor's own network stack (see [`Runsc::invocation`]).
    pub fn own_network_stack(&self) -> bool {
        self.flags.iter().any(|f| f == OWN_NETWORK)
    }
}

impl Runsc {
    /// The node's copy of warren-init that gVisor sandboxes exec, beside
    /// runsc's state of this home.
    pub fn init_binary(home: &Path) -> PathBuf {
        home.join("runsc").join("warren-init")
    }

    /// The call of one sandbox: its own state directory (so destroy and
    /// the sweep of leftovers remove it with the sandbox's), the platform,
    /// and the modes Warren's design needs:
    /// - the network: a sandbox that reaches nothing gets gVisor's own
    ///   stack (`none`: loopback only; runsc then runs the sentry as nobody
    ///   in a user namespace of its own); one that goes through the node's
    ///   proxy gets host networking inside its own network namespace (the
    ///   proxy, DNS stub and port door work as for containers; runsc then
    ///   leaves the sentry root in the host's user namespace, under its
    ///   seccomp filter; docs/isolation.md);
    /// - shared file access (the file API's changes are seen at once);
    /// - host unix sockets created by the sandbox (init's socket, on a tmpfs
    ///   of its own), and Warren's seccomp profile enforced by the sentry.
    pub fn invocation(&self, state_dir: &Path, proxied_network: bool) -> Invocation {
        let mut flags = vec![format!("--root={}", state_dir.display())];
        if let Some(p) = &self.platform {
            flags.push(format!("--platform={p}"));
        }
        flags.push(
            if proxied_network {
                HOST_NETWORK
            } else {
                OWN_NETWORK
            }
            .to_string(),
        );
        flags.extend(
            [
                "--file-access=shared",
                "--host-uds=create",
                "--cpu-num-from-quota",
                "--oci-seccomp",
            ]
            .map(String::from),
        );
        Invocation {
            runsc: self.path.clone(),
            flags,
        }
    }
}

/// Lays out a gVisor sandbox's directory: runsc's config and the record
/// that says how runsc is called for it. With `userns`, the sandbox gets a
/// host id range of its own, as a container does ([`crate::userns`]): runsc
/// runs the gofer, the process that serves the sandbox's files, as root of
/// a user namespace mapped to that range instead of the host's root, and
/// the root is built on id-mapped layers so the range owns its files. (This
/// runsc keeps the sentry as nobody in a user namespace of its own either
/// way; with host networking it refuses a user namespace in the config, so
/// the caller asks for one only with gVisor's own network stack.)
pub(crate) fn prepare(
    handle: &crate::SandboxHandle,
    resources: &warren_core::ResolvedResources,
    run: &Invocation,
    home: &Path,
    userns: bool,
) -> Result<Option<crate::userns::IdRange>, crate::RuntimeError> {
    use crate::RuntimeError;
    use nix::sys::resource::Resource;
    let dir = &handle.dir;
    std::fs::create_dir(dir)
        .map_err(|e| RuntimeError::Create(format!("sandbox directory {}: {e}", dir.display())))?;
    let ids = if userns {
        Some(crate::userns::allocate(dir)?)
    } else {
        None
    };
    let ipc = ipc_mount(&handle.id);
    let config = config(&bundle::ConfigInput {
        id: &handle.id,
        rootfs: &crate::root_mount(&handle.id),
        cgroup_path: &handle.cgroup_path,
        resources,
        nofile: crate::capped_limit(Resource::RLIMIT_NOFILE, 65536, 1024),
        init: &Runsc::init_binary(home),
        ipc: &ipc,
        ids,
    });
    let bytes = serde_json::to_vec(&config).map_err(RuntimeError::Config)?;
    std::fs::write(dir.join("config.json"), bytes)
        .map_err(RuntimeError::io("write config.json"))?;
    let record = serde_json::to_vec(run).map_err(RuntimeError::Config)?;
    std::fs::write(dir.join(RECORD), record)
        .map_err(RuntimeError::io("record the sandbox's runsc"))?;
    Ok(ids)
}

/// Writes the node's copy of warren-init (a new file each start, renamed
/// into place, so running sandboxes keep the one they bound).
pub(crate) fn install_init(home: &Path) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let target = Runsc::init_binary(home);
    let dir = target.parent().unwrap_or(home);
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".warren-init.{}", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o555)
        .open(&tmp)?;
    f.write_all(crate::init::PROGRAM)?;
    f.sync_all()?;
    std::fs::rename(&tmp, &target)
}

/// The invocation a sandbox's directory records, if it runs in gVisor.
pub fn recorded(sandbox_dir: &Path) -> Option<Invocation> {
    let bytes = std::fs::read(sandbox_dir.join(RECORD)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Where the spawner mounts a sandbox's ipc tmpfs, in its own mount
/// namespace (under [`crate::ROOTS_DIR`]); the gofer's namespace keeps it
/// bound at [`IPC_DIR`] after the spawner lets go.
pub fn ipc_mount(id: &str) -> PathBuf {
    Path::new(crate::ROOTS_DIR).join(format!("{id}.ipc"))
}

/// Where the spawner binds the node's copy of warren-init for one sandbox,
/// in its own mount namespace, as the config's source for [`INIT_PATH`]:
/// the gofer opens it with its own credentials, and the node's home may be
/// closed to it (mode 0700, and a gofer in a user namespace is not the
/// host's root), while [`crate::ROOTS_DIR`] is open.
pub fn init_mount(id: &str) -> PathBuf {
    Path::new(crate::ROOTS_DIR).join(format!("{id}.init"))
}

/// Init's socket as the daemon reaches it: through the gofer's view of the
/// sandbox's root, where the ipc tmpfs is bound (the daemon's own mount
/// namespace never holds it).
pub fn socket(sandbox_dir: &Path) -> PathBuf {
    let gofer = gofer_pid(sandbox_dir).unwrap_or(0);
    PathBuf::from(format!("/proc/{gofer}/root{IPC_DIR}/init.sock"))
}

/// The gofer's pid of a gVisor sandbox, as the spawner recorded it.
pub fn gofer_pid(sandbox_dir: &Path) -> Option<i32> {
    std::fs::read_to_string(sandbox_dir.join(GOFER_PID))
        .ok()?
        .trim()
        .parse()
        .ok()
}

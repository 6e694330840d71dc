//! The sandbox spec as clients send it, its validation, and the defaults that
//! turn it into the fully resolved spec a node runs.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use thiserror::Error;
use utoipa::ToSchema;

use crate::labels::{self, LabelError, Labels};

mod fork;
pub use fork::{ForkOrigin, ForkRequest, FORK_LABEL, MAX_FORK};

pub use crate::units::{ByteSize, Cpu, Dur};

/// Smallest memory limit we accept: below this the sandbox's own init and a
/// shell cannot start reliably, so a lower value is a mistake, not a choice.
pub const MIN_MEMORY: u64 = 16 << 20;
pub const MIN_DISK: u64 = 16 << 20;
pub const MIN_PIDS: u32 = 8;
pub const MAX_CPU_MILLIS: u64 = 1024 * 1000;
pub const DEFAULT_CPU_MILLIS: u64 = 1000;
pub const DEFAULT_MEMORY: u64 = 512 << 20;
/// What a sandbox that names no request (and has no learned profile) holds
/// in admission: an idle sandbox costs the host about 1.3 MB and almost no
/// CPU, so small requests let a node hold thousands of them, while its
/// limits (`cpu`, `memory`) still bound what it may use.
pub const DEFAULT_CPU_REQUEST_MILLIS: u64 = 10;
pub const DEFAULT_MEMORY_REQUEST: u64 = 16 << 20;
pub const DEFAULT_PIDS: u32 = 1024;
pub const DEFAULT_TTL: Duration = Duration::from_secs(3600);
pub const DEFAULT_KEEP_FOR: Duration = Duration::from_secs(3600);
pub const DEFAULT_DELAY: Duration = Duration::from_secs(30);
/// The kernel's own ceiling on process ids (PID_MAX_LIMIT); a node refuses
/// more than its process table can hold (see the node's admission).
pub const MAX_PIDS: u32 = 1 << 22;
/// Far above any machine; what is left is refused by the node's admission.
pub const MAX_MEMORY: u64 = 1 << 50;
pub const MAX_DISK: u64 = 1 << 50;
/// Bytes of argv, environment and working directory together. A process's
/// arguments and environment live in one page-limited area of the kernel's
/// (ARG_MAX, 2 MiB with the usual stack limit), and they travel to the
/// sandbox's init in one bounded frame.
pub const MAX_ARGS_BYTES: usize = 256 << 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum NetworkMode {
    /// Loopback only.
    #[default]
    None,
    /// Egress only through the node's proxy, to the listed `host:port` rules.
    Allowlist,
    /// Egress through the node's proxy to any public address on any port
    /// (deny rules still win; allow rules add internal addresses). Only on
    /// nodes whose operator permits it (`--egress-open`).
    Open,
}

impl NetworkMode {
    /// Whether the sandbox's egress goes through the node's proxy.
    pub fn is_proxied(self) -> bool {
        self != NetworkMode::None
    }

    pub fn as_str(self) -> &'static str {
        match self {
            NetworkMode::None => "none",
            NetworkMode::Allowlist => "allowlist",
            NetworkMode::Open => "open",
        }
    }
}

impl std::str::FromStr for NetworkMode {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, SpecError> {
        [NetworkMode::None, NetworkMode::Allowlist, NetworkMode::Open]
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| SpecError::NetworkMode(s.to_string()))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkSpec {
    #[serde(default)]
    pub mode: NetworkMode,
    /// `HOST:PORT` rules: exact names, `*.suffix` wildcards, IPv4
    /// addresses or CIDRs (`10.0.0.0/8:5000`).
    #[serde(default)]
    pub allow: Vec<String>,
    /// Rules that win over `allow` (and over the node's defaults).
    #[serde(default)]
    pub deny: Vec<String>,
}

impl NetworkSpec {
    /// Checks the rules' shape and the mode they need.
    pub fn validate(&self) -> Result<(), SpecError> {
        match self.mode {
            NetworkMode::None if !self.allow.is_empty() || !self.deny.is_empty() => {
                Err(SpecError::AllowWithoutAllowlist)
            }
            NetworkMode::None => Ok(()),
            NetworkMode::Allowlist | NetworkMode::Open => {
                crate::network::Policy::parse(&self.allow, &self.deny, &[])?;
                Ok(())
            }
        }
    }

    /// The parsed policy, with the node's default allow rules merged in.
    pub fn policy(
        &self,
        defaults: &[String],
    ) -> Result<crate::network::Policy, crate::network::RuleError> {
        let policy = crate::network::Policy::parse(&self.allow, &self.deny, defaults)?;
        Ok(if self.mode == NetworkMode::Open {
            policy.open()
        } else {
            policy
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ReclaimPolicy {
    #[default]
    Destroy,
    Delay,
    Keep,
    KeepOnFailure,
    /// At its TTL the sandbox pauses (frozen, memory kept) for `keep_for`
    /// instead of ending; a resume (with a new TTL) carries on. E2B's
    /// `autoPause`. A main process that exits ends it.
    Pause,
}

impl fmt::Display for ReclaimPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            ReclaimPolicy::Destroy => "destroy",
            ReclaimPolicy::Delay => "delay",
            ReclaimPolicy::Keep => "keep",
            ReclaimPolicy::KeepOnFailure => "keep_on_failure",
            ReclaimPolicy::Pause => "pause",
        };
        f.write_str(s)
    }
}

/// How the scheduler chooses among the nodes a sandbox fits on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Placement {
    /// The node with the most of the scarcest requested resource left (the
    /// default: load spreads, one busy node does not slow a batch).
    #[default]
    Spread,
    /// The node with the least left that still fits (GPU nodes: whole
    /// nodes stay free for the large requests).
    Pack,
}

impl Placement {
    pub fn is_spread(&self) -> bool {
        *self == Placement::Spread
    }
}

/// What a client asks for. Every size is optional; `resolve` fills defaults.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SandboxSpec {
    /// Image reference: `name:tag` or `sha256:<digest>`.
    pub image: String,
    /// A name unique among live sandboxes, usable wherever its id is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<crate::sandbox_name::SandboxName>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Cpu>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<ByteSize>,
    /// CPU the scheduler reserves (admission and placement count requests;
    /// `cpu` is the limit the cgroup enforces). Default: the learned
    /// profile's, else `cpu` if given (as Kubernetes), else 10m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_request: Option<Cpu>,
    /// Memory the scheduler reserves; `memory` is the enforced limit.
    /// Default: the learned profile's, else `memory` if given, else 16M.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_request: Option<ByteSize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<ByteSize>,
    /// Devices of the node's GPU kind (`--gpu-kind`, default
    /// `nvidia.com/gpu`), any free ones; see docs/gpu.md.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<u32>,
    /// CDI devices by fully qualified name (`vendor/class=name`, e.g.
    /// `nvidia.com/gpu=0`): the sandbox gets their device nodes, mounts and
    /// environment, and holds them alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<String>,
    /// Volumes mounted into it (see docs/volumes.md): it is placed on the
    /// node that holds them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<crate::volume::VolumeMount>,
    /// Secrets given to it, as environment variables or files under
    /// /run/secrets (see docs/secrets.md); the spec names them, never holds
    /// their values.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<crate::secret::SecretRef>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub labels: Labels,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<Dur>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<Dur>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    #[serde(default)]
    pub network: NetworkSpec,
    #[serde(default)]
    pub reclaim: ReclaimPolicy,
    /// How long a kept sandbox is held before it is destroyed (default 1h),
    /// or the grace period of the `delay` policy (default 30s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_for: Option<Dur>,
    /// The main process. Without it the sandbox idles until deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmd: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Numeric `uid[:gid]` or a user name from the image's /etc/passwd.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Client-chosen id that makes a create idempotent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// Labels a node must carry (each `key=value`) to run this sandbox.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: Labels,
    #[serde(default, skip_serializing_if = "Placement::is_spread")]
    pub placement: Placement,
    /// What stands between its code and the host (see
    /// [`crate::isolation`]); none: its node's default. The control plane
    /// records the class it ran with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<crate::Isolation>,
    /// Its place in its tenant's queue: higher goes first, and lower is
    /// preempted first. None: its tenant's priority, which is also the
    /// most a tenant's create may give (the operator's may give any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    /// Set on the children of a fork (`POST /v1/sandboxes/{id}/fork`):
    /// the sandbox they were forked from and the layers their root is
    /// built on. A create that names one is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fork: Option<ForkOrigin>,
}

/// A spec with every resource decided; this is what a node runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ResolvedResources {
    /// The CPU limit (the cgroup's quota).
    pub cpu_millis: u64,
    /// The memory limit.
    pub memory: u64,
    /// What admission and placement count. Records written before requests
    /// existed have none: their request was their limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_request_millis: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_request: Option<u64>,
    pub pids: u32,
    /// Bytes of the sandbox's own file system; 0 = no limit of its own.
    pub disk: u64,
    pub gpus: u32,
}

impl ResolvedResources {
    /// Millicores the scheduler reserves for this sandbox.
    pub fn cpu_request(&self) -> u64 {
        self.cpu_request_millis.unwrap_or(self.cpu_millis)
    }

    /// Bytes of memory the scheduler reserves for this sandbox.
    pub fn memory_request(&self) -> u64 {
        self.memory_request.unwrap_or(self.memory)
    }
}

#[derive(Debug, Error, PartialEq)]
pub enum SpecError {
    #[error("image is required: pass --image NAME:TAG (see `warren image ls`)")]
    MissingImage,
    #[error("cpu must be between 0.001 and {max} cores, got {0}", max = MAX_CPU_MILLIS / 1000)]
    Cpu(f64),
    #[error(
        "memory {0} bytes is below the floor of 16M ({MIN_MEMORY} bytes): ask for at least 16M"
    )]
    MemoryTooSmall(u64),
    #[error("disk {0} bytes is below the floor of 16M ({MIN_DISK} bytes): ask for at least 16M")]
    DiskTooSmall(u64),
    #[error(
        "pids {0} is below the floor of {MIN_PIDS}: a sandbox needs at least {MIN_PIDS} processes"
    )]
    PidsTooSmall(u32),
    #[error("pids {0} is above the kernel's limit of {MAX_PIDS} processes: ask for fewer")]
    PidsTooLarge(u32),
    #[error("memory {0} bytes is above the largest request accepted (1P): ask for less")]
    MemoryTooLarge(u64),
    #[error("disk {0} bytes is above the largest request accepted (1P): ask for less")]
    DiskTooLarge(u64),
    #[error("command, environment and cwd take {0} bytes; at most {MAX_ARGS_BYTES} are accepted: pass large data as a file or on stdin")]
    ArgsTooLarge(usize),
    #[error("cpu_request {request} cores is above the cpu limit of {limit} cores: a request is what the scheduler reserves and must fit within the limit (raise --cpu or lower --cpu-request)")]
    CpuRequestAboveLimit { request: f64, limit: f64 },
    #[error("memory_request {request} bytes is above the memory limit of {limit} bytes: a request is what the scheduler reserves and must fit within the limit (raise --memory or lower --memory-request)")]
    MemoryRequestAboveLimit { request: u64, limit: u64 },
    #[error("memory_request must be at least 1M, got {0} bytes")]
    MemoryRequestTooSmall(u64),
    #[error("gpus {0} is above the most one sandbox may ask for ({MAX_GPUS})")]
    Gpus(u32),
    #[error("device {0:?} is not a fully qualified CDI device name: write vendor/class=name, e.g. nvidia.com/gpu=0")]
    Device(String),
    #[error("device {0:?} is named twice")]
    DeviceTwice(String),
    #[error("{0}")]
    Label(#[from] LabelError),
    #[error("{0}")]
    Volume(#[from] crate::volume::VolumeError),
    #[error(transparent)]
    Secret(#[from] crate::secret::SecretError),
    #[error("environment variable {0} is set both by env and by a secret")]
    SecretEnvTwice(String),
    #[error(
        "invalid environment variable name {0:?}: names are non-empty and contain no '=' or NUL"
    )]
    EnvName(String),
    #[error("environment variable {0:?} contains a NUL byte")]
    EnvValue(String),
    #[error("cmd must not be empty: give the program to run, e.g. [\"sh\", \"-c\", \"...\"]")]
    EmptyCmd,
    #[error("argument contains a NUL byte: {0:?}")]
    NulArg(String),
    #[error(
        "cwd must be an absolute path inside the sandbox (or ~ for the user's home), got {0:?}"
    )]
    Cwd(String),
    #[error(transparent)]
    NetworkRule(#[from] crate::network::RuleError),
    #[error("allow and deny rules need network mode 'allowlist' or 'open'")]
    AllowWithoutAllowlist,
    #[error("network mode {0:?}: use none, allowlist or open")]
    NetworkMode(String),
    #[error("ttl must be greater than zero")]
    ZeroTtl,
    #[error("lease must be at least 1s")]
    ShortLease,
    #[error("request_id must be 1-128 characters of letters, digits, '-', '_', '.' or ':'")]
    RequestId,
    #[error("count must be between 1 and {MAX_FORK} children, got {0}")]
    ForkCount(u32),
    #[error("{0}")]
    ForkProcesses(&'static str),
}

/// Checks that argv, environment and working directory together stay
/// within [`MAX_ARGS_BYTES`].
pub fn validate_args_size(
    cmd: Option<&[String]>,
    env: &BTreeMap<String, String>,
    cwd: Option<&str>,
) -> Result<(), SpecError> {
    let bytes = cmd
        .unwrap_or_default()
        .iter()
        .map(|a| a.len() + 1)
        .sum::<usize>()
        + env
            .iter()
            .map(|(k, v)| k.len() + v.len() + 2)
            .sum::<usize>()
        + cwd.map_or(0, str::len);
    if bytes > MAX_ARGS_BYTES {
        return Err(SpecError::ArgsTooLarge(bytes));
    }
    Ok(())
}

/// Most devices of the GPU kind one sandbox may ask for.
pub const MAX_GPUS: u32 = 256;

/// Each name is `vendor/class=name` as CDI writes them (the vendor a
/// DNS-like name, the class and the device name letters, digits and
/// `_-.`, the device name also `:`), and named once.
pub fn validate_devices(devices: &[String]) -> Result<(), SpecError> {
    let part = |s: &str, extra: &str| {
        s.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || extra.contains(c))
    };
    let mut seen = std::collections::HashSet::new();
    for d in devices {
        let ok = d.split_once('=').is_some_and(|(kind, name)| {
            kind.split_once('/')
                .is_some_and(|(vendor, class)| part(vendor, "-_.") && part(class, "-_."))
                && part(name, "-_.:")
        });
        if !ok || d.len() > 256 {
            return Err(SpecError::Device(d.clone()));
        }
        if !seen.insert(d) {
            return Err(SpecError::DeviceTwice(d.clone()));
        }
    }
    Ok(())
}

pub fn validate_env(env: &BTreeMap<String, String>) -> Result<(), SpecError> {
    for (k, v) in env {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return Err(SpecError::EnvName(k.clone()));
        }
        if v.contains('\0') {
            return Err(SpecError::EnvValue(k.clone()));
        }
    }
    Ok(())
}

pub fn validate_cmd(cmd: &[String]) -> Result<(), SpecError> {
    if cmd.is_empty() {
        return Err(SpecError::EmptyCmd);
    }
    if let Some(a) = cmd.iter().find(|a| a.contains('\0')) {
        return Err(SpecError::NulArg(a.clone()));
    }
    Ok(())
}

/// An absolute path, or `~` / `~/…`: the home directory (from the
/// sandbox's /etc/passwd) of the user the process runs as.
pub fn validate_cwd(cwd: &str) -> Result<(), SpecError> {
    let home = cwd == "~" || cwd.starts_with("~/");
    if !(cwd.starts_with('/') || home) || cwd.contains('\0') {
        return Err(SpecError::Cwd(cwd.to_string()));
    }
    Ok(())
}

impl SandboxSpec {
    /// Checks every field and returns the resources this spec asks for.
    pub fn resolve(&self) -> Result<ResolvedResources, SpecError> {
        if self.image.trim().is_empty() {
            return Err(SpecError::MissingImage);
        }
        crate::volume::check_mounts(&self.volumes)?;
        crate::secret::check_refs(&self.secrets)?;
        if let Some(env) = self
            .secrets
            .iter()
            .find_map(|r| r.env.as_ref().filter(|e| self.env.contains_key(e.as_str())))
        {
            return Err(SpecError::SecretEnvTwice(env.as_str().to_string()));
        }
        let cpu_millis = self.cpu.map_or(DEFAULT_CPU_MILLIS, |c| c.0);
        if cpu_millis == 0 || cpu_millis > MAX_CPU_MILLIS {
            return Err(SpecError::Cpu(cpu_millis as f64 / 1000.0));
        }
        let memory = self.memory.map_or(DEFAULT_MEMORY, |m| m.0);
        if memory < MIN_MEMORY {
            return Err(SpecError::MemoryTooSmall(memory));
        }
        if memory > MAX_MEMORY {
            return Err(SpecError::MemoryTooLarge(memory));
        }
        let cpu_request = match self.cpu_request {
            Some(c) if c.0 == 0 || c.0 > cpu_millis => {
                return Err(SpecError::CpuRequestAboveLimit {
                    request: c.0 as f64 / 1000.0,
                    limit: cpu_millis as f64 / 1000.0,
                })
            }
            Some(c) => c.0,
            // As Kubernetes: a limit given without a request is also the
            // request; with neither, the small default.
            None if self.cpu.is_some() => cpu_millis,
            None => DEFAULT_CPU_REQUEST_MILLIS,
        };
        let memory_request = match self.memory_request {
            Some(m) if m.0 < 1 << 20 => return Err(SpecError::MemoryRequestTooSmall(m.0)),
            Some(m) if m.0 > memory => {
                return Err(SpecError::MemoryRequestAboveLimit {
                    request: m.0,
                    limit: memory,
                })
            }
            Some(m) => m.0,
            None if self.memory.is_some() => memory,
            None => DEFAULT_MEMORY_REQUEST,
        };
        let disk = self.disk.map_or(0, |d| d.0);
        if self.disk.is_some() && disk < MIN_DISK {
            return Err(SpecError::DiskTooSmall(disk));
        }
        if disk > MAX_DISK {
            return Err(SpecError::DiskTooLarge(disk));
        }
        let pids = self.pids.unwrap_or(DEFAULT_PIDS);
        if pids < MIN_PIDS {
            return Err(SpecError::PidsTooSmall(pids));
        }
        if pids > MAX_PIDS {
            return Err(SpecError::PidsTooLarge(pids));
        }
        let gpus = self.gpus.unwrap_or(0);
        if gpus > MAX_GPUS {
            return Err(SpecError::Gpus(gpus));
        }
        validate_devices(&self.devices)?;
        labels::validate(&self.labels)?;
        labels::validate(&self.node_selector)?;
        // A profile is named like a label value (it is often the `task`
        // label), so the profile table can be exported and imported again.
        if let Some(p) = &self.profile {
            labels::validate_value("profile", p)?;
        }
        validate_env(&self.env)?;
        if let Some(cmd) = &self.cmd {
            validate_cmd(cmd)?;
        }
        if let Some(cwd) = &self.cwd {
            validate_cwd(cwd)?;
        }
        validate_args_size(self.cmd.as_deref(), &self.env, self.cwd.as_deref())?;
        self.network.validate()?;
        if self.ttl.is_some_and(|t| t.get().is_zero()) {
            return Err(SpecError::ZeroTtl);
        }
        if self.lease.is_some_and(|l| l.get() < Duration::from_secs(1)) {
            return Err(SpecError::ShortLease);
        }
        if let Some(id) = &self.request_id {
            let ok = !id.is_empty()
                && id.len() <= 128
                && id
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c));
            if !ok {
                return Err(SpecError::RequestId);
            }
        }
        Ok(ResolvedResources {
            cpu_millis,
            memory,
            cpu_request_millis: Some(cpu_request),
            memory_request: Some(memory_request),
            pids,
            disk,
            gpus,
        })
    }

    pub fn ttl(&self) -> Duration {
        self.ttl.map_or(DEFAULT_TTL, |t| t.get())
    }

    pub fn keep_for(&self) -> Duration {
        self.keep_for.map_or(DEFAULT_KEEP_FOR, |t| t.get())
    }

    /// Grace period of the `delay` policy: `keep_for`, or 30 s.
    pub fn delay_for(&self) -> Duration {
        self.keep_for.map_or(DEFAULT_DELAY, |t| t.get())
    }
}

/// Thread-count variables derived from the CPU limit, so that numeric
/// libraries do not start one thread per host core inside a small sandbox.
pub const THREAD_VARS: &[&str] = &[
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "NUMEXPR_MAX_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "BLIS_NUM_THREADS",
    "RAYON_NUM_THREADS",
    "GOMAXPROCS",
    "TF_NUM_INTRAOP_THREADS",
    "TF_NUM_INTEROP_THREADS",
    "JULIA_NUM_THREADS",
    "UV_THREADPOOL_SIZE",
];

pub fn thread_count(cpu_millis: u64) -> u64 {
    cpu_millis.div_ceil(1000).max(1)
}

/// The process environment of a sandbox: image config first, then the
/// thread variables, then the spec (which wins over both).
pub fn sandbox_env(
    image_env: &[String],
    cpu_millis: u64,
    spec_env: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> = image_env
        .iter()
        .filter_map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
        })
        .collect();
    env.entry("PATH".into())
        .or_insert_with(|| "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into());
    let threads = thread_count(cpu_millis).to_string();
    for var in THREAD_VARS {
        if !image_env
            .iter()
            .any(|kv| kv.starts_with(&format!("{var}=")))
        {
            env.insert(var.to_string(), threads.clone());
        }
    }
    for (k, v) in spec_env {
        env.insert(k.clone(), v.clone());
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: &str) -> Result<SandboxSpec, serde_json::Error> {
        serde_json::from_str(json)
    }

    #[test]
    fn parses_sizes_in_both_forms() {
        let s = spec(r#"{"image":"a","cpu":"500m","memory":"256M","disk":1073741824,"ttl":"10m"}"#)
            .expect("valid spec");
        let r = s.resolve().expect("resolves");
        assert_eq!(r.cpu_millis, 500);
        assert_eq!(r.memory, 256 << 20);
        assert_eq!(r.disk, 1 << 30);
        assert_eq!(s.ttl(), Duration::from_secs(600));
    }

    #[test]
    fn rejects_bad_values_with_reasons() {
        assert!(spec(r#"{"image":"a","cpu":-1}"#).is_err());
        assert!(spec(r#"{"image":"a","memory":"lots"}"#).is_err());
        assert!(spec(r#"{"image":"a","bogus":1}"#).is_err());
        let small = spec(r#"{"image":"a","memory":"1M"}"#).expect("parses");
        assert_eq!(small.resolve(), Err(SpecError::MemoryTooSmall(1 << 20)));
        let zero = spec(r#"{"image":"a","cpu":0}"#).expect("parses");
        assert!(matches!(zero.resolve(), Err(SpecError::Cpu(_))));
        let label = spec(r#"{"image":"a","labels":{"bad key":"x"}}"#).expect("parses");
        assert!(matches!(label.resolve(), Err(SpecError::Label(_))));
        assert_eq!(
            spec(r#"{"image":""}"#).expect("parses").resolve(),
            Err(SpecError::MissingImage)
        );
    }

    #[test]
    fn gpus_and_devices_are_checked() {
        let r = spec(r#"{"image":"a","gpus":2,"devices":["nvidia.com/gpu=0","test.example/gpu=GPU-1:mig-2"]}"#)
            .expect("parses")
            .resolve()
            .expect("resolves");
        assert_eq!(r.gpus, 2);
        for (json, want) in [
            (r#"{"image":"a","gpus":257}"#, SpecError::Gpus(257)),
            (
                r#"{"image":"a","devices":["nvidia.com/gpu"]}"#,
                SpecError::Device("nvidia.com/gpu".into()),
            ),
            (
                r#"{"image":"a","devices":["gpu=0"]}"#,
                SpecError::Device("gpu=0".into()),
            ),
            (
                r#"{"image":"a","devices":["a.b/c=d e"]}"#,
                SpecError::Device("a.b/c=d e".into()),
            ),
            (
                r#"{"image":"a","devices":["a.b/c=0","a.b/c=0"]}"#,
                SpecError::DeviceTwice("a.b/c=0".into()),
            ),
        ] {
            assert_eq!(spec(json).expect("parses").resolve(), Err(want), "{json}");
        }
    }

    // Found by a hostile run against the release build: each of these was
    // accepted and then broke the node (an unreadable stored spec, a panic
    // in the create task, a cgroup write failing with a 500).
    #[test]
    fn counts_and_durations_have_a_ceiling() {
        for json in [
            r#"{"image":"a","ttl":1000000000001}"#,
            r#"{"image":"a","ttl":18446744073709551615}"#,
            r#"{"image":"a","lease":"400d"}"#,
            r#"{"image":"a","keep_for":1e13}"#,
        ] {
            let e = spec(json).expect_err(json).to_string();
            assert!(e.contains("365d"), "{json}: {e}");
        }
        let big = |field: &str, v: &str| {
            spec(&format!(r#"{{"image":"a","{field}":{v}}}"#))
                .expect("parses")
                .resolve()
        };
        assert_eq!(
            big("pids", "4294967295"),
            Err(SpecError::PidsTooLarge(u32::MAX))
        );
        assert!(matches!(
            big("memory", "18446744073709551615"),
            Err(SpecError::MemoryTooLarge(_))
        ));
        assert!(matches!(
            big("disk", "\"9000T\""),
            Err(SpecError::DiskTooLarge(_))
        ));
        assert!(matches!(
            spec(r#"{"image":"a","profile":"a b\nc"}"#)
                .expect("parses")
                .resolve(),
            Err(SpecError::Label(_))
        ));
        let huge = "x".repeat(MAX_ARGS_BYTES);
        let s = SandboxSpec {
            image: "a".into(),
            cmd: Some(vec!["sh".into(), huge]),
            ..Default::default()
        };
        assert!(matches!(s.resolve(), Err(SpecError::ArgsTooLarge(_))));
    }

    // Found by the `spec` fuzz target: sub-millisecond durations did not
    // survive the spec's own serialised form.
    #[test]
    fn stored_spec_reads_back_the_same() {
        for json in [
            r#"{"image":"a","keep_for":"5.5ms","ttl":0.0004,"lease":1.0000001}"#,
            r#"{"image":"a","ttl":"0.6ms","keep_for":0.0105}"#,
        ] {
            let s = spec(json).expect("parses");
            let again = spec(&serde_json::to_string(&s).expect("serialises")).expect("reads back");
            assert_eq!(again, s, "{json}");
            assert_eq!(again.resolve(), s.resolve(), "{json}");
        }
        assert_eq!(
            spec(r#"{"image":"a","ttl":0.0004}"#).unwrap().resolve(),
            Err(SpecError::ZeroTtl)
        );
    }

    #[test]
    fn requests_default_small_and_never_exceed_limits() {
        let r = spec(r#"{"image":"a"}"#).unwrap().resolve().unwrap();
        assert_eq!(
            (r.cpu_millis, r.memory),
            (DEFAULT_CPU_MILLIS, DEFAULT_MEMORY)
        );
        assert_eq!(
            (r.cpu_request(), r.memory_request()),
            (DEFAULT_CPU_REQUEST_MILLIS, DEFAULT_MEMORY_REQUEST)
        );
        // A limit given alone is also the request (as in Kubernetes).
        let r = spec(r#"{"image":"a","cpu":"5m","memory":"1G"}"#)
            .unwrap()
            .resolve()
            .unwrap();
        assert_eq!((r.cpu_request(), r.memory_request()), (5, 1 << 30));
        let r = spec(r#"{"image":"a","cpu":2}"#).unwrap().resolve().unwrap();
        assert_eq!(
            (r.cpu_request(), r.memory_request()),
            (2000, DEFAULT_MEMORY_REQUEST)
        );
        let r = spec(
            r#"{"image":"a","cpu":2,"cpu_request":"1.5","memory_request":"1G","memory":"2G"}"#,
        )
        .unwrap()
        .resolve()
        .unwrap();
        assert_eq!((r.cpu_request(), r.memory_request()), (1500, 1 << 30));
        assert!(matches!(
            spec(r#"{"image":"a","cpu_request":2}"#).unwrap().resolve(),
            Err(SpecError::CpuRequestAboveLimit { .. })
        ));
        assert!(matches!(
            spec(r#"{"image":"a","memory_request":"1G"}"#)
                .unwrap()
                .resolve(),
            Err(SpecError::MemoryRequestAboveLimit { .. })
        ));
        assert_eq!(
            spec(r#"{"image":"a","memory_request":0}"#)
                .unwrap()
                .resolve(),
            Err(SpecError::MemoryRequestTooSmall(0))
        );
        // A record stored before requests existed reserved its limits.
        let old: ResolvedResources = serde_json::from_str(
            r#"{"cpu_millis":1000,"memory":536870912,"pids":1024,"disk":0,"gpus":0}"#,
        )
        .unwrap();
        assert_eq!((old.cpu_request(), old.memory_request()), (1000, 512 << 20));
    }

    #[test]
    fn env_layers_and_thread_vars() {
        let mut spec_env = BTreeMap::new();
        spec_env.insert("A".to_string(), "spec".to_string());
        spec_env.insert("OMP_NUM_THREADS".to_string(), "7".to_string());
        let env = sandbox_env(&["A=image".into(), "B=image".into()], 1500, &spec_env);
        assert_eq!(env["A"], "spec");
        assert_eq!(env["B"], "image");
        assert_eq!(env["OMP_NUM_THREADS"], "7");
        assert_eq!(env["MKL_NUM_THREADS"], "2");
        assert_eq!(env["GOMAXPROCS"], "2");
        assert!(env.contains_key("PATH"));
        assert_eq!(thread_count(100), 1);
    }
}

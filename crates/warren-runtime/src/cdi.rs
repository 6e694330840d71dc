//! Container Device Interface (CDI) specs: the vendor-neutral files that
//! NVIDIA's container toolkit, AMD and Intel write under `/etc/cdi` and
//! `/var/run/cdi` to say which device nodes, mounts, environment and hooks a
//! container needs for each device (<https://github.com/cncf-tags/container-device-interface/blob/main/SPEC.md>).
//!
//! The node reads them ([`Registry::load`]), reports the devices it finds,
//! and turns the devices a sandbox holds into an [`Injection`]: bind mounts
//! of the host's device nodes (a sandbox in a user namespace cannot mknod),
//! the device cgroup rules that allow exactly those nodes, file mounts and
//! environment. A malformed spec is skipped with its reason, never fatal.

use std::collections::BTreeMap;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Where CDI specs live when the node is given no `--cdi-dir`; a later
/// directory's device overrides an earlier one's of the same name (the
/// CDI rule: dynamic specs under /var/run win over static ones).
pub const DEFAULT_DIRS: &[&str] = &["/etc/cdi", "/var/run/cdi"];

/// One spec file, as the published schema describes it (fields Warren does
/// not use are accepted and ignored, so newer minor versions still parse).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    pub cdi_version: String,
    /// `vendor/class`, e.g. `nvidia.com/gpu`.
    pub kind: String,
    pub devices: Vec<Device>,
    /// Applied once for any device of this spec a container gets.
    #[serde(default)]
    pub container_edits: ContainerEdits,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    pub name: String,
    #[serde(default)]
    pub container_edits: ContainerEdits,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerEdits {
    /// `KEY=VALUE` entries.
    #[serde(default)]
    pub env: Vec<String>,
    #[serde(default)]
    pub device_nodes: Vec<DeviceNode>,
    #[serde(default)]
    pub mounts: Vec<Mount>,
    #[serde(default)]
    pub hooks: Vec<Hook>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    /// Where it appears in the container.
    pub path: String,
    /// The node on the host; `path` when absent.
    #[serde(default)]
    pub host_path: Option<String>,
    /// `c`, `b` or `u`; read from the host node when absent.
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    #[serde(default)]
    pub major: Option<i64>,
    #[serde(default)]
    pub minor: Option<i64>,
    #[serde(default)]
    pub file_mode: Option<u32>,
    /// Device cgroup access, a subset of `rwm` (default `rwm`).
    #[serde(default)]
    pub permissions: Option<String>,
    #[serde(default)]
    pub uid: Option<u32>,
    #[serde(default)]
    pub gid: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    pub host_path: String,
    pub container_path: String,
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    #[serde(default)]
    pub options: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Hook {
    pub hook_name: String,
    pub path: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: Vec<String>,
    #[serde(default)]
    pub timeout: Option<i64>,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum CdiError {
    #[error("{0}")]
    Parse(String),
    #[error("{0}")]
    Invalid(String),
    #[error("unknown device {name:?}: {known}")]
    Unknown { name: String, known: String },
    #[error("device {0:?}: {1}")]
    Host(String, String),
    #[error("device {name:?}: its CDI spec {file} lists {hooks} hook(s) ({first}); Warren does not run CDI hooks, so it refuses the device rather than give a half-set-up one (remove the hooks from the spec, see docs/gpu.md)")]
    Hooks {
        name: String,
        file: String,
        hooks: usize,
        first: String,
    },
}

/// Checks a parsed spec against the schema's rules that serde cannot.
pub fn validate(spec: &Spec) -> Result<(), CdiError> {
    let invalid = |m: String| Err(CdiError::Invalid(m));
    if !version_known(&spec.cdi_version) {
        return invalid(format!(
            "cdiVersion {:?} is not a CDI version this node reads (0.3.0 to 1.x)",
            spec.cdi_version
        ));
    }
    if parse_kind(&spec.kind).is_none() {
        return invalid(format!(
            "kind {:?} is not `vendor/class` (e.g. nvidia.com/gpu)",
            spec.kind
        ));
    }
    if spec.devices.is_empty() {
        return invalid("it lists no devices".into());
    }
    check_edits(&spec.container_edits, "containerEdits")?;
    let mut seen = std::collections::HashSet::new();
    for d in &spec.devices {
        if !device_name_ok(&d.name) {
            return invalid(format!(
                "device name {:?} must be letters, digits, '_', '-', '.' or ':' and start with a letter or digit",
                d.name
            ));
        }
        if !seen.insert(&d.name) {
            return invalid(format!("device {:?} is listed twice", d.name));
        }
        check_edits(&d.container_edits, &format!("device {:?}", d.name))?;
    }
    Ok(())
}

fn version_known(v: &str) -> bool {
    let mut parts = v.split('.');
    let (Some(major), Some(minor)) = (parts.next(), parts.next()) else {
        return false;
    };
    match (major.parse::<u32>(), minor.parse::<u32>()) {
        (Ok(0), Ok(minor)) => minor >= 3,
        (Ok(1), Ok(_)) => true,
        _ => false,
    }
}

/// `vendor/class` of a kind, when it is well formed: the vendor a DNS-like
/// name, the class letters, digits, '_', '-' and '.'.
pub fn parse_kind(kind: &str) -> Option<(&str, &str)> {
    let (vendor, class) = kind.split_once('/')?;
    let label = |s: &str, extra: &str| {
        !s.is_empty()
            && s.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || extra.contains(c))
    };
    (label(vendor, "-_.") && label(class, "-_.")).then_some((vendor, class))
}

fn device_name_ok(name: &str) -> bool {
    name.chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-.:".contains(c))
}

/// `vendor/class=name` split into kind and name, when well formed.
pub fn parse_qualified(name: &str) -> Option<(&str, &str)> {
    let (kind, dev) = name.split_once('=')?;
    (parse_kind(kind).is_some() && device_name_ok(dev)).then_some((kind, dev))
}

fn check_edits(e: &ContainerEdits, at: &str) -> Result<(), CdiError> {
    let invalid = |m: String| Err(CdiError::Invalid(format!("{at}: {m}")));
    for kv in &e.env {
        match kv.split_once('=') {
            Some((k, _)) if !k.is_empty() && !kv.contains('\0') => {}
            _ => return invalid(format!("env entry {kv:?} is not KEY=VALUE")),
        }
    }
    for n in &e.device_nodes {
        if !n.path.starts_with("/dev/") || n.path.contains("..") {
            return invalid(format!(
                "device node path {:?} must be an absolute path under /dev",
                n.path
            ));
        }
        if n.host_path.as_ref().is_some_and(|h| !h.starts_with('/')) {
            return invalid(format!(
                "device node {:?}: hostPath must be absolute",
                n.path
            ));
        }
        if let Some(k) = &n.kind {
            if !["c", "b", "u"].contains(&k.as_str()) {
                return invalid(format!(
                    "device node {:?}: type {k:?} is not c, b or u",
                    n.path
                ));
            }
        }
        if let Some(p) = &n.permissions {
            if p.is_empty() || !p.chars().all(|c| "rwm".contains(c)) {
                return invalid(format!(
                    "device node {:?}: permissions {p:?} are not a subset of rwm",
                    n.path
                ));
            }
        }
    }
    for m in &e.mounts {
        if !m.host_path.starts_with('/') || !m.container_path.starts_with('/') {
            return invalid(format!(
                "mount {:?} -> {:?}: both paths must be absolute",
                m.host_path, m.container_path
            ));
        }
        if m.container_path.split('/').any(|c| c == "..") {
            return invalid(format!("mount target {:?} contains '..'", m.container_path));
        }
    }
    for h in &e.hooks {
        if !h.path.starts_with('/') {
            return invalid(format!("hook {:?}: path must be absolute", h.hook_name));
        }
    }
    Ok(())
}

/// Parses one spec file (YAML or JSON by its extension) and validates it.
pub fn parse(path: &Path, text: &str) -> Result<Spec, CdiError> {
    let json = path.extension().is_some_and(|e| e == "json");
    let spec: Spec = if json {
        serde_json::from_str(text).map_err(|e| CdiError::Parse(e.to_string()))?
    } else {
        serde_yaml_ng::from_str(text).map_err(|e| CdiError::Parse(e.to_string()))?
    };
    validate(&spec)?;
    Ok(spec)
}

/// A spec file the node read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpecFile {
    pub path: PathBuf,
    pub kind: String,
    pub devices: Vec<String>,
    /// Hooks the spec lists (Warren refuses its devices while it has any).
    pub hooks: usize,
}

/// A file that was not used, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Skipped {
    pub path: PathBuf,
    pub reason: String,
}

/// What a node found in its CDI directories.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    pub specs: Vec<SpecFile>,
    pub skipped: Vec<Skipped>,
    /// Qualified name (`vendor/class=name`) → the spec (index into
    /// `parsed`) and the device in it.
    devices: BTreeMap<String, (usize, usize)>,
    parsed: Vec<(PathBuf, Spec)>,
}

impl Registry {
    /// Reads every `*.yaml`, `*.yml` and `*.json` of `dirs` (a missing
    /// directory is no error: most hosts have none). Files are read in name
    /// order; a device defined again in a later directory replaces the
    /// earlier one, and one defined twice in one directory keeps the first.
    pub fn load(dirs: &[PathBuf]) -> Registry {
        let mut reg = Registry::default();
        for dir in dirs {
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            let mut files: Vec<PathBuf> = entries
                .filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| {
                    p.extension()
                        .is_some_and(|e| e == "yaml" || e == "yml" || e == "json")
                })
                .collect();
            files.sort();
            let mut in_dir: BTreeMap<String, PathBuf> = BTreeMap::new();
            for path in files {
                let text = match std::fs::read_to_string(&path) {
                    Ok(t) => t,
                    Err(e) => {
                        reg.skip(&path, format!("cannot read it: {e}"));
                        continue;
                    }
                };
                let spec = match parse(&path, &text) {
                    Ok(s) => s,
                    Err(e) => {
                        reg.skip(&path, e.to_string());
                        continue;
                    }
                };
                let clash = spec.devices.iter().find_map(|d| {
                    let q = format!("{}={}", spec.kind, d.name);
                    in_dir.get(&q).map(|other| (q, other.clone()))
                });
                if let Some((q, other)) = clash {
                    reg.skip(
                        &path,
                        format!("device {q} is already defined in {}", other.display()),
                    );
                    continue;
                }
                let at = reg.parsed.len();
                let hooks = spec.container_edits.hooks.len()
                    + spec
                        .devices
                        .iter()
                        .map(|d| d.container_edits.hooks.len())
                        .sum::<usize>();
                for (i, d) in spec.devices.iter().enumerate() {
                    let q = format!("{}={}", spec.kind, d.name);
                    in_dir.insert(q.clone(), path.clone());
                    reg.devices.insert(q, (at, i));
                }
                reg.specs.push(SpecFile {
                    path: path.clone(),
                    kind: spec.kind.clone(),
                    devices: spec.devices.iter().map(|d| d.name.clone()).collect(),
                    hooks,
                });
                reg.parsed.push((path, spec));
            }
        }
        reg
    }

    fn skip(&mut self, path: &Path, reason: String) {
        self.skipped.push(Skipped {
            path: path.to_path_buf(),
            reason,
        });
    }

    /// Every device's qualified name, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.devices.keys().map(String::as_str)
    }

    /// The devices of one kind, in a stable order (numeric names by
    /// number, so `gpu=10` comes after `gpu=2`).
    pub fn of_kind(&self, kind: &str) -> Vec<String> {
        let mut names: Vec<&str> = self
            .devices
            .keys()
            .filter_map(|q| q.strip_prefix(kind)?.strip_prefix('='))
            .collect();
        names.sort_by_key(|n| (n.parse::<u64>().ok().unwrap_or(u64::MAX), n.to_string()));
        names.into_iter().map(|n| format!("{kind}={n}")).collect()
    }

    /// Device counts per kind.
    pub fn kinds(&self) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for q in self.devices.keys() {
            if let Some((kind, _)) = q.split_once('=') {
                *out.entry(kind.to_string()).or_default() += 1;
            }
        }
        out
    }

    pub fn contains(&self, name: &str) -> bool {
        self.devices.contains_key(name)
    }

    /// The host nodes of a device's own edits (not its spec's shared
    /// ones, such as NVIDIA's `/dev/nvidiactl`): two devices that share one
    /// are the same hardware, or one covers the other (`all`, a MIG slice
    /// of a GPU).
    pub fn own_nodes(&self, name: &str) -> Vec<&str> {
        let Some(&(s, d)) = self.devices.get(name) else {
            return Vec::new();
        };
        self.parsed[s].1.devices[d]
            .container_edits
            .device_nodes
            .iter()
            .map(|n| n.host_path.as_deref().unwrap_or(&n.path))
            .collect()
    }

    /// The devices of a kind that count as one unit each (what `gpus`
    /// hands out), in [`Registry::of_kind`]'s order: a device whose own
    /// nodes include all of another's and more (`all`, a MIG slice) is
    /// left out, and so is one with the same nodes as an earlier one (the
    /// same GPU by index and by UUID).
    pub fn units_of_kind(&self, kind: &str) -> Vec<String> {
        let all = self.of_kind(kind);
        let sets: Vec<std::collections::BTreeSet<&str>> = all
            .iter()
            .map(|d| self.own_nodes(d).into_iter().collect())
            .collect();
        all.iter()
            .enumerate()
            .filter(|&(i, _)| {
                let me = &sets[i];
                me.is_empty()
                    || !sets.iter().enumerate().any(|(j, other)| {
                        j != i
                            && !other.is_empty()
                            && other.is_subset(me)
                            && (other.len() < me.len() || j < i)
                    })
            })
            .map(|(_, d)| d.clone())
            .collect()
    }

    /// What a sandbox holding `names` gets: each device's edits, and each
    /// spec's top-level edits once. Device nodes are checked on the host
    /// (and their type and numbers read from it where the spec leaves them
    /// out).
    pub fn inject(&self, names: &[String]) -> Result<Injection, CdiError> {
        let mut out = Injection::default();
        let mut specs_done = std::collections::HashSet::new();
        for name in names {
            let Some(&(s, d)) = self.devices.get(name) else {
                return Err(self.unknown(name));
            };
            let (file, spec) = &self.parsed[s];
            let device = &spec.devices[d];
            let hooks = spec
                .container_edits
                .hooks
                .iter()
                .chain(&device.container_edits.hooks);
            if let Some(first) = hooks.clone().next() {
                return Err(CdiError::Hooks {
                    name: name.clone(),
                    file: file.display().to_string(),
                    hooks: hooks.count(),
                    first: format!("{} {}", first.hook_name, first.path),
                });
            }
            if specs_done.insert(s) {
                out.add(name, &spec.container_edits)?;
            }
            out.add(name, &device.container_edits)?;
        }
        Ok(out)
    }

    /// The error for a device this registry does not have.
    pub fn unknown(&self, name: &str) -> CdiError {
        let known = if self.devices.is_empty() {
            "this node has no CDI devices (see `warren doctor` and docs/gpu.md)".to_string()
        } else {
            let list: Vec<&str> = self.names().take(16).collect();
            format!("this node has {}", list.join(", "))
        };
        CdiError::Unknown {
            name: name.to_string(),
            known,
        }
    }
}

/// A device node as the sandbox gets it: the host's node bound at `path`,
/// and a device cgroup rule for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeEdit {
    pub path: String,
    pub host_path: String,
    /// `c` or `b`.
    pub kind: String,
    pub major: i64,
    pub minor: i64,
    /// Subset of `rwm`.
    pub access: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountEdit {
    pub host_path: String,
    pub container_path: String,
    pub options: Vec<String>,
}

/// Everything the devices of one sandbox add to its OCI config and its
/// processes' environment.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Injection {
    pub env: BTreeMap<String, String>,
    pub nodes: Vec<NodeEdit>,
    pub mounts: Vec<MountEdit>,
}

impl Injection {
    pub fn is_empty(&self) -> bool {
        self.env.is_empty() && self.nodes.is_empty() && self.mounts.is_empty()
    }

    fn add(&mut self, device: &str, e: &ContainerEdits) -> Result<(), CdiError> {
        for kv in &e.env {
            if let Some((k, v)) = kv.split_once('=') {
                self.env.insert(k.to_string(), v.to_string());
            }
        }
        for n in &e.device_nodes {
            if self.nodes.iter().any(|have| have.path == n.path) {
                continue;
            }
            self.nodes.push(node_edit(device, n)?);
        }
        for m in &e.mounts {
            if self
                .mounts
                .iter()
                .any(|have| have.container_path == m.container_path)
            {
                continue;
            }
            self.mounts.push(mount_edit(m));
        }
        Ok(())
    }
}

fn node_edit(device: &str, n: &DeviceNode) -> Result<NodeEdit, CdiError> {
    let host_path = n.host_path.clone().unwrap_or_else(|| n.path.clone());
    let host = |m: String| CdiError::Host(device.to_string(), m);
    let meta = std::fs::metadata(&host_path)
        .map_err(|e| host(format!("host device node {host_path}: {e}")))?;
    let ft = meta.file_type();
    let kind = if ft.is_char_device() {
        "c"
    } else if ft.is_block_device() {
        "b"
    } else {
        return Err(host(format!(
            "{host_path} is not a character or block device"
        )));
    };
    if let Some(want) = n.kind.as_deref().filter(|k| *k != "u") {
        if want != kind {
            return Err(host(format!(
                "the spec says {host_path} is of type {want}, the host's node is {kind}"
            )));
        }
    }
    use std::os::unix::fs::MetadataExt;
    let rdev = meta.rdev();
    let (major, minor) = (
        i64::from(rustix::fs::major(rdev)),
        i64::from(rustix::fs::minor(rdev)),
    );
    if n.major.is_some_and(|m| m != major) || n.minor.is_some_and(|m| m != minor) {
        return Err(host(format!(
            "the spec gives {host_path} as {}:{}, the host's node is {major}:{minor}",
            n.major.unwrap_or(major),
            n.minor.unwrap_or(minor)
        )));
    }
    Ok(NodeEdit {
        path: n.path.clone(),
        host_path,
        kind: kind.into(),
        major,
        minor,
        access: n.permissions.clone().unwrap_or_else(|| "rwm".into()),
    })
}

/// A CDI mount becomes a bind mount; `nosuid` and `nodev` are always
/// added (a device reaches a sandbox only as a device node, which the
/// device cgroup sees; `nodev` keeps a mounted node shut even where the
/// device rules would allow its numbers), and a spec that gives no options
/// gets a read-only one.
fn mount_edit(m: &Mount) -> MountEdit {
    let mut options = if m.options.is_empty() {
        vec!["ro".to_string()]
    } else {
        m.options.clone()
    };
    options.retain(|o| o != "dev" && o != "suid");
    if !options.iter().any(|o| o == "bind" || o == "rbind") {
        options.insert(0, "rbind".into());
    }
    for forced in ["nosuid", "nodev"] {
        if !options.iter().any(|o| o == forced) {
            options.push(forced.into());
        }
    }
    MountEdit {
        host_path: m.host_path.clone(),
        container_path: m.container_path.clone(),
        options,
    }
}

/// `warren doctor`'s lines: the spec files found, the devices per kind,
/// and each file skipped with its reason.
pub fn checks(dirs: &[PathBuf]) -> Vec<crate::check::Check> {
    use crate::check::{Check, Status};
    let reg = Registry::load(dirs);
    let where_ = dirs
        .iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let mut out = vec![Check {
        name: "cdi specs",
        status: Status::Ok,
        found: if reg.specs.is_empty() {
            format!("none in {where_}")
        } else {
            reg.specs
                .iter()
                .map(|s| {
                    format!(
                        "{} ({}, {} devices)",
                        s.path.display(),
                        s.kind,
                        s.devices.len()
                    )
                })
                .collect::<Vec<_>>()
                .join("; ")
        },
        meaning: if reg.specs.is_empty() {
            "no devices to lend: sandboxes asking for --gpus or --device are refused (docs/gpu.md says how to generate specs)".into()
        } else {
            "sandboxes can ask for these devices with --device vendor/class=name, or --gpus N of the node's --gpu-kind".into()
        },
    }];
    for (kind, count) in reg.kinds() {
        out.push(Check {
            name: "cdi devices",
            status: Status::Ok,
            found: format!("{kind}: {count} ({})", reg.of_kind(&kind).join(", ")),
            meaning: "each is given to one sandbox at a time".into(),
        });
    }
    for s in &reg.specs {
        if s.hooks > 0 {
            out.push(Check {
                name: "cdi hooks",
                status: Status::Degraded,
                found: format!("{}: {} hook(s)", s.path.display(), s.hooks),
                meaning: "Warren does not run CDI hooks: its devices are refused until the hooks are removed (docs/gpu.md)".into(),
            });
        }
    }
    for s in &reg.skipped {
        out.push(Check {
            name: "cdi spec skipped",
            status: Status::Degraded,
            found: format!("{}: {}", s.path.display(), s.reason),
            meaning: "the file is ignored: none of its devices is offered".into(),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const NVIDIA_LIKE: &str = r#"
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
- name: all
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
containerEdits:
  env:
  - NVIDIA_VISIBLE_DEVICES=void
  deviceNodes:
  - path: /dev/nvidiactl
  mounts:
  - hostPath: /usr/bin/nvidia-smi
    containerPath: /usr/bin/nvidia-smi
    options: [ro, nosuid, nodev, bind]
  hooks:
  - hookName: createContainer
    path: /usr/bin/nvidia-cdi-hook
    args: [nvidia-cdi-hook, update-ldcache]
"#;

    fn write(dir: &Path, name: &str, text: &str) {
        std::fs::write(dir.join(name), text).expect("write spec");
    }

    fn test_spec(host_dir: &Path) -> String {
        format!(
            r#"{{"cdiVersion":"0.6.0","kind":"test.example/gpu",
              "containerEdits":{{"env":["TEST_GPU_DRIVER=1"],
                "mounts":[{{"hostPath":"{d}/driver.txt","containerPath":"/opt/driver.txt"}}]}},
              "devices":[
                {{"name":"0","containerEdits":{{"env":["TEST_GPU=0"],
                  "deviceNodes":[{{"path":"/dev/testgpu0","hostPath":"/dev/null","permissions":"rw"}}]}}}},
                {{"name":"1","containerEdits":{{"deviceNodes":[{{"path":"/dev/testgpu1","hostPath":"/dev/zero","type":"c","major":1,"minor":5}}]}}}}
              ]}}"#,
            d = host_dir.display()
        )
    }

    #[test]
    fn parses_an_nvidia_toolkit_style_yaml_spec() {
        let spec = parse(Path::new("nvidia.yaml"), NVIDIA_LIKE).expect("parses");
        assert_eq!(spec.kind, "nvidia.com/gpu");
        assert_eq!(spec.devices.len(), 2);
        assert_eq!(spec.container_edits.mounts[0].options.len(), 4);
        assert_eq!(
            spec.container_edits.hooks[0].args,
            ["nvidia-cdi-hook", "update-ldcache"]
        );
        assert_eq!(
            spec.devices[0].container_edits.device_nodes[0].host_path,
            None
        );
    }

    #[test]
    fn malformed_specs_say_why() {
        let cases = [
            ("kind: x\n", "cdiVersion"),
            ("cdiVersion: 0.6.0\nkind: gpu\ndevices: [{name: a, containerEdits: {}}]\n", "vendor/class"),
            ("cdiVersion: 9.0.0\nkind: a.b/c\ndevices: [{name: a}]\n", "cdiVersion"),
            ("cdiVersion: 0.6.0\nkind: a.b/c\ndevices: []\n", "no devices"),
            ("cdiVersion: 0.6.0\nkind: a.b/c\ndevices: [{name: 'a b'}]\n", "device name"),
            ("cdiVersion: 0.6.0\nkind: a.b/c\ndevices: [{name: a, containerEdits: {deviceNodes: [{path: /etc/passwd}]}}]\n", "under /dev"),
            ("cdiVersion: 0.6.0\nkind: a.b/c\ndevices: [{name: a, containerEdits: {env: [NOEQUALS]}}]\n", "KEY=VALUE"),
            ("cdiVersion: 0.6.0\nkind: a.b/c\ndevices: [{name: a, containerEdits: {mounts: [{hostPath: x, containerPath: /y}]}}]\n", "absolute"),
            ("cdiVersion: 0.6.0\nkind: a.b/c\ndevices: [{name: a}, {name: a}]\n", "twice"),
            ("{{{ not yaml", ""),
        ];
        for (text, want) in cases {
            let err = parse(Path::new("x.yaml"), text)
                .expect_err(text)
                .to_string();
            assert!(err.contains(want), "{text:?}: {err}");
        }
    }

    #[test]
    fn qualified_names() {
        assert_eq!(
            parse_qualified("nvidia.com/gpu=0"),
            Some(("nvidia.com/gpu", "0"))
        );
        assert_eq!(
            parse_qualified("test.example/gpu=GPU-1a:2"),
            Some(("test.example/gpu", "GPU-1a:2"))
        );
        for bad in ["nvidia.com/gpu", "gpu=0", "a/b=", "a/b=c d", "/b=0"] {
            assert_eq!(parse_qualified(bad), None, "{bad}");
        }
    }

    #[test]
    fn registry_reads_directories_skips_bad_files_and_lets_later_dirs_win() {
        let a = tempfile::tempdir().expect("tempdir");
        let b = tempfile::tempdir().expect("tempdir");
        write(a.path(), "test.json", &test_spec(a.path()));
        write(
            a.path(),
            "broken.yaml",
            "cdiVersion: 0.6.0\nkind: nope\ndevices: [{name: a}]\n",
        );
        write(a.path(), "ignored.txt", "not a spec");
        write(a.path(), "nvidia.yml", NVIDIA_LIKE);
        // A second spec in the same directory naming the same device.
        write(a.path(), "zz-dup.yaml", "cdiVersion: 0.6.0\nkind: test.example/gpu\ndevices: [{name: '0', containerEdits: {env: [X=1]}}]\n");
        write(b.path(), "override.yaml", "cdiVersion: 0.6.0\nkind: test.example/gpu\ndevices: [{name: '1', containerEdits: {env: [OVERRIDDEN=1]}}]\n");
        let reg = Registry::load(&[
            a.path().to_path_buf(),
            PathBuf::from("/nonexistent/cdi"),
            b.path().to_path_buf(),
        ]);
        let skipped: Vec<String> = reg
            .skipped
            .iter()
            .map(|s| format!("{} {}", s.path.display(), s.reason))
            .collect();
        assert_eq!(skipped.len(), 2, "{skipped:?}");
        assert!(skipped[0].contains("broken.yaml") && skipped[0].contains("vendor/class"));
        assert!(skipped[1].contains("zz-dup.yaml") && skipped[1].contains("already defined"));
        assert_eq!(
            reg.of_kind("test.example/gpu"),
            ["test.example/gpu=0", "test.example/gpu=1"]
        );
        assert_eq!(reg.kinds()["nvidia.com/gpu"], 2);
        assert_eq!(
            reg.specs
                .iter()
                .find(|s| s.kind == "nvidia.com/gpu")
                .map(|s| s.hooks),
            Some(1)
        );
        let inj = reg.inject(&["test.example/gpu=1".into()]).expect("injects");
        assert_eq!(inj.env.get("OVERRIDDEN").map(String::as_str), Some("1"));
        assert!(inj.nodes.is_empty(), "the override has no nodes: {inj:?}");
    }

    #[test]
    fn injection_merges_spec_and_device_edits_and_reads_the_host_nodes() {
        let dir = tempfile::tempdir().expect("tempdir");
        write(dir.path(), "test.json", &test_spec(dir.path()));
        let reg = Registry::load(&[dir.path().to_path_buf()]);
        let both = reg
            .inject(&["test.example/gpu=0".into(), "test.example/gpu=1".into()])
            .expect("injects");
        assert_eq!(both.env.len(), 2, "{:?}", both.env);
        assert_eq!(both.mounts.len(), 1, "top-level edits come once");
        assert_eq!(both.mounts[0].options, ["rbind", "ro", "nosuid", "nodev"]);
        let spec_opts = mount_edit(&Mount {
            host_path: "/a".into(),
            container_path: "/b".into(),
            kind: None,
            options: vec!["bind".into(), "rw".into(), "dev".into(), "suid".into()],
        });
        assert_eq!(spec_opts.options, ["bind", "rw", "nosuid", "nodev"]);
        assert_eq!(
            both.nodes,
            [
                NodeEdit {
                    path: "/dev/testgpu0".into(),
                    host_path: "/dev/null".into(),
                    kind: "c".into(),
                    major: 1,
                    minor: 3,
                    access: "rw".into(),
                },
                NodeEdit {
                    path: "/dev/testgpu1".into(),
                    host_path: "/dev/zero".into(),
                    kind: "c".into(),
                    major: 1,
                    minor: 5,
                    access: "rwm".into(),
                },
            ]
        );
        let err = reg
            .inject(&["test.example/gpu=7".into()])
            .expect_err("unknown");
        assert!(
            err.to_string()
                .contains("test.example/gpu=0, test.example/gpu=1"),
            "{err}"
        );
    }

    #[test]
    fn units_leave_out_aggregates_slices_and_second_names() {
        let dir = tempfile::tempdir().expect("tempdir");
        write(
            dir.path(),
            "gpu.yaml",
            "cdiVersion: 0.6.0\nkind: v.example/gpu\ncontainerEdits: {deviceNodes: [{path: /dev/ctl, hostPath: /dev/full}]}\ndevices:\n\
             - {name: '1', containerEdits: {deviceNodes: [{path: /dev/g1, hostPath: /dev/zero}]}}\n\
             - {name: '0', containerEdits: {deviceNodes: [{path: /dev/g0, hostPath: /dev/null}]}}\n\
             - {name: all, containerEdits: {deviceNodes: [{path: /dev/g0, hostPath: /dev/null}, {path: /dev/g1, hostPath: /dev/zero}]}}\n\
             - {name: GPU-aaaa, containerEdits: {deviceNodes: [{path: /dev/g0, hostPath: /dev/null}]}}\n\
             - {name: '0:1', containerEdits: {deviceNodes: [{path: /dev/g0, hostPath: /dev/null}, {path: /dev/cap1, hostPath: /dev/urandom}]}}\n\
             - {name: envonly, containerEdits: {env: [A=1]}}\n",
        );
        let reg = Registry::load(&[dir.path().to_path_buf()]);
        assert!(reg.skipped.is_empty(), "{:?}", reg.skipped);
        assert_eq!(
            reg.of_kind("v.example/gpu"),
            ["0", "1", "0:1", "GPU-aaaa", "all", "envonly"].map(|n| format!("v.example/gpu={n}"))
        );
        assert_eq!(
            reg.units_of_kind("v.example/gpu"),
            ["0", "1", "envonly"].map(|n| format!("v.example/gpu={n}"))
        );
        // The spec's shared node is no device's own.
        assert_eq!(reg.own_nodes("v.example/gpu=0"), ["/dev/null"]);
    }

    #[test]
    fn host_nodes_must_match_the_spec_and_hooks_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        write(dir.path(), "wrong.yaml", "cdiVersion: 0.6.0\nkind: a.example/x\ndevices:\n- {name: num, containerEdits: {deviceNodes: [{path: /dev/x, hostPath: /dev/null, major: 9, minor: 9}]}}\n- {name: file, containerEdits: {deviceNodes: [{path: /dev/y, hostPath: /etc/hostname}]}}\n- {name: gone, containerEdits: {deviceNodes: [{path: /dev/z, hostPath: /dev/warren-no-such-node}]}}\n");
        write(dir.path(), "nvidia.yaml", NVIDIA_LIKE);
        let reg = Registry::load(&[dir.path().to_path_buf()]);
        for (name, want) in [
            ("a.example/x=num", "1:3"),
            ("a.example/x=file", "not a character or block device"),
            ("a.example/x=gone", "No such file"),
            ("nvidia.com/gpu=0", "does not run CDI hooks"),
        ] {
            let err = reg.inject(&[name.to_string()]).expect_err(name).to_string();
            assert!(err.contains(want), "{name}: {err}");
        }
    }
}

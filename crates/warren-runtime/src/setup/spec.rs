//! The part of a sandbox's `config.json` that the set-up reads: exactly
//! the fields [`crate::oci::config`] writes, each one refused when it is
//! not understood. A field added there without being handled here fails
//! every create with a message that names it, instead of being ignored.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::error::SetupError;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Config {
    #[allow(dead_code)]
    pub oci_version: String,
    pub root: Root,
    pub hostname: String,
    pub process: Process,
    pub mounts: Vec<Mount>,
    pub linux: Linux,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Root {
    pub path: PathBuf,
    pub readonly: bool,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Process {
    pub terminal: bool,
    pub user: User,
    /// The set-up process execs Warren's own init, never these.
    #[allow(dead_code)]
    pub args: Vec<String>,
    pub env: Vec<String>,
    pub cwd: String,
    pub no_new_privileges: bool,
    pub capabilities: Capabilities,
    pub rlimits: Vec<Rlimit>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct User {
    pub uid: u32,
    pub gid: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Capabilities {
    pub bounding: Vec<String>,
    pub effective: Vec<String>,
    pub permitted: Vec<String>,
    pub inheritable: Vec<String>,
    pub ambient: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rlimit {
    #[serde(rename = "type")]
    pub kind: String,
    pub hard: u64,
    pub soft: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mount {
    pub destination: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub source: PathBuf,
    #[serde(default)]
    pub options: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Linux {
    pub namespaces: Vec<Namespace>,
    #[serde(default)]
    pub uid_mappings: Vec<IdMapping>,
    #[serde(default)]
    pub gid_mappings: Vec<IdMapping>,
    pub cgroups_path: String,
    pub resources: Resources,
    pub rootfs_propagation: String,
    pub masked_paths: Vec<String>,
    pub readonly_paths: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Namespace {
    #[serde(rename = "type")]
    pub kind: String,
}

#[derive(Debug, Deserialize, Clone, Copy)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IdMapping {
    #[serde(rename = "containerID")]
    pub container_id: u32,
    #[serde(rename = "hostID")]
    pub host_id: u32,
    pub size: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resources {
    pub devices: Vec<DeviceRule>,
    pub memory: Memory,
    pub cpu: Cpu,
    pub pids: Pids,
    /// cgroup v2 files written as they are; a v1 host has none of them
    /// (its OOM killer always picks within the sandbox's memory cgroup).
    #[allow(dead_code)]
    pub unified: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceRule {
    pub allow: bool,
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub major: Option<i64>,
    pub minor: Option<i64>,
    pub access: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Memory {
    pub limit: u64,
    /// Memory and swap together, as OCI counts it.
    pub swap: u64,
    #[serde(rename = "kernelTCP")]
    pub kernel_tcp: u64,
    pub reservation: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cpu {
    pub quota: u64,
    pub period: u64,
    pub shares: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pids {
    pub limit: u64,
}

impl Config {
    pub fn load(bundle: &Path) -> Result<Config, SetupError> {
        let path = bundle.join("config.json");
        let bytes = std::fs::read(&path)
            .map_err(|e| SetupError::os(format!("read {}", path.display()), e))?;
        serde_json::from_slice(&bytes).map_err(|source| SetupError::Config { path, source })
    }

    pub fn has_namespace(&self, kind: &str) -> bool {
        self.linux.namespaces.iter().any(|n| n.kind == kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oci::tests::{test_config, test_devices};

    #[test]
    fn every_config_warren_writes_is_read() {
        for ids in [None, Some(crate::userns::IdRange { base: 1 << 20 })] {
            let value = test_config(500, 0, &test_devices(), ids);
            let config: Config = serde_json::from_value(value).expect("the set-up reads it");
            assert_eq!(config.has_namespace("user"), ids.is_some());
            assert_eq!(config.linux.uid_mappings.len(), usize::from(ids.is_some()));
            assert_eq!(config.linux.resources.memory.limit, 64 << 20);
            assert_eq!(config.linux.resources.cpu.quota, 50_000);
            assert!(config
                .mounts
                .iter()
                .any(|m| m.destination == "/dev/testgpu0"));
            assert!(config
                .mounts
                .iter()
                .any(|m| m.kind == "bind" && m.options.contains(&"ro".to_string())));
        }
    }

    #[test]
    fn an_unknown_field_is_refused_by_name() {
        let mut value = test_config(1000, 0, &Default::default(), None);
        value["linux"]["sysctl"] = serde_json::json!({ "net.ipv4.ip_forward": "1" });
        let err = serde_json::from_value::<Config>(value).expect_err("refused");
        assert!(err.to_string().contains("sysctl"), "{err}");
    }
}

//! Forks' part of the spec: what a fork request asks for and where a
//! forked sandbox's filesystem (and, for a fork with processes, its
//! memory) comes from.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{ByteSize, Cpu, Dur, NetworkMode, SandboxSpec, SpecError};
use crate::labels::{self, Labels};

/// Where a forked sandbox's filesystem comes from.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkOrigin {
    /// The sandbox it was forked from.
    pub source: String,
    /// The read-only layers of the source's filesystem its root is built
    /// on (above the image's), topmost first: names on the source's node.
    #[serde(default)]
    pub layers: Vec<String>,
    /// It resumes the source's memory and processes, saved with its
    /// topmost layer (a gVisor fork with processes), instead of booting.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub processes: bool,
}

/// Every child of a fork carries this label with its source's id.
pub const FORK_LABEL: &str = "warren.dev/fork-of";
/// Most children one fork makes.
pub const MAX_FORK: u32 = 256;

/// What `POST /v1/sandboxes/{id}/fork` takes: how many children, labels
/// added over the source's, and sizes and lifetimes that differ from the
/// source's (everything else is the source's spec).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkRequest {
    /// Children to make, 1 to 256.
    pub count: u32,
    /// Added to (and over) the source's labels.
    #[serde(default)]
    pub labels: Labels,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Cpu>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<ByteSize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_request: Option<Cpu>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_request: Option<ByteSize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<ByteSize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<Dur>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<Dur>,
    /// Children start from the source's memory and running processes as
    /// well as its files (gVisor sources on network `none` only): the
    /// source is saved and resumed, and each child resumes the same image.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub with_processes: bool,
}

impl ForkRequest {
    /// The spec of each child of `source_id` (whose spec is `source`):
    /// the source's, without its request id, with this request's labels
    /// and overrides, its isolation class, and the fork's origin (its
    /// layers are the node's to fill in); batch labels are not inherited.
    /// A limit overridden without its request drops the source's request,
    /// so the usual default (request = limit) applies.
    pub fn child_spec(
        &self,
        source_id: &str,
        source: &SandboxSpec,
    ) -> Result<SandboxSpec, SpecError> {
        if self.count == 0 || self.count > MAX_FORK {
            return Err(SpecError::ForkCount(self.count));
        }
        if self.with_processes {
            if source.isolation.unwrap_or_default() != crate::Isolation::Gvisor {
                return Err(SpecError::ForkProcesses(
                    "only a gvisor sandbox can be forked with its processes (the container class has no memory snapshots here)",
                ));
            }
            if source.network.mode != NetworkMode::None {
                return Err(SpecError::ForkProcesses(
                    "a gvisor sandbox that reaches the network cannot be forked with its processes: this runsc cannot save host networking (the source needs network none)",
                ));
            }
        }
        let mut spec = source.clone();
        spec.request_id = None;
        // Names are one sandbox's each.
        spec.name = None;
        // A child is no member of its source's batch.
        for batch in [labels::BATCH_LABEL, labels::RETRY_LABEL] {
            spec.labels.remove(batch);
        }
        spec.labels.extend(self.labels.clone());
        spec.labels.insert(FORK_LABEL.into(), source_id.into());
        if let Some(cpu) = self.cpu {
            spec.cpu = Some(cpu);
            spec.cpu_request = None;
        }
        if let Some(memory) = self.memory {
            spec.memory = Some(memory);
            spec.memory_request = None;
        }
        spec.cpu_request = self.cpu_request.or(spec.cpu_request);
        spec.memory_request = self.memory_request.or(spec.memory_request);
        spec.pids = self.pids.or(spec.pids);
        spec.disk = self.disk.or(spec.disk);
        spec.ttl = self.ttl.or(spec.ttl);
        spec.lease = self.lease.or(spec.lease);
        // Children run in their source's class (a record from before
        // classes names none: it ran as a container).
        spec.isolation = Some(source.isolation.unwrap_or_default());
        spec.fork = Some(ForkOrigin {
            source: source_id.into(),
            layers: vec![],
            processes: self.with_processes,
        });
        spec.resolve()?;
        Ok(spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: &str) -> Result<SandboxSpec, serde_json::Error> {
        serde_json::from_str(json)
    }

    #[test]
    fn fork_children_inherit_the_source_with_overrides() {
        let source = spec(
            r#"{"image":"busybox","cpu":1,"cpu_request":0.5,"memory":"256M","labels":{"task":"a","run":"1","warren.dev/batch":"b-1"},"request_id":"r-1","ttl":"10m","cmd":["sleep","9"]}"#,
        )
        .unwrap();
        let req: ForkRequest =
            serde_json::from_str(r#"{"count":3,"labels":{"run":"2"},"cpu":0.25,"lease":"30s"}"#)
                .unwrap();
        let child = req.child_spec("sbx-source000000", &source).unwrap();
        assert_eq!(child.request_id, None);
        assert_eq!(child.labels["task"], "a");
        assert_eq!(child.labels["run"], "2");
        assert_eq!(child.labels[FORK_LABEL], "sbx-source000000");
        assert!(!child.labels.contains_key(crate::labels::BATCH_LABEL));
        // A new limit without a request: the request follows the limit.
        assert_eq!((child.cpu, child.cpu_request), (Some(Cpu(250)), None));
        assert_eq!(child.memory, Some(ByteSize(256 << 20)));
        assert_eq!(child.ttl, Dur::from_secs(600).ok());
        assert_eq!(child.lease, Dur::from_secs(30).ok());
        assert_eq!(child.cmd, source.cmd);
        assert_eq!(
            child.fork.as_ref().map(|f| f.source.as_str()),
            Some("sbx-source000000")
        );
        // The source's isolation class; a source recorded before classes
        // ran as a container.
        assert_eq!(child.isolation, Some(crate::Isolation::Container));
        let gvisor = SandboxSpec {
            isolation: Some(crate::Isolation::Gvisor),
            ..source.clone()
        };
        let child = req.child_spec("sbx-source000000", &gvisor).unwrap();
        assert_eq!(child.isolation, Some(crate::Isolation::Gvisor));
        for count in [0, MAX_FORK + 1] {
            let bad = ForkRequest {
                count,
                ..req.clone()
            };
            assert_eq!(
                bad.child_spec("sbx-x", &source),
                Err(SpecError::ForkCount(count))
            );
        }
        let bad = ForkRequest {
            memory: Some(ByteSize(1)),
            ..req.clone()
        };
        assert!(matches!(
            bad.child_spec("sbx-x", &source),
            Err(SpecError::MemoryTooSmall(1))
        ));
        assert!(serde_json::from_str::<ForkRequest>(r#"{"count":1,"image":"x"}"#).is_err());
    }

    #[test]
    fn a_fork_with_processes_needs_a_gvisor_source_on_network_none() {
        let req = ForkRequest {
            count: 2,
            with_processes: true,
            ..Default::default()
        };
        let container = spec(r#"{"image":"busybox","cmd":["sleep","9"]}"#).unwrap();
        assert!(matches!(
            req.child_spec("sbx-x", &container),
            Err(SpecError::ForkProcesses(m)) if m.contains("only a gvisor sandbox")
        ));
        let proxied = spec(
            r#"{"image":"busybox","isolation":"gvisor","network":{"mode":"allowlist","allow":["example.com:443"]}}"#,
        )
        .unwrap();
        assert!(matches!(
            req.child_spec("sbx-x", &proxied),
            Err(SpecError::ForkProcesses(m)) if m.contains("network none")
        ));
        let gvisor = spec(r#"{"image":"busybox","isolation":"gvisor"}"#).unwrap();
        let child = req.child_spec("sbx-x", &gvisor).unwrap();
        assert!(child.fork.is_some_and(|f| f.processes));
        // Files only unless asked, and the flag is optional on the wire.
        let files: ForkRequest = serde_json::from_str(r#"{"count":1}"#).unwrap();
        assert!(
            !files
                .child_spec("sbx-x", &gvisor)
                .unwrap()
                .fork
                .unwrap()
                .processes
        );
    }
}

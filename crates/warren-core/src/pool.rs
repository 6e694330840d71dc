//! Warm pools: a node keeps `size` ready sandboxes of one image and size,
//! and a create that matches takes one instead of making a sandbox.

use serde::{Deserialize, Serialize};
use thiserror::Error;
use utoipa::ToSchema;

use crate::labels::{self, LabelError};
use crate::spec::{ByteSize, Cpu, SandboxSpec, SpecError};

/// The label every pool member carries until it is claimed.
pub const POOL_LABEL: &str = "warren.pool";
/// Most ready sandboxes one pool may keep.
pub const MAX_POOL_SIZE: u32 = 4096;

/// What `PUT /v1/pools/{name}` takes: the image and sizes a create must
/// ask for to be served from the pool, and how many to keep ready.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PoolSpec {
    pub image: String,
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
    /// A main process its members start with (a template's server): a
    /// create with the same command takes a member that runs it already.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmd: Option<Vec<String>>,
    /// The isolation class its members run in (none: each its node's
    /// default); a create is served only when it names the same (or, with
    /// none, none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<crate::Isolation>,
    pub size: u32,
}

/// A pool and how many of its sandboxes are ready now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PoolInfo {
    pub name: String,
    pub spec: PoolSpec,
    pub ready: u32,
    /// Creates it has served since the control plane started.
    pub claimed: u64,
}

#[derive(Debug, Error, PartialEq)]
pub enum PoolError {
    #[error("pool name: {0}")]
    Name(LabelError),
    #[error("pool size {0} is above the most a pool keeps ({MAX_POOL_SIZE})")]
    TooLarge(u32),
    #[error("{0}")]
    Spec(#[from] SpecError),
}

impl PoolSpec {
    /// The spec its members are made from (and a create must match).
    pub fn template(&self, name: &str) -> SandboxSpec {
        SandboxSpec {
            image: self.image.clone(),
            cpu: self.cpu,
            memory: self.memory,
            cpu_request: self.cpu_request,
            memory_request: self.memory_request,
            pids: self.pids,
            cmd: self.cmd.clone(),
            isolation: self.isolation,
            labels: [(POOL_LABEL.to_string(), name.to_string())].into(),
            // Waiting is its job; a claim gives it the create's TTL.
            ttl: crate::spec::Dur::from_secs(24 * 3600).ok(),
            ..Default::default()
        }
    }

    pub fn validate(&self, name: &str) -> Result<(), PoolError> {
        labels::validate_value(POOL_LABEL, name).map_err(PoolError::Name)?;
        if self.size > MAX_POOL_SIZE {
            return Err(PoolError::TooLarge(self.size));
        }
        self.template(name).resolve()?;
        Ok(())
    }

    /// Whether a create asking for `spec` may take a member of this pool:
    /// the same image, resources, main command and isolation class (both
    /// naming none: the member runs in its node's default, as the create
    /// would), nothing that only a new sandbox can give (its own disk, a
    /// node selector, GPUs, CDI devices: a member holds none). Labels,
    /// env, TTL, lease, network policy, cwd and user are applied at claim.
    pub fn serves(&self, name: &str, spec: &SandboxSpec) -> bool {
        spec.isolation == self.isolation && self.fits(name, spec)
    }

    /// Whether a sandbox recorded with `spec` is a member of this pool as
    /// it is defined now. A member's record names the class it runs in,
    /// which for a pool that names none is its node's default.
    pub fn has_member(&self, name: &str, spec: &SandboxSpec) -> bool {
        self.isolation.is_none_or(|c| spec.isolation == Some(c)) && self.fits(name, spec)
    }

    /// [`PoolSpec::serves`] but for the isolation class.
    fn fits(&self, name: &str, spec: &SandboxSpec) -> bool {
        // Every create asks each pool: the cheap checks first, so a create
        // of another image never resolves a spec twice.
        let shape = spec.image == self.image
            && spec.cmd == self.cmd
            && spec.disk.is_none()
            && spec.devices.is_empty()
            // Members are made without volumes or secrets (a claim cannot
            // add a mount to a running sandbox).
            && spec.volumes.is_empty()
            && spec.secrets.is_empty()
            && spec.node_selector.is_empty()
            && spec.placement.is_spread();
        shape
            && matches!(
                (spec.resolve(), self.template(name).resolve()),
                (Ok(want), Ok(have)) if want == have
            )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(json: &str) -> PoolSpec {
        serde_json::from_str(json).expect(json)
    }

    #[test]
    fn a_create_matches_by_image_and_resolved_resources() {
        let p = pool(r#"{"image":"bb:1","memory":"256M","size":4}"#);
        p.validate("py").unwrap();
        let spec = |json: &str| -> SandboxSpec { serde_json::from_str(json).expect(json) };
        assert!(p.serves("py", &spec(r#"{"image":"bb:1","memory":"256M","labels":{"task":"x"},"env":{"A":"1"},"ttl":"5m"}"#)));
        // Same resources written another way.
        assert!(p.serves(
            "py",
            &spec(r#"{"image":"bb:1","memory":268435456,"memory_request":"256M"}"#)
        ));
        for other in [
            r#"{"image":"bb:2","memory":"256M"}"#,
            r#"{"image":"bb:1"}"#,
            r#"{"image":"bb:1","memory":"256M","cmd":["true"]}"#,
            r#"{"image":"bb:1","memory":"256M","disk":"1G"}"#,
            r#"{"image":"bb:1","memory":"256M","node_selector":{"gpu":"a"}}"#,
            r#"{"image":"bb:1","memory":"256M","gpus":1}"#,
            r#"{"image":"bb:1","memory":"256M","devices":["nvidia.com/gpu=0"]}"#,
            r#"{"image":"bb:1","memory":"256M","secrets":[{"name":"hf"}]}"#,
            r#"{"image":"bb:1","memory":"256M","volumes":[{"name":"ds","path":"/data"}]}"#,
        ] {
            assert!(!p.serves("py", &spec(other)), "{other}");
        }
        // A pool of started servers serves creates of that command only.
        let servers = pool(r#"{"image":"bb:1","memory":"256M","cmd":["serve"],"size":1}"#);
        assert!(servers.serves(
            "srv",
            &spec(r#"{"image":"bb:1","memory":"256M","cmd":["serve"]}"#)
        ));
        assert!(!servers.serves("srv", &spec(r#"{"image":"bb:1","memory":"256M"}"#)));
        assert!(!servers.serves(
            "srv",
            &spec(r#"{"image":"bb:1","memory":"256M","cmd":["other"]}"#)
        ));
        assert_eq!(servers.template("srv").cmd, Some(vec!["serve".to_string()]));
        assert_eq!(p.template("py").isolation, None);
        assert!(!p.serves(
            "py",
            &spec(r#"{"image":"bb:1","memory":"256M","isolation":"gvisor"}"#)
        ));
        assert!(pool(r#"{"image":"bb:1","size":5000}"#)
            .validate("py")
            .is_err());
        assert!(pool(r#"{"image":"bb:1","memory":"1M","size":1}"#)
            .validate("py")
            .is_err());
        assert!(pool(r#"{"image":"bb:1","size":1}"#)
            .validate("bad name!")
            .is_err());
    }

    #[test]
    fn a_pool_serves_and_keeps_its_isolation_class() {
        use crate::Isolation::{Container, Gvisor};
        let spec = |json: &str| -> SandboxSpec { serde_json::from_str(json).expect(json) };
        let g = pool(r#"{"image":"bb:1","memory":"256M","isolation":"gvisor","size":2}"#);
        g.validate("g").unwrap();
        // Its members are made in the class, and serve creates that name it.
        let member = g.template("g");
        assert_eq!(member.isolation, Some(Gvisor));
        assert!(g.has_member("g", &member));
        let gvisor = spec(r#"{"image":"bb:1","memory":"256M","isolation":"gvisor"}"#);
        assert!(g.serves("g", &gvisor));
        // Not a create that names another class, or none (its node's
        // default, which a gvisor member need not be).
        for other in [
            r#"{"image":"bb:1","memory":"256M","isolation":"container"}"#,
            r#"{"image":"bb:1","memory":"256M"}"#,
        ] {
            assert!(!g.serves("g", &spec(other)), "{other}");
        }
        // A record of another class is no member of it.
        let stray = SandboxSpec {
            isolation: Some(Container),
            ..member
        };
        assert!(!g.has_member("g", &stray));
        // A pool that names none: its members run in their node's default,
        // recorded as such, and serve creates that name none.
        let any = pool(r#"{"image":"bb:1","memory":"256M","size":2}"#);
        let mut made = any.template("a");
        for class in [Container, Gvisor] {
            made.isolation = Some(class);
            assert!(any.has_member("a", &made), "{class}");
        }
        assert!(any.serves("a", &spec(r#"{"image":"bb:1","memory":"256M"}"#)));
        assert!(!any.serves("a", &gvisor));
        // The class goes through JSON, and an unknown one is refused.
        let text = serde_json::to_string(&g).unwrap();
        assert!(text.contains(r#""isolation":"gvisor""#), "{text}");
        assert!(serde_json::from_str::<PoolSpec>(
            r#"{"image":"bb:1","isolation":"kata","size":1}"#
        )
        .is_err());
    }
}

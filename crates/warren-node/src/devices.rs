//! The node's CDI devices: what its spec directories list, and which
//! sandbox holds each. A device is held by one sandbox at a time; the
//! holdings live in each sandbox's journaled create request, so a
//! restarted node rebuilds them from the sandboxes it takes over.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use warren_core::sync::lock;
use warren_node_api::DeviceClass;
use warren_runtime::cdi::{CdiError, Injection, Registry};

use crate::NodeError;

/// How old the registry read for `info` may be: a spec written by the
/// vendor's tool after the node started shows up within this.
const REFRESH: Duration = Duration::from_secs(10);

pub(crate) struct Devices {
    dirs: Vec<PathBuf>,
    gpu_kind: String,
    registry: Mutex<(Arc<Registry>, Instant)>,
    /// Device (qualified name) → the sandbox holding it.
    held: Mutex<BTreeMap<String, String>>,
}

impl Devices {
    pub(crate) fn new(dirs: Vec<PathBuf>, gpu_kind: String) -> Devices {
        let registry = Registry::load(&dirs);
        for s in &registry.skipped {
            tracing::warn!(file = %s.path.display(), reason = %s.reason, "CDI spec skipped");
        }
        if !registry.specs.is_empty() {
            tracing::info!(devices = ?registry.kinds(), "CDI devices found");
        }
        Devices {
            dirs,
            gpu_kind,
            registry: Mutex::new((Arc::new(registry), Instant::now())),
            held: Mutex::default(),
        }
    }

    /// The registry, read again when older than `max_age`.
    fn registry(&self, max_age: Duration) -> Arc<Registry> {
        let mut r = lock(&self.registry);
        if r.1.elapsed() >= max_age {
            *r = (Arc::new(Registry::load(&self.dirs)), Instant::now());
        }
        r.0.clone()
    }

    /// Devices of the GPU kind that `gpus` hands out (not `all`-like
    /// ones, nor a second name of the same GPU).
    pub(crate) fn gpus(&self) -> u32 {
        let n = self.registry(REFRESH).units_of_kind(&self.gpu_kind).len();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// Every kind with its devices and those held.
    pub(crate) fn classes(&self) -> Vec<DeviceClass> {
        let reg = self.registry(REFRESH);
        let held = lock(&self.held).clone();
        reg.kinds()
            .into_keys()
            .map(|kind| {
                let devices = reg.of_kind(&kind);
                let used = devices
                    .iter()
                    .filter(|d| holder(&reg, &held, d).is_some())
                    .cloned()
                    .collect();
                DeviceClass {
                    gpu: kind == self.gpu_kind,
                    kind,
                    devices,
                    used,
                }
            })
            .collect()
    }

    /// Gives sandbox `id` the devices it names and `gpus` free devices of
    /// the GPU kind, with what they inject. Nothing is held when it fails.
    pub(crate) fn claim(
        &self,
        id: &str,
        named: &[String],
        gpus: u32,
    ) -> Result<(Vec<String>, Injection), NodeError> {
        if named.is_empty() && gpus == 0 {
            return Ok((Vec::new(), Injection::default()));
        }
        // Read afresh: the spec files are the truth at the time of a create.
        let reg = self.registry(Duration::ZERO);
        if let Some(unknown) = named.iter().find(|n| !reg.contains(n)) {
            return Err(node_error(reg.unknown(unknown)));
        }
        let mut held = lock(&self.held);
        for d in named {
            if let Some((other, sandbox)) = holder(&reg, &held, d) {
                return Err(NodeError::Conflict(if other == *d {
                    format!("device {d} is in use by sandbox {sandbox}; a device is given to one sandbox at a time")
                } else {
                    format!("device {d} shares a device node with {other}, in use by sandbox {sandbox}; a device is given to one sandbox at a time")
                }));
            }
        }
        let units = reg.units_of_kind(&self.gpu_kind);
        let free: Vec<&String> = units
            .iter()
            .filter(|d| holder(&reg, &held, d).is_none() && !shares_node(&reg, d, named))
            .collect();
        if (free.len() as u64) < u64::from(gpus) {
            return Err(NodeError::Conflict(format!(
                "not enough GPUs: asked for {gpus} of kind {}, this node has {} ({} free){}",
                self.gpu_kind,
                units.len(),
                free.len(),
                if units.is_empty() {
                    " (see `warren doctor`, --gpu-kind and docs/gpu.md)"
                } else {
                    ""
                }
            )));
        }
        let mut devices = named.to_vec();
        devices.extend(free.into_iter().take(gpus as usize).cloned());
        let injection = reg.inject(&devices).map_err(node_error)?;
        for d in &devices {
            held.insert(d.clone(), id.to_string());
        }
        Ok((devices, injection))
    }

    /// Marks devices as held by a sandbox taken over after a restart.
    pub(crate) fn adopt(&self, id: &str, devices: &[String]) {
        let mut held = lock(&self.held);
        for d in devices {
            if let Some(other) = held.insert(d.clone(), id.to_string()) {
                tracing::warn!(device = %d, sandbox = %id, other = %other, "device held by two sandboxes after a restart");
            }
        }
    }

    /// Frees what sandbox `id` held.
    pub(crate) fn release(&self, id: &str) {
        lock(&self.held).retain(|_, holder| holder != id);
    }
}

/// The held device that `device` is, or shares one of its own nodes with,
/// and the sandbox holding it.
fn holder(
    reg: &Registry,
    held: &BTreeMap<String, String>,
    device: &str,
) -> Option<(String, String)> {
    if let Some(sandbox) = held.get(device) {
        return Some((device.to_string(), sandbox.clone()));
    }
    held.iter()
        .find(|(other, _)| shares_node(reg, device, std::slice::from_ref(*other)))
        .map(|(other, sandbox)| (other.clone(), sandbox.clone()))
}

/// Whether `device` is one of `others` or has one of its own nodes.
fn shares_node(reg: &Registry, device: &str, others: &[String]) -> bool {
    let mine = reg.own_nodes(device);
    others
        .iter()
        .any(|o| o == device || reg.own_nodes(o).iter().any(|n| mine.contains(n)))
}

/// Unknown devices and refused specs are the request's to fix; a spec
/// whose host nodes are missing or wrong is the node's.
fn node_error(e: CdiError) -> NodeError {
    match e {
        CdiError::Unknown { .. } | CdiError::Hooks { .. } => NodeError::BadRequest(e.to_string()),
        e => NodeError::Internal(format!("CDI: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: &str = "cdiVersion: 0.6.0\nkind: t.example/gpu\ndevices:\n\
        - {name: '0', containerEdits: {env: [G=0], deviceNodes: [{path: /dev/g0, hostPath: /dev/null}]}}\n\
        - {name: '1', containerEdits: {deviceNodes: [{path: /dev/g1, hostPath: /dev/zero}]}}\n\
        - {name: all, containerEdits: {deviceNodes: [{path: /dev/g0, hostPath: /dev/null}, {path: /dev/g1, hostPath: /dev/zero}]}}\n";

    fn devices() -> (tempfile::TempDir, Devices) {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("t.yaml"), SPEC).expect("write");
        let d = Devices::new(vec![dir.path().to_path_buf()], "t.example/gpu".into());
        (dir, d)
    }

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|n| format!("t.example/gpu={n}")).collect()
    }

    #[test]
    fn gpus_take_whole_units_and_a_device_goes_to_one_sandbox() {
        let (_dir, d) = devices();
        assert_eq!(d.gpus(), 2, "`all` is no unit of its own");
        let (got, inj) = d.claim("sbx-a", &names(&["0"]), 0).expect("claims 0");
        assert_eq!(got, names(&["0"]));
        assert_eq!(inj.env.get("G").map(String::as_str), Some("0"));
        let err = d.claim("sbx-b", &names(&["0"]), 0).expect_err("held");
        assert!(err.to_string().contains("in use by sandbox sbx-a"), "{err}");
        let err = d.claim("sbx-b", &names(&["all"]), 0).expect_err("overlaps");
        assert!(
            err.to_string()
                .contains("shares a device node with t.example/gpu=0"),
            "{err}"
        );
        let err = d.claim("sbx-b", &[], 2).expect_err("one left");
        assert!(
            err.to_string().contains("this node has 2 (1 free)"),
            "{err}"
        );
        // A failed claim holds nothing: the one free GPU is still there.
        let (got, _) = d.claim("sbx-b", &[], 1).expect("claims 1");
        assert_eq!(got, names(&["1"]));
        let used: Vec<String> = d.classes().into_iter().flat_map(|c| c.used).collect();
        assert_eq!(used, names(&["0", "1", "all"]));
        d.release("sbx-a");
        d.release("sbx-b");
        let (got, inj) = d.claim("sbx-c", &[], 2).expect("both free again");
        assert_eq!(got, names(&["0", "1"]));
        assert_eq!(inj.nodes.len(), 2);
        let err = d
            .claim("sbx-d", &["t.example/gpu=9".into()], 0)
            .expect_err("unknown");
        assert!(matches!(err, NodeError::BadRequest(_)), "{err}");
    }

    #[test]
    fn holdings_taken_over_after_a_restart_are_not_given_again() {
        let (_dir, d) = devices();
        d.adopt("sbx-old", &names(&["1"]));
        let err = d.claim("sbx-new", &names(&["1"]), 0).expect_err("held");
        assert!(err.to_string().contains("sbx-old"), "{err}");
        let (got, _) = d.claim("sbx-new", &[], 1).expect("the other one");
        assert_eq!(got, names(&["0"]));
    }
}

//! Isolation classes inside the runtime: what differs between a sandbox on
//! the host kernel (`container`) and one on gVisor's (`gvisor`), behind one
//! interface, so that another class (a microVM where KVM with hardware
//! virtualization exists) is a new implementation of [`IsolationClass`]
//! and a new way for the spawner to start it ([`crate::proto::Start`]),
//! not a rewrite. Everything else is shared by every class: the sandbox's
//! directory, its root (image layers under an overlay, mounted by the
//! spawner), its cgroup path, warren-init as PID 1 and the frames the node
//! speaks to it, and destroy (kill through the cgroup, remove its state).

use std::path::{Path, PathBuf};

use warren_core::Isolation;

use crate::{gvisor, RuntimeError, SandboxHandle};

/// What the node needs to know of a sandbox's class to serve it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Traits {
    /// Each exec may get a host cgroup of its own (handed to init, which
    /// moves the exec there). A user-space kernel cannot take one in.
    pub exec_cgroups: bool,
    /// Terminals are relayed by init: no descriptor leaves the sandbox, so
    /// the node gets a stream, not the terminal's master.
    pub relayed_terminals: bool,
    /// The sandbox's ports are reached through init, on a network stack of
    /// its own the node cannot connect into.
    pub ports_through_init: bool,
}

/// How the spawner starts a sandbox once its root is mounted, and the host
/// id range it maps root to, if any (see [`crate::userns`]).
pub(crate) struct Prepared {
    pub id_base: Option<u32>,
    pub start: crate::proto::Start,
}

/// One isolation class of the runtime.
pub(crate) trait IsolationClass: Send + Sync {
    /// Whether this node creates sandboxes of the class.
    fn offered(&self) -> bool;

    /// Refuses what the class cannot run, before anything is made.
    fn check(&self, req: &crate::CreateRequest) -> Result<(), RuntimeError>;

    /// Lays out the sandbox's directory (`handle.dir`, made by the caller):
    /// its bundle and whatever the class records there.
    fn prepare(&self, handle: &SandboxHandle, req: &PrepareInput)
        -> Result<Prepared, RuntimeError>;

    /// Init's socket, as the daemon reaches it.
    fn socket(&self, dir: &Path) -> PathBuf;

    /// The process whose `/proc/<pid>/root` is the sandbox's root as its
    /// own processes see it (the file API and user lookups go through it).
    /// None when the class's process is not (or no longer) there.
    fn root_pid(&self, dir: &Path, pid: i32, cgroup_path: &str) -> Option<i32>;

    fn traits(&self, dir: &Path) -> Traits;
}

/// What a class prepares a sandbox from.
pub(crate) struct PrepareInput {
    pub resources: warren_core::ResolvedResources,
    pub devices: crate::cdi::Injection,
    pub proxied_network: bool,
}

/// The host kernel behind namespaces, seccomp, dropped capabilities and,
/// where the node has them on, a user namespace per sandbox.
pub(crate) struct Container {
    pub userns: bool,
}

impl IsolationClass for Container {
    fn offered(&self) -> bool {
        true
    }

    fn check(&self, _req: &crate::CreateRequest) -> Result<(), RuntimeError> {
        Ok(())
    }

    fn prepare(
        &self,
        handle: &SandboxHandle,
        req: &PrepareInput,
    ) -> Result<Prepared, RuntimeError> {
        let ids = crate::prepare(handle, &req.resources, &req.devices, self.userns)?;
        Ok(Prepared {
            id_base: ids.map(|r| r.base),
            start: crate::proto::Start::Container,
        })
    }

    fn socket(&self, dir: &Path) -> PathBuf {
        dir.join("init.sock")
    }

    fn root_pid(&self, _dir: &Path, pid: i32, _cgroup_path: &str) -> Option<i32> {
        Some(pid)
    }

    fn traits(&self, _dir: &Path) -> Traits {
        Traits {
            exec_cgroups: true,
            relayed_terminals: false,
            ports_through_init: false,
        }
    }
}

/// gVisor's user-space kernel through runsc (see [`crate::gvisor`]). A node
/// without runsc still serves, and destroys, the gVisor sandboxes it finds
/// (none of that calls runsc); it only creates none.
pub(crate) struct Gvisor {
    pub runsc: Option<gvisor::Runsc>,
    pub home: PathBuf,
    /// Where runsc keeps each sandbox's state (a directory per sandbox).
    pub state_root: PathBuf,
    /// Whether sandboxes with gVisor's own network stack get a host id
    /// range (the node's `--userns`; see [`gvisor::prepare`]).
    pub userns: bool,
}

impl IsolationClass for Gvisor {
    fn offered(&self) -> bool {
        self.runsc.is_some()
    }

    fn check(&self, req: &crate::CreateRequest) -> Result<(), RuntimeError> {
        if self.runsc.is_none() {
            return Err(RuntimeError::Unsupported(
                "this node does not offer the gvisor isolation class (no runsc answered; see `warren doctor`)".into(),
            ));
        }
        if !req.devices.nodes.is_empty() || !req.devices.mounts.is_empty() {
            return Err(RuntimeError::Unsupported(
                "gvisor sandboxes take no devices (GPUs need gVisor's nvproxy, which this runsc lacks): use isolation container".into(),
            ));
        }
        Ok(())
    }

    fn prepare(
        &self,
        handle: &SandboxHandle,
        req: &PrepareInput,
    ) -> Result<Prepared, RuntimeError> {
        let runsc = self.runsc.as_ref().ok_or_else(|| {
            RuntimeError::Unsupported("this node does not offer the gvisor isolation class".into())
        })?;
        let run = runsc.invocation(&self.state_root.join(&handle.id), req.proxied_network);
        let userns = self.userns && !req.proxied_network;
        let ids = gvisor::prepare(handle, &req.resources, &run, &self.home, userns)?;
        Ok(Prepared {
            id_base: ids.map(|r| r.base),
            start: crate::proto::Start::Runsc(run),
        })
    }

    fn socket(&self, dir: &Path) -> PathBuf {
        gvisor::socket(dir)
    }

    fn root_pid(&self, dir: &Path, _pid: i32, cgroup_path: &str) -> Option<i32> {
        // The sentry's own root is an empty tmpfs: the gofer serves files.
        gvisor::gofer_pid(dir).filter(|g| crate::owns_pid(*g, cgroup_path))
    }

    fn traits(&self, dir: &Path) -> Traits {
        Traits {
            exec_cgroups: false,
            relayed_terminals: true,
            ports_through_init: gvisor::recorded(dir).is_some_and(|r| r.own_network_stack()),
        }
    }
}

/// The class a sandbox's directory records (a gVisor sandbox records its
/// runsc; every other is a container).
pub(crate) fn recorded(dir: &Path) -> Isolation {
    if dir.join(gvisor::RECORD).exists() {
        Isolation::Gvisor
    } else {
        Isolation::Container
    }
}

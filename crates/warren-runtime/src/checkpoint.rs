//! A gVisor sandbox's memory and processes saved and resumed: what a fork
//! with processes is made of. runsc saves the whole sandbox (its kernel's
//! memory, processes and open files by path) into an image and stops it;
//! the image is then restored into the source again and into each child's
//! own bundle, whose root holds a copy of the source's files as they were
//! at the checkpoint. Only a sandbox on gVisor's own network stack can be
//! saved by this runsc (host networking's sockets cannot), and nothing in
//! it may hold a host descriptor: init lets go of its host sockets first
//! (see `warren_init::proto::InitRequest::Quiesce`) and relays the main
//! process's output through pipes of the sandbox's own.

use std::path::Path;
use std::process::{Command, Stdio};

use crate::gvisor::Invocation;
use crate::{proto, userns, Runtime, RuntimeError, SandboxHandle};

impl Runtime {
    /// Saves sandbox `id` (gVisor, network none) into the directory
    /// `image`, which stops it: its init lets go of its host sockets, runsc
    /// writes the image, and runsc's record of it goes, so that it can be
    /// restored under its own id ([`Runtime::restore_in_place`]). When the
    /// checkpoint fails the sandbox is told to listen again; it may have
    /// ended (runsc stops a sandbox it could not save).
    pub async fn checkpoint(&self, id: &str, image: &Path) -> Result<(), RuntimeError> {
        let dir = self.sandbox_dir(id);
        let run = checkpointable(&dir)?;
        std::fs::create_dir(image)
            .map_err(|e| RuntimeError::os(format!("create {}", image.display()), e))?;
        crate::exec::quiesce(&crate::gvisor::socket(&dir)).await?;
        let (id, image) = (id.to_string(), image.to_path_buf());
        tokio::task::spawn_blocking(move || {
            let image_arg = format!("--image-path={}", image.display());
            let saved = runsc(&run, &["checkpoint", &image_arg, &id]);
            if let Err(e) = saved {
                let _ = runsc(&run, &["kill", &id, &warren_init::LISTEN_AGAIN.to_string()]);
                return Err(e);
            }
            runsc(&run, &["delete", "--force", &id])
        })
        .await
        .map_err(RuntimeError::task("checkpoint task"))?
    }

    /// Starts a checkpointed sandbox again under its own id, on its own
    /// directory, upper directory and cgroup, from the memory image
    /// `req.restore`; its root is mounted anew from `req`'s layers. Returns
    /// its new handle (the sentry and gofer are new processes). On failure
    /// the caller destroys it.
    pub async fn restore_in_place(
        &self,
        req: crate::CreateRequest,
    ) -> Result<SandboxHandle, RuntimeError> {
        let image = req.restore.clone().ok_or_else(|| {
            RuntimeError::Unsupported("a restore needs a checkpoint's memory image".into())
        })?;
        let dir = self.sandbox_dir(&req.id);
        let run = crate::gvisor::recorded(&dir).ok_or_else(|| {
            RuntimeError::Unsupported(format!("sandbox {} does not run in gVisor", req.id))
        })?;
        let socket = self.handle(&req.id, 0).socket;
        let id_base = userns::recorded(&dir).map(|r| r.base);
        let (pid, _) = self
            .pool
            .create(proto::SpawnerRequest::Create {
                id: req.id.clone(),
                bundle: dir,
                state_root: self.state_root(),
                socket,
                lower: req.lower_dirs.clone(),
                disk: req.resources.disk,
                id_base,
                volumes: req.volumes.clone(),
                secrets: req.secret_files.clone(),
                start: proto::Start::RunscRestore { run, image },
            })
            .await?;
        Ok(self.handle(&req.id, pid))
    }
}

/// The sandbox's runsc invocation, if this runsc can save it.
fn checkpointable(dir: &Path) -> Result<Invocation, RuntimeError> {
    let run = crate::gvisor::recorded(dir).ok_or_else(|| {
        RuntimeError::Unsupported(
            "only a gvisor sandbox can be forked with its processes (create it with --isolation gvisor)"
                .into(),
        )
    })?;
    if !run.own_network_stack() {
        return Err(RuntimeError::Unsupported(
            "a gvisor sandbox that reaches the network cannot be forked with its processes: \
             this runsc cannot save host networking (create the source with network none)"
                .into(),
        ));
    }
    Ok(run)
}

/// Runs one runsc command of the sandbox; its last line of error on failure.
fn runsc(run: &Invocation, args: &[&str]) -> Result<(), RuntimeError> {
    let out = Command::new(&run.runsc)
        .args(&run.flags)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| RuntimeError::os(format!("run {}", run.runsc.display()), e))?;
    if out.status.success() {
        return Ok(());
    }
    let text = String::from_utf8_lossy(&out.stderr);
    // runsc prints a Go trace after a failed save; the cause is its first line.
    let message = text
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("no message")
        .trim();
    let message: String = message.chars().take(300).collect();
    Err(RuntimeError::Unsupported(format!(
        "runsc {} failed: {message} ({})",
        args.first().unwrap_or(&""),
        out.status
    )))
}

//! After a start: the sandboxes of the node's journal are taken over (their
//! init alive in their cgroup), what cannot be is removed, and what no entry
//! claims is swept.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::exec::main_request;
use crate::{exec_stream, journal, lifetime, ExitInfo, Live, Node, NodeError};
use warren_node_api::{NodeEvent, Phase};

/// Journal entries taken over at once after a restart.
pub(crate) const TAKE_OVER_PARALLELISM: usize = 32;

impl Node {
    /// After a start: takes over every sandbox of the journal (those whose
    /// init is gone are removed), then sweeps what no entry claims (left by
    /// a crash between a create's first step and its journal entry).
    pub(crate) async fn take_over(self: Arc<Self>) {
        use futures_util::StreamExt;
        let node = self.clone();
        let entries = tokio::task::spawn_blocking(move || node.journal.load())
            .await
            .unwrap_or_default();
        futures_util::stream::iter(entries)
            .for_each_concurrent(TAKE_OVER_PARALLELISM, |entry| {
                let node = self.clone();
                async move {
                    let id = entry.create.id.clone();
                    match node.adopt(entry).await {
                        Ok(()) => tracing::info!(sandbox = %id, "taken over after a restart"),
                        Err(e) => {
                            tracing::warn!(sandbox = %id, error = %e, "could not take the sandbox over; removing its remains");
                            node.journal.remove(&id);
                        }
                    }
                }
            })
            .await;
        for id in self.runtime.list_host_sandboxes() {
            if !self.is_live(&id) && self.runtime.destroy(&id, None).await.is_ok() {
                tracing::info!(sandbox = %id, "swept orphaned sandbox resources");
            }
        }
        // Fork layers no sandbox taken over claims.
        self.forks.sweep().await;
        self.ready.send_replace(true);
    }

    /// Waits until the journal's sandboxes are taken over.
    pub(crate) async fn wait_ready(&self) {
        let mut rx = self.ready.subscribe();
        let _ = rx.wait_for(|r| *r).await;
    }

    /// Takes over a sandbox that outlived a daemon restart: its init must
    /// still be alive and in the sandbox's cgroup. Nothing here waits on
    /// the sandbox's processes: its main process's output, which init held
    /// while no daemon was reading, is re-attached in the background, and
    /// only once the sandbox is not frozen.
    pub(crate) async fn adopt(self: &Arc<Self>, entry: journal::Entry) -> Result<(), NodeError> {
        let id = entry.create.id.clone();
        let id = id.as_str();
        let image = self.images.resolve(&entry.create.image_digest).await?;
        let cgroup_path = self.runtime.cgroup_path(id);
        if !warren_runtime::owns_pid(entry.pid, &cgroup_path) {
            return Err(NodeError::NotRunning(id.to_string()));
        }
        // A crash between a freeze (or thaw) and its journal entry: the
        // entry is what the control plane was told, so the freezer follows.
        let path = cgroup_path.clone();
        let frozen = entry.phase != Phase::Running;
        tokio::task::spawn_blocking(move || {
            if warren_runtime::cgroups::is_frozen(&path) != frozen {
                warren_runtime::cgroups::freeze(&path, frozen)
            } else {
                Ok(())
            }
        })
        .await??;
        let log = self.logs.open(id)?;
        log.event(
            "running",
            "adopted",
            "the daemon restarted and took the sandbox over",
        );
        // The old daemon's proxy sockets died with it, so egress has failed
        // closed since; new ones restore it with the journaled policy.
        if let Err(e) = self
            .attach_network(id, entry.pid, &entry.create.spec, &log)
            .await
        {
            log.event("running", "network_unavailable", &e.to_string());
        }
        // A held sandbox's lifetime is its hold; its main process has been
        // dealt with.
        let working = entry.phase != Phase::Held;
        let remaining = (entry.ends_boot_ms - lifetime::boot_ms()).max(0) as u64;
        let lifetime = lifetime::Lifetime::new(
            std::time::Duration::from_millis(remaining),
            entry.create.spec.lease.map(|l| l.get()).filter(|_| working),
        );
        let has_main = entry.create.spec.cmd.is_some();
        self.forks.adopt(id, entry.create.spec.fork.as_ref());
        self.devices.adopt(id, &entry.create.devices);
        self.volumes.adopt(id, &entry.create.spec.volumes);
        let live = self.register(entry.create, entry.pid, entry.phase, &image, log, lifetime);
        // Execs that were running died with their streams (their cgroups
        // go), and a kill the crash interrupted is finished.
        let path = cgroup_path.clone();
        let _ = tokio::task::spawn_blocking(move || {
            warren_runtime::exec_cgroup::settle(&path);
        })
        .await;
        if has_main && working {
            if frozen {
                live.main_detached.store(true, Ordering::Release);
            } else {
                self.spawn_attach_main(id);
            }
        }
        Ok(())
    }

    /// Re-attaches to the main process of an adopted sandbox, retrying while
    /// its init does not answer (a busy host), until the sandbox is frozen
    /// again (the thaw retries) or gone.
    pub(crate) fn spawn_attach_main(self: &Arc<Self>, id: &str) {
        let node = self.clone();
        let id = id.to_string();
        tokio::spawn(async move {
            let mut wait = std::time::Duration::from_millis(200);
            loop {
                let Ok(live) = node.get(&id) else { return };
                if live.destroying.load(Ordering::Acquire) {
                    return;
                }
                match node.attach_main(&id, &live).await {
                    Ok(()) => return,
                    Err(e) => {
                        let path = live.cgroup_path.clone();
                        let frozen = tokio::task::spawn_blocking(move || {
                            warren_runtime::cgroups::is_frozen(&path)
                        })
                        .await
                        .unwrap_or(false);
                        if frozen {
                            live.main_detached.store(true, Ordering::Release);
                            return;
                        }
                        tracing::warn!(sandbox = %id, error = %e, "re-attaching to the main process; retrying");
                        tokio::time::sleep(wait).await;
                        wait = (wait * 2).min(std::time::Duration::from_secs(30));
                    }
                }
            }
        });
    }

    pub(crate) async fn attach_main(
        self: &Arc<Self>,
        id: &str,
        live: &Arc<Live>,
    ) -> Result<(), NodeError> {
        match warren_runtime::exec::attach_main(&live.socket).await? {
            warren_runtime::exec::MainAttach::Running {
                pid: main_pid,
                stdout,
                stderr,
                exit,
            } => {
                let cmd = live.main_cmd.clone().unwrap_or_default();
                let job = self.exec_job(id, live, &main_request(&cmd), true)?;
                let cgroup =
                    warren_runtime::exec_cgroup::ExecCgroup::existing(&live.cgroup_path, "main");
                self.supervise_main(id, async move |tx| {
                    let started = std::time::Instant::now();
                    exec_stream::pump(
                        &job,
                        main_pid,
                        exec_stream::Output::Pipe(stdout),
                        exec_stream::Output::Pipe(stderr),
                        exit,
                        None,
                        cgroup,
                        tx,
                        started,
                    )
                    .await
                });
            }
            warren_runtime::exec::MainAttach::Exited { code, signal } => {
                let exit = ExitInfo {
                    code,
                    signal,
                    timed_out: false,
                };
                let oom_killed = self.oom_kills(id) > 0;
                self.feed.push(NodeEvent::MainExited {
                    id: id.to_string(),
                    exit,
                    oom_killed,
                });
            }
            warren_runtime::exec::MainAttach::NoMain => {}
        }
        Ok(())
    }
}

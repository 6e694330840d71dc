//! Commands in a live sandbox: its main process and every exec, with the
//! environment they inherit, their input and terminal size, and the
//! thawing of a kept (frozen) sandbox while a person looks inside.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::sync::mpsc;
use warren_core::sync::lock;
use warren_core::{ExecEvent, ExecRequest, SandboxSpec};
use warren_image::ImageRecord;
use warren_node_api::{NodeEvent, Phase};
use warren_runtime::{files, ExecSpec, TermSize};

use crate::{exec_stream, user, ExitInfo, Live, Node, NodeError};

impl Node {
    /// Starts the spec's main process, if it has one. The control plane
    /// calls this once the sandbox is recorded as running, so the main
    /// process's exit is never reported for a sandbox still `creating`.
    pub fn start_main(self: &Arc<Self>, id: &str) -> Result<(), NodeError> {
        let live = self.get(id)?;
        let Some(cmd) = live.main_cmd.clone() else {
            return Ok(());
        };
        // A child that resumed its source's processes has its main process
        // running already.
        if live.create().spec.fork.is_some_and(|f| f.processes) {
            let (node, id) = (self.clone(), id.to_string());
            tokio::spawn(async move {
                if let Err(e) = node.attach_main(&id, &live).await {
                    tracing::warn!(sandbox = %id, error = %e, "attaching to a resumed main process");
                }
            });
            return Ok(());
        }
        let job = self.exec_job(id, &live, &main_request(&cmd), true)?;
        self.supervise_main(id, async move |tx| exec_stream::run(job, tx).await);
        Ok(())
    }

    /// Runs the main process's event pump and reports its exit. Nobody
    /// consumes its events here: output goes to the log, which `warren logs`
    /// and `warren run` follow.
    pub(crate) fn supervise_main<F, Fut>(self: &Arc<Self>, id: &str, pump: F)
    where
        F: FnOnce(mpsc::Sender<ExecEvent>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<ExitInfo, NodeError>> + Send,
    {
        let node = self.clone();
        let id = id.to_string();
        tokio::spawn(async move {
            let (tx, mut rx) = mpsc::channel(64);
            tokio::spawn(async move { while rx.recv().await.is_some() {} });
            if let Ok(exit) = pump(tx).await {
                let oom_killed = node.oom_kills(&id) > 0;
                node.feed.push(NodeEvent::MainExited {
                    id,
                    exit,
                    oom_killed,
                });
            }
        });
    }

    pub(crate) fn exec_job(
        &self,
        id: &str,
        live: &Live,
        req: &ExecRequest,
        main: bool,
    ) -> Result<exec_stream::ExecJob, NodeError> {
        let stdin = req
            .validate()
            .map_err(|e| NodeError::BadRequest(e.to_string()))?;
        let (mut env, default_cwd, default_user) = {
            let d = lock(&live.exec_defaults);
            (d.env.clone(), d.cwd.clone(), d.user.clone())
        };
        env.extend(req.env.clone());
        if req.tty {
            env.entry("TERM".into())
                .or_insert_with(|| "xterm-256color".into());
        }
        let root = files::open_root(live.root_pid)?;
        let user_spec = req.user.clone().unwrap_or(default_user);
        let user =
            user::resolve(&root, &user_spec).map_err(|e| NodeError::BadRequest(e.to_string()))?;
        // HOME, USER and LOGNAME of the account it runs as (as `su -`
        // and E2B's envd set them): a user named by this request wins over
        // the image's settings; the request's own env wins over both.
        for (k, v) in user.login_env() {
            if req.env.contains_key(k) {
                continue;
            }
            if req.user.is_some() {
                env.insert(k.into(), v);
            } else {
                env.entry(k.into()).or_insert(v);
            }
        }
        let seq = self.execs.next_seq();
        Ok(exec_stream::ExecJob {
            socket: live.socket.clone(),
            sandbox_cgroup: live.traits.exec_cgroups.then(|| live.cgroup_path.clone()),
            spec: ExecSpec {
                argv: req.cmd.clone(),
                env: env.into_iter().map(|(k, v)| format!("{k}={v}")).collect(),
                cwd: user.expand(req.cwd.as_deref().unwrap_or(&default_cwd)),
                uid: user.uid,
                gid: user.gid,
                groups: vec![],
                main,
                cgroup: false,
                tty_relay: req.tty && live.traits.relayed_terminals,
                tty: req.tty.then(|| {
                    let size = req.window_size();
                    TermSize {
                        rows: size.rows,
                        cols: size.cols,
                    }
                }),
            },
            stdin,
            more_stdin: None,
            timeout: req.timeout.map(|t| t.get()),
            exec_id: if main {
                "main".into()
            } else {
                format!("ex-{id}-{seq}")
            },
            log: Some(live.log.clone()),
        })
    }

    /// Starts an exec; its events arrive on the returned channel. Dropping
    /// the receiver kills the exec's process tree.
    pub async fn exec(
        self: &Arc<Self>,
        id: &str,
        req: &ExecRequest,
    ) -> Result<mpsc::Receiver<ExecEvent>, NodeError> {
        let live = self.get(id)?;
        if live.destroying.load(Ordering::Acquire) {
            return Err(NodeError::NotRunning(id.to_string()));
        }
        let held = live.phase() == Phase::Held;
        if held {
            // The first exec into a kept sandbox thaws it.
            self.execs.thaw_held(id, self.freeze(id, false)).await?;
        }
        let mut job = match self.exec_job(id, &live, req, false) {
            Ok(job) => job,
            Err(e) => {
                if held {
                    self.refreeze_held(id).await;
                }
                return Err(e);
            }
        };
        // Removed when the exec ends, which closes its stdin.
        let input = (req.stdin_open || req.tty).then(|| {
            let (input_tx, input_rx) = mpsc::channel(16);
            job.more_stdin = Some(input_rx);
            input_tx
        });
        let control_key = (id.to_string(), job.exec_id.clone());
        self.execs
            .open(control_key.clone(), input, req.stdin_open, req.tty);
        let senders = Arc::downgrade(self);
        let (tx, rx) = mpsc::channel(64);
        // Surface "cannot start" errors synchronously so the API can answer 409.
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let (inner_tx, mut inner_rx) = mpsc::channel::<ExecEvent>(64);
            let fwd = tokio::spawn(async move {
                let mut first = Some(started_tx);
                loop {
                    // A client that drops the stream is noticed now (the
                    // exec then dies of it), not at its next event.
                    let ev = tokio::select! {
                        ev = inner_rx.recv() => ev,
                        _ = tx.closed() => None,
                    };
                    let Some(ev) = ev else { break };
                    if let Some(s) = first.take() {
                        let _ = s.send(Ok(()));
                    }
                    if tx.send(ev).await.is_err() {
                        break;
                    }
                }
                first
            });
            let result = exec_stream::run(job, inner_tx).await;
            if let Some(node) = senders.upgrade() {
                node.execs.close(&control_key);
                if held {
                    node.refreeze_held(&control_key.0).await;
                }
            }
            if let (Err(e), Ok(Some(s))) = (result, fwd.await) {
                let _ = s.send(Err(e));
            }
        });
        match started_rx.await {
            Ok(Ok(())) => Ok(rx),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(NodeError::Internal("exec task ended early".into())),
        }
    }

    /// Freezes a kept sandbox again when its last exec has ended (unless
    /// it has gone meanwhile).
    async fn refreeze_held(self: &Arc<Self>, id: &str) {
        let refreeze = async {
            let still_held = self.get(id).is_ok_and(|l| l.phase() == Phase::Held);
            if still_held {
                if let Err(e) = self.freeze(id, true).await {
                    tracing::warn!(sandbox = %id, error = %e, "freezing a kept sandbox again after an exec");
                }
            }
        };
        self.execs.refreeze_held(id, refreeze).await
    }
}

/// The environment, working directory and user an exec inherits.
pub(crate) struct ExecDefaults {
    env: BTreeMap<String, String>,
    cwd: String,
    user: String,
}

impl ExecDefaults {
    /// The image's settings under the spec's; the environment its CDI
    /// devices set goes over the image's and under the spec's.
    pub(crate) fn of(
        image: &ImageRecord,
        spec: &SandboxSpec,
        cpu_millis: u64,
        device_env: &BTreeMap<String, String>,
        secrets: &[warren_core::secret::Resolved],
    ) -> ExecDefaults {
        let mut env = warren_core::spec::sandbox_env(&image.config.env, cpu_millis, &spec.env);
        // The spec cannot set a variable a secret sets (checked with it).
        for s in secrets {
            if let warren_core::secret::Delivery::Env(name) = &s.delivery {
                env.insert(name.as_str().to_string(), s.value.clone());
            }
        }
        for (k, v) in device_env {
            if !spec.env.contains_key(k) {
                env.insert(k.clone(), v.clone());
            }
        }
        if spec.network.mode.is_proxied() {
            for (k, v) in warren_net::proxy_env() {
                env.entry(k).or_insert(v);
            }
        }
        let cwd = spec
            .cwd
            .clone()
            .or_else(|| Some(image.config.working_dir.clone()).filter(|w| w.starts_with('/')))
            .unwrap_or_else(|| "/".into());
        let user = spec
            .user
            .clone()
            .unwrap_or_else(|| image.config.user.clone());
        ExecDefaults { env, cwd, user }
    }
}

pub(crate) fn main_request(cmd: &[String]) -> ExecRequest {
    ExecRequest {
        cmd: cmd.to_vec(),
        ..Default::default()
    }
}

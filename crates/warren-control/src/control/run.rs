//! One command in a sandbox made for it and removed after it, in one
//! request (`POST /v1/run`, what `warren run --rm` sends).

use std::sync::Arc;
use std::time::Duration;
use warren_core::tenant::Principal;

use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use tokio::sync::mpsc;
use warren_core::clock::now_rfc3339;
use warren_core::run::{RunEvent, RunRequest, RunSandbox};
use warren_core::state::reason;
use warren_core::{ApiError, ExecEvent, ExecRequest, SandboxState};

use crate::control::Control;
use crate::store::Transition;

impl Control {
    /// Admits and creates the sandbox (errors answer the request: bad spec,
    /// queue full, no node), then streams its state and the command's
    /// events. The sandbox goes once the command ends or the client leaves;
    /// the stream's last line says it is destroyed.
    pub async fn run(
        self: &Arc<Self>,
        who: &Principal,
        req: RunRequest,
    ) -> Result<BoxStream<'static, RunEvent>, ApiError> {
        let RunRequest {
            mut spec,
            stdin,
            timeout,
        } = req;
        let cmd = spec.cmd.take().ok_or_else(|| {
            ApiError::bad_request(
                "run needs a command: give spec.cmd, e.g. [\"sh\", \"-c\", \"...\"] (`warren run --rm --image IMG -- CMD`)",
            )
        })?;
        let exec = ExecRequest {
            cmd,
            stdin,
            timeout,
            ..Default::default()
        };
        exec.validate()
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        let (info, _) = self.create(who, spec, false).await?;
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(self.clone().drive_run(info.id, exec, tx));
        Ok(futures_util::stream::unfold(
            rx,
            |mut rx| async move { rx.recv().await.map(|ev| (ev, rx)) },
        )
        .boxed())
    }

    async fn drive_run(self: Arc<Self>, id: String, exec: ExecRequest, tx: mpsc::Sender<RunEvent>) {
        if let Err(e) = self.run_command(&id, &exec, &tx).await {
            // The run's client reads the stream, not a status: the error
            // is its last exec event.
            let message = e.message;
            let _ = tx.send(RunEvent::Exec(ExecEvent::Error { message })).await;
        }
        // The last line says the sandbox is gone, so a client that reads on
        // (`warren run --rm`, as `docker run --rm`) leaves nothing behind; one
        // that needs only the exit may stop at it.
        match self.destroy(&id, reason::RUN_ENDED).await {
            Ok(row) => {
                let _ = tx
                    .send(RunEvent::Sandbox {
                        sandbox: RunSandbox {
                            id: row.id,
                            state: row.state,
                            queue_position: None,
                            waiting_for: None,
                        },
                    })
                    .await;
            }
            Err(e) => {
                tracing::warn!(%id, error = %e.message, "could not remove a run's sandbox; the reconciler retries");
            }
        }
    }

    /// Records the command's exit code (the record keeps it, as it keeps a
    /// main process's) and the sandbox as `stopping`, in one write, before
    /// the client hears the exit: `warren run --rm` returns at the exit, and
    /// whatever happens to the daemon after it, the sandbox is then one a
    /// restart and the reconciler remove.
    async fn stop_after_run(&self, id: &str, code: i32) {
        let _one = self.sandbox_locks.lock(id).await;
        // A DELETE may have got there first.
        if !matches!(self.records.row(id).await, Ok(row) if row.state == SandboxState::Running) {
            return;
        }
        let t = Transition {
            exit_code: Some(code),
            ..Default::default()
        };
        let now = now_rfc3339();
        if let Err(e) = self
            .store
            .transition(id, SandboxState::Stopping, reason::RUN_ENDED, &now, t)
            .await
        {
            tracing::warn!(%id, error = %e, "could not record a run's exit; it is removed all the same");
        }
    }

    /// Waits for the sandbox to run (showing its place while it queues),
    /// then forwards the command's events until its exit or the client's
    /// departure.
    async fn run_command(
        &self,
        id: &str,
        exec: &ExecRequest,
        tx: &mpsc::Sender<RunEvent>,
    ) -> Result<(), ApiError> {
        let sandbox = |state, queue_position, waiting_for| RunEvent::Sandbox {
            sandbox: RunSandbox {
                id: id.to_string(),
                state,
                queue_position,
                waiting_for,
            },
        };
        let mut shown = None;
        loop {
            let row = self.records.row(id).await?;
            match row.state {
                SandboxState::Running => break,
                SandboxState::Queued | SandboxState::Creating => {
                    if row.state == SandboxState::Queued {
                        let info = self.records.info(row, false).await;
                        let now = (info.queue_position, info.waiting_for);
                        // Between leaving the queue and starting it has none.
                        if now.0.is_some() && Some(&now) != shown.as_ref() {
                            let event = sandbox(SandboxState::Queued, now.0, now.1.clone());
                            shown = Some(now);
                            if tx.send(event).await.is_err() {
                                return Ok(());
                            }
                        }
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(20)) => {}
                        _ = tx.closed() => return Ok(()),
                    }
                }
                state => {
                    return Err(ApiError::conflict(format!(
                        "sandbox {id} is {state} ({}) and cannot run the command; see `warren inspect {id}`",
                        row.reason
                    )))
                }
            }
        }
        if tx
            .send(sandbox(SandboxState::Running, None, None))
            .await
            .is_err()
        {
            return Ok(());
        }
        let mut events = self.io.exec(id, exec).await?;
        loop {
            tokio::select! {
                ev = events.next() => match ev {
                    Some(ev) => {
                        if let ExecEvent::Exit { code, .. } = &ev {
                            self.stop_after_run(id, *code).await;
                        }
                        let last = matches!(ev, ExecEvent::Exit { .. } | ExecEvent::Error { .. });
                        let sent = tx.send(RunEvent::Exec(ev)).await.is_ok();
                        if last {
                            warren_crashpoint::hit("run:exit_sent");
                        }
                        if !sent || last {
                            return Ok(());
                        }
                    }
                    None => return Err(ApiError::internal(format!("the command's stream in sandbox {id} ended without an exit (the sandbox was destroyed?)"))),
                },
                // Dropping the exec stream kills the command at once.
                _ = tx.closed() => return Ok(()),
            }
        }
    }
}

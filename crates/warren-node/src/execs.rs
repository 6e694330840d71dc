//! The execs running in live sandboxes as the API reaches them after their
//! start: their ids, where more stdin and terminal resizes go, and how many
//! run in each kept (frozen) sandbox, which stays thawed while one does.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use tokio::sync::mpsc;
use warren_core::sync::lock;
use warren_core::WindowSize;
use warren_runtime::RuntimeError;

use crate::exec_stream::ExecInput;
use crate::NodeError;

/// A running exec by sandbox id and exec id.
type ExecKey = (String, String);

pub(crate) struct Execs {
    /// The next exec's number (see `new`).
    seq: AtomicU64,
    /// Where more stdin goes, for execs started with `stdin_open`, by
    /// sandbox and exec id; gone when the exec ends.
    controls: Mutex<HashMap<ExecKey, ExecControl>>,
    /// Execs running in each kept (held, frozen) sandbox: it is thawed
    /// while there is one, so a person can look at its scene in a terminal.
    /// An async lock: it is held across the freeze or thaw it decides on.
    held: tokio::sync::Mutex<HashMap<String, usize>>,
}

/// How the API reaches a running exec after its start (every exec but
/// the main process has one while it runs).
struct ExecControl {
    /// Where its further input and resizes go, when it takes any.
    input: Option<mpsc::Sender<ExecInput>>,
    /// It was started with `stdin_open`, and its stdin was not closed yet.
    stdin: bool,
    tty: bool,
}

impl Execs {
    /// Exec numbers start at `first_seq` and count up.
    pub(crate) fn new(first_seq: u64) -> Execs {
        Execs {
            seq: AtomicU64::new(first_seq),
            controls: Default::default(),
            held: Default::default(),
        }
    }

    /// A number no other exec of this node has had.
    pub(crate) fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed)
    }

    /// Makes a started exec reachable for `input` and `resize` until
    /// `close`.
    pub(crate) fn open(
        &self,
        key: (String, String),
        input: Option<mpsc::Sender<ExecInput>>,
        stdin: bool,
        tty: bool,
    ) {
        lock(&self.controls).insert(key, ExecControl { input, stdin, tty });
    }

    /// The exec has ended: dropping its sender closes its stdin.
    pub(crate) fn close(&self, key: &(String, String)) {
        lock(&self.controls).remove(key);
    }

    /// Sends more stdin to a running exec started with `stdin_open`;
    /// `close` ends its stdin after `data`.
    pub(crate) async fn input(
        &self,
        id: &str,
        exec_id: &str,
        data: bytes::Bytes,
        close: bool,
    ) -> Result<(), NodeError> {
        let key = (id.to_string(), exec_id.to_string());
        let sender = {
            let mut controls = lock(&self.controls);
            let open = controls.get_mut(&key).filter(|c| c.stdin).and_then(|c| {
                // Closed now: a later send finds it closed, in order.
                c.stdin = !close;
                c.input.clone()
            });
            open.ok_or_else(|| {
                NodeError::Runtime(RuntimeError::NotFound(format!(
                    "no exec {exec_id} with an open stdin in sandbox {id}: start it with stdin_open, and send while it runs"
                )))
            })?
        };
        let gone = || NodeError::Conflict(format!("exec {exec_id} has ended; its stdin is closed"));
        if !data.is_empty() {
            sender
                .send(ExecInput::Data(data))
                .await
                .map_err(|_| gone())?;
        }
        if close {
            sender.send(ExecInput::Close).await.map_err(|_| gone())?;
        }
        Ok(())
    }

    /// Sets the window size of a running exec's terminal.
    pub(crate) async fn resize(
        &self,
        id: &str,
        exec_id: &str,
        size: WindowSize,
    ) -> Result<(), NodeError> {
        size.validate()
            .map_err(|e| NodeError::BadRequest(e.to_string()))?;
        let key = (id.to_string(), exec_id.to_string());
        let sender = {
            let controls = lock(&self.controls);
            let control = controls.get(&key).ok_or_else(|| {
                NodeError::Runtime(RuntimeError::NotFound(format!(
                    "no running exec {exec_id} in sandbox {id} (it has ended, or never ran)"
                )))
            })?;
            match (&control.input, control.tty) {
                (Some(input), true) => input.clone(),
                _ => {
                    return Err(NodeError::Conflict(format!(
                        "exec {exec_id} has no terminal to resize: start it with \"tty\": true"
                    )))
                }
            }
        };
        sender.send(ExecInput::Resize(size)).await.map_err(|_| {
            NodeError::Runtime(RuntimeError::NotFound(format!(
                "exec {exec_id} in sandbox {id} has ended"
            )))
        })
    }

    /// Counts an exec into a kept sandbox; the first one runs `thaw`
    /// (which is not polled otherwise), and is not counted if it fails.
    pub(crate) async fn thaw_held(
        &self,
        id: &str,
        thaw: impl Future<Output = Result<(), NodeError>>,
    ) -> Result<(), NodeError> {
        let mut held = self.held.lock().await;
        let n = held.get(id).copied().unwrap_or(0);
        if n == 0 {
            thaw.await?;
        }
        held.insert(id.to_string(), n + 1);
        Ok(())
    }

    /// Counts an exec out of a kept sandbox; the last one runs `refreeze`.
    pub(crate) async fn refreeze_held(&self, id: &str, refreeze: impl Future<Output = ()>) {
        let mut held = self.held.lock().await;
        match held.get(id).copied() {
            Some(n) if n > 1 => {
                held.insert(id.to_string(), n - 1);
            }
            Some(_) => {
                held.remove(id);
                refreeze.await;
            }
            None => {}
        }
    }
}

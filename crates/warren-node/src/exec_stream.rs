//! Runs one exec and turns it into the event stream of the API: `start`,
//! `stdout`/`stderr` chunks, `keepalive`, `exit`. Output is forwarded as it
//! arrives (no line buffering) and, for the main process, copied to the log.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;
use warren_core::ExecEvent;
use warren_core::WindowSize;
use warren_runtime::exec_cgroup::ExecCgroup;
use warren_runtime::{exec, ExecIo, ExecOutcome, ExecSpec, Pty};

use crate::logs::SandboxLog;
use crate::NodeError;

const KEEPALIVE: Duration = Duration::from_secs(15);
/// After the exec's process exits, background children may still hold its
/// stdout; read what is already there, then stop waiting for them.
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(100);
/// After an exec is killed, how long its exit report may take before the
/// stream ends with one of its own (init may be frozen, or gone).
const EXIT_AFTER_KILL: Duration = Duration::from_secs(5);

pub struct ExecJob {
    pub socket: PathBuf,
    /// The sandbox's cgroup, below which the exec gets its own; none in
    /// gVisor (init's own tree kill stops what the exec started).
    pub sandbox_cgroup: Option<String>,
    pub spec: ExecSpec,
    pub stdin: Option<Vec<u8>>,
    /// What reaches the exec while it runs: more stdin (after `stdin`),
    /// its end, terminal resizes. Without it stdin ends after `stdin`.
    pub more_stdin: Option<mpsc::Receiver<ExecInput>>,
    pub timeout: Option<Duration>,
    pub exec_id: String,
    /// Where output is copied (main process and logged execs).
    pub log: Option<Arc<SandboxLog>>,
}

/// What reaches a running exec after its start, in order.
#[derive(Debug)]
pub enum ExecInput {
    Data(bytes::Bytes),
    /// The end of stdin: the pipe closes; a terminal gets ^D, as typing it
    /// would give (a terminal itself has no end of input).
    Close,
    Resize(WindowSize),
}

/// The byte a terminal in canonical mode reads as end of input (VEOF's
/// default, ^D).
const TERMINAL_EOF: u8 = 0x04;

/// Where an exec's output is read from.
pub enum Output {
    Pipe(tokio::net::unix::pipe::Receiver),
    /// A terminal: stdout and stderr in one.
    Pty(Pty),
    /// Nothing (a terminal exec's stderr).
    None,
}

impl Output {
    async fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Output::Pipe(p) => p.read(buf).await,
            Output::Pty(p) => p.read(buf).await,
            Output::None => Ok(0),
        }
    }

    fn try_read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Output::Pipe(p) => p.try_read(buf),
            Output::Pty(p) => p.try_read(buf),
            Output::None => Ok(0),
        }
    }
}

/// Where an exec's further input goes.
enum Input {
    Pipe(tokio::net::unix::pipe::Sender),
    Pty(Pty),
}

/// How an exec ended (the contract's `Exit`).
pub type ExitInfo = warren_node_api::Exit;

/// Starts the exec; returns an error (and sends nothing) if it could not be
/// started at all, e.g. the sandbox's init is gone.
pub async fn run(mut job: ExecJob, tx: mpsc::Sender<ExecEvent>) -> Result<ExitInfo, NodeError> {
    let started = Instant::now();
    let (cgroup, procs) = match job
        .sandbox_cgroup
        .as_deref()
        .map(|parent| ExecCgroup::create(parent, &job.exec_id))
    {
        Some(Ok((c, fd))) => (Some(c), Some(fd)),
        Some(Err(e)) => {
            tracing::warn!(exec = %job.exec_id, error = %e, "exec without a cgroup of its own");
            (None, None)
        }
        None => (None, None),
    };
    let stdin = match job.more_stdin {
        Some(_) => exec::Stdin::Open,
        None => exec::Stdin::Bytes(job.stdin.take()),
    };
    let started_exec = exec::start(&job.socket, &job.spec, stdin, procs).await;
    let running = match started_exec {
        Ok(Ok(r)) => r,
        Err(e) => {
            if let Some(c) = &cgroup {
                c.remove();
            }
            return Err(e.into());
        }
        Ok(Err((message, code))) => {
            if let Some(c) = &cgroup {
                c.remove();
            }
            // Like a shell: 127 for "not found", 126 for "cannot execute".
            let _ = tx
                .send(ExecEvent::Start {
                    exec_id: job.exec_id.clone(),
                    pid: 0,
                })
                .await;
            let _ = tx
                .send(ExecEvent::output(true, format!("{message}\n").as_bytes()))
                .await;
            if let Some(log) = &job.log {
                log.output("stderr", &job.exec_id, format!("{message}\n").as_bytes());
            }
            let exit = ExitInfo {
                code,
                signal: None,
                timed_out: false,
            };
            let _ = tx.send(exit_event(exit, started)).await;
            return Ok(exit);
        }
    };
    let exec::RunningExec {
        pid,
        io,
        exit,
        signal,
    } = running;
    let (input, stdout, stderr) = match io {
        ExecIo::Pipes {
            stdin,
            stdout,
            stderr,
        } => (
            stdin.map(Input::Pipe),
            Output::Pipe(stdout),
            Output::Pipe(stderr),
        ),
        ExecIo::Pty(pty) => (
            Some(Input::Pty(pty.clone())),
            Output::Pty(pty),
            Output::None,
        ),
    };
    if let (Some(input), Some(more)) = (input, job.more_stdin.take()) {
        tokio::spawn(write_input(input, job.stdin.take(), more));
    }
    pump(
        &job,
        pid,
        stdout,
        stderr,
        exit,
        Some(signal),
        cgroup,
        tx,
        started,
    )
    .await
}

/// Writes what stdin gets, in order: the bytes given at start, then each
/// send, until a send closes it or every sender is gone (the exec ended);
/// a terminal's resizes come in the same order.
async fn write_input(input: Input, first: Option<Vec<u8>>, mut more: mpsc::Receiver<ExecInput>) {
    use tokio::io::AsyncWriteExt;
    match input {
        Input::Pipe(mut pipe) => {
            if let Some(first) = first.filter(|b| !b.is_empty()) {
                if pipe.write_all(&first).await.is_err() {
                    return;
                }
            }
            while let Some(msg) = more.recv().await {
                match msg {
                    // A command that exits or closes its stdin ends the writes.
                    ExecInput::Data(chunk) => {
                        if pipe.write_all(&chunk).await.is_err() {
                            return;
                        }
                    }
                    ExecInput::Close => return,
                    // Refused before it gets here: the exec has no terminal.
                    ExecInput::Resize(_) => {}
                }
            }
        }
        Input::Pty(pty) => {
            let mut open = true;
            if let Some(first) = first.filter(|b| !b.is_empty()) {
                open = pty.write_all(&first).await.is_ok();
            }
            while let Some(msg) = more.recv().await {
                match msg {
                    ExecInput::Data(chunk) if open => {
                        open = pty.write_all(&chunk).await.is_ok();
                    }
                    ExecInput::Close if open => {
                        let _ = pty.write_all(&[TERMINAL_EOF]).await;
                        open = false;
                    }
                    ExecInput::Data(_) | ExecInput::Close => {}
                    ExecInput::Resize(size) => {
                        // Fails only once the terminal is gone.
                        let _ = pty.resize(size);
                    }
                }
            }
        }
    }
}

/// Kills everything in the exec's cgroup (off the async threads: it waits
/// for the processes to be gone).
async fn kill_cgroup(cgroup: &Option<ExecCgroup>) {
    if let Some(c) = cgroup.clone() {
        let _ = tokio::task::spawn_blocking(move || c.kill(EXIT_AFTER_KILL)).await;
    }
}

/// Streams an exec's output and exit (after `start`, or after re-attaching
/// to a main process). Timeouts need a way to signal, hence `signal`.
#[allow(clippy::too_many_arguments)]
pub async fn pump(
    job: &ExecJob,
    pid: i32,
    stdout: Output,
    stderr: Output,
    exit: warren_runtime::ExitWait,
    signal: Option<warren_runtime::ExecSignal>,
    cgroup: Option<ExecCgroup>,
    tx: mpsc::Sender<ExecEvent>,
    started: Instant,
) -> Result<ExitInfo, NodeError> {
    let result = pump_streams(job, pid, stdout, stderr, exit, signal, &cgroup, tx, started).await;
    match &result {
        // The client went away: the exec dies with its stream.
        Err(NodeError::ClientGone) if !job.spec.main => kill_cgroup(&cgroup).await,
        // The exec's command still runs although its shim reported an
        // exit: something in the sandbox killed the shim to leave the
        // exec's supervision. The exec ends, and all of it with it.
        Ok(_) if cgroup.as_ref().is_some_and(|c| c.holds_sandbox_pid(pid)) => {
            kill_cgroup(&cgroup).await
        }
        _ => {}
    }
    if let Some(c) = &cgroup {
        // Left in place while a background job of the exec runs.
        c.remove();
    }
    result
}

#[allow(clippy::too_many_arguments)]
async fn pump_streams(
    job: &ExecJob,
    pid: i32,
    mut stdout: Output,
    mut stderr: Output,
    exit: warren_runtime::ExitWait,
    mut signal: Option<warren_runtime::ExecSignal>,
    cgroup: &Option<ExecCgroup>,
    tx: mpsc::Sender<ExecEvent>,
    started: Instant,
) -> Result<ExitInfo, NodeError> {
    if tx
        .send(ExecEvent::Start {
            exec_id: job.exec_id.clone(),
            pid,
        })
        .await
        .is_err()
    {
        return Err(NodeError::ClientGone);
    }
    let exit_fut = exit.wait();
    tokio::pin!(exit_fut);
    let deadline = job
        .timeout
        .filter(|_| signal.is_some())
        .map(|t| tokio::time::Instant::now() + t);
    let mut timed_out = false;
    let (mut out_open, mut err_open) = (true, !matches!(stderr, Output::None));
    let mut outcome = None;
    let mut drain_until: Option<tokio::time::Instant> = None;
    let mut buf_out = vec![0u8; 64 * 1024];
    let mut buf_err = vec![0u8; 64 * 1024];
    let mut keepalive =
        tokio::time::interval_at(tokio::time::Instant::now() + KEEPALIVE, KEEPALIVE);
    loop {
        if outcome.is_some() && (!out_open && !err_open) {
            break;
        }
        let timer = drain_until.or(if timed_out { None } else { deadline });
        tokio::select! {
            n = stdout.read(&mut buf_out), if out_open => match n {
                Ok(0) | Err(_) => out_open = false,
                Ok(n) => forward(&tx, job, false, &buf_out[..n]).await?,
            },
            n = stderr.read(&mut buf_err), if err_open => match n {
                Ok(0) | Err(_) => err_open = false,
                Ok(n) => forward(&tx, job, true, &buf_err[..n]).await?,
            },
            r = &mut exit_fut, if outcome.is_none() => {
                outcome = Some(r?);
                drain_until = Some(tokio::time::Instant::now() + DRAIN_AFTER_EXIT);
            },
            _ = sleep_until_opt(timer) => {
                if drain_until.is_some() {
                    // What the command wrote before it exited is in the
                    // pipes already; a busy node can reach this timer before
                    // it got to read them, and must not lose that output.
                    if out_open {
                        drain_ready(&mut stdout, &mut buf_out, &tx, job, false).await?;
                    }
                    if err_open {
                        drain_ready(&mut stderr, &mut buf_err, &tx, job, true).await?;
                    }
                    break;
                }
                timed_out = true;
                // The cgroup catches what the sandbox detached, stopped or
                // re-parented; init's tree walk is the fallback where an
                // exec has no cgroup.
                if let Some(signal) = signal.as_mut() {
                    let _ = signal.send(libc::SIGKILL).await;
                }
                kill_cgroup(cgroup).await;
                // Init reports the exit at once, unless it cannot run.
                drain_until = Some(tokio::time::Instant::now() + EXIT_AFTER_KILL);
            },
            _ = keepalive.tick() => {
                if tx.send(ExecEvent::Keepalive).await.is_err() {
                    return Err(NodeError::ClientGone);
                }
            },
            // A client that drops its stream kills the exec now, not at
            // the next output or keepalive (E2B's kill of a process is
            // exactly that).
            _ = tx.closed(), if !job.spec.main => return Err(NodeError::ClientGone),
        }
    }
    let (code, sig) = match outcome {
        Some(ExecOutcome::Exited { code, signal }) => (code, signal),
        // Killed at its deadline, but init did not report it (the sandbox
        // is frozen, or init is gone): what was killed died of SIGKILL.
        None if timed_out => (128 + libc::SIGKILL, Some(libc::SIGKILL)),
        None => {
            return Err(NodeError::Internal(
                "exec ended without an exit report".into(),
            ))
        }
    };
    let exit = ExitInfo {
        code,
        signal: sig,
        timed_out,
    };
    let _ = tx.send(exit_event(exit, started)).await;
    Ok(exit)
}

/// Forwards what a pipe holds now, without waiting for more (background
/// children may keep it open forever).
async fn drain_ready(
    pipe: &mut Output,
    buf: &mut [u8],
    tx: &mpsc::Sender<ExecEvent>,
    job: &ExecJob,
    stderr: bool,
) -> Result<(), NodeError> {
    loop {
        match pipe.try_read(buf) {
            Ok(0) | Err(_) => return Ok(()),
            Ok(n) => forward(tx, job, stderr, &buf[..n]).await?,
        }
    }
}

async fn forward(
    tx: &mpsc::Sender<ExecEvent>,
    job: &ExecJob,
    stderr: bool,
    bytes: &[u8],
) -> Result<(), NodeError> {
    if let Some(log) = &job.log {
        log.output(
            if stderr { "stderr" } else { "stdout" },
            &job.exec_id,
            bytes,
        );
    }
    // For the main process nobody may be listening; output still goes to the log.
    if tx.send(ExecEvent::output(stderr, bytes)).await.is_err() && !job.spec.main {
        return Err(NodeError::ClientGone);
    }
    Ok(())
}

fn exit_event(exit: ExitInfo, started: Instant) -> ExecEvent {
    ExecEvent::Exit {
        code: exit.code,
        signal: exit.signal,
        timed_out: exit.timed_out,
        duration_ms: started.elapsed().as_millis() as u64,
    }
}

async fn sleep_until_opt(t: Option<tokio::time::Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

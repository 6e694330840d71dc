//! envd's `process.Process` service on Warren's exec. A process is a
//! Warren exec whose event stream a task here owns: it fans the output out
//! to the `Start` stream and any `Connect` streams, and killing the process
//! drops that stream, which makes the node kill the exec's whole cgroup.
//! A finished process is kept a minute so that a late `Connect` still gets
//! its end. A PTY process is a Warren exec on a terminal: its output goes
//! out as `pty` data, its input is `pty` input, and `Update` resizes it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::Extension;
use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};
use warren_core::sync::lock;
use warren_core::{ExecEvent, ExecRequest, WindowSize};

use super::{paths, Target};
use crate::connect::{self, Code, Item, RpcError};
use crate::E2b;

/// How long a finished process stays for `Connect`.
const KEEP_FINISHED: Duration = Duration::from_secs(60);

#[derive(Default)]
pub struct Processes {
    by_sandbox: Mutex<HashMap<String, HashMap<u32, Arc<Proc>>>>,
}

struct Proc {
    pid: u32,
    /// Warren's name for the exec, for sending it stdin.
    exec_id: String,
    /// Started with `stdin: true`: input may follow.
    stdin: bool,
    /// Runs on a terminal: input and output are `pty`, not stdin/stdout.
    pty: bool,
    config: Value,
    tag: Option<String>,
    subscribers: Mutex<Vec<mpsc::Sender<Msg>>>,
    /// The end event, once the process has ended.
    ended: Mutex<Option<Value>>,
    kill: Mutex<Option<oneshot::Sender<()>>>,
}

/// What a process's readers get: its events, or word that its deadline
/// (`Connect-Timeout-Ms`) passed, which ends a stream with
/// `deadline_exceeded` as envd's does.
#[derive(Clone)]
enum Msg {
    Event(Value),
    Deadline,
    /// The sandbox went away under the process: its streams drop, as the
    /// connection to a killed E2B sandbox drops (the SDK then asks whether
    /// the sandbox is still there and says it was killed).
    Gone,
}

impl Proc {
    /// Sends an event to every stream still reading (waiting for slow
    /// ones: their backlog slows the process's output, nothing is lost).
    async fn publish(&self, event: Msg) {
        let subs: Vec<_> = lock(&self.subscribers).clone();
        for s in &subs {
            let _ = s.send(event.clone()).await;
        }
        lock(&self.subscribers).retain(|s| !s.is_closed());
    }

    fn subscribe(&self) -> mpsc::Receiver<Msg> {
        let (tx, rx) = mpsc::channel(64);
        lock(&self.subscribers).push(tx);
        rx
    }
}

impl Processes {
    fn insert(&self, sandbox: &str, proc: Arc<Proc>) {
        lock(&self.by_sandbox)
            .entry(sandbox.to_string())
            .or_default()
            .insert(proc.pid, proc);
    }

    fn find(&self, sandbox: &str, selector: &Selector) -> Option<Arc<Proc>> {
        let table = lock(&self.by_sandbox);
        let procs = table.get(sandbox)?;
        match selector {
            Selector { pid: Some(pid), .. } => procs.get(pid).cloned(),
            Selector { tag: Some(tag), .. } => procs
                .values()
                .find(|p| p.tag.as_deref() == Some(tag.as_str()))
                .cloned(),
            _ => None,
        }
    }

    fn running(&self, sandbox: &str) -> Vec<Arc<Proc>> {
        lock(&self.by_sandbox)
            .get(sandbox)
            .map(|m| {
                m.values()
                    .filter(|p| lock(&p.ended).is_none())
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    fn remove(&self, sandbox: &str, proc: &Arc<Proc>) {
        let mut table = lock(&self.by_sandbox);
        if let Some(m) = table.get_mut(sandbox) {
            if m.get(&proc.pid).is_some_and(|p| Arc::ptr_eq(p, proc)) {
                m.remove(&proc.pid);
            }
            if m.is_empty() {
                table.remove(sandbox);
            }
        }
    }

    /// Drops what is known of a killed sandbox's processes (their streams
    /// end as the sandbox goes).
    pub fn forget_sandbox(&self, sandbox: &str) {
        lock(&self.by_sandbox).remove(sandbox);
    }
}

#[derive(Deserialize, Default)]
struct Selector {
    #[serde(default)]
    pid: Option<u32>,
    #[serde(default)]
    tag: Option<String>,
}

#[derive(Deserialize)]
struct ProcessConfig {
    cmd: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    envs: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    cwd: Option<String>,
}

#[derive(Deserialize)]
struct StartRequest {
    process: Value,
    #[serde(default)]
    tag: Option<String>,
    /// envd's default when absent is true (older SDKs send nothing).
    #[serde(default)]
    stdin: Option<bool>,
    #[serde(default)]
    pty: Option<Pty>,
}

/// envd's `PTY`. Connect-JSON leaves out zero numbers, so every field may
/// be missing.
#[derive(Deserialize, Default)]
struct Pty {
    #[serde(default)]
    size: Option<PtySize>,
}

#[derive(Deserialize, Default)]
struct PtySize {
    #[serde(default)]
    rows: u32,
    #[serde(default)]
    cols: u32,
}

impl PtySize {
    /// Rows and columns as Warren's exec takes them; a zero is `None` (it
    /// is what Connect-JSON makes of a number left out, and a terminal of
    /// no size is no use).
    fn dims(&self) -> Result<(Option<u16>, Option<u16>), RpcError> {
        let dim = |n: u32, what: &str| -> Result<Option<u16>, RpcError> {
            if n == 0 {
                return Ok(None);
            }
            u16::try_from(n).map(Some).map_err(|_| {
                RpcError::new(
                    Code::InvalidArgument,
                    format!("pty size: {what} must be at most {}", u16::MAX),
                )
            })
        };
        Ok((dim(self.rows, "rows")?, dim(self.cols, "cols")?))
    }
}

#[derive(Deserialize)]
struct ProcessRequest {
    #[serde(default)]
    process: Selector,
    #[serde(default)]
    signal: Option<Value>,
}

pub async fn rpc(
    State(e2b): State<Arc<E2b>>,
    Extension(target): Extension<Target>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    match method.as_str() {
        "Start" => match start(&e2b, &target, &headers, &body).await {
            Ok(r) => r,
            Err(e) => connect::stream_error(e),
        },
        "Connect" => match attach(&e2b, &target, &headers, &body) {
            Ok(r) => r,
            Err(e) => connect::stream_error(e),
        },
        "List" => connect::unary(Ok(list(&e2b, &target))),
        "SendSignal" => connect::unary(signal(&e2b, &target, &headers, &body)),
        "SendInput" => connect::unary(send_input(&e2b, &target, &headers, &body).await),
        "CloseStdin" => connect::unary(close_stdin(&e2b, &target, &headers, &body).await),
        // A client stream answers as a stream: its one message, then the end.
        "StreamInput" => match stream_input(&e2b, &target, &body).await {
            Ok(v) => connect::server_stream(futures_util::stream::iter([
                Item::Message(v),
                Item::End(Ok(())),
            ])),
            Err(e) => connect::stream_error(e),
        },
        "Update" => connect::unary(update(&e2b, &target, &headers, &body).await),
        other => connect::unary::<Value>(Err(RpcError::new(
            Code::Unimplemented,
            format!("process.Process has no method {other:?}"),
        ))),
    }
}

async fn start(
    e2b: &Arc<E2b>,
    target: &Target,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, RpcError> {
    // The deadline runs from the request, as the client's does: the
    // stream must end before the client gives up reading it.
    let timeout = connect::timeout(headers)?;
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t.get());
    let req: StartRequest = connect::decode(headers, body)?;
    let (rows, cols) = match &req.pty {
        Some(pty) => pty
            .size
            .as_ref()
            .map(PtySize::dims)
            .transpose()?
            .unwrap_or_default(),
        None => (None, None),
    };
    let pty = req.pty.is_some();
    // A terminal always takes input, as envd's does (its `stdin` flag is
    // about a pipe, which a PTY process has none of).
    let stdin = pty || req.stdin.unwrap_or(true);
    let config: ProcessConfig = serde_json::from_value(req.process.clone())
        .map_err(|e| RpcError::new(Code::InvalidArgument, format!("process: {e}")))?;
    let user = target.user(headers);
    let exec = ExecRequest {
        cmd: std::iter::once(config.cmd).chain(config.args).collect(),
        env: config.envs,
        // envd starts a process in its template's working directory, else
        // its user's home, unless told otherwise.
        cwd: Some(config.cwd.filter(|c| !c.is_empty()).map_or_else(
            || {
                target
                    .accounts
                    .workdir
                    .clone()
                    .unwrap_or_else(|| "~".into())
            },
            |c| paths::resolve(&c, user.as_deref()),
        )),
        stdin: None,
        timeout,
        user: user.filter(|u| u != "root"),
        stdin_open: stdin,
        tty: pty,
        rows,
        cols,
    };
    let mut events = target.control.io().exec(&target.id, &exec).await?;
    let (pid, exec_id) = match events.next().await {
        Some(ExecEvent::Start { pid, exec_id }) => (pid.max(0) as u32, exec_id),
        Some(ExecEvent::Error { message }) => return Err(RpcError::new(Code::Internal, message)),
        _ => {
            return Err(RpcError::new(
                Code::Internal,
                "the process did not start: its exec stream ended at once",
            ))
        }
    };
    let (kill_tx, kill_rx) = oneshot::channel();
    let proc = Arc::new(Proc {
        pid,
        exec_id,
        stdin,
        pty,
        config: req.process,
        tag: req.tag,
        subscribers: Mutex::new(Vec::new()),
        ended: Mutex::new(None),
        kill: Mutex::new(Some(kill_tx)),
    });
    let rx = proc.subscribe();
    e2b.processes.insert(&target.id, proc.clone());
    tokio::spawn(drive(
        e2b.clone(),
        target.id.clone(),
        proc,
        events,
        kill_rx,
        deadline,
    ));
    let pings = Pings::new(connect::keepalive(headers), deadline);
    Ok(event_stream(pid, rx, None, pings))
}

/// When a stream sends keepalives. The Python SDK reads a stream with
/// its timeout as the read timeout, which runs from the last chunk it got
/// (the `start` event, for a quiet command); the end that says the
/// deadline passed comes a little after that deadline, later still on a
/// loaded host, and a client that gave up first sees a bare read timeout
/// instead of the SDK's `TimeoutException`. One keepalive shortly before
/// the deadline restarts that read timer, so the end arrives while the
/// client still reads.
struct Pings {
    every: Duration,
    before_deadline: Option<tokio::time::Instant>,
}

impl Pings {
    fn new(every: Duration, deadline: Option<tokio::time::Instant>) -> Pings {
        let before = |d: tokio::time::Instant| {
            d - deadline_margin(d.saturating_duration_since(tokio::time::Instant::now()))
        };
        Pings {
            every,
            before_deadline: deadline.map(before),
        }
    }
}

/// How long before the deadline the last keepalive goes: a quarter of the
/// timeout, at most 250 ms.
fn deadline_margin(timeout: Duration) -> Duration {
    (timeout / 4).min(Duration::from_millis(250))
}

/// Owns the exec's stream: output to the readers, then the end.
async fn drive(
    e2b: Arc<E2b>,
    sandbox: String,
    proc: Arc<Proc>,
    mut events: BoxStream<'static, ExecEvent>,
    mut kill: oneshot::Receiver<()>,
    deadline: Option<tokio::time::Instant>,
) {
    let past_deadline = async move {
        match deadline {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(past_deadline);
    let mut timed_out = false;
    let mut gone = false;
    let end = loop {
        tokio::select! {
            _ = &mut kill => {
                // Dropping the stream is what kills the exec.
                break killed("signal: killed");
            }
            _ = &mut past_deadline => {
                timed_out = true;
                break killed("signal: killed");
            }
            ev = events.next() => match ev {
                // A terminal's output (stdout and stderr in one) is `pty`.
                Some(ExecEvent::Stdout { data }) if proc.pty => proc.publish(Msg::Event(json!({"data": {"pty": data}}))).await,
                Some(ExecEvent::Stdout { data }) => proc.publish(Msg::Event(json!({"data": {"stdout": data}}))).await,
                Some(ExecEvent::Stderr { data }) => proc.publish(Msg::Event(json!({"data": {"stderr": data}}))).await,
                Some(ExecEvent::Exit { code, signal, timed_out: node_timed_out, .. }) => {
                    let (end, deadline) = exit_end(code, signal, node_timed_out);
                    timed_out = deadline;
                    break end;
                }
                Some(ExecEvent::Error { message }) => break json!({"exitCode": -1, "exited": false, "status": "error", "error": message}),
                Some(_) => {}
                // No exit: the stream ended with the sandbox.
                None => {
                    gone = true;
                    break killed("signal: killed");
                }
            }
        }
    };
    drop(events);
    *lock(&proc.ended) = Some(end.clone());
    proc.publish(if timed_out {
        Msg::Deadline
    } else if gone {
        Msg::Gone
    } else {
        Msg::Event(json!({"end": end}))
    })
    .await;
    lock(&proc.subscribers).clear();
    tokio::time::sleep(KEEP_FINISHED).await;
    e2b.processes.remove(&sandbox, &proc);
}

/// Go's `ProcessState` for a normal exit, as envd reports it.
/// How a process that exited ends its stream, and whether that end is the
/// deadline's. The node kills at the same deadline as this door's timer
/// and may report it first (after a stall both are ready, and `select!`
/// picks either): that is still E2B's `deadline_exceeded`, never a plain
/// exit the SDK would raise as a failed command.
fn exit_end(code: i32, signal: Option<i32>, timed_out: bool) -> (Value, bool) {
    let end = if timed_out || signal.is_some() {
        killed(match signal {
            Some(15) => "signal: terminated",
            _ => "signal: killed",
        })
    } else {
        exited(code)
    };
    (end, timed_out)
}

fn exited(code: i32) -> Value {
    let status = format!("exit status {code}");
    if code == 0 {
        json!({"exited": true, "status": status})
    } else {
        json!({"exitCode": code, "exited": true, "status": status, "error": status})
    }
}

fn killed(status: &str) -> Value {
    json!({"exitCode": -1, "exited": false, "status": status, "error": status})
}

/// A process's events as a Connect stream: `start` with the pid first
/// (the SDK insists), then output, keepalives while quiet, the end.
fn event_stream(pid: u32, rx: mpsc::Receiver<Msg>, ended: Option<Value>, pings: Pings) -> Response {
    let start =
        futures_util::stream::iter([Item::Message(json!({"event": {"start": {"pid": pid}}}))]);
    let rest: BoxStream<'static, Item> = match ended {
        Some(end) => futures_util::stream::iter([
            Item::Message(json!({"event": {"end": end}})),
            Item::End(Ok(())),
        ])
        .boxed(),
        None => futures_util::stream::unfold(
            Some((rx, pings.before_deadline)),
            move |state| async move {
                let (mut rx, mut before_deadline) = state?;
                let regular = tokio::time::Instant::now() + pings.every;
                let ping_at = before_deadline.map_or(regular, |d| d.min(regular));
                match tokio::time::timeout_at(ping_at, rx.recv()).await {
                    Err(_) => {
                        if before_deadline.is_some_and(|d| d <= ping_at) {
                            before_deadline = None;
                        }
                        let ping = Item::Message(json!({"event": {"keepalive": {}}}));
                        Some((ping, Some((rx, before_deadline))))
                    }
                    Ok(Some(Msg::Deadline)) => Some((
                        Item::End(Err(RpcError::new(
                            Code::DeadlineExceeded,
                            "the command ran past its timeout and was killed",
                        ))),
                        None,
                    )),
                    Ok(Some(Msg::Event(ev))) => {
                        let last = ev.get("end").is_some();
                        let item = Item::Message(json!({"event": ev}));
                        Some((item, (!last).then_some((rx, before_deadline))))
                    }
                    Ok(Some(Msg::Gone)) => Some((Item::Gone, None)),
                    Ok(None) => Some((Item::End(Ok(())), None)),
                }
            },
        )
        .chain(futures_util::stream::iter([Item::End(Ok(()))]))
        .boxed(),
    };
    connect::server_stream(start.chain(rest))
}

fn attach(
    e2b: &Arc<E2b>,
    target: &Target,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, RpcError> {
    let req: ProcessRequest = connect::decode(headers, body)?;
    let proc = e2b
        .processes
        .find(&target.id, &req.process)
        .ok_or_else(|| no_process(&req.process))?;
    let rx = proc.subscribe();
    let ended = lock(&proc.ended).clone();
    let pings = Pings::new(connect::keepalive(headers), None);
    Ok(event_stream(proc.pid, rx, ended, pings))
}

fn no_process(s: &Selector) -> RpcError {
    let what = match (&s.pid, &s.tag) {
        (Some(pid), _) => format!("pid {pid}"),
        (None, Some(tag)) => format!("tag {tag:?}"),
        _ => "a process (name it by pid or tag)".into(),
    };
    RpcError::new(
        Code::NotFound,
        format!("no process with {what} in this sandbox"),
    )
}

fn list(e2b: &E2b, target: &Target) -> Value {
    let processes: Vec<Value> = e2b
        .processes
        .running(&target.id)
        .iter()
        .map(|p| {
            let mut v = json!({"config": p.config, "pid": p.pid});
            if let Some(tag) = &p.tag {
                v["tag"] = json!(tag);
            }
            v
        })
        .collect();
    json!({ "processes": processes })
}

#[derive(Deserialize, Default)]
struct Input {
    #[serde(default)]
    stdin: Option<String>,
    #[serde(default)]
    pty: Option<String>,
}

#[derive(Deserialize)]
struct InputRequest {
    #[serde(default)]
    process: Selector,
    #[serde(default)]
    input: Input,
}

/// The running process a stdin call is for, if it took stdin.
fn stdin_target(e2b: &E2b, target: &Target, selector: &Selector) -> Result<Arc<Proc>, RpcError> {
    let proc = e2b
        .processes
        .find(&target.id, selector)
        .filter(|p| lock(&p.ended).is_none())
        .ok_or_else(|| no_process(selector))?;
    if !proc.stdin {
        return Err(RpcError::new(
            Code::FailedPrecondition,
            format!(
                "process {} was started without stdin; start it with stdin=True",
                proc.pid
            ),
        ));
    }
    Ok(proc)
}

/// The bytes of an input message for `proc`: `pty` input for a process
/// on a terminal, `stdin` for one on pipes (as envd, which has nowhere
/// else to put either).
fn input_bytes(proc: &Proc, input: &Input) -> Result<Bytes, RpcError> {
    let data = match (&input.stdin, &input.pty) {
        (Some(_), _) if proc.pty => {
            return Err(RpcError::new(
                Code::FailedPrecondition,
                format!(
                    "process {} runs on a PTY: send its input as pty input (sbx.pty.send_stdin)",
                    proc.pid
                ),
            ))
        }
        (_, Some(_)) if !proc.pty => {
            return Err(RpcError::new(
                Code::FailedPrecondition,
                format!(
                    "process {} has no PTY: send its input as stdin (sbx.commands.send_stdin)",
                    proc.pid
                ),
            ))
        }
        (Some(d), _) | (None, Some(d)) => d.as_str(),
        (None, None) => "",
    };
    base64::Engine::decode(&base64::engine::general_purpose::STANDARD, data)
        .map(Bytes::from)
        .map_err(|_| RpcError::new(Code::InvalidArgument, "input must be base64"))
}

async fn write_input(
    target: &Target,
    proc: &Proc,
    data: Bytes,
    close: bool,
) -> Result<(), RpcError> {
    target
        .control
        .io()
        .exec_input(&target.id, &proc.exec_id, data, close)
        .await
        .map_err(RpcError::from)
}

async fn send_input(
    e2b: &E2b,
    target: &Target,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Value, RpcError> {
    let req: InputRequest = connect::decode(headers, body)?;
    let proc = stdin_target(e2b, target, &req.process)?;
    write_input(target, &proc, input_bytes(&proc, &req.input)?, false).await?;
    Ok(json!({}))
}

async fn close_stdin(
    e2b: &E2b,
    target: &Target,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Value, RpcError> {
    let req: ProcessRequest = connect::decode(headers, body)?;
    let proc = stdin_target(e2b, target, &req.process)?;
    if proc.pty {
        // envd's answer too: a terminal has no pipe to close.
        return Err(RpcError::new(
            Code::FailedPrecondition,
            format!(
                "process {} runs on a PTY, which has no stdin to close; send Ctrl-D (0x04) as pty input",
                proc.pid
            ),
        ));
    }
    write_input(target, &proc, Bytes::new(), true).await?;
    Ok(json!({}))
}

#[derive(Deserialize)]
struct UpdateRequest {
    #[serde(default)]
    process: Selector,
    #[serde(default)]
    pty: Option<Pty>,
}

/// Resizes a PTY process's terminal; an update without a size changes
/// nothing, as in envd.
async fn update(
    e2b: &E2b,
    target: &Target,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Value, RpcError> {
    let req: UpdateRequest = connect::decode(headers, body)?;
    let proc = e2b
        .processes
        .find(&target.id, &req.process)
        .filter(|p| lock(&p.ended).is_none())
        .ok_or_else(|| no_process(&req.process))?;
    let Some(size) = req.pty.and_then(|p| p.size) else {
        return Ok(json!({}));
    };
    if !proc.pty {
        return Err(RpcError::new(
            Code::FailedPrecondition,
            format!("process {} has no PTY to resize", proc.pid),
        ));
    }
    let (Some(rows), Some(cols)) = size.dims()? else {
        return Err(RpcError::new(
            Code::InvalidArgument,
            "pty size: a terminal needs at least 1 row and 1 column",
        ));
    };
    let size = WindowSize { rows, cols };
    target
        .control
        .io()
        .exec_resize(&target.id, &proc.exec_id, size)
        .await?;
    Ok(json!({}))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct StreamInputMessage {
    #[serde(default)]
    start: Option<ProcessRequest>,
    #[serde(default)]
    data: Option<InputRequest>,
}

/// A client stream: `start` naming the process, then `data` messages
/// written in order (keepalives skipped).
async fn stream_input(e2b: &E2b, target: &Target, body: &[u8]) -> Result<Value, RpcError> {
    let messages: Vec<StreamInputMessage> = connect::decode_stream(body)?;
    let mut proc = None;
    for m in messages {
        if let Some(start) = m.start {
            proc = Some(stdin_target(e2b, target, &start.process)?);
        } else if let Some(data) = m.data {
            let p = proc.as_ref().ok_or_else(|| {
                RpcError::new(
                    Code::InvalidArgument,
                    "a StreamInput stream starts with a start message naming the process",
                )
            })?;
            write_input(target, p, input_bytes(p, &data.input)?, false).await?;
        }
    }
    Ok(json!({}))
}

/// SIGKILL and SIGTERM both end the process: Warren kills the exec's
/// whole cgroup (a process tree cannot escape it by forking).
fn signal(e2b: &E2b, target: &Target, headers: &HeaderMap, body: &[u8]) -> Result<Value, RpcError> {
    let req: ProcessRequest = connect::decode(headers, body)?;
    let known = matches!(
        req.signal
            .as_ref()
            .and_then(|s| s
                .as_str()
                .map(str::to_string)
                .or_else(|| s.as_i64().map(|n| n.to_string())))
            .as_deref(),
        Some("SIGNAL_SIGKILL" | "SIGNAL_SIGTERM" | "9" | "15")
    );
    if !known {
        return Err(RpcError::new(
            Code::InvalidArgument,
            "signal must be SIGNAL_SIGKILL or SIGNAL_SIGTERM",
        ));
    }
    let proc = e2b
        .processes
        .find(&target.id, &req.process)
        .filter(|p| lock(&p.ended).is_none())
        .ok_or_else(|| no_process(&req.process))?;
    if let Some(kill) = lock(&proc.kill).take() {
        let _ = kill.send(());
    }
    Ok(json!({}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exit_the_node_timed_out_ends_as_the_deadline() {
        assert_eq!(
            exit_end(137, Some(9), true),
            (killed("signal: killed"), true)
        );
        assert_eq!(exit_end(-1, None, true), (killed("signal: killed"), true));
        assert_eq!(
            exit_end(143, Some(15), false),
            (killed("signal: terminated"), false)
        );
        assert_eq!(exit_end(3, None, false), (exited(3), false));
    }

    fn proc(pty: bool) -> Proc {
        Proc {
            pid: 7,
            exec_id: "x".into(),
            stdin: true,
            pty,
            config: json!({}),
            tag: None,
            subscribers: Mutex::new(Vec::new()),
            ended: Mutex::new(None),
            kill: Mutex::new(None),
        }
    }

    fn input(json: Value) -> Input {
        serde_json::from_value(json).unwrap()
    }

    /// The envelopes of a stream's body as (flags, JSON).
    async fn frames(resp: Response) -> Vec<(u8, Value)> {
        let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        let mut out = Vec::new();
        let mut rest = &body[..];
        while rest.len() >= 5 {
            let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
            out.push((rest[0], serde_json::from_slice(&rest[5..5 + len]).unwrap()));
            rest = &rest[5 + len..];
        }
        out
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_stream_pings_shortly_before_its_deadline() {
        let start = tokio::time::Instant::now();
        let deadline = start + Duration::from_secs(1);
        assert_eq!(
            deadline_margin(Duration::from_secs(1)),
            Duration::from_millis(250)
        );
        assert_eq!(
            deadline_margin(Duration::from_millis(200)),
            Duration::from_millis(50)
        );
        let (tx, rx) = mpsc::channel(4);
        let pings = Pings::new(Duration::from_secs(90), Some(deadline));
        let sent = tokio::spawn(async move {
            tokio::time::sleep_until(deadline).await;
            let at_deadline = tokio::time::Instant::now();
            tx.send(Msg::Deadline).await.unwrap();
            at_deadline
        });
        let got = frames(event_stream(7, rx, None, pings)).await;
        let kinds: Vec<&Value> = got.iter().map(|(_, v)| v).collect();
        assert_eq!(kinds[0]["event"]["start"]["pid"], 7);
        assert_eq!(*kinds[1], json!({"event": {"keepalive": {}}}), "{kinds:?}");
        assert_eq!(got.len(), 3, "one ping, then the end: {kinds:?}");
        assert_eq!(got[2].0, connect::END_STREAM);
        assert_eq!(got[2].1["error"]["code"], "deadline_exceeded");
        assert_eq!(sent.await.unwrap() - start, Duration::from_secs(1));
    }

    #[test]
    fn pty_sizes_leave_out_zeros_and_refuse_what_a_terminal_cannot_be() {
        let req: StartRequest = serde_json::from_value(
            json!({"process": {"cmd": "bash"}, "pty": {"size": {"rows": 30}}}),
        )
        .unwrap();
        let size = req.pty.and_then(|p| p.size).unwrap();
        assert_eq!(size.dims().unwrap(), (Some(30), None));
        let empty: StartRequest =
            serde_json::from_value(json!({"process": {"cmd": "bash"}, "pty": {}})).unwrap();
        assert!(empty.pty.is_some_and(|p| p.size.is_none()));
        let huge = PtySize {
            rows: 70_000,
            cols: 80,
        };
        assert_eq!(huge.dims().unwrap_err().code, Code::InvalidArgument);
    }

    #[test]
    fn input_goes_to_the_pty_of_a_pty_process_and_to_stdin_of_another() {
        let hi = json!({"pty": "aGk="});
        assert_eq!(input_bytes(&proc(true), &input(hi.clone())).unwrap(), "hi");
        assert_eq!(
            input_bytes(&proc(false), &input(hi)).unwrap_err().code,
            Code::FailedPrecondition
        );
        let stdin = json!({"stdin": "aGk="});
        assert_eq!(
            input_bytes(&proc(false), &input(stdin.clone())).unwrap(),
            "hi"
        );
        let e = input_bytes(&proc(true), &input(stdin)).unwrap_err();
        assert!(e.message.contains("pty input"), "{}", e.message);
        assert_eq!(
            input_bytes(&proc(true), &input(json!({"pty": "%%"})))
                .unwrap_err()
                .code,
            Code::InvalidArgument
        );
    }
}

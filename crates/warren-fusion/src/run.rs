//! One `/run_code` call: a fresh sandbox, the code and files written into a
//! directory of it, the compile and run steps as execs, the fetched files
//! read back, and the sandbox destroyed whatever happened.

use std::collections::BTreeMap;
use std::sync::Arc;

use std::time::{Duration, Instant};
use warren_core::tenant::Principal;

use base64::Engine;
use futures_util::StreamExt;
use warren_control::Control;
use warren_core::files::{FileKind, WriteFile};
use warren_core::spec::{ByteSize, Cpu, Dur};
use warren_core::state::reason;
use warren_core::{ApiError, ErrorCode, ExecEvent, ExecRequest, SandboxSpec, SandboxState};

use crate::languages::{java_classpath, Language};
use crate::protocol::{CommandRunResult, CommandRunStatus, RunCodeResponse};

/// The label every sandbox of this front door carries (`warren ps
/// --label warren.dev/front=sandbox-fusion`).
pub const FRONT_LABEL: (&str, &str) = ("warren.dev/front", "sandbox-fusion");

/// SandboxFusion returns at most 1 MiB of each stream (`get_output_non_blocking`);
/// the rest is read and dropped, so a program that prints forever costs
/// no memory here.
const OUTPUT_CAP: usize = 1 << 20;

/// Most bytes of `fetch_files` one call returns, all files together, each
/// counted as often as the answer lists it (base64 makes the answer a third
/// larger). A file past it is the call's error, never a truncated file: the
/// daemon's memory per call stays bounded whatever the sandbox writes.
const FETCH_CAP: u64 = 16 << 20;

/// Above `memory_limit_MB`, for what the sandbox holds besides the program:
/// its init, the exec shim, and the page cache of the files written.
const MEMORY_HEADROOM_MIB: u64 = 32;

/// How long a create refused for capacity (queue full, no node, disk
/// pressure) is retried before the client is told to come back.
const CAPACITY_PATIENCE: Duration = Duration::from_secs(600);

/// A request, checked and decoded.
#[derive(Debug)]
pub struct Job {
    pub language: &'static Language,
    pub code: String,
    pub compile_timeout: Duration,
    pub run_timeout: Duration,
    pub memory_limit_mb: i64,
    pub stdin: Option<Vec<u8>>,
    pub files: Vec<(String, Vec<u8>)>,
    pub fetch_files: Vec<String>,
}

/// How a call ended: an answer in SandboxFusion's shape, or no sandbox
/// could be had (the HTTP layer answers 503 with `Retry-After`).
#[derive(Debug)]
pub enum Outcome {
    Answer(RunCodeResponse),
    Busy(ApiError),
}

/// Sizes of the sandbox: `memory_limit_MB` plus headroom when given; else
/// small ones, bigger for compilers and JVMs (g++, rustc and javac need
/// several hundred MB). CPU is a limit, lent 8× per core by default, so
/// many of these run at once.
pub fn sizes(lang: &Language, memory_limit_mb: i64) -> (Cpu, ByteSize) {
    const MIB: u64 = 1 << 20;
    let cpu = if lang.heavy { Cpu(1000) } else { Cpu(500) };
    let memory = match u64::try_from(memory_limit_mb) {
        Ok(mb) if mb > 0 => mb.saturating_add(MEMORY_HEADROOM_MIB).saturating_mul(MIB),
        _ if lang.heavy => 1024 * MIB,
        _ => 256 * MIB,
    };
    (cpu, ByteSize(memory))
}

pub fn spec(image: &str, job: &Job) -> SandboxSpec {
    let (cpu, memory) = sizes(job.language, job.memory_limit_mb);
    let mut labels = warren_core::Labels::new();
    labels.insert(FRONT_LABEL.0.to_string(), FRONT_LABEL.1.to_string());
    SandboxSpec {
        image: image.to_string(),
        cpu: Some(cpu),
        memory: Some(memory),
        labels,
        // A backstop only: the call destroys its sandbox itself. Should
        // that fail (the daemon stops mid-call), the TTL still ends it.
        // Each timeout is at most a day (protocol::timeout), so the sum is
        // a valid TTL.
        ttl: Dur::new(job.compile_timeout + job.run_timeout + Duration::from_secs(300)).ok(),
        ..Default::default()
    }
}

/// Runs a job. `gone` resolves when the client has gone away: the work
/// stops there and the sandbox is destroyed at once.
pub async fn run(
    control: Arc<Control>,
    image: String,
    owner: Principal,
    job: Job,
    gone: tokio::sync::oneshot::Receiver<()>,
) -> Outcome {
    let mut gone = gone;
    let created = tokio::select! {
        c = create(&control, &image, &owner, &job) => c,
        _ = &mut gone => return Outcome::Answer(RunCodeResponse::sandbox_error("the client went away")),
    };
    let id = match created {
        Ok(id) => id,
        Err(Failure::Busy(e)) => return Outcome::Busy(e),
        Err(Failure::Error(message)) => {
            return Outcome::Answer(RunCodeResponse::sandbox_error(message))
        }
    };
    let answer = tokio::select! {
        a = steps(&control, &image, &id, &job) => a,
        _ = &mut gone => RunCodeResponse::sandbox_error("the client went away"),
    };
    if let Err(e) = control.destroy(&id, reason::USER_DELETED).await {
        // Warren retries a destroy that failed (the reconciler); the TTL
        // is the last resort.
        tracing::warn!(sandbox = %id, error = %e.message, "sandbox-fusion: destroying the sandbox");
    }
    Outcome::Answer(answer)
}

enum Failure {
    Busy(ApiError),
    Error(String),
}

/// Whether a create refusal is about capacity (worth waiting for).
fn is_busy(e: &ApiError) -> bool {
    matches!(
        e.code,
        ErrorCode::TooManyRequests | ErrorCode::NoCapacity | ErrorCode::Unavailable
    )
}

/// A running sandbox for the job. A create beyond capacity waits in
/// Warren's FIFO queue; one refused outright (queue full, no node) is
/// retried after the `Retry-After` Warren gives.
async fn create(
    control: &Arc<Control>,
    image: &str,
    owner: &Principal,
    job: &Job,
) -> Result<String, Failure> {
    let deadline = Instant::now() + CAPACITY_PATIENCE;
    let spec = spec(image, job);
    loop {
        // The door's sandboxes are the tenant's it was opened for
        // (`--sandbox-fusion-tenant`), else the operator's.
        match control.create(owner, spec.clone(), true).await {
            Ok((info, _)) if info.state == SandboxState::Running => return Ok(info.id),
            Ok((info, _)) => {
                let _ = control.destroy(&info.id, reason::USER_DELETED).await;
                return Err(Failure::Error(format!(
                    "sandbox {} of image {image} is {} ({}), not running",
                    info.id, info.state, info.reason
                )));
            }
            Err(e) if is_busy(&e) => {
                let wait = Duration::from_millis(e.retry_after_ms.unwrap_or(1000).clamp(100, 5000));
                if Instant::now() + wait > deadline {
                    return Err(Failure::Busy(e));
                }
                tokio::time::sleep(wait).await;
            }
            Err(e) => {
                return Err(Failure::Error(format!(
                    "could not create a sandbox of image {image} (warren up --sandbox-fusion-image): {}",
                    e.message
                )))
            }
        }
    }
}

/// The work directory: a fresh sandbox has an empty /tmp, and a name like
/// SandboxFusion's `tempfile` ones (`/tmp/tmpXXXX`).
fn work_dir(id: &str) -> String {
    format!("/tmp/tmp{}", tag(id))
}

/// The last (most random) 8 letters and digits of a sandbox id.
fn tag(id: &str) -> String {
    let alnum: Vec<char> = id.chars().filter(char::is_ascii_alphanumeric).collect();
    alnum[alnum.len().saturating_sub(8)..].iter().collect()
}

/// A request's path, relative to the work directory (SandboxFusion's
/// `os.path.join(tmp_dir, name)`: an absolute name stays absolute).
fn in_dir(dir: &str, name: &str) -> String {
    if name.starts_with('/') {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

async fn steps(control: &Arc<Control>, image: &str, id: &str, job: &Job) -> RunCodeResponse {
    let dir = work_dir(id);
    let lang = job.language;
    // Files first, then the code, as SandboxFusion does (the code wins a
    // name clash).
    for (name, data) in &job.files {
        if let Err(e) = write(control, id, &in_dir(&dir, name), data.clone()).await {
            return RunCodeResponse::sandbox_error(format!("restoring file {name}: {}", e.message));
        }
    }
    let file = in_dir(&dir, &lang.file_name(&format!("tmp{}", tag(id))));
    let source = lang.source_text(&job.code).into_bytes();
    if let Err(e) = write(control, id, &file, source).await {
        return RunCodeResponse::sandbox_error(format!("writing the code: {}", e.message));
    }
    let classpath = java_classpath(job.files.iter().map(|(n, _)| n.as_str()));
    let env: BTreeMap<String, String> = lang
        .env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let step = |template: &[&str], timeout: Duration, stdin: Option<&[u8]>| ExecRequest {
        cmd: lang.argv(template, &file, &dir, &classpath),
        env: env.clone(),
        cwd: Some(dir.clone()),
        stdin: stdin.map(|s| base64::engine::general_purpose::STANDARD.encode(s)),
        timeout: Dur::new(timeout).ok(),
        user: None,
        ..Default::default()
    };
    let compile_result = match lang.compile {
        Some(c) => Some(exec(control, id, image, lang, step(c, job.compile_timeout, None)).await),
        None => None,
    };
    let run_result = match &compile_result {
        Some(c) if !c.succeeded() => None,
        _ => Some(
            exec(
                control,
                id,
                image,
                lang,
                step(lang.run, job.run_timeout, job.stdin.as_deref()),
            )
            .await,
        ),
    };
    match fetch_all(control, id, &dir, &job.fetch_files).await {
        Ok(files) => RunCodeResponse::from_steps(compile_result, run_result, files),
        Err(e) => RunCodeResponse::sandbox_error(e.to_string()),
    }
}

/// A file of `fetch_files` that could not be read back.
#[derive(Debug, thiserror::Error)]
#[error("fetching {name}: {source}")]
struct FetchError {
    /// As the request named it.
    name: String,
    source: ReadError,
}

/// Why one file could not be read back.
#[derive(Debug, thiserror::Error)]
enum ReadError {
    /// The sandbox's answer (its message says what went wrong).
    #[error(transparent)]
    Sandbox(#[from] ApiError),
    #[error(
        "the fetched files come to more than {} MiB together; fetch fewer or smaller files",
        FETCH_CAP >> 20
    )]
    OverCap,
}

/// The `fetch_files` that are regular files, base64 by the name asked for.
/// Each file is read once however many spellings name it (`a`, `./a`,
/// `x/../a`), and all the names answered together stay within [`FETCH_CAP`].
async fn fetch_all(
    control: &Control,
    id: &str,
    dir: &str,
    names: &[String],
) -> Result<BTreeMap<String, String>, FetchError> {
    // By file: its bytes in base64 and their number, or None (not a file).
    let mut read: BTreeMap<String, Option<(String, u64)>> = BTreeMap::new();
    let mut files = BTreeMap::new();
    let mut total = 0u64;
    for name in names {
        let path = normalize(&in_dir(dir, name));
        let file = match read.get(&path) {
            Some(known) => known.clone(),
            None => {
                let got = fetch(control, id, &path, FETCH_CAP.saturating_sub(total))
                    .await
                    .map_err(|source| FetchError {
                        name: name.clone(),
                        source,
                    })?
                    .map(|data| {
                        let b64 = base64::engine::general_purpose::STANDARD.encode(&data);
                        (b64, data.len() as u64)
                    });
                read.insert(path, got.clone());
                got
            }
        };
        // SandboxFusion returns only the names that are regular files.
        let Some((encoded, size)) = file else {
            continue;
        };
        total += size;
        if total > FETCH_CAP {
            return Err(FetchError {
                name: name.clone(),
                source: ReadError::OverCap,
            });
        }
        files.insert(name.clone(), encoded);
    }
    Ok(files)
}

/// `path` with `.`, empty and `..` names resolved lexically (the sandbox
/// resolves its symlinks; this only makes one file's spellings one key).
fn normalize(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    format!("/{}", parts.join("/"))
}

async fn write(control: &Control, id: &str, path: &str, data: Vec<u8>) -> Result<(), ApiError> {
    let body = futures_util::stream::once(async move { Ok(bytes::Bytes::from(data)) }).boxed();
    let req = WriteFile {
        path: path.to_string(),
        mode: 0o644,
        tar: false,
        xattrs: Default::default(),
    };
    control.io().write_file(id, req, body).await
}

/// A regular file's bytes; None when the path is missing or not a file.
/// One larger than `room` is refused before it is read (and, should it
/// grow while read, as soon as it passes `room`).
async fn fetch(
    control: &Control,
    id: &str,
    path: &str,
    room: u64,
) -> Result<Option<Vec<u8>>, ReadError> {
    let read = match control.io().read_file(id, path).await {
        Ok(r) => r,
        Err(e) if matches!(e.code, ErrorCode::NotFound | ErrorCode::BadRequest) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let FileKind::File { size } = read.kind else {
        return Ok(None);
    };
    if size > room {
        return Err(ReadError::OverCap);
    }
    let mut body = read.body;
    let mut data = Vec::with_capacity(size as usize);
    while let Some(chunk) = body.next().await {
        let chunk = chunk?;
        if (data.len() + chunk.len()) as u64 > room {
            return Err(ReadError::OverCap);
        }
        data.extend_from_slice(&chunk);
    }
    Ok(Some(data))
}

/// Appends output up to the cap.
fn take(buf: &mut Vec<u8>, data: &[u8]) {
    let room = OUTPUT_CAP.saturating_sub(buf.len());
    buf.extend_from_slice(&data[..data.len().min(room)]);
}

/// Runs one step and reports it as SandboxFusion does.
async fn exec(
    control: &Control,
    id: &str,
    image: &str,
    lang: &Language,
    req: ExecRequest,
) -> CommandRunResult {
    let program = req.cmd.first().cloned().unwrap_or_default();
    let started = Instant::now();
    let mut events = match control.io().exec(id, &req).await {
        Ok(s) => s,
        Err(e) => return CommandRunResult::error(format!("exec {program}: {}", e.message)),
    };
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let mut pid = None;
    while let Some(ev) = events.next().await {
        match ev {
            ExecEvent::Start { pid: p, .. } => pid = Some(p),
            ExecEvent::Stdout { .. } | ExecEvent::Stderr { .. } => {
                let bytes = ev.output_bytes().unwrap_or_default();
                let buf = if matches!(ev, ExecEvent::Stdout { .. }) {
                    &mut stdout
                } else {
                    &mut stderr
                };
                take(buf, &bytes);
            }
            ExecEvent::Keepalive => {}
            ExecEvent::Error { message } => {
                return CommandRunResult::error(format!("exec {program}: {message}"))
            }
            ExecEvent::Exit {
                code,
                signal,
                timed_out,
                duration_ms,
            } => {
                // Warren reports a program that could not be started as a
                // start with pid 0, its reason on stderr, then 127 (not
                // found) or 126 (not executable), like a shell.
                if pid == Some(0) && (code == 127 || code == 126) {
                    return CommandRunResult::error(missing_toolchain(
                        image,
                        lang,
                        &program,
                        &String::from_utf8_lossy(&stderr),
                    ));
                }
                let text = |b: Vec<u8>| Some(String::from_utf8_lossy(&b).into_owned());
                if timed_out {
                    return CommandRunResult {
                        status: CommandRunStatus::TimeLimitExceeded,
                        execution_time: Some(started.elapsed().as_secs_f64()),
                        return_code: None,
                        stdout: text(stdout),
                        stderr: text(stderr),
                    };
                }
                return CommandRunResult {
                    status: CommandRunStatus::Finished,
                    execution_time: Some(duration_ms as f64 / 1000.0),
                    // SandboxFusion's subprocess reports death by signal N
                    // as -N (Python's returncode), not the shell's 128+N.
                    return_code: Some(signal.map_or(code, |s| -s)),
                    stdout: text(stdout),
                    stderr: text(stderr),
                };
            }
        }
    }
    CommandRunResult::error(format!(
        "exec {program}: the sandbox's exec stream ended without an exit status"
    ))
}

fn missing_toolchain(image: &str, lang: &Language, program: &str, why: &str) -> String {
    format!(
        "the image {image} cannot run {program}, which {} needs ({}); \
         start Warren with --sandbox-fusion-image set to an image that has it \
         (docs/sandbox-fusion.md shows how to build one)",
        lang.name,
        why.trim()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::languages::{lookup, Lookup};

    fn lang(name: &str) -> &'static Language {
        match lookup(name) {
            Lookup::Runs(l) => l,
            _ => panic!("{name}"),
        }
    }

    #[test]
    fn sizes_follow_memory_limit() {
        let (cpu, mem) = sizes(lang("python"), -1);
        assert_eq!((cpu.0, mem.0), (500, 256 << 20));
        let (cpu, mem) = sizes(lang("cpp"), 0);
        assert_eq!((cpu.0, mem.0), (1000, 1024 << 20));
        let (_, mem) = sizes(lang("python"), 1024);
        assert_eq!(mem.0, (1024 + 32) << 20);
    }

    #[test]
    fn one_file_is_one_key_however_it_is_spelled() {
        for spelled in ["big", "./big", "././big", "x/../big", ".//big/"] {
            assert_eq!(
                normalize(&in_dir("/tmp/w", spelled)),
                "/tmp/w/big",
                "{spelled}"
            );
        }
        assert_eq!(normalize("/../../etc/passwd"), "/etc/passwd");
    }

    #[test]
    fn paths() {
        assert_eq!(work_dir("sb-0123456789abcdef"), "/tmp/tmp89abcdef");
        assert_eq!(in_dir("/tmp/x", "a/b.txt"), "/tmp/x/a/b.txt");
        assert_eq!(in_dir("/tmp/x", "/etc/y"), "/etc/y");
    }

    #[test]
    fn output_is_capped() {
        let mut buf = Vec::new();
        take(&mut buf, &vec![b'x'; OUTPUT_CAP - 1]);
        take(&mut buf, b"abc");
        assert_eq!(buf.len(), OUTPUT_CAP);
        assert_eq!(buf[OUTPUT_CAP - 1], b'a');
    }
}

//! Sandbox commands: create, run, exec, ps, inspect, rm and the lifecycle
//! actions (pause, resume, heartbeat, ttl).

use std::io::{Read, Write};

use anyhow::{bail, Context, Result};
use base64::Engine;
use warren_core::spec::Dur;
use warren_core::{ExecEvent, ExecRequest, SandboxInfo, SandboxState};

use super::images::{pull, PullOutput};
use super::logs::follow_log;
use super::spec::{parse_env, spec_from};
use crate::cli::{CreateArgs, ExecArgs};
use warren_cli::client::{Client, SandboxQuery};

pub(super) async fn create(client: &Client, args: &CreateArgs, cmd: Vec<String>) -> Result<i32> {
    pull_for_create(client, &args.image).await?;
    let cmd = (!cmd.is_empty()).then_some(cmd);
    let may_have_ended = cmd.is_some();
    let info = create_and_wait(client, &spec_from(args, cmd)?, may_have_ended).await?;
    println!("{}", info.id);
    Ok(0)
}

/// Creates a sandbox and waits until it is made (and, unless its main
/// process may already have ended, that it runs); while it waits for
/// capacity its place in the queue is shown on stderr.
async fn create_and_wait(
    client: &Client,
    spec: &warren_core::SandboxSpec,
    may_have_ended: bool,
) -> Result<warren_core::SandboxInfo> {
    use warren_core::SandboxState;
    let mut info = client.create_sandbox_queued(spec).await?;
    let mut shown = None;
    while matches!(info.state, SandboxState::Queued | SandboxState::Creating) {
        let now = (info.queue_position, info.waiting_for.clone());
        if info.state == SandboxState::Queued && Some(&now) != shown.as_ref() {
            say!(
                "{}: queued at position {}: {} (`warren rm {}` cancels it)",
                info.id,
                now.0.unwrap_or(0),
                waiting_text(&now.1),
                info.id
            );
            shown = Some(now);
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        info = client.get_sandbox(&info.id).await?;
    }
    if info.state != SandboxState::Running && !(may_have_ended && info.started_at.is_some()) {
        anyhow::bail!(
            "sandbox {} is {} ({}); see `warren inspect {}`",
            info.id,
            info.state,
            info.reason,
            info.id
        );
    }
    Ok(info)
}

/// A registry image is pulled with progress before the create (which
/// would pull it silently); nothing is printed when it is already stored.
async fn pull_for_create(client: &Client, image: &str) -> Result<()> {
    if warren_core::image_ref::registry_host(image).is_some() {
        pull(client, image, PullOutput::Downloads).await?;
    }
    Ok(())
}

/// `warren run`: the command is the sandbox's main process; its output is
/// followed through the sandbox log until the sandbox ends.
pub(super) async fn run(
    client: &Client,
    a: &CreateArgs,
    cmd: Vec<String>,
    rm: bool,
    detach: bool,
) -> Result<i32> {
    pull_for_create(client, &a.image).await?;
    let cmd = match cmd.is_empty() {
        true => image_command(client, &a.image).await?,
        false => cmd,
    };
    if rm {
        return run_removed(client, spec_from(a, Some(cmd))?).await;
    }
    let info = create_and_wait(client, &spec_from(a, Some(cmd))?, true).await?;
    let id = info.id.clone();
    if detach {
        println!("{id}");
        return Ok(0);
    }
    let result = follow_log(client, &id, super::logs::Shown::Output).await;
    // The log ends with the main process; the record follows within moments.
    let mut info = client.get_sandbox(&id).await?;
    for _ in 0..50 {
        if info.state.is_final() || info.state == SandboxState::Kept {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        info = client.get_sandbox(&id).await?;
    }
    if info.state == SandboxState::Kept {
        say!(
            "sandbox {id} is kept ({}): look inside with `warren exec {id} sh`, remove it with `warren rm {id}`",
            info.reason
        );
    }
    if rm && !info.state.is_final() {
        client.delete_sandbox(&id).await?;
    }
    result?;
    Ok(info
        .exit_code
        .unwrap_or(if info.state == SandboxState::Destroyed {
            0
        } else {
            1
        }))
}

/// What `docker run IMAGE` runs: the image config's entrypoint, then its
/// cmd. The image is found by the name it was given (`busybox` is
/// `busybox:latest`) or a digest prefix.
async fn image_command(client: &Client, image: &str) -> Result<Vec<String>> {
    let images = client.list_images().await?;
    let digest = image.strip_prefix("sha256:").unwrap_or(image);
    let found = images.iter().find(|i| {
        let name = i["name"].as_str().unwrap_or("");
        let d = i["digest"].as_str().unwrap_or("");
        name == image
            || name == format!("{image}:latest")
            || name.ends_with(&format!("/{image}"))
            || name.ends_with(&format!("/library/{image}:latest"))
            || (digest.len() >= 12 && d.trim_start_matches("sha256:").starts_with(digest))
    });
    let Some(found) = found else {
        bail!("image {image} is not in the store (`warren image ls`); give the command to run after the options");
    };
    let config = &found["config"];
    let words = |k: &str| -> Vec<String> {
        config[k]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|w| w.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut cmd = words("entrypoint");
    cmd.extend(words("cmd"));
    if cmd.is_empty() {
        bail!("image {image} names no command (no ENTRYPOINT or CMD); give one after the options");
    }
    Ok(cmd)
}

/// `warren run --rm`: one request (`POST /v1/run`) that creates, runs,
/// streams and removes; nothing is polled.
async fn run_removed(client: &Client, spec: warren_core::SandboxSpec) -> Result<i32> {
    use warren_core::RunEvent;
    let req = warren_core::RunRequest {
        spec,
        ..Default::default()
    };
    let exit = client
        .run(&req, |ev| match ev {
            RunEvent::Sandbox { sandbox } if sandbox.state == SandboxState::Queued => say!(
                "{}: queued at position {}: {} (Ctrl-C cancels it)",
                sandbox.id,
                sandbox.queue_position.unwrap_or(0),
                waiting_text(&sandbox.waiting_for)
            ),
            RunEvent::Sandbox { .. } => {}
            RunEvent::Exec(ev) => write_output(ev),
        })
        .await?;
    Ok(exit_code(&exit))
}

fn write_output(ev: &ExecEvent) {
    let Some(bytes) = ev.output_bytes() else {
        return;
    };
    let res = match ev {
        ExecEvent::Stderr { .. } => std::io::stderr().write_all(&bytes),
        _ => std::io::stdout()
            .write_all(&bytes)
            .and_then(|_| std::io::stdout().flush()),
    };
    let _ = res;
}

fn exit_code(ev: &ExecEvent) -> i32 {
    match ev {
        ExecEvent::Exit {
            code, timed_out, ..
        } => {
            if *timed_out {
                say!("warren: command timed out and was killed");
            }
            *code
        }
        _ => 1,
    }
}

pub(super) async fn exec(client: &Client, a: ExecArgs) -> Result<i32> {
    let stdin = if a.stdin && !a.tty {
        let mut buf = Vec::new();
        std::io::stdin()
            .read_to_end(&mut buf)
            .context("reading stdin")?;
        Some(base64::engine::general_purpose::STANDARD.encode(buf))
    } else {
        None
    };
    let req = ExecRequest {
        cmd: a.cmd,
        env: parse_env(&a.env)?,
        cwd: a.cwd,
        stdin,
        timeout: a.timeout.as_deref().map(Dur::parse).transpose()?,
        user: a.user,
        ..Default::default()
    };
    if a.tty {
        return super::terminal::exec(client, &a.id, req, a.stdin).await;
    }
    let exit = client.exec(&a.id, &req, write_output).await?;
    Ok(exit_code(&exit))
}

pub(super) async fn ps(
    client: &Client,
    label: Vec<String>,
    state: Option<String>,
    all: bool,
    json: bool,
    quiet: bool,
) -> Result<i32> {
    let query = SandboxQuery {
        labels: label,
        state,
        all,
    };
    let list = client.list_sandboxes(&query).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(0);
    }
    if quiet {
        for s in list {
            println!("{}", s.id);
        }
        return Ok(0);
    }
    // CPU time and memory of the live ones, from one usage answer.
    let usage = client.usage(&query).await?;
    let used: std::collections::HashMap<&str, (u64, u64)> = usage["sandboxes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|u| {
            Some((
                u["id"].as_str()?,
                (u["cpu_usage_ns"].as_u64()?, u["memory_bytes"].as_u64()?),
            ))
        })
        .collect();
    println!(
        "{:<18} {:<10} {:<24} {:<12} {:>8} {:>10} {:<14} {:<22} {:<16} LABELS",
        "ID", "STATE", "IMAGE", "NODE", "CPU", "MEM", "REASON", "CREATED", "NAME"
    );
    for s in list {
        let (cpu, mem) = match used.get(s.id.as_str()) {
            Some((ns, bytes)) => (
                format!("{:.2}s", *ns as f64 / 1e9),
                super::images::human(*bytes),
            ),
            None => ("-".to_string(), "-".to_string()),
        };
        let labels: Vec<String> = s
            .spec
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        println!(
            "{:<18} {:<10} {:<24} {:<12} {:>8} {:>10} {:<14} {:<22} {:<16} {}",
            s.id,
            s.state.as_str(),
            s.spec.image,
            if s.node.is_empty() { "-" } else { &s.node },
            cpu,
            mem,
            s.reason,
            s.created_at.get(..19).unwrap_or(&s.created_at),
            s.spec.name.as_ref().map_or("-", |n| n.as_str()),
            labels.join(",")
        );
    }
    Ok(0)
}

pub(super) async fn inspect(client: &Client, id: &str) -> Result<i32> {
    let info = client.get_sandbox(id).await?;
    println!("{}", serde_json::to_string_pretty(&info)?);
    Ok(0)
}

pub(super) async fn rm(client: &Client, ids: Vec<String>, label: Vec<String>) -> Result<i32> {
    if ids.is_empty() && label.is_empty() {
        bail!("give sandbox ids or --label K=V");
    }
    let mut failed = 0;
    for id in ids {
        match client.delete_sandbox(&id).await {
            Ok(info) => println!("{} {}", info.id, info.state),
            Err(e) => {
                say!("{id}: {e:#}");
                failed += 1;
            }
        }
    }
    if !label.is_empty() {
        let list = client.delete_sandboxes(&label).await?;
        for info in list {
            println!("{} {}", info.id, info.state);
        }
    }
    Ok(if failed > 0 { 1 } else { 0 })
}

pub(super) async fn pause(client: &Client, id: &str) -> Result<i32> {
    print_state(client.pause_sandbox(id).await?)
}

pub(super) async fn resume(client: &Client, id: &str) -> Result<i32> {
    print_state(client.resume_sandbox(id).await?)
}

pub(super) async fn heartbeat(client: &Client, id: &str) -> Result<i32> {
    print_state(client.heartbeat(id).await?)
}

pub(super) async fn ttl(client: &Client, id: &str, ttl: &str) -> Result<i32> {
    print_state(client.set_ttl(id, ttl).await?)
}

pub(super) async fn reclaim(
    client: &Client,
    id: &str,
    reclaim: &str,
    keep_for: Option<&str>,
) -> Result<i32> {
    print_state(client.set_reclaim(id, reclaim, keep_for).await?)
}

fn print_state(info: SandboxInfo) -> Result<i32> {
    println!("{} {}", info.id, info.state);
    Ok(0)
}

/// Why a queued create waits, as the server says (older servers say
/// nothing: room, then).
fn waiting_text(why: &Option<String>) -> &str {
    why.as_deref().unwrap_or("waiting until a node has room")
}

//! The client commands.

use std::collections::BTreeMap;
use std::io::{Read, Write};

use anyhow::{bail, Context, Result};
use base64::Engine;
use reqwest::Method;
use warren_core::spec::{ByteSize, Cpu, Dur, NetworkMode, NetworkSpec, ReclaimPolicy};
use warren_core::{
    labels, quantity, ExecEvent, ExecRequest, SandboxInfo, SandboxSpec, SandboxState,
};

use crate::cli::{BatchCmd, Cli, Command, CreateArgs, ExecArgs, ImageCmd, ProfileCmd};
use crate::client::{Client, LineStream};

mod bench;
mod bench_net;
pub mod doctor;
mod port_forward;
mod simulate;

pub async fn run(cli: Cli) -> Result<i32> {
    let client = || Client::new(&cli.url, cli.token.clone(), &cli.home);
    match cli.command {
        Command::Up(args) => crate::up::run(&cli.home, args).await,
        Command::Spawner => unreachable!("dispatched before the runtime starts"),
        Command::Image(cmd) => image(&client()?, cmd).await,
        Command::Create(args) => {
            let c = client()?;
            pull_for_create(&c, &args.image).await?;
            let info = c.create(&spec_from(&args, None)?).await?;
            println!("{}", info.id);
            Ok(0)
        }
        Command::Run { create, rm, cmd } => run_main(&client()?, &create, cmd, rm).await,
        Command::Exec(args) => exec(&client()?, args).await,
        Command::Cp { src, dst } => cp(&client()?, &src, &dst).await,
        Command::Ps {
            label,
            state,
            all,
            json,
        } => ps(&client()?, &label, state, all, json).await,
        Command::Commit { id, name } => {
            let c = client()?;
            let rec: serde_json::Value = c
                .json(
                    c.request(Method::POST, &format!("/v1/sandboxes/{id}/commit"))
                        .json(&serde_json::json!({ "name": name })),
                )
                .await?;
            println!(
                "{} {}",
                rec["name"].as_str().unwrap_or(&name),
                rec["digest"].as_str().unwrap_or("")
            );
            Ok(0)
        }
        Command::Inspect { id } => {
            let info = client()?.get(&id).await?;
            println!("{}", serde_json::to_string_pretty(&info)?);
            Ok(0)
        }
        Command::Logs {
            id: Some(id),
            follow,
            ..
        } => logs(&client()?, &id, follow).await,
        Command::Logs {
            id: None, label, ..
        } => {
            let c = client()?;
            let text = c
                .send(
                    c.request(Method::GET, "/v1/logs")
                        .query(&[("label", label.join(","))]),
                )
                .await?
                .bytes()
                .await?;
            std::io::stdout().write_all(&text)?;
            Ok(0)
        }
        Command::Rm { ids, label } => rm(&client()?, ids, label).await,
        Command::Bench(args) => bench::run(&client()?, args).await,
        Command::BenchNet(args) => bench_net::run(&client()?, args).await,
        Command::Simulate(args) => simulate::run(args),
        // Run by main before the async runtime starts (it forks).
        Command::Doctor { .. } => anyhow::bail!("doctor runs before the async runtime starts"),
        Command::Batch(cmd) => batch(&client()?, cmd).await,
        Command::Profile(cmd) => profile(&client()?, cmd).await,
        Command::Events {
            sandbox,
            label,
            batch,
            kind,
            follow,
        } => events(&client()?, sandbox, label, batch, kind, follow).await,
        Command::Pause { id } => lifecycle(&client()?, &id, "pause", None).await,
        Command::Resume { id } => lifecycle(&client()?, &id, "resume", None).await,
        Command::Heartbeat { id } => lifecycle(&client()?, &id, "heartbeat", None).await,
        Command::Ttl { id, ttl } => {
            quantity::parse_duration(&ttl)?;
            lifecycle(
                &client()?,
                &id,
                "ttl",
                Some(serde_json::json!({ "ttl": ttl })),
            )
            .await
        }
        Command::Network { id, allow, deny } => {
            let c = client()?;
            let change: serde_json::Value = c
                .json(
                    c.request(Method::PATCH, &format!("/v1/sandboxes/{id}/network"))
                        .json(&serde_json::json!({ "allow": allow, "deny": deny })),
                )
                .await?;
            println!("{}", serde_json::to_string_pretty(&change)?);
            Ok(0)
        }
        Command::PortForward { id, ports, address } => {
            port_forward::run(&client()?, &id, &ports, address).await
        }
    }
}

fn parse_env(pairs: &[String]) -> Result<BTreeMap<String, String>> {
    pairs
        .iter()
        .map(|p| {
            p.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .with_context(|| format!("--env {p:?}: write it as KEY=VALUE"))
        })
        .collect()
}

pub fn spec_from(a: &CreateArgs, cmd: Option<Vec<String>>) -> Result<SandboxSpec> {
    let labels = a
        .labels
        .iter()
        .map(|l| labels::parse_pair(l).map_err(anyhow::Error::from))
        .collect::<Result<_>>()?;
    let network = match a.network.as_deref() {
        None if !a.allow.is_empty() || !a.deny.is_empty() => NetworkMode::Allowlist,
        None | Some("none") => NetworkMode::None,
        Some("allowlist") => NetworkMode::Allowlist,
        Some(other) => bail!("--network {other:?}: use none or allowlist"),
    };
    let reclaim = match a.reclaim.as_deref() {
        None | Some("destroy") => ReclaimPolicy::Destroy,
        Some("delay") => ReclaimPolicy::Delay,
        Some("keep") => ReclaimPolicy::Keep,
        Some("keep_on_failure") => ReclaimPolicy::KeepOnFailure,
        Some(other) => bail!("--reclaim {other:?}: use destroy, delay, keep or keep_on_failure"),
    };
    let size = |s: &Option<String>| -> Result<Option<ByteSize>> {
        s.as_deref()
            .map(|v| quantity::parse_size(v).map(ByteSize))
            .transpose()
            .map_err(Into::into)
    };
    let dur = |s: &Option<String>| -> Result<Option<Dur>> {
        s.as_deref()
            .map(|v| quantity::parse_duration(v).map(Dur))
            .transpose()
            .map_err(Into::into)
    };
    Ok(SandboxSpec {
        image: a.image.clone(),
        cpu: a
            .cpu
            .as_deref()
            .map(|c| quantity::parse_cpu(c).map(Cpu))
            .transpose()?,
        memory: size(&a.memory)?,
        pids: a.pids,
        disk: size(&a.disk)?,
        gpus: a.gpus,
        env: parse_env(&a.env)?,
        labels,
        ttl: dur(&a.ttl)?,
        lease: dur(&a.lease)?,
        profile: a.profile.clone(),
        network: NetworkSpec {
            mode: network,
            allow: a.allow.clone(),
            deny: a.deny.clone(),
        },
        reclaim,
        keep_for: dur(&a.keep_for)?,
        cmd,
        cwd: a.cwd.clone(),
        user: a.user.clone(),
        request_id: a.request_id.clone(),
    })
}

async fn image(client: &Client, cmd: ImageCmd) -> Result<i32> {
    match cmd {
        ImageCmd::Import { file, name } => {
            let f = tokio::fs::File::open(&file)
                .await
                .with_context(|| format!("open {}", file.display()))?;
            let size = f.metadata().await.map(|m| m.len()).unwrap_or(0);
            eprintln!("importing {} ({} bytes) as {name}...", file.display(), size);
            let body = reqwest::Body::wrap_stream(tokio_util_stream(f));
            let rec: serde_json::Value = client
                .json(
                    client
                        .request(Method::POST, "/v1/images/import")
                        .query(&[("name", &name)])
                        .body(body),
                )
                .await?;
            println!(
                "{} {}",
                rec["name"].as_str().unwrap_or(&name),
                rec["digest"].as_str().unwrap_or("")
            );
        }
        ImageCmd::Pull {
            reference,
            quiet,
            json,
        } => {
            let output = if quiet {
                PullOutput::Quiet
            } else {
                PullOutput::All
            };
            let image = pull(client, &reference, output).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&image)?);
            } else {
                println!(
                    "{} {}",
                    image["name"].as_str().unwrap_or(&reference),
                    image["digest"].as_str().unwrap_or("")
                );
            }
        }
        ImageCmd::Gc { budget } => {
            let res: serde_json::Value = client
                .json(
                    client
                        .request(Method::POST, "/v1/images/gc")
                        .json(&serde_json::json!({ "budget": budget })),
                )
                .await?;
            println!("{}", serde_json::to_string_pretty(&res)?);
        }
        ImageCmd::Push { reference, from } => {
            let res: serde_json::Value = client
                .json(
                    client
                        .request(Method::POST, "/v1/images/push")
                        .json(&serde_json::json!({ "reference": reference, "source": from })),
                )
                .await?;
            eprintln!(
                "uploaded {} blobs, mounted {} from the source repository (the registry had the rest)",
                res["uploaded"].as_u64().unwrap_or(0),
                res["mounted"].as_u64().unwrap_or(0)
            );
            println!(
                "{reference} {}",
                res["image"]["digest"].as_str().unwrap_or("")
            );
        }
        ImageCmd::Prewarm { reference, nodes } => {
            let res: serde_json::Value = client
                .json(
                    client
                        .request(Method::POST, "/v1/images/prewarm")
                        .json(&serde_json::json!({ "reference": reference, "nodes": nodes })),
                )
                .await?;
            for n in res["nodes"].as_array().into_iter().flatten() {
                println!(
                    "{} {} {}",
                    n["node"].as_str().unwrap_or(""),
                    reference,
                    n["digest"].as_str().unwrap_or("")
                );
            }
        }
        ImageCmd::Ls { json } => {
            let list: Vec<serde_json::Value> = client
                .json(client.request(Method::GET, "/v1/images"))
                .await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                println!(
                    "{:<40} {:<20} {:>8} {:>12}",
                    "NAME", "DIGEST", "LAYERS", "SIZE"
                );
                for i in list {
                    let digest = i["digest"].as_str().unwrap_or("");
                    println!(
                        "{:<40} {:<20} {:>8} {:>12}",
                        i["name"].as_str().unwrap_or(""),
                        digest.get(..19).unwrap_or(digest),
                        i["layers"].as_array().map_or(0, |l| l.len()),
                        quantity::format_size(i["size"].as_u64().unwrap_or(0)),
                    );
                }
            }
        }
        ImageCmd::Rm { reference } => {
            let _: serde_json::Value = client
                .json(client.request(Method::DELETE, &format!("/v1/images/{reference}")))
                .await?;
            println!("{reference}");
        }
    }
    Ok(0)
}

/// What a pull prints on stderr.
#[derive(Clone, Copy, PartialEq)]
enum PullOutput {
    Quiet,
    All,
    /// Only when something is downloaded (the implicit pull of a create).
    Downloads,
}

/// Runs a pull with progress, printing a line per step to stderr; returns
/// the image record.
async fn pull(client: &Client, reference: &str, output: PullOutput) -> Result<serde_json::Value> {
    let resp = client
        .send(
            client
                .request(Method::POST, "/v1/images/pull")
                .query(&[("progress", "true")])
                .json(&serde_json::json!({ "reference": reference })),
        )
        .await?;
    let mut lines = LineStream::new(resp);
    let started = std::time::Instant::now();
    let mut layers = 0u64;
    while let Some(line) = lines.next_line().await? {
        let ev: serde_json::Value =
            serde_json::from_slice(&line).context("decoding a pull event")?;
        let short = |d: &serde_json::Value| {
            let d = d.as_str().unwrap_or("");
            d.get(..19).unwrap_or(d).to_string()
        };
        match ev["type"].as_str().unwrap_or("") {
            "image" => return Ok(ev["image"].clone()),
            "error" => bail!(
                "{}",
                ev["error"]["message"].as_str().unwrap_or("the pull failed")
            ),
            _ if output == PullOutput::Quiet => {}
            "resolved" | "done"
                if output == PullOutput::Downloads && ev["cached"].as_bool() != Some(false) => {}
            "resolved" => eprintln!(
                "{} resolves to {}",
                ev["reference"].as_str().unwrap_or(reference),
                ev["digest"].as_str().unwrap_or("")
            ),
            "manifest" => {
                layers = ev["layers"].as_u64().unwrap_or(0);
                let total = ev["bytes"].as_u64().unwrap_or(0);
                eprintln!(
                    "manifest {}: {layers} layers, {}",
                    short(&ev["digest"]),
                    human(total)
                );
            }
            "progress" => eprintln!(
                "  layer {}/{layers} {}: {} / {}",
                ev["layer"].as_u64().unwrap_or(0) + 1,
                short(&ev["digest"]),
                human(ev["bytes"].as_u64().unwrap_or(0)),
                human(ev["size"].as_u64().unwrap_or(0)),
            ),
            "layer" => eprintln!(
                "  layer {}/{layers} {}: {} ({})",
                ev["layer"].as_u64().unwrap_or(0) + 1,
                short(&ev["digest"]),
                if ev["downloaded"].as_bool().unwrap_or(false) {
                    "downloaded"
                } else {
                    "already present"
                },
                human(ev["size"].as_u64().unwrap_or(0)),
            ),
            "done" => eprintln!(
                "pulled {} in {:.2}s{}",
                ev["name"].as_str().unwrap_or(reference),
                started.elapsed().as_secs_f64(),
                if ev["cached"].as_bool().unwrap_or(false) {
                    " (already in the store)"
                } else {
                    ""
                }
            ),
            _ => {}
        }
    }
    bail!("the pull stream ended early (did the Warren daemon stop?)")
}

/// Bytes for progress lines: 1.0 MiB style, one decimal.
fn human(bytes: u64) -> String {
    let b = bytes as f64;
    if b >= (1u64 << 30) as f64 {
        format!("{:.1} GiB", b / (1u64 << 30) as f64)
    } else if b >= (1u64 << 20) as f64 {
        format!("{:.1} MiB", b / (1u64 << 20) as f64)
    } else if b >= 1024.0 {
        format!("{:.1} KiB", b / 1024.0)
    } else {
        format!("{bytes} B")
    }
}

fn tokio_util_stream(
    f: tokio::fs::File,
) -> impl futures_util::Stream<Item = std::io::Result<bytes::Bytes>> + Send + 'static {
    use tokio::io::AsyncReadExt;
    futures_util::stream::unfold(f, |mut f| async move {
        let mut buf = vec![0u8; 256 * 1024];
        match f.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(bytes::Bytes::from(buf)), f))
            }
            Err(e) => Some((Err(e), f)),
        }
    })
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
                eprintln!("warren: command timed out and was killed");
            }
            *code
        }
        _ => 1,
    }
}

async fn exec(client: &Client, a: ExecArgs) -> Result<i32> {
    let stdin = if a.stdin {
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
        timeout: a
            .timeout
            .as_deref()
            .map(|t| quantity::parse_duration(t).map(Dur))
            .transpose()?,
        user: a.user,
    };
    let exit = client.exec(&a.id, &req, write_output).await?;
    Ok(exit_code(&exit))
}

/// `warren run`: the command is the sandbox's main process; its output is
/// followed through the sandbox log until the sandbox ends.
/// A registry image is pulled with progress before the create (which
/// would pull it silently); nothing is printed when it is already stored.
async fn pull_for_create(client: &Client, image: &str) -> Result<()> {
    if warren_image::registry_host(image).is_some() {
        pull(client, image, PullOutput::Downloads).await?;
    }
    Ok(())
}

async fn run_main(client: &Client, a: &CreateArgs, cmd: Vec<String>, rm: bool) -> Result<i32> {
    pull_for_create(client, &a.image).await?;
    let info = client.create(&spec_from(a, Some(cmd))?).await?;
    let id = info.id.clone();
    let result = follow_log(client, &id, true).await;
    let info = client.get(&id).await?;
    if rm && !info.state.is_final() {
        client.delete(&id).await?;
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

/// Streams a sandbox log; with `output_only` prints the main process's
/// output as raw bytes instead of JSON lines.
async fn follow_log(client: &Client, id: &str, output_only: bool) -> Result<()> {
    let resp = client
        .send(
            client
                .request(Method::GET, &format!("/v1/sandboxes/{id}/logs"))
                .query(&[("follow", "true")]),
        )
        .await?;
    let mut lines = LineStream::new(resp);
    while let Some(line) = lines.next_line().await? {
        if !output_only {
            std::io::stdout().write_all(&line)?;
            std::io::stdout().write_all(b"\n")?;
            continue;
        }
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(&line) else {
            continue;
        };
        let bytes = match (v["text"].as_str(), v["data"].as_str()) {
            (Some(t), _) => t.as_bytes().to_vec(),
            (None, Some(d)) => base64::engine::general_purpose::STANDARD
                .decode(d)
                .unwrap_or_default(),
            _ => continue,
        };
        match v["kind"].as_str() {
            Some("stdout") => {
                std::io::stdout().write_all(&bytes)?;
                std::io::stdout().flush()?;
            }
            Some("stderr") => std::io::stderr().write_all(&bytes)?,
            _ => {}
        }
    }
    Ok(())
}

async fn logs(client: &Client, id: &str, follow: bool) -> Result<i32> {
    if follow {
        follow_log(client, id, false).await?;
    } else {
        let text = client
            .send(client.request(Method::GET, &format!("/v1/sandboxes/{id}/logs")))
            .await?
            .bytes()
            .await?;
        std::io::stdout().write_all(&text)?;
    }
    Ok(0)
}

fn split_remote(s: &str) -> Option<(&str, &str)> {
    let (id, path) = s.split_once(':')?;
    (id.starts_with("sbx-") && path.starts_with('/')).then_some((id, path))
}

async fn cp(client: &Client, src: &str, dst: &str) -> Result<i32> {
    match (split_remote(src), split_remote(dst)) {
        (None, Some((id, path))) => {
            let meta = std::fs::metadata(src)
                .with_context(|| format!("{src}: no such local file or directory"))?;
            let url = format!("/v1/sandboxes/{id}/files");
            let req = if meta.is_dir() {
                let mut builder = tar::Builder::new(Vec::new());
                builder.follow_symlinks(false);
                builder
                    .append_dir_all(".", src)
                    .with_context(|| format!("packing {src}"))?;
                let data = builder.into_inner()?;
                client
                    .request(Method::PUT, &url)
                    .query(&[("path", path)])
                    .header("content-type", "application/x-tar")
                    .body(data)
            } else {
                use std::os::unix::fs::PermissionsExt;
                let mode = format!("{:o}", meta.permissions().mode() & 0o777);
                let data = tokio::fs::read(src)
                    .await
                    .with_context(|| format!("reading {src}"))?;
                client
                    .request(Method::PUT, &url)
                    .query(&[("path", path), ("mode", &mode)])
                    .body(data)
            };
            client.send(req).await?;
        }
        (Some((id, path)), None) => {
            let resp = client
                .send(
                    client
                        .request(Method::GET, &format!("/v1/sandboxes/{id}/files"))
                        .query(&[("path", path)]),
                )
                .await?;
            let is_tar = resp
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                == Some("application/x-tar");
            let data = resp.bytes().await?;
            if is_tar {
                std::fs::create_dir_all(dst).with_context(|| format!("creating {dst}"))?;
                tar::Archive::new(&data[..])
                    .unpack(dst)
                    .with_context(|| format!("unpacking into {dst}"))?;
            } else {
                let target = if std::path::Path::new(dst).is_dir() {
                    std::path::Path::new(dst)
                        .join(std::path::Path::new(path).file_name().unwrap_or_default())
                } else {
                    dst.into()
                };
                std::fs::write(&target, &data)
                    .with_context(|| format!("writing {}", target.display()))?;
            }
        }
        _ => bail!("one side of `warren cp` must be ID:/absolute/path and the other a local path"),
    }
    Ok(0)
}

async fn ps(
    client: &Client,
    label: &[String],
    state: Option<String>,
    all: bool,
    json: bool,
) -> Result<i32> {
    let mut q: Vec<(&str, String)> = Vec::new();
    if !label.is_empty() {
        q.push(("label", label.join(",")));
    }
    if let Some(s) = state {
        q.push(("state", s));
    }
    if all {
        q.push(("all", "true".into()));
    }
    let list: Vec<SandboxInfo> = client
        .json(client.request(Method::GET, "/v1/sandboxes").query(&q))
        .await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(0);
    }
    println!(
        "{:<18} {:<10} {:<24} {:<14} {:<22} LABELS",
        "ID", "STATE", "IMAGE", "REASON", "CREATED"
    );
    for s in list {
        let labels: Vec<String> = s
            .spec
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        println!(
            "{:<18} {:<10} {:<24} {:<14} {:<22} {}",
            s.id,
            s.state.as_str(),
            s.spec.image,
            s.reason,
            s.created_at.get(..19).unwrap_or(&s.created_at),
            labels.join(",")
        );
    }
    Ok(0)
}

async fn rm(client: &Client, ids: Vec<String>, label: Vec<String>) -> Result<i32> {
    if ids.is_empty() && label.is_empty() {
        bail!("give sandbox ids or --label K=V");
    }
    let mut failed = 0;
    for id in ids {
        match client.delete(&id).await {
            Ok(info) => println!("{} {}", info.id, info.state),
            Err(e) => {
                eprintln!("{id}: {e:#}");
                failed += 1;
            }
        }
    }
    if !label.is_empty() {
        let list: Vec<SandboxInfo> = client
            .json(
                client
                    .request(Method::DELETE, "/v1/sandboxes")
                    .query(&[("label", label.join(","))]),
            )
            .await?;
        for info in list {
            println!("{} {}", info.id, info.state);
        }
    }
    Ok(if failed > 0 { 1 } else { 0 })
}

async fn lifecycle(
    client: &Client,
    id: &str,
    action: &str,
    body: Option<serde_json::Value>,
) -> Result<i32> {
    let mut req = client.request(Method::POST, &format!("/v1/sandboxes/{id}/{action}"));
    if let Some(b) = body {
        req = req.json(&b);
    }
    let info: SandboxInfo = client.json(req).await?;
    println!("{} {}", info.id, info.state);
    Ok(0)
}

async fn batch(client: &Client, cmd: BatchCmd) -> Result<i32> {
    match cmd {
        BatchCmd::Create {
            count,
            batch_labels,
            retry_on_oom,
            create,
            cmd,
        } => {
            let labels: std::collections::BTreeMap<String, String> = batch_labels
                .iter()
                .map(|l| labels::parse_pair(l).map_err(anyhow::Error::from))
                .collect::<Result<_>>()?;
            let spec = spec_from(&create, (!cmd.is_empty()).then_some(cmd))?;
            let req = warren_core::BatchRequest {
                count,
                spec,
                labels,
                retry_on_oom,
            };
            let info: warren_core::BatchInfo = client
                .json(client.request(Method::POST, "/v1/batches").json(&req))
                .await?;
            let id = info.id.clone();
            let start = std::time::Instant::now();
            loop {
                let b: warren_core::BatchInfo = client
                    .json(client.request(Method::GET, &format!("/v1/batches/{id}")))
                    .await?;
                let creating = b.states.get("creating").copied().unwrap_or(0)
                    + b.states.get("queued").copied().unwrap_or(0);
                let states: Vec<String> =
                    b.states.iter().map(|(k, v)| format!("{k} {v}")).collect();
                eprint!(
                    "\r  {id}: submitted {}/{} ({})   ",
                    b.submitted,
                    b.count,
                    states.join(", ")
                );
                if b.submitted >= b.count && creating == 0 {
                    eprintln!(
                        "\n  done in {:.2} s, {} failed",
                        start.elapsed().as_secs_f64(),
                        b.failures.len()
                    );
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            println!("{id}");
        }
        BatchCmd::Ls => {
            let list: Vec<warren_core::BatchInfo> = client
                .json(client.request(Method::GET, "/v1/batches"))
                .await?;
            println!(
                "{:<18} {:>6} {:>9} {:>8} {:<22} STATES",
                "ID", "COUNT", "SUBMITTED", "FAILED", "CREATED"
            );
            for b in list {
                let states: Vec<String> =
                    b.states.iter().map(|(k, v)| format!("{k}={v}")).collect();
                println!(
                    "{:<18} {:>6} {:>9} {:>8} {:<22} {}",
                    b.id,
                    b.count,
                    b.submitted,
                    b.failures.len(),
                    b.created_at.get(..19).unwrap_or(&b.created_at),
                    states.join(",")
                );
            }
        }
        BatchCmd::Inspect { id } => {
            let b: serde_json::Value = client
                .json(client.request(Method::GET, &format!("/v1/batches/{id}")))
                .await?;
            println!("{}", serde_json::to_string_pretty(&b)?);
        }
        BatchCmd::Rm { id } => {
            let b: warren_core::BatchInfo = client
                .json(client.request(Method::DELETE, &format!("/v1/batches/{id}")))
                .await?;
            println!("{} deleted ({} sandboxes)", b.id, b.submitted);
        }
    }
    Ok(0)
}

async fn events(
    client: &Client,
    sandbox: Option<String>,
    label: Vec<String>,
    batch: Option<String>,
    kind: Option<String>,
    follow: bool,
) -> Result<i32> {
    let mut q: Vec<(&str, String)> = Vec::new();
    if let Some(s) = sandbox {
        q.push(("sandbox", s));
    }
    if !label.is_empty() {
        q.push(("label", label.join(",")));
    }
    if let Some(b) = batch {
        q.push(("batch", b));
    }
    if let Some(k) = kind {
        q.push(("type", k));
    }
    if follow {
        q.push(("follow", "true".into()));
        let resp = client
            .send(client.request(Method::GET, "/v1/events").query(&q))
            .await?;
        let mut lines = LineStream::new(resp);
        while let Some(line) = lines.next_line().await? {
            std::io::stdout().write_all(&line)?;
            std::io::stdout().write_all(b"\n")?;
            std::io::stdout().flush()?;
        }
    } else {
        let evs: Vec<serde_json::Value> = client
            .json(client.request(Method::GET, "/v1/events").query(&q))
            .await?;
        for e in evs {
            println!("{e}");
        }
    }
    Ok(0)
}

async fn profile(client: &Client, cmd: ProfileCmd) -> Result<i32> {
    use warren_core::profile::Profile;
    match cmd {
        ProfileCmd::Ls => {
            let list: Vec<Profile> = client
                .json(client.request(Method::GET, "/v1/profiles"))
                .await?;
            println!(
                "{:<24} {:>8} {:>10} {:>13} {:>15} {:>6}  FLAG",
                "PROFILE", "CPU", "MEMORY", "ORIGINAL CPU", "ORIGINAL MEMORY", "RUNS"
            );
            for p in list {
                println!(
                    "{:<24} {:>8.2} {:>10} {:>13.2} {:>15} {:>6}  {}",
                    p.name,
                    p.current.cpu_millis as f64 / 1000.0,
                    quantity::format_size(p.current.memory),
                    p.original.cpu_millis as f64 / 1000.0,
                    quantity::format_size(p.original.memory),
                    p.runs,
                    if p.anomalous {
                        format!("ANOMALOUS: {}", p.anomaly)
                    } else {
                        String::new()
                    }
                );
            }
        }
        ProfileCmd::Show { name } => {
            let v: serde_json::Value = client
                .json(client.request(Method::GET, &format!("/v1/profiles/{name}")))
                .await?;
            println!("{}", serde_json::to_string_pretty(&v)?);
        }
        ProfileCmd::Export => {
            let text = client
                .send(client.request(Method::GET, "/v1/profiles/export"))
                .await?
                .text()
                .await?;
            print!("{text}");
        }
        ProfileCmd::Import { file } => {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("reading {}", file.display()))?;
            let list: Vec<Profile> = client
                .json(
                    client
                        .request(Method::POST, "/v1/profiles/import")
                        .header("content-type", "application/toml")
                        .body(text),
                )
                .await?;
            println!("imported {} profiles", list.len());
        }
        ProfileCmd::Reset { name } => {
            let p: Profile = client
                .json(client.request(Method::POST, &format!("/v1/profiles/{name}/reset")))
                .await?;
            println!(
                "{} reset to cpu {} memory {}",
                p.name,
                p.current.cpu_millis as f64 / 1000.0,
                quantity::format_size(p.current.memory)
            );
        }
    }
    Ok(0)
}

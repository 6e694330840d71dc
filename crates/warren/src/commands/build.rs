//! `warren build`: the context directory as a tar archive to
//! `POST /v1/builds`, its events shown as they come.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _, Result};
use warren_core::build::{BuildEvent, BuildRequest};

use crate::cli::BuildArgs;
use warren_cli::client::Client;

pub(super) async fn build(client: &Client, args: &BuildArgs) -> Result<i32> {
    let context = std::fs::canonicalize(&args.context)
        .with_context(|| format!("build context {}", args.context.display()))?;
    if !context.is_dir() {
        bail!(
            "the build context {} is not a directory",
            args.context.display()
        );
    }
    let dockerfile = dockerfile_in(&context, args.file.as_deref())?;
    let mut pairs = vec![("dockerfile".to_string(), dockerfile)];
    for kv in &args.build_args {
        pairs.push(("build_arg".into(), kv.clone()));
    }
    let mut one = |k: &str, v: &Option<String>| {
        if let Some(v) = v {
            pairs.push((k.to_string(), v.clone()));
        }
    };
    one("tag", &args.tag);
    one("target", &args.target);
    one("test", &args.test);
    one("push", &args.push);
    for rule in &args.allow {
        pairs.push(("allow".into(), rule.clone()));
    }
    if args.no_cache {
        pairs.push(("no_cache".into(), "true".into()));
    }
    // Checked here as the API checks it, before the context is packed.
    let req = BuildRequest::from_pairs(&pairs)?;
    let archive = tokio::task::spawn_blocking(move || pack(&context))
        .await
        .context("packing the build context")??;
    let mut lines = client
        .build(&req.to_pairs(), tokio::fs::File::from_std(archive))
        .await?;
    while let Some(line) = lines.next_line().await? {
        let event: BuildEvent = serde_json::from_slice(&line).context("decoding a build event")?;
        match event {
            BuildEvent::Done {
                digest,
                tag,
                seconds,
            } => {
                if !args.quiet {
                    say!(
                        "built {} in {seconds:.2}s",
                        tag.as_deref().unwrap_or(digest.as_str())
                    );
                }
                println!("{digest}");
                return Ok(0);
            }
            BuildEvent::Failed { message, line } => match line {
                Some(n) if !message.contains("line") => bail!("Dockerfile line {n}: {message}"),
                _ => bail!("{message}"),
            },
            _ if args.quiet => {}
            BuildEvent::Build { id } => say!("build {id}"),
            BuildEvent::Step {
                step,
                of,
                instruction,
                ..
            } => say!("[{step}/{of}] {instruction}"),
            BuildEvent::Output { text, .. } => say_partial!("{text}"),
            BuildEvent::StepDone {
                cached, seconds, ..
            } => {
                if cached {
                    say!("  cached")
                } else {
                    say!("  done in {seconds:.2}s")
                }
            }
            BuildEvent::Warning { message } => say!("warning: {message}"),
            BuildEvent::Test { command } => say!("test: {command}"),
            BuildEvent::Published { reference } => {
                say!("published as {reference} for every node of the cluster")
            }
        }
    }
    bail!("the build's stream ended without a result (is the daemon stopping?)")
}

/// The Dockerfile's path inside the context, as the API takes it.
fn dockerfile_in(context: &Path, file: Option<&Path>) -> Result<String> {
    let path: PathBuf = match file {
        None => return Ok("Dockerfile".into()),
        Some(f) => {
            std::fs::canonicalize(f).with_context(|| format!("Dockerfile {}", f.display()))?
        }
    };
    let rel = path.strip_prefix(context).map_err(|_| {
        anyhow::anyhow!(
            "the Dockerfile {} is outside the build context {}; move it inside",
            path.display(),
            context.display()
        )
    })?;
    Ok(rel.to_string_lossy().into_owned())
}

/// The context directory as a tar archive in a temporary file (symlinks
/// kept as links).
fn pack(dir: &Path) -> Result<std::fs::File> {
    use std::io::{Seek, SeekFrom};
    let mut file = tempfile::tempfile().context("a temporary file for the build context")?;
    {
        let mut tar = tar::Builder::new(&mut file);
        tar.follow_symlinks(false);
        tar.append_dir_all(".", dir)
            .with_context(|| format!("packing {}", dir.display()))?;
        tar.finish().context("packing the build context")?;
    }
    file.seek(SeekFrom::Start(0))?;
    Ok(file)
}

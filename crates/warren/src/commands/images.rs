//! Image commands: `image import|pull|push|prewarm|gc|ls|rm` and `commit`
//! (a sandbox's changes as a new image).

use anyhow::{bail, Context, Result};
use warren_core::quantity;

use crate::cli::ImageCmd;
use warren_cli::client::Client;

pub(super) async fn run(client: &Client, cmd: ImageCmd) -> Result<i32> {
    match cmd {
        ImageCmd::Import { file, name } => {
            let f = tokio::fs::File::open(&file)
                .await
                .with_context(|| format!("open {}", file.display()))?;
            let meta = f
                .metadata()
                .await
                .with_context(|| format!("stat {}", file.display()))?;
            if meta.is_dir() {
                bail!(
                    "{} is a directory; `warren image import` takes an archive: an OCI layout or                      `docker save` tar (for a layout directory: tar -C {} -cf image.tar .)",
                    file.display(),
                    file.display()
                );
            }
            let size = meta.len();
            say!("importing {} ({} bytes) as {name}...", file.display(), size);
            let rec = client.import_image(&name, f).await?;
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
            let res = client.gc_images(budget.as_deref()).await?;
            println!("{}", serde_json::to_string_pretty(&res)?);
        }
        ImageCmd::Push { reference, from } => {
            let res = client.push_image(&reference, from.as_deref()).await?;
            say!(
                "uploaded {} blobs, mounted {} from the source repository (the registry had the rest)",
                res["uploaded"].as_u64().unwrap_or(0),
                res["mounted"].as_u64().unwrap_or(0)
            );
            println!(
                "{reference} {}",
                res["image"]["digest"].as_str().unwrap_or("")
            );
        }
        ImageCmd::Prewarm {
            reference,
            nodes,
            node_selector,
        } => {
            let nodes: Vec<String> = nodes.into_iter().filter(|n| n != "all").collect();
            let selector: std::collections::BTreeMap<String, String> = node_selector
                .iter()
                .map(|l| {
                    warren_core::labels::parse_pair(l)
                        .map_err(|e| anyhow::anyhow!("--node-selector {l:?}: {e}; write KEY=VALUE"))
                })
                .collect::<Result<_>>()?;
            let res = client.prewarm_image(&reference, &nodes, &selector).await?;
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
            let list = client.list_images().await?;
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
            client.delete_image(&reference).await?;
            println!("{reference}");
        }
    }
    Ok(0)
}

/// `warren commit ID NAME`.
pub(super) async fn commit(client: &Client, id: &str, name: &str) -> Result<i32> {
    let rec = client.commit_sandbox(id, name).await?;
    println!(
        "{} {}",
        rec["name"].as_str().unwrap_or(name),
        rec["digest"].as_str().unwrap_or("")
    );
    Ok(0)
}

/// What a pull prints on stderr.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum PullOutput {
    Quiet,
    All,
    /// Only when something is downloaded (the implicit pull of a create).
    Downloads,
}

/// Runs a pull with progress, printing a line per step to stderr; returns
/// the image record.
pub(super) async fn pull(
    client: &Client,
    reference: &str,
    output: PullOutput,
) -> Result<serde_json::Value> {
    let mut lines = client.pull_image(reference).await?;
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
            "resolved" => say!(
                "{} resolves to {}",
                ev["reference"].as_str().unwrap_or(reference),
                ev["digest"].as_str().unwrap_or("")
            ),
            "manifest" => {
                layers = ev["layers"].as_u64().unwrap_or(0);
                let total = ev["bytes"].as_u64().unwrap_or(0);
                say!(
                    "manifest {}: {layers} layers, {}",
                    short(&ev["digest"]),
                    human(total)
                );
            }
            "progress" => say!(
                "  layer {}/{layers} {}: {} / {}",
                ev["layer"].as_u64().unwrap_or(0) + 1,
                short(&ev["digest"]),
                human(ev["bytes"].as_u64().unwrap_or(0)),
                human(ev["size"].as_u64().unwrap_or(0)),
            ),
            "layer" => say!(
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
            "done" => say!(
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
pub(super) fn human(bytes: u64) -> String {
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

//! `warren cp`: copying files and directories into and out of a sandbox.

use std::path::Path;

use anyhow::{bail, Context, Result};

use warren_cli::client::Client;

fn split_remote(s: &str) -> Option<(&str, &str)> {
    let (id, path) = s.split_once(':')?;
    (id.starts_with("sbx-") && path.starts_with('/')).then_some((id, path))
}

pub(super) async fn cp(client: &Client, src: &str, dst: &str) -> Result<i32> {
    match (split_remote(src), split_remote(dst)) {
        (None, Some((id, path))) => {
            let meta = std::fs::metadata(src)
                .with_context(|| format!("{src}: no such local file or directory"))?;
            if meta.is_dir() {
                let mut builder = tar::Builder::new(Vec::new());
                builder.follow_symlinks(false);
                builder
                    .append_dir_all(".", src)
                    .with_context(|| format!("packing {src}"))?;
                let data = builder.into_inner()?;
                client.put_tar(id, path, data).await?;
            } else {
                use std::os::unix::fs::PermissionsExt;
                let mode = format!("{:o}", meta.permissions().mode() & 0o777);
                let data = tokio::fs::read(src)
                    .await
                    .with_context(|| format!("reading {src}"))?;
                // As with cp: a destination ending in / is the directory
                // the file goes into, under its own name.
                let path = match (path.ends_with('/'), Path::new(src).file_name()) {
                    (true, Some(name)) => format!("{path}{}", name.to_string_lossy()),
                    _ => path.to_string(),
                };
                client.put_file(id, &path, &mode, data).await?;
            }
        }
        (Some((id, path)), None) => {
            let file = client.get_file(id, path).await?;
            let data = file.data;
            if file.is_tar {
                std::fs::create_dir_all(dst).with_context(|| format!("creating {dst}"))?;
                tar::Archive::new(&data[..])
                    .unpack(dst)
                    .with_context(|| format!("unpacking into {dst}"))?;
            } else {
                let target = if dst.ends_with('/') || Path::new(dst).is_dir() {
                    Path::new(dst).join(Path::new(path).file_name().unwrap_or_default())
                } else {
                    dst.into()
                };
                // Missing parent directories are made, as copying in does.
                if let Some(parent) = target.parent().filter(|p| !p.as_os_str().is_empty()) {
                    std::fs::create_dir_all(parent)
                        .with_context(|| format!("creating {}", parent.display()))?;
                }
                std::fs::write(&target, &data)
                    .with_context(|| format!("writing {}", target.display()))?;
            }
        }
        _ => bail!("one side of `warren cp` must be ID:/absolute/path and the other a local path"),
    }
    Ok(0)
}

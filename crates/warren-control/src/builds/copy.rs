//! `COPY` and `ADD`: the context's files (or another stage's or image's)
//! written into a sandbox of the step before and committed as one layer.

use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use warren_core::files::{FileKind, PathKind, PathOp, WriteFile};
use warren_core::sync::lock;
use warren_core::{ApiError, ExecRequest};

use super::context::{Context, Selection};
use super::dockerfile::Copy;
use super::engine::{Run, Sandbox};
use super::state::{key, Failure, State};
use super::words;
use crate::node_errors::node_error;

/// A `COPY` with its words substituted: what it copies where.
struct Plan {
    sources: Vec<String>,
    /// Absolute (relative to the working directory as written).
    dest: String,
    /// The destination is a directory: it ends with `/`, or several
    /// sources go there.
    dest_is_dir: bool,
    chmod: Option<u32>,
    chown: Option<String>,
}

impl Run {
    pub(super) async fn copy_step(
        &self,
        state: &mut State,
        c: &Copy,
        line: usize,
        text: &str,
    ) -> Result<bool, Failure> {
        let vars = state.vars();
        let esc = self.file.escape;
        let bad = |e: words::WordError| Failure::at(line, e);
        let sources: Vec<String> = c
            .sources
            .iter()
            .map(|s| words::expand(s, &vars, esc))
            .collect::<Result<_, _>>()
            .map_err(bad)?;
        let raw_dest = words::expand(&c.dest, &vars, esc).map_err(bad)?;
        let dest = state.path(&raw_dest);
        let dest_is_dir = raw_dest.ends_with('/') || sources.len() > 1;
        let chmod = c
            .chmod
            .as_deref()
            .map(|m| u32::from_str_radix(m, 8).ok().filter(|m| *m <= 0o7777))
            .map(|m| {
                m.ok_or_else(|| {
                    Failure::at(line, format!("--chmod={:?} is not an octal mode", c.chmod))
                })
            })
            .transpose()?;
        let chown = c
            .chown
            .as_deref()
            .map(|o| words::expand(o, &vars, esc))
            .transpose()
            .map_err(bad)?;
        let plan = Plan {
            sources,
            dest,
            dest_is_dir,
            chmod,
            chown,
        };
        if let Some(from) = &c.from {
            let from = words::expand(from, &vars, esc).map_err(bad)?;
            return self.copy_from(state, &from, &plan, line, text).await;
        }
        let Plan {
            sources,
            dest,
            dest_is_dir,
            chmod,
            chown,
        } = plan;
        let context = self.context.clone();
        let selected = {
            let ctx = lock(&context);
            let mut all = Vec::new();
            for s in &sources {
                all.push(ctx.select(s).map_err(|e| Failure::at(line, e))?);
            }
            let digests: Vec<String> = all.iter().map(|s| ctx.digest(s)).collect();
            (all, digests.join(","))
        };
        let (selections, digests) = selected;
        let single_file = selections.len() == 1 && selections[0].single_file;
        let unpack = c.add && single_file && is_archive(&selections[0].items[0].0);
        let k = key(&[
            &state.digest,
            "copy",
            &serde_json::to_string(&(&sources, &dest, dest_is_dir, unpack, &chown, chmod))
                .unwrap_or_default(),
            &digests,
        ]);
        if self.reuse(state, &k).await? {
            return Ok(true);
        }
        let sandbox = self.sandbox(&state.digest, false).await?;
        let result = async {
            // One file to a path that is not an existing directory: the
            // file takes that name.
            let rename = if single_file && !dest_is_dir && !unpack {
                let st = self
                    .control
                    .io()
                    .path_op(&sandbox.id, PathOp::Stat { path: dest.clone() })
                    .await;
                match st {
                    Ok(entries) if entries.first().is_some_and(|e| e.kind == PathKind::Dir) => None,
                    _ => Some(dest.rsplit('/').next().unwrap_or_default().to_string()),
                }
            } else {
                None
            };
            let dir = match &rename {
                Some(_) => parent(&dest),
                None => dest.clone(),
            };
            let mut top = Vec::new();
            for sel in &selections {
                let body = archive_of(context.clone(), sel, rename.clone(), chmod, unpack).await?;
                self.control
                    .io()
                    .write_file(
                        &sandbox.id,
                        WriteFile {
                            path: dir.clone(),
                            mode: 0o755,
                            tar: true,
                            xattrs: Default::default(),
                        },
                        body,
                    )
                    .await?;
                top.extend(tops(sel, rename.as_deref()));
            }
            if let Some(owner) = &chown {
                let base = dir.trim_end_matches('/');
                let paths = top.iter().map(|t| format!("{base}/{t}")).collect();
                self.chown(&sandbox, owner, paths).await?;
            }
            self.commit(&sandbox, k, text).await
        }
        .await;
        sandbox.remove().await;
        state.digest = result?;
        Ok(false)
    }

    /// `--chown`: the copied `paths`' owner, set by the image's own
    /// `chown` as root (it reads the image's users and groups by name).
    async fn chown(
        &self,
        sandbox: &Sandbox,
        owner: &str,
        paths: Vec<String>,
    ) -> Result<(), Failure> {
        let mut cmd = vec!["chown".to_string(), "-hR".into(), owner.to_string()];
        cmd.extend(paths);
        let req = ExecRequest {
            cmd,
            user: Some("0".into()),
            ..Default::default()
        };
        let code = self.exec(sandbox, req).await?;
        if code != 0 {
            return Err(Failure::new(format!(
                "--chown={owner}: chown exited with code {code} (does the image have chown and that user?)"
            )));
        }
        Ok(())
    }

    async fn copy_from(
        &self,
        state: &mut State,
        from: &str,
        plan: &Plan,
        line: usize,
        text: &str,
    ) -> Result<bool, Failure> {
        let Plan {
            sources,
            dest,
            dest_is_dir,
            chown,
            ..
        } = plan;
        let dest_is_dir = *dest_is_dir;
        let source_digest = match self.file.stage_index(from, self.stages.len()) {
            Some(j) => self.stages[j]
                .as_ref()
                .map(|s| s.digest.clone())
                .ok_or_else(|| {
                    Failure::at(line, format!("stage {from:?} is not built before this one"))
                })?,
            None => {
                self.control
                    .images()
                    .for_create(&self.tenant, self.api.as_ref(), from)
                    .await
                    .map_err(|e| Failure::at(line, node_error(e).message))?
                    .digest
            }
        };
        if sources.iter().any(|s| s.contains(['*', '?', '['])) {
            return Err(Failure::at(
                line,
                "COPY --from with wildcards is not supported yet; name the paths",
            ));
        }
        let k = key(&[
            &state.digest,
            "copy-from",
            &source_digest,
            &serde_json::to_string(&(sources, dest, dest_is_dir, &chown)).unwrap_or_default(),
        ]);
        if self.reuse(state, &k).await? {
            return Ok(true);
        }
        let source = self.sandbox(&source_digest, false).await?;
        let target = match self.sandbox(&state.digest, false).await {
            Ok(t) => t,
            Err(e) => {
                source.remove().await;
                return Err(e);
            }
        };
        let result = async {
            let mut top = Vec::new();
            for s in sources {
                let path = if s.starts_with('/') {
                    s.clone()
                } else {
                    format!("/{s}")
                };
                let read = self.control.io().read_file(&source.id, &path).await?;
                let name = path
                    .trim_end_matches('/')
                    .rsplit('/')
                    .next()
                    .unwrap_or_default()
                    .to_string();
                match read.kind {
                    FileKind::Dir => {
                        self.control
                            .io()
                            .write_file(
                                &target.id,
                                WriteFile {
                                    path: dest.to_string(),
                                    mode: 0o755,
                                    tar: true,
                                    xattrs: Default::default(),
                                },
                                read.body,
                            )
                            .await?;
                        top.push(dest.to_string());
                    }
                    FileKind::File { .. } => {
                        let mode = self
                            .control
                            .io()
                            .path_op(&source.id, PathOp::Stat { path: path.clone() })
                            .await?
                            .first()
                            .map_or(0o644, |e| e.mode);
                        let to = if dest_is_dir || dest.ends_with('/') {
                            format!("{}/{name}", dest.trim_end_matches('/'))
                        } else {
                            dest.to_string()
                        };
                        self.control
                            .io()
                            .write_file(
                                &target.id,
                                WriteFile {
                                    path: to.clone(),
                                    mode,
                                    tar: false,
                                    xattrs: Default::default(),
                                },
                                read.body,
                            )
                            .await?;
                        top.push(to);
                    }
                }
            }
            if let Some(owner) = chown {
                self.chown(&target, owner, top).await?;
            }
            self.commit(&target, k, text).await
        }
        .await;
        source.remove().await;
        target.remove().await;
        state.digest = result?;
        Ok(false)
    }
}

fn parent(path: &str) -> String {
    match path.trim_end_matches('/').rsplit_once('/') {
        Some(("", _)) | None => "/".into(),
        Some((dir, _)) => dir.to_string(),
    }
}

/// The names a selection puts directly below the destination.
fn tops(sel: &Selection, rename: Option<&str>) -> Vec<String> {
    if let Some(r) = rename {
        return vec![r.to_string()];
    }
    let mut names: Vec<String> = sel
        .items
        .iter()
        .map(|(_, rel)| rel.split('/').next().unwrap_or_default().to_string())
        .collect();
    names.dedup();
    names
}

fn is_archive(path: &str) -> bool {
    [".tar", ".tar.gz", ".tgz"]
        .iter()
        .any(|s| path.ends_with(s))
}

/// The tar a sandbox unpacks for one selection: the context's files, or
/// for ADD of an archive, the archive's own entries.
async fn archive_of(
    context: Arc<Mutex<Context>>,
    sel: &Selection,
    rename: Option<String>,
    chmod: Option<u32>,
    unpack: bool,
) -> Result<crate::streams::ByteStream, Failure> {
    let items = sel.clone();
    let spooled = tokio::task::spawn_blocking(move || -> Result<std::fs::File, Failure> {
        use std::io::{Seek, SeekFrom};
        let mut out = tempfile::tempfile().map_err(Failure::new)?;
        let mut ctx = lock(&context);
        if unpack {
            let path = &items.items[0].0;
            let reader = ctx.open(path).map_err(Failure::new)?;
            super::tar_bytes(reader)
                .and_then(|mut tar| std::io::copy(&mut tar, &mut out))
                .map_err(|e| Failure::new(format!("unpacking {path}: {e}")))?;
        } else {
            ctx.write_tar(&items, rename.as_deref(), chmod, &mut out)
                .map_err(Failure::new)?;
        }
        out.seek(SeekFrom::Start(0)).map_err(Failure::new)?;
        Ok(out)
    })
    .await
    .map_err(|e| Failure::new(format!("build task: {e}")))??;
    let stream = tokio_util::io::ReaderStream::new(tokio::fs::File::from_std(spooled))
        .map(|r| r.map_err(|e| ApiError::internal(format!("reading the spooled archive: {e}"))))
        .boxed();
    Ok(stream)
}

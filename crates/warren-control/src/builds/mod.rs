//! Image builds: a Dockerfile run step by step in Warren sandboxes on one
//! node, each step's result kept in that node's step cache (see
//! [`engine`]). This module keeps the builds a client can look at: each
//! one's events, followed live by the request that started it and
//! readable afterwards (`GET /v1/builds/{id}`), the last
//! [`KEPT_FINISHED`] finished ones in memory.

mod context;
mod copy;
mod dockerfile;
mod engine;
mod state;
mod words;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use crate::streams::ByteStream;
use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use warren_core::build::{BuildEvent, BuildInfo, BuildRequest, BuildState};
use warren_core::sync::lock;
use warren_core::ApiError;

use crate::control::Control;

/// A tar archive's bytes as `reader` holds them, gzip or plain (ADD of a
/// local archive, E2B's uploads: neither says which).
pub fn tar_bytes<'a, R: std::io::Read + 'a>(
    reader: R,
) -> std::io::Result<Box<dyn std::io::Read + 'a>> {
    use std::io::BufRead;
    let mut reader = std::io::BufReader::new(reader);
    let gzip = reader.fill_buf()?.starts_with(&[0x1f, 0x8b]);
    Ok(if gzip {
        Box::new(flate2::read::GzDecoder::new(reader))
    } else {
        Box::new(reader)
    })
}

/// Finished builds kept for `GET /v1/builds/{id}`.
const KEPT_FINISHED: usize = 100;
/// Output text a build keeps; past it, output is dropped (said once).
const MAX_OUTPUT: usize = 8 << 20;

#[derive(Default)]
pub(crate) struct Builds(Mutex<BTreeMap<String, Arc<Build>>>);

pub(crate) struct Build {
    info: Mutex<BuildInfo>,
    output: Mutex<usize>,
    changed: tokio::sync::watch::Sender<usize>,
}

impl Build {
    /// Adds an event and wakes who follows.
    pub(crate) fn emit(&self, event: BuildEvent) {
        if let BuildEvent::Output { text, .. } = &event {
            let mut used = lock(&self.output);
            if *used >= MAX_OUTPUT {
                return;
            }
            *used += text.len();
            if *used >= MAX_OUTPUT {
                drop(used);
                self.emit(BuildEvent::Warning {
                    message: format!(
                        "the build's output passed {} MiB; the rest is not kept",
                        MAX_OUTPUT >> 20
                    ),
                });
            }
        }
        let mut info = lock(&self.info);
        match &event {
            BuildEvent::Done { digest, .. } => {
                info.state = BuildState::Succeeded;
                info.digest = Some(digest.clone());
                info.finished_at = Some(warren_core::clock::now_rfc3339());
            }
            BuildEvent::Failed { message, .. } => {
                info.state = BuildState::Failed;
                info.error = Some(message.clone());
                info.finished_at = Some(warren_core::clock::now_rfc3339());
            }
            _ => {}
        }
        info.events.push(event);
        let n = info.events.len();
        drop(info);
        self.changed.send_replace(n);
    }

    fn finished(&self) -> bool {
        lock(&self.info).state != BuildState::Running
    }

    /// Every event from the first, then each new one until the last.
    fn follow(self: Arc<Self>) -> BoxStream<'static, BuildEvent> {
        let rx = self.changed.subscribe();
        futures_util::stream::unfold((self, rx, 0usize), |(build, mut rx, sent)| async move {
            loop {
                let (batch, done) = {
                    let info = lock(&build.info);
                    (
                        info.events[sent..].to_vec(),
                        info.state != BuildState::Running,
                    )
                };
                if !batch.is_empty() {
                    let next = sent + batch.len();
                    return Some((futures_util::stream::iter(batch), (build, rx, next)));
                }
                if done || rx.changed().await.is_err() {
                    return None;
                }
            }
        })
        .flatten()
        .boxed()
    }
}

impl Control {
    /// Starts a build of `context` (a tar archive): answers its events as
    /// they come, the first naming its id. The build runs in its own
    /// task: a client that leaves does not stop it.
    pub async fn start_build(
        self: &Arc<Self>,
        req: BuildRequest,
        context: ByteStream,
    ) -> Result<BoxStream<'static, BuildEvent>, ApiError> {
        self.lifecycle.refuse_if_stopping()?;
        req.validate()
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        let spooled = spool(context).await?;
        let id = crate::control::new_id_with("bld");
        let build = Arc::new(Build {
            info: Mutex::new(BuildInfo {
                id: id.clone(),
                state: BuildState::Running,
                tag: req.tag.clone(),
                digest: None,
                error: None,
                started_at: warren_core::clock::now_rfc3339(),
                finished_at: None,
                events: Vec::new(),
            }),
            output: Mutex::new(0),
            changed: tokio::sync::watch::channel(0).0,
        });
        build.emit(BuildEvent::Build { id: id.clone() });
        self.builds.keep(&id, build.clone());
        let this = self.clone();
        let runner = build.clone();
        tokio::spawn(async move { engine::run(this, runner, req, spooled).await });
        Ok(build.follow())
    }

    /// A build as it stands (running or among the recent finished).
    pub fn build_info(&self, id: &str) -> Result<BuildInfo, ApiError> {
        let builds = lock(&self.builds.0);
        let build = builds.get(id).ok_or_else(|| {
            ApiError::not_found(format!(
                "no build {id} (finished builds are kept for the last {KEPT_FINISHED})"
            ))
        })?;
        let info = lock(&build.info).clone();
        Ok(info)
    }
}

impl Builds {
    fn keep(&self, id: &str, build: Arc<Build>) {
        let mut all = lock(&self.0);
        all.insert(id.to_string(), build);
        let mut finished: Vec<(String, String)> = all
            .iter()
            .filter(|(_, b)| b.finished())
            .map(|(id, b)| (lock(&b.info).started_at.clone(), id.clone()))
            .collect();
        // The oldest go first.
        finished.sort();
        let extra = finished.len().saturating_sub(KEPT_FINISHED);
        for (_, old) in &finished[..extra] {
            all.remove(old);
        }
    }
}

/// Writes the uploaded context to an anonymous temporary file, refusing
/// more than [`context::MAX_CONTEXT`] bytes.
async fn spool(mut body: ByteStream) -> Result<std::fs::File, ApiError> {
    use tokio::io::AsyncWriteExt;
    let internal =
        |e: std::io::Error| ApiError::internal(format!("spooling the build context: {e}"));
    let file = tempfile::tempfile().map_err(internal)?;
    let mut out = tokio::fs::File::from_std(file.try_clone().map_err(internal)?);
    let mut total = 0u64;
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| {
            ApiError::bad_request(format!("the build context upload broke off: {e}"))
        })?;
        total += chunk.len() as u64;
        if total > context::MAX_CONTEXT {
            return Err(ApiError::bad_request(
                context::ContextError::TooLarge.to_string(),
            ));
        }
        out.write_all(&chunk).await.map_err(internal)?;
    }
    out.flush().await.map_err(internal)?;
    Ok(file)
}

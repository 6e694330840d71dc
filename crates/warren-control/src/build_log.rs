//! The image builds a client can look at: each one's events, followed live
//! by the request that started it and readable afterwards
//! (`GET /v1/builds/{id}`), the last [`KEPT_FINISHED`] finished ones in
//! memory. `crate::builds` runs them.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use warren_core::build::{BuildEvent, BuildInfo, BuildState};
use warren_core::sync::lock;
use warren_core::tenant::{Principal, TenantName};

/// Finished builds kept for `GET /v1/builds/{id}`.
pub(crate) const KEPT_FINISHED: usize = 100;
/// Output text a build keeps; past it, output is dropped (said once).
const MAX_OUTPUT: usize = 8 << 20;

#[derive(Default)]
pub(crate) struct Builds(Mutex<BTreeMap<String, Arc<Build>>>);

pub(crate) struct Build {
    /// Whose it is: its steps' sandboxes and its image are that tenant's.
    tenant: TenantName,
    info: Mutex<BuildInfo>,
    output: Mutex<usize>,
    changed: tokio::sync::watch::Sender<usize>,
}

impl Build {
    /// A running build with no events yet.
    pub(crate) fn new(id: &str, tag: Option<String>, tenant: TenantName) -> Build {
        Build {
            tenant,
            info: Mutex::new(BuildInfo {
                id: id.to_string(),
                state: BuildState::Running,
                tag,
                digest: None,
                error: None,
                started_at: warren_core::clock::now_rfc3339(),
                finished_at: None,
                events: Vec::new(),
            }),
            output: Mutex::new(0),
            changed: tokio::sync::watch::channel(0).0,
        }
    }

    pub(crate) fn tenant(&self) -> &TenantName {
        &self.tenant
    }

    /// The build's id.
    pub(crate) fn id(&self) -> String {
        lock(&self.info).id.clone()
    }

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
    pub(crate) fn follow(self: Arc<Self>) -> BoxStream<'static, BuildEvent> {
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

impl Builds {
    pub(crate) fn keep(&self, id: &str, build: Arc<Build>) {
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

    /// A build of a tenant `who` reaches, as it stands (running or among
    /// the recent finished).
    pub(crate) fn info(&self, who: &Principal, id: &str) -> Option<BuildInfo> {
        let build = lock(&self.0).get(id).cloned()?;
        if !who.reaches(&build.tenant) {
            return None;
        }
        let info = lock(&build.info).clone();
        Some(info)
    }
}

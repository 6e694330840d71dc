//! The end and the pauses of a sandbox's life: destroy, TTL and lease,
//! holding it frozen after its end, pause and resume, and its init's death.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use warren_core::sync::lock;
use warren_core::Usage;
use warren_node_api::{NodeEvent, Phase};

use crate::{Node, NodeError};

impl Node {
    /// Kills and removes everything of the sandbox, `why` being the last
    /// line of its log. Idempotent. Returns the sandbox's final usage when
    /// it was live here. A create of it still under way is waited for
    /// first.
    pub async fn destroy(&self, id: &str, why: &str) -> Result<Option<Usage>, NodeError> {
        self.creating.settled(id).await;
        self.destroy_now(id, why).await
    }

    /// Destroy without waiting for a create of it: what its own create
    /// calls when it fails after the sandbox was made.
    pub(crate) async fn destroy_now(
        &self,
        id: &str,
        why: &str,
    ) -> Result<Option<Usage>, NodeError> {
        let mut last_usage = None;
        let live = self.get(id).ok();
        let pid = live.as_ref().map(|live| {
            live.destroying.store(true, Ordering::Release);
            // The resource summary, read while the cgroup still exists.
            self.meter.sample_one(&self.runtime, id, live, true);
            {
                let u = lock(&live.usage);
                let usage = u.usage();
                live.log
                    .record("summary", serde_json::json!({ "usage": usage }));
                last_usage = Some(usage);
            }
            live.pid
        });
        self.egress.detach(id);
        self.runtime.destroy(id, pid).await?;
        self.journal.remove(id);
        if let Some(live) = &live {
            // Before it leaves the table, so a log follower reads it.
            live.log.event("destroyed", why, "");
        }
        {
            let mut m = lock(&self.live);
            m.remove(id);
        }
        if let Some(live) = &live {
            // Gone from the table now: a follower that woke on the line
            // above may have found it still there.
            live.log.wake_followers();
        }
        // The fork layers only it kept go with it.
        self.forks.release_child(id).await;
        // Its devices are free once nothing of it is left to use them.
        self.devices.release(id);
        self.volumes.release(id);
        Ok(last_usage)
    }

    /// Renews the sandbox's lease (heartbeat, or any API call on it).
    pub fn renew_lease(&self, id: &str) {
        if let Ok(live) = self.get(id) {
            {
                let mut l = lock(&live.lifetime);
                l.renew();
            }
        }
    }

    /// Lets the sandbox live `ttl` from now.
    pub fn set_ttl(&self, id: &str, ttl: std::time::Duration) -> Result<(), NodeError> {
        let live = self.get(id)?;
        lock(&live.lifetime).set_ttl(ttl);
        self.journal(&live)
    }

    /// Freezes a finished sandbox and holds it for `hold_for` (a new
    /// lifetime without lease: a kept sandbox's own expiry, or a grace
    /// period). Answers the usage of its run.
    pub async fn hold(
        self: &Arc<Self>,
        id: &str,
        hold_for: std::time::Duration,
        note: &warren_node_api::LogNote,
    ) -> Result<Option<Usage>, NodeError> {
        if let Err(e) = self.freeze(id, true).await {
            tracing::warn!(sandbox = %id, error = %e, "freezing a finished sandbox");
        }
        let live = self.get(id)?;
        {
            let mut l = lock(&live.lifetime);
            l.restart(hold_for);
        }
        live.set_phase(Phase::Held);
        self.journal(&live)?;
        live.log.event(&note.state, &note.reason, &note.message);
        Ok(self.usage(id))
    }

    /// Ends a sandbox whose expiry the control plane never answered, as
    /// the control plane would have: a held one (kept, or in a grace
    /// period) is destroyed; otherwise its reclaim policy decides (`keep`
    /// holds it for `keep_for`, `delay` for its grace period, the others
    /// destroy: an expiry is not a failure). The control plane learns it
    /// from the expiry it reads later (a destroy here is idempotent, a hold
    /// is held again) or, when it gave the sandbox up meanwhile, from the
    /// reconciliation.
    pub(crate) async fn end_alone(self: &Arc<Self>, id: &str, why: &'static str) {
        use warren_core::spec::ReclaimPolicy;
        use warren_core::state::reason;
        let Ok(live) = self.get(id) else { return };
        let (reclaim, keep_for, delay_for) = {
            let c = lock(&live.create);
            (c.spec.reclaim, c.spec.keep_for(), c.spec.delay_for())
        };
        tracing::warn!(sandbox = %id, reason = why, "no control plane answered its expiry; the node ends it alone");
        let note = |state: &str, message: &str| warren_node_api::LogNote {
            state: state.into(),
            reason: why.into(),
            message: message.into(),
        };
        let done = match (live.phase(), reclaim) {
            (Phase::Held, _) => self.destroy(id, reason::KEEP_EXPIRED).await.map(|_| ()),
            // Without a control plane to resume it, a paused sandbox is a
            // kept one.
            (_, ReclaimPolicy::Keep | ReclaimPolicy::Pause) => {
                let n = note("kept", "held by its node: no control plane answered");
                self.hold(id, keep_for, &n).await.map(|_| ())
            }
            (_, ReclaimPolicy::Delay) => {
                let n = note("stopping", "held by its node: no control plane answered");
                self.hold(id, delay_for, &n).await.map(|_| ())
            }
            _ => self.destroy(id, why).await.map(|_| ()),
        };
        if let Err(e) = done {
            tracing::warn!(sandbox = %id, error = %e, "ending an expired sandbox alone");
        }
    }

    /// Pauses (freezes) or resumes (thaws) the sandbox, journaled.
    pub async fn set_paused(self: &Arc<Self>, id: &str, paused: bool) -> Result<(), NodeError> {
        let live = self.get(id)?;
        if live.phase() == Phase::Held {
            return Err(NodeError::Conflict(format!(
                "sandbox {id} has finished and is held; it cannot be paused or resumed"
            )));
        }
        self.freeze(id, paused).await?;
        live.set_phase(if paused {
            Phase::Paused
        } else {
            Phase::Running
        });
        self.journal(&live)
    }

    /// Freezes (or thaws) every process of the sandbox with the cgroup freezer.
    pub(crate) async fn freeze(self: &Arc<Self>, id: &str, frozen: bool) -> Result<(), NodeError> {
        let live = self.get(id)?;
        let path = live.cgroup_path.clone();
        tokio::task::spawn_blocking(move || warren_runtime::cgroups::freeze(&path, frozen))
            .await??;
        if !frozen && live.main_detached.swap(false, Ordering::AcqRel) {
            self.spawn_attach_main(id);
        }
        Ok(())
    }

    /// The init `pid` of sandbox `id` died: reported unless the sandbox is
    /// being destroyed, is being saved (see memory_fork), or runs on
    /// another init now (it was resumed).
    pub(crate) fn init_died(&self, id: &str, pid: i32) {
        let Ok(live) = self.get(id) else { return };
        if live.destroying.load(Ordering::Acquire)
            || live.saving.load(Ordering::Acquire)
            || live.pid != pid
        {
            return;
        }
        let oom_killed = warren_runtime::cgroups::oom_kills(&live.cgroup_path) > 0;
        self.feed.push(NodeEvent::InitDied {
            id: id.to_string(),
            oom_killed,
        });
    }
}

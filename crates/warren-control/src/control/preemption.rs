//! Preemption, as the control plane carries it out: admission chooses the
//! sandboxes to end (the newest of the lowest priority, of tenants above
//! their fair share, for a tenant that takes its share back by preempting);
//! this ends each as `preempted`, its reclaim policy's grace and all, and
//! the room it frees goes to the create it was chosen for.

use std::sync::Arc;

use warren_core::state::reason;

use super::Control;

impl Control {
    /// Ends the sandboxes admission asks to preempt, as it asks, until the
    /// control plane stops.
    pub async fn enforce_preemptions(self: Arc<Self>) {
        let signal = self.admission.preemption_signal();
        loop {
            tokio::select! {
                _ = signal.notified() => {}
                _ = self.lifecycle.stopped() => return,
            }
            for p in self.admission.preemptions() {
                let this = self.clone();
                tokio::spawn(async move {
                    let message = format!(
                        "preempted: tenant {} takes back its fair share (for {}); tenant {} ran it on borrowed capacity",
                        p.for_tenant, p.for_id, p.tenant
                    );
                    tracing::info!(sandbox = %p.id, %message);
                    if let Err(e) = this.destroy(&p.id, reason::PREEMPTED).await {
                        tracing::warn!(sandbox = %p.id, error = %e.message, "preempting a sandbox");
                    }
                });
            }
        }
    }
}

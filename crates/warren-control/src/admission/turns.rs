//! Whose create goes next: the fair-share order of the tenants' heads,
//! the anchor that keeps the lowest share's head from starving, and why a
//! create waits (the rules are in the module doc of `admission`).

use warren_core::tenant::TenantName;

use super::fair_share::Waiting;
use super::{add, placement, preempt, sub, Candidate, Need, State};

impl State {
    /// Tenants whose head may start (quota allows it), lowest weighted
    /// dominant share first; on a tie, the older head.
    fn order(&self) -> Vec<TenantName> {
        let mut v: Vec<(f64, u64, &TenantName)> = self
            .tenants
            .iter()
            .filter(|(_, t)| t.head_blocked().is_none())
            .filter_map(|(n, t)| Some((self.share(t), t.queue.front()?.seq, n)))
            .collect();
        v.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        v.into_iter().map(|(_, _, n)| n.clone()).collect()
    }

    /// Starts as many waiting creates as now may, in fair-share order.
    pub(super) fn start_queued(&mut self) {
        while !self.waiting.is_empty() && self.step() {}
    }

    /// Starts one waiting create; false when none can start now. On the
    /// way, anchors the lowest share's head and lets preempting tenants
    /// reclaim (module doc).
    fn step(&mut self) -> bool {
        let order = self.order();
        // Tenants ahead of the anchor's in the order (a lower share, or an
        // equal one with an older head) may use the anchor's room: it is
        // kept only against those it would otherwise wait behind.
        let anchored = self
            .anchor
            .as_ref()
            .and_then(|a| self.waiting.get(a))
            .and_then(|t| order.iter().position(|o| o == t))
            .unwrap_or(usize::MAX);
        for (i, t) in order.iter().enumerate() {
            if self.start_head(t, i < anchored) {
                return true;
            }
            if preempt::may_reclaim(self, t) && preempt::reclaim(self, t) {
                continue;
            }
            let Some(head) = self.tenants.get(t).and_then(|x| x.queue.front()) else {
                continue;
            };
            if i == 0 && self.anchor.is_none() && !self.reserved.contains_key(&head.id) {
                let head = head.id.clone();
                self.anchor_head(t, &head);
            }
        }
        false
    }

    /// Starts tenant `t`'s head if it fits (on its reserved room first;
    /// on the anchor's too if `past_anchor`).
    fn start_head(&mut self, t: &TenantName, past_anchor: bool) -> bool {
        let Some(id) = self
            .tenants
            .get(t)
            .and_then(|x| x.queue.front())
            .map(|w| w.id.clone())
        else {
            return false;
        };
        let was_anchor = self.anchor.as_deref() == Some(id.as_str());
        let lifted = self.unreserve(&id);
        let Some(head) = self.tenants.get(t).and_then(|x| x.queue.front()) else {
            return false;
        };
        let node = match &lifted {
            Some(r) if head.req.node.is_none() => {
                let mut on = head.req.placement();
                on.node = Some(&r.node);
                placement::choose(&on, self.candidates())
                    .or_else(|| placement::choose(&head.req.placement(), self.candidates()))
                    .map(str::to_string)
            }
            _ => self.place(&head.req),
        };
        let node = match (node, past_anchor) {
            (None, true) => self.place_past_anchor(t),
            (node, _) => node,
        };
        let Some(node) = node else {
            if let Some(r) = lifted {
                // An anchor stays until its create starts; a reclaim's room
                // stays while what it waits for is still on its way out.
                let leaving = self
                    .slot_ref(&r.node)
                    .is_some_and(|s| s.leaving != Need::default());
                let victims_live = r.victims.iter().any(|v| self.held.contains_key(v));
                if was_anchor || victims_live || leaving {
                    self.reserve(&id, &r.node, r.need, r.victims);
                    if was_anchor {
                        self.anchor = Some(id);
                    }
                }
            }
            return false;
        };
        let Some(w) = self.tenants.get_mut(t).and_then(|x| x.queue.pop_front()) else {
            return false;
        };
        self.waiting.remove(&w.id);
        // A waiter whose client left still gets the capacity; it gives it
        // back through release() when its create is abandoned.
        self.take(&w.id, &node, &w.req, true);
        let _ = w.ready.send(node);
        true
    }

    /// Where tenant `t`'s head fits if the anchor's room were free.
    fn place_past_anchor(&mut self, t: &TenantName) -> Option<String> {
        let kept = self
            .anchor
            .as_ref()
            .and_then(|a| self.reserved.get(a))
            .map(|r| (r.node.clone(), r.need))?;
        if let Some(slot) = self.slot(&kept.0) {
            sub(&mut slot.reserved, &kept.1);
        }
        let node = self
            .tenants
            .get(t)
            .and_then(|x| x.queue.front())
            .and_then(|head| self.place(&head.req));
        if let Some(slot) = self.slot(&kept.0) {
            add(&mut slot.reserved, &kept.1);
        }
        node
    }

    /// Reserves room for tenant `t`'s head `id` on the node nearest to
    /// fitting it, so that it cannot starve (module doc).
    fn anchor_head(&mut self, t: &TenantName, id: &str) {
        let Some(head) = self.tenants.get(t).and_then(|x| x.queue.front()) else {
            return;
        };
        let req = head.req.placement();
        let need = head.req.need;
        let shortfall = |c: &Candidate<'_>| {
            let lack = |need: u64, used: u64, total: u64| {
                if need == 0 || total == 0 {
                    0.0
                } else {
                    (used + need).saturating_sub(total) as f64 / total as f64
                }
            };
            lack(need.cpu_millis, c.used.cpu_millis, c.total.cpu_millis)
                .max(lack(need.memory, c.used.memory, c.total.memory))
                .max(lack(
                    u64::from(need.slots),
                    u64::from(c.used.slots),
                    u64::from(c.total.slots),
                ))
                .max(lack(
                    u64::from(need.gpus),
                    u64::from(c.used.gpus),
                    u64::from(c.total.gpus),
                ))
        };
        let best = self
            .candidates()
            .filter(|c| c.schedulable && placement::could_ever(&req, c))
            .map(|c| (shortfall(&c), c.name))
            .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(b.1)))
            .map(|(_, n)| n.to_string());
        if let Some(node) = best {
            self.reserve(id, &node, need, Vec::new());
            self.anchor = Some(id.to_string());
        }
    }

    /// Why tenant `t`'s waiting create `id` has not started.
    pub(super) fn why(&self, id: &str, t: &TenantName) -> Waiting {
        let Some(tenant) = self.tenants.get(t) else {
            return Waiting::Room;
        };
        if let Some((resource, quota)) = tenant.head_blocked() {
            return Waiting::Quota {
                tenant: t.clone(),
                resource,
                quota: resource.show(quota),
            };
        }
        let victims = self.reserved.get(id).map_or(0, |r| {
            r.victims
                .iter()
                .filter(|v| self.held.contains_key(*v))
                .count()
        });
        if victims > 0 {
            Waiting::Reclaiming { victims }
        } else {
            Waiting::Room
        }
    }
}

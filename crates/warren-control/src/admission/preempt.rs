//! Reclaiming a share: which sandboxes a tenant below its fair share may
//! have preempted, and where (module doc of `admission`). Admission only
//! names them; the control plane ends them.
//!
//! Both sides are bounded so that preemption cannot ping-pong: the
//! reclaiming tenant takes no more than would keep it at or below its fair
//! share, and a victim's tenant is never taken below its own. And it takes
//! a band: a tenant reclaims only when more than [`BAND`] below its fair
//! share, from tenants more than [`BAND`] above theirs, so the ripples of a
//! full cluster (a tenant one sandbox below its share for a moment) end no
//! one's work.

use std::collections::HashMap;

use warren_core::tenant::TenantName;

use super::fair_share::{quota_hit, Preemption, EPSILON};
use super::{add, candidate, placement, sub, Need, State};

/// How far (relative to its fair share) a tenant must be below it to
/// reclaim, and a victim's tenant above it to lose sandboxes.
pub(super) const BAND: f64 = 0.05;

/// A sandbox that may be preempted.
struct Victim {
    id: String,
    tenant: TenantName,
    priority: i32,
    seq: u64,
    need: Need,
}

/// Whether tenant `t` preempts, is below its fair share (by more than
/// the band) and waits for room not yet reclaimed.
pub(super) fn may_reclaim(s: &State, t: &TenantName) -> bool {
    let Some(tenant) = s.tenants.get(t) else {
        return false;
    };
    // Only where some create of its has no room kept yet.
    if !tenant.spec.preempt || tenant.queue.iter().all(|w| s.reserved.contains_key(&w.id)) {
        return false;
    }
    let fair = tenant.weight() / s.active_weight();
    s.totals.dominant(&tenant.held) < fair * (1.0 - BAND) - EPSILON
}

/// For each of `t`'s waiting creates that has no room kept yet, in queue
/// order, while the tenant would stay within its fair share and quota:
/// picks victims on one node (lowest priority first, then newest), marks
/// them, and reserves their room for the create. False if it found none.
pub(super) fn reclaim(s: &mut State, t: &TenantName) -> bool {
    let wsum = s.active_weight();
    let Some(tenant) = s.tenants.get(t) else {
        return false;
    };
    let fair_of = |w: f64| w / wsum;
    let fair = fair_of(tenant.weight());
    let quota = tenant.spec.quota;
    // What it will hold once the creates that have room kept start.
    let mut projected = tenant.held;
    let mut count = tenant.sandboxes;
    let mut wanted: Vec<(String, Need, super::Request)> = Vec::new();
    for w in &tenant.queue {
        if let Some(r) = s.reserved.get(&w.id) {
            add(&mut projected, &r.need);
            count += 1;
            continue;
        }
        wanted.push((w.id.clone(), w.req.need, w.req.clone()));
    }
    // What each tenant may lose and stay at or above its fair share.
    let mut spare: HashMap<TenantName, Need> = HashMap::new();
    let mut above: HashMap<TenantName, f64> = HashMap::new();
    for (n, u) in &s.tenants {
        if n == t {
            continue;
        }
        let mut keeps = u.held;
        sub(&mut keeps, &u.leaving);
        if s.totals.dominant(&keeps) > fair_of(u.weight()) * (1.0 + BAND) + EPSILON {
            above.insert(n.clone(), fair_of(u.weight()));
            spare.insert(n.clone(), keeps);
        }
    }
    if above.is_empty() {
        return false;
    }
    let mut by_node: HashMap<String, Vec<Victim>> = HashMap::new();
    for (id, h) in &s.held {
        if h.preempted || !above.contains_key(&h.tenant) {
            continue;
        }
        by_node.entry(h.node.clone()).or_default().push(Victim {
            id: id.clone(),
            tenant: h.tenant.clone(),
            priority: h.priority,
            seq: h.seq,
            need: h.need,
        });
    }
    for list in by_node.values_mut() {
        list.sort_by(|a, b| a.priority.cmp(&b.priority).then(b.seq.cmp(&a.seq)));
    }
    let mut any = false;
    for (id, need, req) in wanted {
        if quota_hit(&quota, &projected, count, &need).is_some() {
            break;
        }
        let mut after = projected;
        add(&mut after, &need);
        if s.totals.dominant(&after) > fair + EPSILON {
            break;
        }
        let Some((node, picks)) = best_node(s, &req, &by_node, &spare, &above) else {
            break;
        };
        let mut victims = Vec::with_capacity(picks.len());
        for k in picks {
            let Some(v) = by_node.get(&node).and_then(|l| l.get(k)) else {
                continue;
            };
            if let Some(h) = s.held.get_mut(&v.id) {
                h.preempted = true;
            }
            if let Some(slot) = s.slot(&node) {
                add(&mut slot.leaving, &v.need);
            }
            if let Some(u) = s.tenants.get_mut(&v.tenant) {
                add(&mut u.leaving, &v.need);
            }
            if let Some(keeps) = spare.get_mut(&v.tenant) {
                sub(keeps, &v.need);
            }
            s.preemptions.push(Preemption {
                id: v.id.clone(),
                node: node.clone(),
                tenant: v.tenant.clone(),
                for_tenant: t.clone(),
                for_id: id.clone(),
            });
            victims.push(v.id.clone());
        }
        s.reserve(&id, &node, need, victims);
        projected = after;
        count += 1;
        any = true;
    }
    any
}

/// The node where `req` fits once the fewest, lowest-priority victims
/// leave, with those victims (indices into the node's list).
fn best_node(
    s: &State,
    req: &super::Request,
    by_node: &HashMap<String, Vec<Victim>>,
    spare: &HashMap<TenantName, Need>,
    above: &HashMap<TenantName, f64>,
) -> Option<(String, Vec<usize>)> {
    let p = req.placement();
    let mut best: Option<((i32, usize), &str, Vec<usize>)> = None;
    for (node, list) in by_node {
        let Some(slot) = s.slot_ref(node) else {
            continue;
        };
        let c = candidate(slot);
        if !c.schedulable || !placement::could_ever(&p, &c) {
            continue;
        }
        // What the node will hold once what is already leaving has left
        // (and the room kept for others is taken).
        let mut held = c.used;
        sub(&mut held, &slot.leaving);
        // What each victim's tenant may still lose, on this node's picks.
        let mut keeps: Vec<(&TenantName, Need)> = Vec::new();
        let mut picks = Vec::new();
        let mut top = i32::MIN;
        for (k, v) in list.iter().enumerate() {
            if placement::fits(&req.need, &held, &slot.total) {
                break;
            }
            if s.held.get(&v.id).is_none_or(|h| h.preempted) {
                continue;
            }
            let left = match keeps.iter_mut().find(|(n, _)| *n == &v.tenant) {
                Some((_, left)) => left,
                None => {
                    let start = spare.get(&v.tenant).copied().unwrap_or_default();
                    keeps.push((&v.tenant, start));
                    let Some((_, left)) = keeps.last_mut() else {
                        continue;
                    };
                    left
                }
            };
            let mut rest = *left;
            sub(&mut rest, &v.need);
            let fair = above.get(&v.tenant).copied().unwrap_or(f64::INFINITY);
            if s.totals.dominant(&rest) < fair - EPSILON {
                continue;
            }
            *left = rest;
            sub(&mut held, &v.need);
            picks.push(k);
            top = top.max(v.priority);
        }
        if picks.is_empty() || !placement::fits(&req.need, &held, &slot.total) {
            continue;
        }
        let key = (top, picks.len());
        if best
            .as_ref()
            .is_none_or(|(b, n, _)| key < *b || (key == *b && node.as_str() < *n))
        {
            best = Some((key, node, picks));
        }
    }
    best.map(|(_, n, p)| (n.to_string(), p))
}

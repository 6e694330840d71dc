//! The fleet over a window of time (`GET /v1/fleet`): every sandbox that
//! has not ended and every one that ended within the window, grouped by
//! the values of one label key. Computed from the store a page at a time,
//! so a request holds one page and the groups, however many sandboxes the
//! store keeps; live sandboxes' usage comes from one inventory of the
//! nodes, ended ones' as they ended.

use std::collections::{BTreeMap, HashMap};

use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;
use warren_core::fleet::{self, Fleet, FleetGroup, Member, Outcome, MAX_GROUPS};
use warren_core::tenant::Principal;
use warren_core::ApiError;
use warren_node_api::SandboxStatus;

use super::Records;
use crate::store::SandboxRow;

/// Records read per store trip.
const PAGE: i64 = 1000;

/// The rows of an answer as they are summed.
struct Groups<'a> {
    key: &'a str,
    held: HashMap<String, SandboxStatus>,
    values: BTreeMap<String, FleetGroup>,
    unlabelled: FleetGroup,
    other: Option<FleetGroup>,
    total: FleetGroup,
}

impl Groups<'_> {
    fn add(&mut self, r: &SandboxRow) {
        // A live sandbox's usage as its node reads it now; an ended one's
        // as it ended (kept with its record).
        let usage = if r.state.is_live() {
            self.held.get(&r.id).and_then(|s| s.usage.as_ref())
        } else {
            r.usage.as_ref()
        };
        let member = Member {
            column: fleet::column(r.state, &r.reason, r.exit_code),
            outcome: Outcome::of(r.state, &r.reason, r.exit_code),
            cpu_request_millis: r.resources.cpu_request(),
            cpu_limit_millis: r.resources.cpu_millis,
            memory_request: r.resources.memory_request(),
            memory_limit: r.resources.memory,
            usage,
        };
        self.total.add(&member);
        let group = match r.labels().get(self.key) {
            None => &mut self.unlabelled,
            Some(v) if self.values.contains_key(v) || self.values.len() < MAX_GROUPS => {
                self.values.entry(v.clone()).or_default()
            }
            // Past the cap, values share one row: the answer stays bounded
            // whatever the key's cardinality (an id-like label, say).
            Some(_) => self.other.get_or_insert_with(FleetGroup::default),
        };
        group.add(&member);
    }
}

impl Records {
    /// The fleet `who` may see over the window `since` (e.g. `1h`),
    /// grouped by the label `key`.
    pub async fn fleet(&self, who: &Principal, key: &str, since: &str) -> Result<Fleet, ApiError> {
        warren_core::labels::validate_key(key)
            .map_err(|e| ApiError::bad_request(format!("key: {e}")))?;
        let window =
            fleet::parse_window(since).map_err(|e| ApiError::bad_request(e.to_string()))?;
        let from = (OffsetDateTime::now_utc() - window)
            .format(&Rfc3339)
            .map_err(|e| ApiError::internal(format!("formatting the window's start: {e}")))?;
        let tenant = who.scope();
        let mut groups = Groups {
            key,
            held: self.inventory().await,
            values: BTreeMap::new(),
            unlabelled: FleetGroup::default(),
            other: None,
            total: FleetGroup::default(),
        };
        // Two walks, each in an order the store keeps an index for. A
        // sandbox that ends between them may count in both or neither: the
        // answer is a moment's view, not a ledger.
        let mut after = String::new();
        loop {
            let page = self.store.unended_page(tenant, &after, PAGE).await?;
            page.iter().for_each(|r| groups.add(r));
            match page.last() {
                Some(last) if page.len() as i64 == PAGE => after = last.id.clone(),
                _ => break,
            }
        }
        let mut after = (from.clone(), String::new());
        loop {
            let page = self
                .store
                .ended_page(tenant, (&after.0, &after.1), PAGE)
                .await?;
            page.iter().for_each(|r| groups.add(r));
            match page.last() {
                Some(last) if page.len() as i64 == PAGE => {
                    after = (
                        last.finished_at.clone().unwrap_or_default(),
                        last.id.clone(),
                    )
                }
                _ => break,
            }
        }
        let finish = |mut g: FleetGroup| {
            g.finish();
            g
        };
        Ok(Fleet {
            key: key.to_string(),
            since: since.to_string(),
            from,
            columns: fleet::columns().into_iter().map(str::to_string).collect(),
            groups: groups
                .values
                .into_iter()
                .map(|(v, g)| {
                    finish(FleetGroup {
                        value: Some(v),
                        ..g
                    })
                })
                .collect(),
            unlabelled: finish(groups.unlabelled),
            other: groups.other.map(finish),
            total: finish(groups.total),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use warren_core::{ResolvedResources, SandboxSpec, SandboxState};

    fn row(id: &str, label: Option<&str>, state: SandboxState) -> SandboxRow {
        let mut spec = SandboxSpec::default();
        if let Some(v) = label {
            spec.labels.insert("task".into(), v.into());
        }
        let resources = ResolvedResources {
            cpu_millis: 1000,
            memory: 1 << 30,
            pids: 128,
            disk: 0,
            gpus: 0,
            cpu_request_millis: Some(100),
            memory_request: Some(64 << 20),
        };
        SandboxRow::new(id, spec, resources, "n".into(), "sha256:x".into(), state)
    }

    /// Values past the cap share one row, so an answer stays bounded
    /// whatever the key's cardinality; the total counts every sandbox.
    #[test]
    fn values_past_the_cap_share_the_other_row() {
        let mut g = Groups {
            key: "task",
            held: HashMap::new(),
            values: BTreeMap::new(),
            unlabelled: FleetGroup::default(),
            other: None,
            total: FleetGroup::default(),
        };
        for i in 0..MAX_GROUPS + 2 {
            g.add(&row(
                &format!("sbx-{i}"),
                Some(&format!("v{i}")),
                SandboxState::Queued,
            ));
        }
        g.add(&row("sbx-v0-again", Some("v0"), SandboxState::Queued));
        g.add(&row("sbx-bare", None, SandboxState::Queued));
        assert_eq!(g.values.len(), MAX_GROUPS);
        assert_eq!(g.values["v0"].sandboxes, 2);
        assert_eq!(g.other.as_ref().map(|o| o.sandboxes), Some(2));
        assert_eq!(g.unlabelled.sandboxes, 1);
        assert_eq!(g.total.sandboxes, MAX_GROUPS as u64 + 4);
        assert_eq!(g.total.counts["queued"], MAX_GROUPS as u64 + 4);
    }
}

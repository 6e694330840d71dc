//! Alerts: the events an operator is paged for (a node's CPU saturated, a
//! sandbox killed for memory, a node lost or unreachable, a disk limit
//! hit, memory pressure) sent as they are recorded to webhooks, in
//! Alertmanager's webhook format, so that whatever already receives
//! Alertmanager's (a chat bridge, an incident tool) receives Warren's.
//!
//! Delivery follows the event log from the moment the control plane starts
//! (history is not replayed), in order, to every hook with a few tries; a
//! hook that stays down costs its own deliveries only.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use warren_core::state::reason;
use warren_core::Event;

use crate::telemetry::Telemetry;

/// The reasons that are alerts: of a node (its own event), and of a
/// sandbox (its first event of that reason: an OOM kill is recorded as the
/// sandbox stops and again as it is destroyed).
pub const NODE_ALERTS: [&str; 3] = ["node_cpu_saturated", "node_unreachable", reason::NODE_LOST];
pub const SANDBOX_ALERTS: [&str; 3] = [
    reason::OOM_KILLED,
    reason::DISK_EXCEEDED,
    reason::MEMORY_PRESSURE,
];

/// Whether an event is sent as an alert.
pub fn is_alert(ev: &Event) -> bool {
    let why = ev.reason.as_str();
    if ev.sandbox_id.is_empty() {
        NODE_ALERTS.contains(&why)
    } else {
        SANDBOX_ALERTS.contains(&why) && ev.state != Some(warren_core::SandboxState::Destroyed)
    }
}

/// Tries per delivery, and the wait before the next one (doubling).
const TRIES: u32 = 4;
const FIRST_RETRY: Duration = Duration::from_millis(500);
const TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
#[error("alert webhook {0:?}: an http:// or https:// URL")]
pub struct WebhookError(String);

/// Where alerts are sent (`--alert-webhook`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Webhook(reqwest::Url);

impl std::str::FromStr for Webhook {
    type Err = WebhookError;

    fn from_str(s: &str) -> Result<Self, WebhookError> {
        reqwest::Url::parse(s)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some())
            .map(Webhook)
            .ok_or_else(|| WebhookError(s.to_string()))
    }
}

/// The severity Alertmanager's receivers route by.
fn severity(why: &str) -> &'static str {
    match why {
        reason::NODE_LOST | reason::OOM_KILLED => "critical",
        _ => "warning",
    }
}

/// One event as an Alertmanager webhook message (version 4) with one
/// firing alert: its labels are `alertname` (the event's reason),
/// `severity`, `sandbox` and `node` where they apply, and the sandbox's
/// own labels (which cannot shadow those).
pub fn message(ev: &Event, node: Option<&str>, labels: &warren_core::Labels) -> Value {
    let mut alert_labels = serde_json::Map::new();
    for (k, v) in labels {
        alert_labels.insert(k.clone(), json!(v));
    }
    alert_labels.insert("alertname".into(), json!(ev.reason));
    alert_labels.insert("severity".into(), json!(severity(&ev.reason)));
    if !ev.sandbox_id.is_empty() {
        alert_labels.insert("sandbox".into(), json!(ev.sandbox_id));
    }
    if let Some(node) = node.filter(|n| !n.is_empty()) {
        alert_labels.insert("node".into(), json!(node));
    }
    // Some events say it all in their reason (an OOM kill has no message).
    let summary = if ev.message.is_empty() {
        match (ev.sandbox_id.as_str(), node) {
            ("", _) => ev.reason.clone(),
            (id, Some(n)) if !n.is_empty() => format!("sandbox {id} on node {n}: {}", ev.reason),
            (id, _) => format!("sandbox {id}: {}", ev.reason),
        }
    } else {
        ev.message.clone()
    };
    json!({
        "version": "4",
        "status": "firing",
        "receiver": "warren",
        "groupKey": format!("warren:{}", ev.seq),
        "groupLabels": {"alertname": ev.reason},
        "commonLabels": alert_labels,
        "commonAnnotations": {"summary": summary},
        "externalURL": "",
        "alerts": [{
            "status": "firing",
            "labels": alert_labels,
            "annotations": {"summary": summary},
            "startsAt": ev.time,
            "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": "",
            "fingerprint": format!("{:016x}", ev.seq),
        }],
    })
}

/// Alerts waiting for one hook; past this a hook that is down loses the
/// newest (each loss logged) rather than holding memory without bound.
const BACKLOG: usize = 1024;

impl Telemetry {
    /// Sends every alert recorded from now on to `hooks`, until the
    /// control plane stops. Each hook has a queue and a sender of its own,
    /// so one that is slow or down delays only its own deliveries.
    pub async fn send_alerts(self: Arc<Self>, hooks: Vec<Webhook>) {
        let client = match reqwest::Client::builder().timeout(TIMEOUT).build() {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "alerts: no HTTP client; no alert will be sent");
                return;
            }
        };
        let queues: Vec<_> = hooks
            .into_iter()
            .map(|hook| {
                let (tx, mut rx) = tokio::sync::mpsc::channel::<Arc<Value>>(BACKLOG);
                let client = client.clone();
                tokio::spawn(async move {
                    while let Some(body) = rx.recv().await {
                        deliver(&client, &hook, &body).await;
                    }
                });
                tx
            })
            .collect();
        let mut writes = self.records.event_writes();
        let mut after = match self.store.last_event_seq().await {
            Ok(seq) => seq,
            Err(e) => {
                tracing::error!(error = %e, "alerts: reading the event log; no alert will be sent");
                return;
            }
        };
        loop {
            let events = match self.store.events(None, after, 1000).await {
                Ok(events) => events,
                Err(e) => {
                    tracing::warn!(error = %e, "alerts: reading the event log");
                    Vec::new()
                }
            };
            for ev in events {
                after = after.max(ev.seq);
                if !is_alert(&ev) {
                    continue;
                }
                let body = Arc::new(self.alert_message(&ev).await);
                for q in &queues {
                    if q.try_send(body.clone()).is_err() {
                        tracing::warn!(seq = ev.seq, reason = %ev.reason, "alert dropped: its webhook is {BACKLOG} alerts behind");
                    }
                }
            }
            tokio::select! {
                changed = writes.changed() => if changed.is_err() { return },
                _ = self.lifecycle.stopped() => return,
            }
        }
    }

    async fn alert_message(&self, ev: &Event) -> Value {
        let (node, labels) = match self.store.get(&ev.sandbox_id).await {
            Ok(Some(row)) if !ev.sandbox_id.is_empty() => (Some(row.node.clone()), row.spec.labels),
            _ => (None, Default::default()),
        };
        message(ev, node.as_deref(), &labels)
    }
}

async fn deliver(client: &reqwest::Client, hook: &Webhook, body: &Value) {
    let mut wait = FIRST_RETRY;
    for attempt in 1..=TRIES {
        match client.post(hook.0.clone()).json(body).send().await {
            Ok(r) if r.status().is_success() => return,
            Ok(r) => {
                tracing::warn!(hook = %hook.0, status = %r.status(), attempt, "alert webhook refused")
            }
            Err(e) => {
                tracing::warn!(hook = %hook.0, error = %e, attempt, "alert webhook unreachable")
            }
        }
        if attempt < TRIES {
            tokio::time::sleep(wait).await;
            wait *= 2;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_is_an_alertmanager_message() {
        let ev = Event {
            seq: 42,
            time: "2026-12-06T12:00:00Z".into(),
            sandbox_id: "sbx-a".into(),
            kind: "state".into(),
            state: None,
            reason: reason::OOM_KILLED.into(),
            message: "killed for memory".into(),
        };
        let labels = [
            ("task".to_string(), "swe".to_string()),
            ("alertname".to_string(), "spoofed".to_string()),
        ]
        .into();
        let m = message(&ev, Some("n1"), &labels);
        let a = &m["alerts"][0];
        assert_eq!(m["version"], "4");
        assert_eq!(a["labels"]["alertname"], "oom_killed");
        assert_eq!(a["labels"]["severity"], "critical");
        assert_eq!(a["labels"]["sandbox"], "sbx-a");
        assert_eq!(a["labels"]["node"], "n1");
        assert_eq!(a["labels"]["task"], "swe");
        assert_eq!(a["annotations"]["summary"], "killed for memory");
        assert_eq!(a["startsAt"], "2026-12-06T12:00:00Z");
        for bad in ["ftp://x", "hook", "http://"] {
            assert!(bad.parse::<Webhook>().is_err(), "{bad}");
        }
        assert!("https://alerts.example/warren".parse::<Webhook>().is_ok());
        // One alert per OOM kill, per lost node (not per sandbox lost).
        let with = |sandbox: &str, state, why: &str| Event {
            sandbox_id: sandbox.into(),
            state,
            reason: why.into(),
            ..ev.clone()
        };
        use warren_core::SandboxState as S;
        assert!(is_alert(&with("sbx-a", Some(S::Stopping), "oom_killed")));
        assert!(!is_alert(&with("sbx-a", Some(S::Destroyed), "oom_killed")));
        assert!(is_alert(&with("", None, "node_lost")));
        assert!(!is_alert(&with("sbx-a", Some(S::Lost), "node_lost")));
        assert!(!is_alert(&with("sbx-a", Some(S::Destroyed), "ttl_expired")));
    }
}

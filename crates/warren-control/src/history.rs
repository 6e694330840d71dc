//! The recent history the console charts (`GET /v1/history`): every
//! [`INTERVAL`] the control plane samples its queue length, the latency of
//! the creates answered since the last sample (p50, p99) and each node's
//! CPU, and keeps the last hour of samples in a ring in memory, with the
//! alert events of that hour (`crate::samples`). The samples are not
//! written down: a restart starts them afresh. The alerts are events of
//! the store's log: a start reads them back from its last
//! [`EVENTS_READ_BACK`] events.

use std::sync::Arc;

use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;
use warren_core::history::{History, HistoryPoint};
use warren_core::{ApiError, Event};

use crate::samples::{now_ms, INTERVAL, KEPT};
use crate::telemetry::Telemetry;

/// Events read per store trip, and trips per sample, while looking for
/// alerts.
const EVENT_PAGE: i64 = 1000;
const EVENT_PAGES: usize = 20;
/// How far back in the event log a start looks for the last hour's
/// alerts: far enough for an hour of a busy cluster's events, bounded so
/// that a start reads a few pages, not the whole log.
const EVENTS_READ_BACK: i64 = 10_000;

/// When an event was written (Unix ms; its writer's clock), or now when its
/// time cannot be read.
fn event_ms(ev: &Event) -> u64 {
    OffsetDateTime::parse(&ev.time, &Rfc3339)
        .ok()
        .and_then(|t| u64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok())
        .unwrap_or_else(now_ms)
}

/// The `q` quantile of `sorted` (nearest rank), in milliseconds.
fn quantile_ms(sorted: &[f64], q: f64) -> Option<f64> {
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted
        .get(rank.saturating_sub(1).min(sorted.len().saturating_sub(1)))
        .map(|s| s * 1000.0)
}

impl Telemetry {
    /// Samples the history every [`INTERVAL`] until the daemon stops.
    pub async fn keep_history(self: Arc<Self>) {
        // The last hour's alerts from the log, then each as it is written.
        let mut after = match self.store.last_event_seq().await {
            Ok(seq) => seq.saturating_sub(EVENTS_READ_BACK).max(0),
            Err(e) => {
                tracing::warn!(error = %e, "reading the event log; the history starts without alerts before now");
                0
            }
        };
        let mut tick = tokio::time::interval(INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = self.lifecycle.stopped() => return,
            }
            self.metrics.history.push(self.sample());
            after = self.follow_alerts(after).await;
        }
    }

    fn sample(&self) -> HistoryPoint {
        let (creates, mut latencies) = self.metrics.create_seconds.take_recent();
        latencies.sort_by(f64::total_cmp);
        HistoryPoint {
            time_ms: now_ms(),
            queued: self.admission.queued() as u64,
            creates,
            create_p50_ms: quantile_ms(&latencies, 0.5),
            create_p99_ms: quantile_ms(&latencies, 0.99),
            node_cpu: self
                .nodes
                .all()
                .iter()
                .map(|n| (n.name.clone(), n.view().info.load.cpu_busy))
                .collect(),
        }
    }

    /// Keeps the alert events after `after`; returns the last one read.
    async fn follow_alerts(&self, mut after: i64) -> i64 {
        for _ in 0..EVENT_PAGES {
            let page = match self.store.events(None, after, EVENT_PAGE).await {
                Ok(page) => page,
                Err(e) => {
                    tracing::warn!(error = %e, "reading events for the history's alerts");
                    return after;
                }
            };
            let full = page.len() as i64 == EVENT_PAGE;
            for ev in page {
                after = ev.seq;
                if crate::alerts::is_alert(&ev) {
                    self.metrics.history.alert(event_ms(&ev), ev);
                }
            }
            if !full {
                break;
            }
        }
        after
    }

    /// The samples and alert events of the last `since` (at most what is
    /// kept, [`KEPT`]).
    pub fn history(&self, since: &str) -> Result<History, ApiError> {
        let window = warren_core::quantity::parse_duration(since).map_err(|_| {
            ApiError::bad_request(format!(
                "since {since:?}: write a duration such as 5m, 15m or 1h"
            ))
        })?;
        if window.is_zero() || window > KEPT {
            return Err(ApiError::bad_request(format!(
                "since {since:?}: the history keeps the last hour; ask for more than zero and at most 1h"
            )));
        }
        let from = now_ms().saturating_sub(window.as_millis() as u64);
        Ok(History {
            interval_ms: INTERVAL.as_millis() as u64,
            kept_ms: KEPT.as_millis() as u64,
            since: since.to_string(),
            points: self.metrics.history.points_since(from),
            alerts: self.metrics.history.alerts_since(from),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_by_nearest_rank() {
        let sorted: Vec<f64> = (1..=100).map(|i| f64::from(i) / 1000.0).collect();
        assert_eq!(quantile_ms(&sorted, 0.5), Some(50.0));
        assert_eq!(quantile_ms(&sorted, 0.99), Some(99.0));
        assert_eq!(quantile_ms(&[0.25], 0.99), Some(250.0));
        assert_eq!(quantile_ms(&[], 0.5), None);
    }
}

//! The recent history the console charts (`GET /v1/history`): every
//! [`INTERVAL`] the control plane samples its queue length, the latency of
//! the creates answered since the last sample (p50, p99) and each node's
//! CPU, and keeps the last hour of samples in a ring in memory, with the
//! alert events of that hour. Nothing of it is written down: a restart
//! starts an empty history (the events themselves stay in the store).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rand::Rng;
use warren_core::history::{History, HistoryPoint};
use warren_core::{ApiError, Event};

use crate::control::Control;

/// Time between samples.
pub const INTERVAL: Duration = Duration::from_secs(5);
/// How far back samples are kept: an hour.
pub const KEPT: Duration = Duration::from_secs(3600);
const POINTS: usize = (KEPT.as_secs() / INTERVAL.as_secs()) as usize;
/// Alert events kept (the newest); beyond them an hour of a flapping node
/// would grow without bound.
const ALERTS: usize = 500;
/// Create latencies kept per interval: past it, a uniform sample of them
/// (reservoir sampling), so a burst of creates costs no more memory.
const LATENCIES: usize = 4096;
/// Events read per store trip, and trips per sample, while looking for
/// alerts.
const EVENT_PAGE: i64 = 1000;
const EVENT_PAGES: usize = 20;

/// The latencies of the creates answered since the last sample.
#[derive(Default)]
pub struct Latencies(Mutex<Reservoir>);

#[derive(Default)]
struct Reservoir {
    seen: u64,
    kept: Vec<f64>,
}

impl Latencies {
    pub fn observe(&self, seconds: f64) {
        let mut r = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        r.seen += 1;
        if r.kept.len() < LATENCIES {
            r.kept.push(seconds);
        } else {
            let i = rand::rng().random_range(0..r.seen);
            if let Some(slot) = r.kept.get_mut(i as usize) {
                *slot = seconds;
            }
        }
    }

    /// How many were answered, and a sample of their latencies, since the
    /// last take.
    pub(crate) fn take(&self) -> (u64, Vec<f64>) {
        let r = std::mem::take(&mut *self.0.lock().unwrap_or_else(PoisonError::into_inner));
        (r.seen, r.kept)
    }
}

/// The `q` quantile of `sorted` (nearest rank), in milliseconds.
fn quantile_ms(sorted: &[f64], q: f64) -> Option<f64> {
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted
        .get(rank.saturating_sub(1).min(sorted.len().saturating_sub(1)))
        .map(|s| s * 1000.0)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The samples and alerts, oldest first.
#[derive(Default)]
pub struct Recorder {
    points: Mutex<VecDeque<HistoryPoint>>,
    alerts: Mutex<VecDeque<(u64, Event)>>,
}

impl Recorder {
    fn push(&self, p: HistoryPoint) {
        let mut points = self.points.lock().unwrap_or_else(PoisonError::into_inner);
        if points.len() == POINTS {
            points.pop_front();
        }
        points.push_back(p);
    }

    fn alert(&self, ev: Event) {
        // When it was seen: an event's own time is the writer's clock.
        let mut alerts = self.alerts.lock().unwrap_or_else(PoisonError::into_inner);
        alerts.retain(|(t, _)| now_ms().saturating_sub(*t) <= KEPT.as_millis() as u64);
        if alerts.len() == ALERTS {
            alerts.pop_front();
        }
        alerts.push_back((now_ms(), ev));
    }
}

impl Control {
    /// Samples the history every [`INTERVAL`] until the daemon stops.
    pub async fn keep_history(self: Arc<Self>) {
        // Alerts from now on (as webhooks are sent): the store keeps the
        // events before.
        let mut after = match self.store.last_event_seq().await {
            Ok(seq) => seq,
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
                    self.metrics.history.alert(ev);
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
        let points = self
            .metrics
            .history
            .points
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|p| p.time_ms >= from)
            .cloned()
            .collect();
        let alerts = self
            .metrics
            .history
            .alerts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|(t, _)| *t >= from)
            .map(|(_, ev)| ev.clone())
            .collect();
        Ok(History {
            interval_ms: INTERVAL.as_millis() as u64,
            kept_ms: KEPT.as_millis() as u64,
            since: since.to_string(),
            points,
            alerts,
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

    #[test]
    fn latencies_are_bounded_and_taken_once() {
        let l = Latencies::default();
        for i in 0..(LATENCIES as u64 + 100) {
            l.observe(i as f64);
        }
        let (seen, kept) = l.take();
        assert_eq!((seen, kept.len()), (LATENCIES as u64 + 100, LATENCIES));
        assert_eq!(l.take(), (0, vec![]));
    }

    #[test]
    fn the_ring_keeps_an_hour_of_samples() {
        let r = Recorder::default();
        for t in 0..(POINTS as u64 + 3) {
            r.push(HistoryPoint {
                time_ms: t,
                queued: 0,
                creates: 0,
                create_p50_ms: None,
                create_p99_ms: None,
                node_cpu: Default::default(),
            });
        }
        let points = r.points.lock().unwrap_or_else(PoisonError::into_inner);
        assert_eq!(points.len(), POINTS);
        assert_eq!(points.front().map(|p| p.time_ms), Some(3));
    }
}

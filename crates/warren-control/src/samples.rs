//! What the history (`crate::history`) keeps, bounded: the latencies of
//! the creates answered since the last sample, and the last hour of
//! samples and alert events, in memory.

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rand::Rng;
use warren_core::history::HistoryPoint;
use warren_core::Event;

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
    pub fn take(&self) -> (u64, Vec<f64>) {
        let r = std::mem::take(&mut *self.0.lock().unwrap_or_else(PoisonError::into_inner));
        (r.seen, r.kept)
    }
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The samples and alerts, oldest first.
#[derive(Default)]
pub struct Recorder {
    points: Mutex<VecDeque<HistoryPoint>>,
    /// Each with its time (Unix ms), in the order they were written.
    alerts: Mutex<VecDeque<(u64, Event)>>,
}

impl Recorder {
    pub fn push(&self, p: HistoryPoint) {
        let mut points = self.points.lock().unwrap_or_else(PoisonError::into_inner);
        if points.len() == POINTS {
            points.pop_front();
        }
        points.push_back(p);
    }

    /// Keeps an alert event that happened at `at` (Unix ms); one older
    /// than what is kept is dropped.
    pub fn alert(&self, at: u64, ev: Event) {
        let oldest = now_ms().saturating_sub(KEPT.as_millis() as u64);
        if at < oldest {
            return;
        }
        let mut alerts = self.alerts.lock().unwrap_or_else(PoisonError::into_inner);
        alerts.retain(|(t, _)| *t >= oldest);
        if alerts.len() == ALERTS {
            alerts.pop_front();
        }
        alerts.push_back((at, ev));
    }

    /// The samples taken at `from` (Unix ms) or later.
    pub fn points_since(&self, from: u64) -> Vec<HistoryPoint> {
        let points = self.points.lock().unwrap_or_else(PoisonError::into_inner);
        points
            .iter()
            .filter(|p| p.time_ms >= from)
            .cloned()
            .collect()
    }

    /// The alert events of `from` (Unix ms) or later.
    pub fn alerts_since(&self, from: u64) -> Vec<Event> {
        let alerts = self.alerts.lock().unwrap_or_else(PoisonError::into_inner);
        alerts
            .iter()
            .filter(|(t, _)| *t >= from)
            .map(|(_, ev)| ev.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let kept = r.points_since(0);
        assert_eq!(kept.len(), POINTS);
        assert_eq!(kept.first().map(|p| p.time_ms), Some(3));
        assert_eq!(r.points_since(POINTS as u64 + 2).len(), 1);
    }

    #[test]
    fn alerts_older_than_an_hour_are_not_kept() {
        let r = Recorder::default();
        let ev = |seq| Event {
            seq,
            time: String::new(),
            sandbox_id: String::new(),
            kind: "node".into(),
            state: None,
            reason: "node_cpu_saturated".into(),
            message: String::new(),
        };
        let now = now_ms();
        r.alert(now - KEPT.as_millis() as u64 - 1000, ev(1));
        r.alert(now - 1000, ev(2));
        let seqs: Vec<i64> = r.alerts_since(0).iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [2]);
        assert!(r.alerts_since(now).is_empty());
    }
}

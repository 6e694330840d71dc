//! The fleet over a window of time (`GET /v1/fleet`): sandboxes grouped by
//! the values of one label, each group counted by state (while a sandbox
//! lives) or by how it ended, with its success rate and what it used
//! against what it asked for.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::state::{reason, SandboxState};
use crate::Usage;

/// How a sandbox that has ended ended. Failures are what a batch counts as
/// failed: a failed create or init, an OOM kill, a non-zero exit, a lost
/// node, a preemption; every other end (its command exited 0, it was
/// deleted, its TTL ran out) is a success.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Succeeded,
    Failed,
    OomKilled,
    Lost,
    Preempted,
}

impl Outcome {
    /// How a sandbox in `state`, which got there for `why` with
    /// `exit_code`, ended; None while it has not.
    pub fn of(state: SandboxState, why: &str, exit_code: Option<i32>) -> Option<Outcome> {
        state
            .is_final()
            .then(|| Outcome::judge(state, why, exit_code))
    }

    /// How a sandbox fares so far, ended or not (a kept sandbox whose
    /// command was OOM-killed has failed already).
    pub fn judge(state: SandboxState, why: &str, exit_code: Option<i32>) -> Outcome {
        match state {
            SandboxState::Lost => Outcome::Lost,
            SandboxState::Preempted => Outcome::Preempted,
            _ if why == reason::OOM_KILLED => Outcome::OomKilled,
            SandboxState::Failed => Outcome::Failed,
            _ if why == reason::INIT_DIED || exit_code.is_some_and(|c| c != 0) => Outcome::Failed,
            _ => Outcome::Succeeded,
        }
    }

    /// Whether a sandbox that ended so is among a batch's failures.
    pub fn is_failure(self) -> bool {
        self != Outcome::Succeeded
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Succeeded => "succeeded",
            Outcome::Failed => "failed",
            Outcome::OomKilled => "oom_killed",
            Outcome::Lost => "lost",
            Outcome::Preempted => "preempted",
        }
    }

    pub const ALL: [Outcome; 5] = [
        Outcome::Succeeded,
        Outcome::Failed,
        Outcome::OomKilled,
        Outcome::Lost,
        Outcome::Preempted,
    ];
}

/// The fleet's columns, in order: each state a sandbox lives in, then each
/// way it can end.
pub fn columns() -> Vec<&'static str> {
    SandboxState::ALL
        .into_iter()
        .filter(|s| !s.is_final())
        .map(SandboxState::as_str)
        .chain(Outcome::ALL.into_iter().map(Outcome::as_str))
        .collect()
}

/// The column a sandbox counts in: its state while it lives, how it ended
/// once it has.
pub fn column(state: SandboxState, why: &str, exit_code: Option<i32>) -> &'static str {
    match Outcome::of(state, why, exit_code) {
        Some(o) => o.as_str(),
        None => state.as_str(),
    }
}

/// The longest window the fleet is asked over.
pub const MAX_WINDOW: Duration = Duration::from_secs(30 * 86_400);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WindowError {
    #[error("window {0:?}: write a duration such as 15m, 1h, 6h or 24h")]
    Unreadable(String),
    #[error("window {0:?}: it must be longer than zero and at most 30d")]
    OutOfRange(String),
}

/// A window `since` (e.g. `1h`): how far back ended sandboxes count.
pub fn parse_window(since: &str) -> Result<Duration, WindowError> {
    let d = crate::quantity::parse_duration(since)
        .map_err(|_| WindowError::Unreadable(since.to_string()))?;
    if d.is_zero() || d > MAX_WINDOW {
        return Err(WindowError::OutOfRange(since.to_string()));
    }
    Ok(d)
}

/// CPU: the sum over a group's measured sandboxes of each one's mean use
/// over its life, against the sum of their requests and limits
/// (millicores).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CpuFigures {
    pub used_millis: u64,
    pub request_millis: u64,
    pub limit_millis: u64,
}

/// Memory: the sum over a group's measured sandboxes of each one's peak,
/// against the sum of their requests and limits (bytes).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct MemoryFigures {
    pub used_bytes: u64,
    pub request_bytes: u64,
    pub limit_bytes: u64,
}

/// One row of the fleet: the sandboxes of one label value (or of none).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct FleetGroup {
    /// The label's value; absent on the unlabelled, other and total rows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    pub sandboxes: u64,
    /// Sandboxes per column (see [`columns`]); a column with none is left out.
    pub counts: BTreeMap<String, u64>,
    /// Those that ended within the window, and those of them that succeeded.
    pub ended: u64,
    pub succeeded: u64,
    /// `succeeded / ended`; absent while none has ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub success_rate: Option<f64>,
    /// Sandboxes with a usage reading (the figures below are theirs): a
    /// queued sandbox, or one whose create failed, has none.
    pub measured: u64,
    pub cpu: CpuFigures,
    pub memory: MemoryFigures,
    /// CFS periods, and those in which a sandbox hit its CPU limit.
    pub cpu_periods: u64,
    pub cpu_throttled_periods: u64,
    /// `cpu_throttled_periods / cpu_periods`; absent without periods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throttled: Option<f64>,
    /// CPU time used (seconds) and memory held over time (GB-seconds).
    pub cpu_seconds: f64,
    pub memory_gb_seconds: f64,
}

/// A sandbox's mean CPU rate over its life (millicores): its CPU time over
/// its run time. The sampler's own mean misses a sandbox that ended
/// between two readings; with no run time yet, that mean is all there is.
fn mean_cpu_millis(u: &Usage) -> u64 {
    match u.runtime_ms {
        0 => u.cpu_millis_mean,
        ms => u.cpu_usage_ns / 1000 / ms,
    }
}

/// What a sandbox adds to a group: where it counts, what it asked for, and
/// its usage (live: as its node reads it now; ended: as it ended).
pub struct Member<'a> {
    pub column: &'static str,
    pub outcome: Option<Outcome>,
    pub cpu_request_millis: u64,
    pub cpu_limit_millis: u64,
    pub memory_request: u64,
    pub memory_limit: u64,
    pub usage: Option<&'a Usage>,
}

impl FleetGroup {
    pub fn add(&mut self, m: &Member<'_>) {
        self.sandboxes += 1;
        *self.counts.entry(m.column.to_string()).or_insert(0) += 1;
        if let Some(o) = m.outcome {
            self.ended += 1;
            self.succeeded += u64::from(o == Outcome::Succeeded);
        }
        if let Some(u) = m.usage {
            self.measured += 1;
            self.cpu.used_millis += mean_cpu_millis(u);
            self.cpu.request_millis += m.cpu_request_millis;
            self.cpu.limit_millis += m.cpu_limit_millis;
            self.memory.used_bytes += u.memory_peak_bytes;
            self.memory.request_bytes += m.memory_request;
            self.memory.limit_bytes += m.memory_limit;
            self.cpu_periods += u.cpu_periods;
            self.cpu_throttled_periods += u.cpu_throttled_periods;
            self.cpu_seconds += u.cpu_usage_ns as f64 / 1e9;
            self.memory_gb_seconds += u.memory_byte_seconds as f64 / 1e9;
        }
    }

    /// Works out the ratios once every member is in.
    pub fn finish(&mut self) {
        self.success_rate = (self.ended > 0).then(|| self.succeeded as f64 / self.ended as f64);
        self.throttled = (self.cpu_periods > 0)
            .then(|| self.cpu_throttled_periods as f64 / self.cpu_periods as f64);
    }
}

/// The answer of `GET /v1/fleet`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Fleet {
    /// The label key the sandboxes are grouped by.
    pub key: String,
    /// The window as asked (e.g. `1h`), and the time it reaches back to:
    /// sandboxes that ended at or after it count, and every one not ended.
    pub since: String,
    pub from: String,
    /// The columns of `counts`, in order.
    pub columns: Vec<String>,
    /// One row per value of the key, by value.
    pub groups: Vec<FleetGroup>,
    /// Sandboxes without the key.
    pub unlabelled: FleetGroup,
    /// Sandboxes of values past the first [`MAX_GROUPS`] met (live ones
    /// first, by id; then ended ones, by end time), together (absent when
    /// there are none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub other: Option<FleetGroup>,
    /// Every sandbox of the answer.
    pub total: FleetGroup,
}

/// The most label values an answer has a row for each.
pub const MAX_GROUPS: usize = 500;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_follow_state_reason_and_exit_code() {
        use SandboxState::*;
        assert_eq!(Outcome::of(Running, "ready", None), None);
        assert_eq!(Outcome::of(Kept, reason::OOM_KILLED, None), None);
        assert_eq!(
            Outcome::judge(Kept, reason::OOM_KILLED, None),
            Outcome::OomKilled
        );
        assert_eq!(
            Outcome::of(Destroyed, reason::MAIN_EXITED, Some(0)),
            Some(Outcome::Succeeded)
        );
        assert_eq!(
            Outcome::of(Destroyed, reason::USER_DELETED, None),
            Some(Outcome::Succeeded)
        );
        assert_eq!(
            Outcome::of(Destroyed, reason::MAIN_EXITED, Some(3)),
            Some(Outcome::Failed)
        );
        assert_eq!(
            Outcome::of(Destroyed, reason::INIT_DIED, None),
            Some(Outcome::Failed)
        );
        assert_eq!(
            Outcome::of(Failed, reason::CREATE_FAILED, None),
            Some(Outcome::Failed)
        );
        assert_eq!(
            Outcome::of(Destroyed, reason::OOM_KILLED, Some(137)),
            Some(Outcome::OomKilled)
        );
        assert_eq!(
            Outcome::of(Lost, reason::NODE_LOST, None),
            Some(Outcome::Lost)
        );
        assert_eq!(
            Outcome::of(Preempted, reason::PREEMPTED, None),
            Some(Outcome::Preempted)
        );
        assert_eq!(column(Queued, reason::QUEUED, None), "queued");
        assert_eq!(
            columns(),
            [
                "queued",
                "creating",
                "running",
                "paused",
                "stopping",
                "kept",
                "succeeded",
                "failed",
                "oom_killed",
                "lost",
                "preempted"
            ]
        );
    }

    #[test]
    fn a_group_sums_its_members_and_rates_its_ends() {
        let usage = Usage {
            runtime_ms: 15_000,
            memory_peak_bytes: 10,
            cpu_periods: 100,
            cpu_throttled_periods: 25,
            cpu_usage_ns: 3_000_000_000,
            memory_byte_seconds: 2_000_000_000,
            ..Default::default()
        };
        let member = |column, outcome, usage| Member {
            column,
            outcome,
            cpu_request_millis: 100,
            cpu_limit_millis: 1000,
            memory_request: 16,
            memory_limit: 32,
            usage,
        };
        let mut g = FleetGroup::default();
        g.add(&member("succeeded", Some(Outcome::Succeeded), Some(&usage)));
        g.add(&member(
            "oom_killed",
            Some(Outcome::OomKilled),
            Some(&usage),
        ));
        g.add(&member("queued", None, None));
        g.finish();
        assert_eq!(
            (g.sandboxes, g.ended, g.succeeded, g.measured),
            (3, 2, 1, 2)
        );
        assert_eq!(g.success_rate, Some(0.5));
        assert_eq!(g.throttled, Some(0.25));
        assert_eq!(
            g.cpu,
            CpuFigures {
                used_millis: 400,
                request_millis: 200,
                limit_millis: 2000
            }
        );
        assert_eq!(g.memory.used_bytes, 20);
        assert_eq!((g.cpu_seconds, g.memory_gb_seconds), (6.0, 4.0));
        assert_eq!(g.counts["queued"], 1);
    }

    #[test]
    fn windows_are_checked() {
        assert_eq!(parse_window("1h"), Ok(Duration::from_secs(3600)));
        assert!(matches!(
            parse_window("0s"),
            Err(WindowError::OutOfRange(_))
        ));
        assert!(matches!(
            parse_window("31d"),
            Err(WindowError::OutOfRange(_))
        ));
        assert!(matches!(
            parse_window("soon"),
            Err(WindowError::Unreadable(_))
        ));
    }
}

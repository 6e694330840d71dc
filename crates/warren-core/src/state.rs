//! Sandbox states and the reasons for moving between them.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SandboxState {
    Queued,
    Creating,
    Running,
    Paused,
    Stopping,
    Destroyed,
    Failed,
    Kept,
    Lost,
    /// Ended to give its capacity back to a tenant below its fair share
    /// (it ran on capacity its tenant borrowed).
    Preempted,
}

impl SandboxState {
    pub const ALL: [SandboxState; 10] = [
        SandboxState::Queued,
        SandboxState::Creating,
        SandboxState::Running,
        SandboxState::Paused,
        SandboxState::Stopping,
        SandboxState::Destroyed,
        SandboxState::Failed,
        SandboxState::Kept,
        SandboxState::Lost,
        SandboxState::Preempted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SandboxState::Queued => "queued",
            SandboxState::Creating => "creating",
            SandboxState::Running => "running",
            SandboxState::Paused => "paused",
            SandboxState::Stopping => "stopping",
            SandboxState::Destroyed => "destroyed",
            SandboxState::Failed => "failed",
            SandboxState::Kept => "kept",
            SandboxState::Lost => "lost",
            SandboxState::Preempted => "preempted",
        }
    }

    /// Whether the sandbox holds resources on its node.
    pub fn is_live(self) -> bool {
        matches!(
            self,
            SandboxState::Creating
                | SandboxState::Running
                | SandboxState::Paused
                | SandboxState::Stopping
                | SandboxState::Kept
        )
    }

    pub fn is_final(self) -> bool {
        matches!(
            self,
            SandboxState::Destroyed
                | SandboxState::Failed
                | SandboxState::Lost
                | SandboxState::Preempted
        )
    }
}

impl fmt::Display for SandboxState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is no [`SandboxState`]'s; the message lists them all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown state {0:?}: expected one of {names}", names = state_names())]
pub struct UnknownState(pub String);

fn state_names() -> String {
    let names: Vec<&str> = SandboxState::ALL.iter().map(|s| s.as_str()).collect();
    names.join(", ")
}

impl FromStr for SandboxState {
    type Err = UnknownState;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SandboxState::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| UnknownState(s.to_string()))
    }
}

/// Why a sandbox changed state. Kept as text on the wire so that new reasons
/// do not break old clients.
pub mod reason {
    pub const CREATED: &str = "created";
    /// Made by a fork of another sandbox (its first event; the source
    /// gets one too, naming its children).
    pub const FORKED: &str = "forked";
    pub const QUEUED: &str = "queued";
    pub const ADMITTED: &str = "admitted";
    pub const READY: &str = "ready";
    pub const MAIN_EXITED: &str = "main_exited";
    pub const USER_DELETED: &str = "user_deleted";
    /// Made by `POST /v1/run` for one command, which has ended.
    pub const RUN_ENDED: &str = "run_ended";
    /// A warm pool's ready sandbox removed: the pool shrank, was removed,
    /// or gave memory back under pressure.
    pub const POOL_SHRUNK: &str = "pool_shrunk";
    pub const TTL_EXPIRED: &str = "ttl_expired";
    pub const LEASE_EXPIRED: &str = "lease_expired";
    pub const KEEP_EXPIRED: &str = "keep_expired";
    pub const PAUSED: &str = "paused";
    pub const RESUMED: &str = "resumed";
    pub const OOM_KILLED: &str = "oom_killed";
    pub const INIT_DIED: &str = "init_died";
    pub const CREATE_FAILED: &str = "create_failed";
    pub const NODE_LOST: &str = "node_lost";
    /// Ended for a tenant that took back its fair share (issue 43).
    pub const PREEMPTED: &str = "preempted";
    /// Still on a drained node at its drain's deadline.
    pub const NODE_DRAINED: &str = "node_drained";
    pub const SHUTDOWN: &str = "shutdown";
    /// Its writable layer outgrew its disk limit, or the node's disk ran
    /// low and it wrote the most.
    pub const DISK_EXCEEDED: &str = "disk_exceeded";
    /// The host's available memory fell under the node's floor and it used
    /// the most above its memory request.
    pub const MEMORY_PRESSURE: &str = "memory_pressure";
    /// Its stored record could not be read (see the store's recovery).
    pub const CORRUPT_RECORD: &str = "corrupt_record";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_state_lists_the_known_ones() {
        assert_eq!("running".parse::<SandboxState>(), Ok(SandboxState::Running));
        let e = "runing".parse::<SandboxState>().expect_err("no such state");
        assert_eq!(e, UnknownState("runing".into()));
        assert_eq!(
            e.to_string(),
            r#"unknown state "runing": expected one of queued, creating, running, paused, stopping, destroyed, failed, kept, lost, preempted"#
        );
    }
}

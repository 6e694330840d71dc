//! `POST /v1/run`: a sandbox made for one command and removed after it, in
//! one request (what `warren run --rm` sends): no polling, no second call.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::exec::ExecEvent;
use crate::spec::{Dur, SandboxSpec};
use crate::state::SandboxState;

/// What to run: the sandbox's spec, whose `cmd` is the command (required),
/// and what that command reads.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunRequest {
    pub spec: SandboxSpec,
    /// The command's whole stdin, base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
    /// Kills the command (and with it the sandbox) after this long.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Dur>,
}

/// Where the run's sandbox stands: `queued` (with its place) while it waits
/// for capacity, then `running` once the command starts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RunSandbox {
    pub id: String,
    pub state: SandboxState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_position: Option<usize>,
    /// Why it waits (see `SandboxInfo::waiting_for`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<String>,
}

/// One line of the run stream: the sandbox's state as it changes, then the
/// command's exec events (start, output, exit).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum RunEvent {
    Sandbox { sandbox: RunSandbox },
    Exec(ExecEvent),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_read_back_by_shape() {
        let lines = [
            r#"{"sandbox":{"id":"sbx-1","state":"queued","queue_position":3}}"#,
            r#"{"type":"stdout","data":"aGk="}"#,
            r#"{"type":"exit","code":0,"timed_out":false,"duration_ms":2}"#,
        ];
        let evs: Vec<RunEvent> = lines
            .iter()
            .map(|l| serde_json::from_str(l).expect(l))
            .collect();
        assert!(
            matches!(&evs[0], RunEvent::Sandbox { sandbox } if sandbox.queue_position == Some(3))
        );
        assert!(matches!(&evs[1], RunEvent::Exec(ExecEvent::Stdout { .. })));
        for (ev, line) in evs.iter().zip(lines) {
            let again: RunEvent =
                serde_json::from_str(&serde_json::to_string(ev).unwrap()).unwrap();
            assert_eq!(&again, ev, "{line}");
        }
        assert!(serde_json::from_str::<RunRequest>(r#"{"spec":{"image":"a"},"bogus":1}"#).is_err());
    }
}

//! The exec request and the NDJSON event stream it returns.

use std::collections::BTreeMap;

use base64::Engine;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::spec::{validate_args_size, validate_cmd, validate_cwd, validate_env, Dur, SpecError};

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    pub cmd: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Bytes for the process's stdin, base64; stdin is closed after them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
    /// Kill the exec's whole process tree after this long.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Dur>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Keep stdin open after `stdin`: more is sent while the exec runs
    /// (`POST /v1/sandboxes/{id}/execs/{exec_id}/stdin`) until a send
    /// closes it or the exec's stream ends.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stdin_open: bool,
}

impl ExecRequest {
    pub fn validate(&self) -> Result<Option<Vec<u8>>, ExecRequestError> {
        validate_cmd(&self.cmd)?;
        validate_env(&self.env)?;
        if let Some(cwd) = &self.cwd {
            validate_cwd(cwd)?;
        }
        validate_args_size(Some(&self.cmd), &self.env, self.cwd.as_deref())?;
        if self.timeout.is_some_and(|t| t.0.is_zero()) {
            return Err(ExecRequestError::ZeroTimeout);
        }
        self.stdin
            .as_ref()
            .map(|s| base64::engine::general_purpose::STANDARD.decode(s))
            .transpose()
            .map_err(|_| ExecRequestError::Stdin)
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ExecRequestError {
    #[error("{0}")]
    Spec(#[from] SpecError),
    #[error("stdin must be base64-encoded bytes")]
    Stdin,
    #[error("timeout must be greater than zero")]
    ZeroTimeout,
}

/// One line of the exec stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ExecEvent {
    Start {
        exec_id: String,
        /// PID inside the sandbox.
        pid: i32,
    },
    Stdout {
        /// base64
        data: String,
    },
    Stderr {
        /// base64
        data: String,
    },
    Exit {
        /// Exit code; 128+N when killed by signal N, as a shell reports it.
        code: i32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signal: Option<i32>,
        #[serde(default)]
        timed_out: bool,
        duration_ms: u64,
    },
    Keepalive,
    Error {
        message: String,
    },
}

impl ExecEvent {
    pub fn output(stderr: bool, bytes: &[u8]) -> ExecEvent {
        let data = base64::engine::general_purpose::STANDARD.encode(bytes);
        if stderr {
            ExecEvent::Stderr { data }
        } else {
            ExecEvent::Stdout { data }
        }
    }

    /// Decoded output bytes of a stdout/stderr event.
    pub fn output_bytes(&self) -> Option<Vec<u8>> {
        match self {
            ExecEvent::Stdout { data } | ExecEvent::Stderr { data } => {
                base64::engine::general_purpose::STANDARD.decode(data).ok()
            }
            _ => None,
        }
    }
}

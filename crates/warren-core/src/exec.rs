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
    /// Run the command on a new pseudo-terminal of the sandbox (its
    /// controlling terminal, on stdin, stdout and stderr): output arrives
    /// as `stdout` events only, stdin goes to the terminal, and the window
    /// can be resized while it runs.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tty: bool,
    /// The terminal's initial height in rows (with `tty`; default 24).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<u16>,
    /// The terminal's initial width in columns (with `tty`; default 80).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cols: Option<u16>,
}

impl ExecRequest {
    pub fn validate(&self) -> Result<Option<Vec<u8>>, ExecRequestError> {
        validate_cmd(&self.cmd)?;
        validate_env(&self.env)?;
        if let Some(cwd) = &self.cwd {
            validate_cwd(cwd)?;
        }
        validate_args_size(Some(&self.cmd), &self.env, self.cwd.as_deref())?;
        if self.timeout.is_some_and(|t| t.get().is_zero()) {
            return Err(ExecRequestError::ZeroTimeout);
        }
        if !self.tty && (self.rows.is_some() || self.cols.is_some()) {
            return Err(ExecRequestError::SizeWithoutTty);
        }
        if self.tty {
            self.window_size().validate()?;
        }
        self.stdin
            .as_ref()
            .map(|s| base64::engine::general_purpose::STANDARD.decode(s))
            .transpose()
            .map_err(|_| ExecRequestError::Stdin)
    }
}

impl ExecRequest {
    /// The terminal's size at start (meaningful with `tty`).
    pub fn window_size(&self) -> WindowSize {
        WindowSize {
            rows: self.rows.unwrap_or(WindowSize::DEFAULT.rows),
            cols: self.cols.unwrap_or(WindowSize::DEFAULT.cols),
        }
    }
}

/// A terminal's size: the body of `POST .../execs/{exec_id}/resize`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WindowSize {
    pub rows: u16,
    pub cols: u16,
}

impl WindowSize {
    /// What a terminal without a size of its own is taken to be.
    pub const DEFAULT: WindowSize = WindowSize { rows: 24, cols: 80 };

    pub fn validate(&self) -> Result<(), ExecRequestError> {
        if self.rows == 0 || self.cols == 0 {
            return Err(ExecRequestError::ZeroSize);
        }
        Ok(())
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
    #[error("rows and cols size a terminal: they need \"tty\": true")]
    SizeWithoutTty,
    #[error("a terminal needs at least 1 row and 1 column")]
    ZeroSize,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn req(json: &str) -> Result<ExecRequest, serde_json::Error> {
        serde_json::from_str(json)
    }

    #[test]
    fn a_terminal_has_a_size_and_only_a_terminal_does() {
        let tty = req(r#"{"cmd":["sh"],"tty":true,"rows":40,"cols":120}"#).unwrap();
        assert_eq!(tty.validate(), Ok(None));
        assert_eq!(
            tty.window_size(),
            WindowSize {
                rows: 40,
                cols: 120
            }
        );
        let default = req(r#"{"cmd":["sh"],"tty":true}"#).unwrap();
        assert_eq!(default.window_size(), WindowSize::DEFAULT);
        let sized = req(r#"{"cmd":["sh"],"rows":40}"#).unwrap();
        assert_eq!(sized.validate(), Err(ExecRequestError::SizeWithoutTty));
        let zero = req(r#"{"cmd":["sh"],"tty":true,"cols":0}"#).unwrap();
        assert_eq!(zero.validate(), Err(ExecRequestError::ZeroSize));
        assert!(req(r#"{"cmd":["sh"],"tty":true,"rows":70000}"#).is_err());
        // Serialized without the terminal fields when there is none.
        let plain = serde_json::to_string(&ExecRequest {
            cmd: vec!["true".into()],
            ..Default::default()
        })
        .unwrap();
        assert!(!plain.contains("tty"), "{plain}");
    }

    #[test]
    fn a_window_size_is_two_positive_numbers() {
        let s: WindowSize = serde_json::from_str(r#"{"rows":50,"cols":132}"#).unwrap();
        assert_eq!(s.validate(), Ok(()));
        let z: WindowSize = serde_json::from_str(r#"{"rows":0,"cols":132}"#).unwrap();
        assert_eq!(z.validate(), Err(ExecRequestError::ZeroSize));
        assert!(serde_json::from_str::<WindowSize>(r#"{"rows":1,"cols":1,"x":1}"#).is_err());
        assert!(serde_json::from_str::<WindowSize>(r#"{"rows":1}"#).is_err());
    }
}

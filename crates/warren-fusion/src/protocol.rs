//! SandboxFusion's wire types (`sandbox/server/sandbox_api.py`,
//! `sandbox/runners/types.py` in bytedance/SandboxFusion) and its status
//! rules (`parse_run_status`). Field names and casing are theirs
//! (`memory_limit_MB`), since clients send and read them verbatim.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A request as clients send it. SandboxFusion requires `language`; verl's
/// tutorial tool sends only `code`, so here every field but `code` is
/// optional and `language` defaults to python.
#[derive(Debug, Clone, Deserialize)]
pub struct RunCodeRequest {
    pub code: String,
    #[serde(default)]
    pub language: Option<String>,
    #[serde(default)]
    pub compile_timeout: Option<f64>,
    #[serde(default)]
    pub run_timeout: Option<f64>,
    #[serde(default, rename = "memory_limit_MB")]
    pub memory_limit_mb: Option<i64>,
    #[serde(default)]
    pub stdin: Option<String>,
    /// Relative path → base64 content; a null content is skipped, as
    /// SandboxFusion's `restore_files` does.
    #[serde(default)]
    pub files: Option<BTreeMap<String, Option<String>>>,
    #[serde(default)]
    pub fetch_files: Option<Vec<String>>,
}

/// SandboxFusion's defaults (`RunCodeRequest` in `sandbox_api.py`).
pub const DEFAULT_TIMEOUT_SECS: f64 = 10.0;

/// `POST /run_jupyter`: cells run in order in one Python kernel.
#[derive(Debug, Clone, Deserialize)]
pub struct RunJupyterRequest {
    pub cells: Vec<String>,
    /// Seconds for each cell; 0 (the default) for no limit of its own.
    #[serde(default)]
    pub cell_timeout: Option<f64>,
    /// Seconds for all of them (default 45).
    #[serde(default)]
    pub total_timeout: Option<f64>,
    #[serde(default)]
    pub kernel: Option<String>,
    #[serde(default, rename = "memory_limit_MB")]
    pub memory_limit_mb: Option<i64>,
    #[serde(default)]
    pub files: Option<BTreeMap<String, Option<String>>>,
    #[serde(default)]
    pub fetch_files: Option<Vec<String>>,
}

/// SandboxFusion's default `total_timeout` (`RunJupyterRequest`).
pub const DEFAULT_JUPYTER_TOTAL_SECS: f64 = 45.0;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunJupyterResponse {
    pub status: RunStatus,
    pub message: String,
    /// The driver that ran the kernel, as a step.
    pub driver: Option<CommandRunResult>,
    /// Per cell: `stdout`, `stderr`, `display` (mime type → data),
    /// `error` (`ename`, `evalue`, `traceback`), as the driver wrote them.
    pub cells: Vec<serde_json::Value>,
    pub executor_pod_name: Option<String>,
    pub files: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum RunStatus {
    Success,
    Failed,
    SandboxError,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum CommandRunStatus {
    Finished,
    Error,
    TimeLimitExceeded,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CommandRunResult {
    pub status: CommandRunStatus,
    pub execution_time: Option<f64>,
    pub return_code: Option<i32>,
    pub stdout: Option<String>,
    pub stderr: Option<String>,
}

impl CommandRunResult {
    /// A step the sandbox could not run (SandboxFusion's `Error`: its
    /// message travels in `stderr`, which `parse_run_status` reports).
    pub fn error(message: impl Into<String>) -> Self {
        CommandRunResult {
            status: CommandRunStatus::Error,
            execution_time: None,
            return_code: None,
            stdout: None,
            stderr: Some(message.into()),
        }
    }

    /// Whether the next step may run (SandboxFusion runs the program only
    /// after a compile that finished with 0).
    pub fn succeeded(&self) -> bool {
        self.status == CommandRunStatus::Finished && self.return_code == Some(0)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunCodeResponse {
    pub status: RunStatus,
    pub message: String,
    pub compile_result: Option<CommandRunResult>,
    pub run_result: Option<CommandRunResult>,
    pub executor_pod_name: Option<String>,
    pub files: BTreeMap<String, String>,
}

impl RunCodeResponse {
    /// The answer for a request the sandbox side could not serve at all.
    pub fn sandbox_error(message: impl Into<String>) -> Self {
        RunCodeResponse {
            status: RunStatus::SandboxError,
            message: message.into(),
            compile_result: None,
            run_result: None,
            executor_pod_name: None,
            files: BTreeMap::new(),
        }
    }

    /// The answer for the steps that ran, with SandboxFusion's status.
    pub fn from_steps(
        compile_result: Option<CommandRunResult>,
        run_result: Option<CommandRunResult>,
        files: BTreeMap<String, String>,
    ) -> Self {
        let (status, message) = run_status(compile_result.as_ref(), run_result.as_ref());
        RunCodeResponse {
            status,
            message,
            compile_result,
            run_result,
            executor_pod_name: None,
            files,
        }
    }
}

/// `parse_run_status`: a step in `Error` makes a `SandboxError` (its
/// stderr is the message); else any time-out or any non-zero return code
/// makes `Failed`; else `Success`. The message is empty unless
/// `SandboxError`.
pub fn run_status(
    compile: Option<&CommandRunResult>,
    run: Option<&CommandRunResult>,
) -> (RunStatus, String) {
    let steps: Vec<&CommandRunResult> = compile.into_iter().chain(run).collect();
    if let Some(e) = steps.iter().find(|s| s.status == CommandRunStatus::Error) {
        return (
            RunStatus::SandboxError,
            e.stderr.clone().unwrap_or_default(),
        );
    }
    let failed = steps.iter().any(|s| {
        s.status == CommandRunStatus::TimeLimitExceeded || s.return_code.is_some_and(|c| c != 0)
    });
    if failed {
        (RunStatus::Failed, String::new())
    } else {
        (RunStatus::Success, String::new())
    }
}

/// What was wrong with a request, answered 422 in FastAPI's shape
/// (`{"detail": [{"type", "loc", "msg", "input"}]}`), which is what
/// SandboxFusion's clients see for a request its model rejects.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field}: {msg}")]
pub struct Invalid {
    pub kind: &'static str,
    pub field: &'static str,
    pub msg: String,
    pub input: serde_json::Value,
}

impl Invalid {
    pub fn detail(&self) -> serde_json::Value {
        let loc: Vec<&str> = if self.field.is_empty() {
            vec!["body"]
        } else {
            vec!["body", self.field]
        };
        serde_json::json!({
            "detail": [{
                "type": self.kind,
                "loc": loc,
                "msg": self.msg,
                "input": self.input,
            }]
        })
    }
}

/// A timeout in seconds as SandboxFusion takes it (any float); Warren's
/// exec needs a positive, finite duration, so zero becomes one
/// millisecond (SandboxFusion's `wait_for(timeout=0)` times out at once).
pub fn timeout(field: &'static str, value: Option<f64>) -> Result<Duration, Invalid> {
    let secs = value.unwrap_or(DEFAULT_TIMEOUT_SECS);
    let bad = |msg: &str| Invalid {
        kind: "value_error",
        field,
        msg: msg.to_string(),
        input: serde_json::json!(secs),
    };
    if !secs.is_finite() || secs < 0.0 {
        return Err(bad("must be a finite, non-negative number of seconds"));
    }
    // Beyond a day an exec's timeout stops meaning anything; refusing it
    // also keeps the sandbox's TTL arithmetic far from overflow.
    if secs > 86_400.0 {
        return Err(bad("must be at most 86400 seconds (one day)"));
    }
    Ok(Duration::from_secs_f64(secs).max(Duration::from_millis(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(status: CommandRunStatus, rc: Option<i32>) -> CommandRunResult {
        CommandRunResult {
            status,
            execution_time: Some(0.1),
            return_code: rc,
            stdout: Some(String::new()),
            stderr: Some("boom".into()),
        }
    }

    #[test]
    fn status_rules_follow_sandbox_fusion() {
        use CommandRunStatus::*;
        let ok = step(Finished, Some(0));
        let bad = step(Finished, Some(1));
        let tle = step(TimeLimitExceeded, None);
        let err = step(Error, None);
        assert_eq!(run_status(None, Some(&ok)).0, RunStatus::Success);
        assert_eq!(run_status(Some(&ok), Some(&ok)).0, RunStatus::Success);
        assert_eq!(run_status(None, Some(&bad)).0, RunStatus::Failed);
        assert_eq!(run_status(Some(&bad), None).0, RunStatus::Failed);
        assert_eq!(
            run_status(None, Some(&tle)),
            (RunStatus::Failed, String::new())
        );
        assert_eq!(
            run_status(Some(&ok), Some(&err)),
            (RunStatus::SandboxError, "boom".to_string())
        );
        // An error wins over a time-out, as in parse_run_status.
        assert_eq!(
            run_status(Some(&tle), Some(&err)).0,
            RunStatus::SandboxError
        );
        assert_eq!(run_status(None, None).0, RunStatus::Success);
    }

    #[test]
    fn only_code_is_required() {
        let r: RunCodeRequest = serde_json::from_str(r#"{"code": "print(1)"}"#).unwrap();
        assert_eq!(r.code, "print(1)");
        assert!(r.language.is_none() && r.files.is_none());
        let r: RunCodeRequest = serde_json::from_str(
            r#"{"code": "x", "language": "cpp", "memory_limit_MB": 128, "stdin": null,
                "files": {"a.txt": "aGk=", "skip": null}, "fetch_files": ["out"],
                "compile_timeout": 2.5, "run_timeout": 1}"#,
        )
        .unwrap();
        assert_eq!(r.memory_limit_mb, Some(128));
        assert_eq!(r.files.unwrap().len(), 2);
        assert!(serde_json::from_str::<RunCodeRequest>(r#"{"language": "python"}"#).is_err());
    }

    #[test]
    fn timeouts() {
        assert_eq!(timeout("t", None).unwrap(), Duration::from_secs(10));
        assert_eq!(timeout("t", Some(0.0)).unwrap(), Duration::from_millis(1));
        assert_eq!(
            timeout("t", Some(1.5)).unwrap(),
            Duration::from_millis(1500)
        );
        assert!(timeout("t", Some(-1.0)).is_err());
        assert!(timeout("t", Some(f64::NAN)).is_err());
        assert!(timeout("t", Some(1e300)).is_err());
    }

    #[test]
    fn response_shape() {
        let r = RunCodeResponse::from_steps(
            None,
            Some(step(CommandRunStatus::TimeLimitExceeded, None)),
            BTreeMap::new(),
        );
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["status"], "Failed");
        assert_eq!(v["compile_result"], serde_json::Value::Null);
        assert_eq!(v["run_result"]["status"], "TimeLimitExceeded");
        assert_eq!(v["run_result"]["return_code"], serde_json::Value::Null);
        assert_eq!(v["executor_pod_name"], serde_json::Value::Null);
        assert_eq!(v["files"], serde_json::json!({}));
    }
}

//! `POST /run_jupyter`: the cells run, in order, in one Python kernel in a
//! fresh sandbox. As SandboxFusion does it (`sandbox/runners/jupyter.py`),
//! a driver script is the program: it reads the cells from a file beside
//! it, runs them and writes every cell's output to another file, which is
//! fetched back. The driver uses a real Jupyter kernel when the image has
//! one (jupyter_client and ipykernel) and a small kernel of its own
//! otherwise, so any image with python3 serves it.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine;

use crate::languages::PYTHON;
use crate::protocol::{
    timeout, CommandRunStatus, Invalid, RunCodeResponse, RunJupyterRequest, RunJupyterResponse,
    RunStatus, DEFAULT_JUPYTER_TOTAL_SECS,
};
use crate::run::Job;
use crate::Fusion;

const DRIVER: &str = include_str!("jupyter_driver.py");

/// Where the driver finds the cells and leaves their output, relative to
/// its directory (SandboxFusion's paths).
const INPUT: &str = "tmp/sandbox/configs/input.json";
const OUTPUT: &str = "tmp/sandbox/configs/output.json";

/// Beyond `total_timeout`, for starting the kernel and writing the output
/// (SandboxFusion gives its driver the same 10 s).
const DRIVER_GRACE: Duration = Duration::from_secs(10);

pub(crate) async fn run_jupyter(State(st): State<Arc<Fusion>>, body: bytes::Bytes) -> Response {
    let job = match parse(&body) {
        Ok(job) => job,
        Err(e) => return (StatusCode::UNPROCESSABLE_ENTITY, Json(e.detail())).into_response(),
    };
    match crate::run_job(&st, job).await {
        Ok(r) => Json(answer(r)).into_response(),
        Err(refusal) => refusal,
    }
}

/// The request as a job: the driver is the code, the cells its input.
pub(crate) fn parse(body: &[u8]) -> Result<Job, Invalid> {
    let req: RunJupyterRequest = serde_json::from_slice(body).map_err(|e| Invalid {
        kind: if e.is_data() {
            "value_error"
        } else {
            "json_invalid"
        },
        field: "",
        msg: format!(
            "{e}; the body must be a JSON object with at least \"cells\" (a list of code strings)"
        ),
        input: serde_json::Value::Null,
    })?;
    let kernel = req.kernel.unwrap_or_else(|| "python3".into());
    if kernel != "python3" {
        return Err(Invalid {
            kind: "literal_error",
            field: "kernel",
            msg: "Input should be 'python3'".into(),
            input: serde_json::json!(kernel),
        });
    }
    // 0, SandboxFusion's default and what its client sends, is no limit.
    let cell_timeout = match req.cell_timeout {
        None => 0.0,
        Some(0.0) => 0.0,
        Some(_) => timeout("cell_timeout", req.cell_timeout)?.as_secs_f64(),
    };
    let total = timeout(
        "total_timeout",
        Some(req.total_timeout.unwrap_or(DEFAULT_JUPYTER_TOTAL_SECS)),
    )?;
    let input = serde_json::json!({
        "kernel": kernel,
        "cells": req.cells,
        "cell_timeout": cell_timeout,
        "total_timeout": total.as_secs_f64(),
    });
    let mut files = crate::decode_files(req.files)?;
    files.push((INPUT.to_string(), input.to_string().into_bytes()));
    let mut fetch_files = req.fetch_files.unwrap_or_default();
    fetch_files.push(OUTPUT.to_string());
    Ok(Job {
        language: &PYTHON,
        code: DRIVER.to_string(),
        compile_timeout: Duration::ZERO,
        run_timeout: total + DRIVER_GRACE,
        memory_limit_mb: req.memory_limit_mb.unwrap_or(-1),
        stdin: None,
        files,
        fetch_files,
    })
}

/// SandboxFusion's `run_jupyter_handler`: a driver that did not finish, or
/// left no output, is `Failed` with no cells; else the output's status
/// decides, and the cells and fetched files are returned.
pub(crate) fn answer(r: RunCodeResponse) -> RunJupyterResponse {
    let mut out = RunJupyterResponse {
        status: RunStatus::Failed,
        message: String::new(),
        driver: r.run_result.clone(),
        cells: Vec::new(),
        executor_pod_name: None,
        files: Default::default(),
    };
    if r.status == RunStatus::SandboxError {
        out.status = RunStatus::SandboxError;
        out.message = r.message;
        return out;
    }
    let finished = r
        .run_result
        .as_ref()
        .is_some_and(|d| d.status == CommandRunStatus::Finished);
    let mut files = r.files;
    let Some(output) = files.remove(OUTPUT) else {
        return out;
    };
    if !finished {
        return out;
    }
    let parsed = base64::engine::general_purpose::STANDARD
        .decode(output.as_bytes())
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok());
    let Some(parsed) = parsed else {
        out.status = RunStatus::SandboxError;
        out.message = "the Jupyter driver's output could not be read".into();
        return out;
    };
    if parsed["status"] == "Finished" {
        out.status = RunStatus::Success;
        out.cells = parsed["cells"].as_array().cloned().unwrap_or_default();
        out.files = files;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::CommandRunResult;

    fn driver(status: CommandRunStatus) -> CommandRunResult {
        CommandRunResult {
            status,
            execution_time: Some(0.5),
            return_code: Some(0),
            stdout: Some("kernel: …\n".into()),
            stderr: Some(String::new()),
        }
    }

    fn response(output: Option<&str>, status: CommandRunStatus) -> RunCodeResponse {
        let mut files = std::collections::BTreeMap::new();
        if let Some(o) = output {
            files.insert(
                OUTPUT.to_string(),
                base64::engine::general_purpose::STANDARD.encode(o),
            );
        }
        files.insert("result.txt".into(), "aGk=".into());
        RunCodeResponse::from_steps(None, Some(driver(status)), files)
    }

    #[test]
    fn cells_and_files_of_a_finished_driver() {
        let r = answer(response(
            Some(
                r#"{"status":"Finished","cells":[{"stdout":"123\n","stderr":"","display":[],"error":[]}]}"#,
            ),
            CommandRunStatus::Finished,
        ));
        assert_eq!(r.status, RunStatus::Success);
        assert_eq!(r.cells[0]["stdout"], "123\n");
        assert_eq!(r.files.keys().collect::<Vec<_>>(), ["result.txt"]);
    }

    #[test]
    fn a_timed_out_driver_or_kernel_fails_without_cells() {
        let r = answer(response(None, CommandRunStatus::TimeLimitExceeded));
        assert_eq!(r.status, RunStatus::Failed);
        assert!(r.cells.is_empty() && r.files.is_empty());
        let r = answer(response(
            Some(r#"{"status":"TimeLimitExceeded","cells":[]}"#),
            CommandRunStatus::Finished,
        ));
        assert_eq!(r.status, RunStatus::Failed);
        let r = answer(response(None, CommandRunStatus::Finished));
        assert_eq!(r.status, RunStatus::Failed, "no output file");
    }

    #[test]
    fn requests() {
        let job = parse(br#"{"cells": ["print(1)"]}"#).unwrap();
        assert_eq!(job.run_timeout, Duration::from_secs(55));
        assert_eq!(job.fetch_files, [OUTPUT]);
        let (name, input) = job.files.last().unwrap();
        assert_eq!(name, INPUT);
        let input: serde_json::Value = serde_json::from_slice(input).unwrap();
        assert_eq!(input["cells"][0], "print(1)");
        assert_eq!(input["cell_timeout"], 0.0);
        let job = parse(br#"{"cells": ["1"], "cell_timeout": 0, "total_timeout": 2}"#).unwrap();
        let input: serde_json::Value = serde_json::from_slice(&job.files[0].1).unwrap();
        assert_eq!(input["cell_timeout"], 0.0, "0 is no limit, not 1 ms");
        assert_eq!(job.run_timeout, Duration::from_secs(12));
        let e = parse(br#"{"cells": ["1"], "kernel": "julia"}"#).unwrap_err();
        assert_eq!(e.field, "kernel");
        let e = parse(br#"{"code": "1"}"#).unwrap_err();
        assert!(e.msg.contains("cells"), "{e}");
        let e = parse(br#"{"cells": ["1"], "total_timeout": -3}"#).unwrap_err();
        assert_eq!(e.field, "total_timeout");
    }
}

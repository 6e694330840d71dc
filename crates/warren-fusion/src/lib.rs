//! SandboxFusion's HTTP protocol (`POST /run_code`, `GET /v1/ping`) on
//! Warren, so that verl's and SkyRL's reward code and the `sandbox-fusion`
//! client run unchanged: each call runs in a fresh sandbox of one
//! configured image, destroyed afterwards. Those clients send no token, so
//! by default it takes none (keep it on loopback, or set one: [`guard`]);
//! it refuses web pages of other origins and bodies that are not JSON.

#![forbid(unsafe_code)]

pub mod guard;
mod jupyter;
pub mod languages;
pub mod protocol;
pub mod run;

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine;
use warren_control::ControlCell;
use warren_core::tenant::{Principal, Role, TenantName};

use languages::{lookup, Lookup};
use protocol::{timeout, Invalid, RunCodeRequest, RunCodeResponse};
use run::{Job, Outcome};

/// Requests carry code and base64 files; SandboxFusion sets no limit of
/// its own, Warren's API takes uploads of this order.
const BODY_LIMIT: usize = 64 << 20;

pub(crate) struct Fusion {
    control: ControlCell,
    image: String,
    /// Whom its sandboxes are made for.
    owner: Principal,
}

/// The front door's routes, behind `guard`. While `control` is empty (a
/// server replica that does not lead) every call answers 503 with
/// `Retry-After`.
/// `tenant`: the tenant whose sandboxes the door makes (its quota, queue and
/// fair share count them); None: the operator's, the default tenant.
pub fn router(
    control: ControlCell,
    image: String,
    guard: guard::Guard,
    tenant: Option<TenantName>,
) -> Router {
    // The door has no token of a tenant's: its calls act for the tenant as
    // a user would, and the audit log names the door as the token.
    let owner = match tenant {
        Some(tenant) => Principal::Tenant {
            tenant,
            role: Role::User,
            token: "sandbox-fusion".into(),
        },
        None => Principal::Operator,
    };
    Router::new()
        .route("/run_code", post(run_code))
        .route("/run_jupyter", post(jupyter::run_jupyter))
        .route("/v1/ping", get(ping))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(axum::middleware::from_fn_with_state(guard, guard::layer))
        .with_state(Arc::new(Fusion {
            control,
            image,
            owner,
        }))
}

async fn ping() -> Json<&'static str> {
    Json("pong")
}

fn unavailable(message: String, retry_after_s: u64) -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [(header::RETRY_AFTER, retry_after_s.to_string())],
        Json(serde_json::json!({ "detail": message })),
    )
        .into_response()
}

async fn run_code(State(st): State<Arc<Fusion>>, body: bytes::Bytes) -> Response {
    let job = match parse(&body) {
        Ok(job) => job,
        Err(e) => return (StatusCode::UNPROCESSABLE_ENTITY, Json(e.detail())).into_response(),
    };
    match run_job(&st, job).await {
        Ok(r) => Json(r).into_response(),
        Err(refusal) => refusal,
    }
}

/// Runs a job in a sandbox of its own; Err is the answer for a call no
/// sandbox could be had for.
pub(crate) async fn run_job(st: &Fusion, job: Job) -> Result<RunCodeResponse, Response> {
    let Some(control) = st.control.get().cloned() else {
        return Err(unavailable(
            "this Warren server does not lead now; retry, or use the leading replica".into(),
            1,
        ));
    };
    // The call runs in a task of its own, so that a client that goes away
    // (which drops this future) cannot leave its sandbox behind: dropping
    // `_client` tells the task, which stops and destroys the sandbox.
    let (_client, gone) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(run::run(
        control,
        st.image.clone(),
        st.owner.clone(),
        job,
        gone,
    ));
    match task.await {
        Ok(Outcome::Answer(r)) => Ok(r),
        Ok(Outcome::Busy(e)) => Err(unavailable(
            format!("no sandbox could be had: {}", e.message),
            e.retry_after_ms.unwrap_or(1000).div_ceil(1000),
        )),
        Err(e) => Ok(RunCodeResponse::sandbox_error(format!("task: {e}"))),
    }
}

/// Checks a request and decodes what it carries.
pub fn parse(body: &[u8]) -> Result<Job, Invalid> {
    let req: RunCodeRequest = serde_json::from_slice(body).map_err(|e| Invalid {
        kind: if e.is_data() {
            "value_error"
        } else {
            "json_invalid"
        },
        field: "",
        msg: format!("{e}; the body must be a JSON object with at least \"code\""),
        input: serde_json::Value::Null,
    })?;
    let name = req.language.as_deref().unwrap_or("python");
    let language = match lookup(name) {
        Lookup::Runs(l) => l,
        Lookup::NotRun => {
            return Err(Invalid {
                kind: "value_error",
                field: "language",
                msg: format!(
                    "Warren does not run SandboxFusion's {name:?} runner (most of these need files bundled with SandboxFusion itself: a Go module, JUnit jars, a node project, a Lean project, a GPU); Warren runs: {}",
                    languages::supported().join(", ")
                ),
                input: serde_json::json!(name),
            })
        }
        Lookup::Unknown => {
            let quoted: Vec<String> = languages::SANDBOX_FUSION_LANGUAGES
                .iter()
                .map(|l| format!("'{l}'"))
                .collect();
            return Err(Invalid {
                kind: "literal_error",
                field: "language",
                msg: format!("Input should be {}", quoted.join(", ")),
                input: serde_json::json!(name),
            });
        }
    };
    Ok(Job {
        language,
        code: req.code,
        compile_timeout: timeout("compile_timeout", req.compile_timeout)?,
        run_timeout: timeout("run_timeout", req.run_timeout)?,
        memory_limit_mb: req.memory_limit_mb.unwrap_or(-1),
        stdin: req.stdin.map(String::into_bytes),
        files: decode_files(req.files)?,
        fetch_files: req.fetch_files.unwrap_or_default(),
    })
}

/// A request's `files`: relative path → base64 content.
pub(crate) fn decode_files(
    given: Option<std::collections::BTreeMap<String, Option<String>>>,
) -> Result<Vec<(String, Vec<u8>)>, Invalid> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut files = Vec::new();
    for (path, content) in given.unwrap_or_default() {
        // SandboxFusion's restore_files skips null contents and names
        // marked IGNORE_THIS_FILE.
        let Some(content) = content else { continue };
        if path.contains("IGNORE_THIS_FILE") {
            continue;
        }
        if path.is_empty() || path.ends_with('/') || path.contains('\0') {
            return Err(Invalid {
                kind: "value_error",
                field: "files",
                msg: format!("{path:?} is not a file name; give a path such as data/input.txt"),
                input: serde_json::json!(path),
            });
        }
        let data = b64.decode(content.as_bytes()).map_err(|e| Invalid {
            kind: "value_error",
            field: "files",
            msg: format!("the content of {path:?} is not base64 ({e}); encode it with base64"),
            input: serde_json::json!(path),
        })?;
        files.push((path, data));
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_code_is_python() {
        let job = parse(br#"{"code": "print(1)"}"#).unwrap();
        assert_eq!(job.language.name, "python");
        assert_eq!(job.run_timeout, std::time::Duration::from_secs(10));
        assert_eq!(job.memory_limit_mb, -1);
        assert!(job.stdin.is_none() && job.files.is_empty() && job.fetch_files.is_empty());
    }

    #[test]
    fn verl_request() {
        let job = parse(
            br#"{"compile_timeout": 10, "run_timeout": 3, "code": "x", "stdin": "1 2\n",
                 "memory_limit_MB": 1024, "language": "python", "files": {}, "fetch_files": []}"#,
        )
        .unwrap();
        assert_eq!(job.stdin.as_deref(), Some(&b"1 2\n"[..]));
        assert_eq!(job.memory_limit_mb, 1024);
    }

    #[test]
    fn bad_requests_say_what_is_wrong() {
        let e = parse(br#"{"language": "python"}"#).unwrap_err();
        assert!(e.msg.contains("code"), "{e}");
        let e = parse(br#"{"code": "x", "language": "cobol"}"#).unwrap_err();
        assert_eq!((e.kind, e.field), ("literal_error", "language"));
        assert_eq!(
            e.detail()["detail"][0]["loc"],
            serde_json::json!(["body", "language"])
        );
        let e = parse(br#"{"code": "x", "language": "junit"}"#).unwrap_err();
        assert!(e.msg.contains("Warren runs: python"), "{e}");
        let e = parse(br#"{"code": "x", "files": {"a": "!!"}}"#).unwrap_err();
        assert!(e.msg.contains("base64"), "{e}");
        let e = parse(br#"{"code": "x", "run_timeout": -1}"#).unwrap_err();
        assert_eq!(e.field, "run_timeout");
        assert!(parse(b"not json").is_err());
    }

    #[test]
    fn files_are_decoded_and_nulls_skipped() {
        let job = parse(
            br#"{"code": "x", "files": {"a.txt": "aGk=", "b": null, "IGNORE_THIS_FILE_c": "aGk="}}"#,
        )
        .unwrap();
        assert_eq!(job.files, vec![("a.txt".to_string(), b"hi".to_vec())]);
    }
}

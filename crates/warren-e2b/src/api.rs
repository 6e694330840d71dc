//! E2B's control API (`E2B_API_URL`): sandboxes are created, listed,
//! connected to, paused, given a new timeout and killed here, each through
//! Warren's control plane. Error bodies are `{code, message}`; 429 and 503
//! carry Retry-After, which the SDK honours.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{json, Value};
use warren_control::Control;
use warren_core::spec::{NetworkMode, ReclaimPolicy};
use warren_core::state::reason;
use warren_core::tenant::Principal;
use warren_core::{ErrorCode, Labels, SandboxInfo, SandboxSpec, SandboxState, Selector};

use crate::reply::{body, control, page, E2bError, E2bResult};
use crate::{E2b, ENVD_VERSION, FRONT_LABEL, TEMPLATE_LABEL};

pub(crate) type St = State<Arc<E2b>>;

/// E2B's own default when a create names no timeout.
const DEFAULT_TIMEOUT_SECS: u64 = 300;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct NewSandbox {
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(default)]
    timeout: Option<u64>,
    #[serde(default)]
    metadata: Option<BTreeMap<String, String>>,
    #[serde(default)]
    env_vars: Option<BTreeMap<String, String>>,
    #[serde(default)]
    network: Option<Network>,
    /// E2B's default is true: the sandbox reaches the internet. (E2B's
    /// schema spells it in snake case, unlike its other fields.)
    #[serde(default, alias = "allow_internet_access")]
    allow_internet_access: Option<bool>,
    /// At the timeout, pause instead of ending (E2B's `on_timeout: pause`).
    #[serde(default)]
    auto_pause: bool,
    /// False asks for a pause that keeps only the filesystem.
    #[serde(default)]
    auto_pause_memory: Option<bool>,
    /// A paused sandbox resumes when traffic reaches it.
    #[serde(default)]
    auto_resume: Option<AutoResume>,
}

/// E2B's `autoResume`: `{"enabled": true}` (older SDKs sent a bool).
#[derive(Deserialize)]
#[serde(untagged)]
enum AutoResume {
    Flag(bool),
    Config { enabled: bool },
}

impl AutoResume {
    fn enabled(&self) -> bool {
        match self {
            AutoResume::Flag(on) | AutoResume::Config { enabled: on } => *on,
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Network {
    #[serde(default)]
    allow_out: Option<Vec<String>>,
    #[serde(default)]
    deny_out: Option<Vec<String>>,
    /// False: the sandbox's ports take only requests with its traffic
    /// token (E2B's default is true: anyone with the URL).
    #[serde(default)]
    allow_public_traffic: Option<bool>,
    /// The Host its ports see, `${PORT}` the port asked for.
    #[serde(default)]
    mask_request_host: Option<String>,
}

/// `maskRequestHost` as labels: its host, and its port (`port` for
/// `${PORT}`); a host that is not a DNS name or address is refused.
fn mask_labels(mask: &str) -> E2bResult<[(&'static str, String); 2]> {
    let bad = || {
        E2bError::new(
            StatusCode::BAD_REQUEST,
            format!("maskRequestHost {mask:?}: write HOST, HOST:PORT or HOST:${{PORT}}"),
        )
    };
    let (host, port) = match mask.rsplit_once(':') {
        Some((h, "${PORT}")) => (h, "port".to_string()),
        Some((h, p)) => (h, p.parse::<u16>().map_err(|_| bad())?.to_string()),
        None => (mask, String::new()),
    };
    let host = match warren_core::network::normalize_host(host).map_err(|_| bad())? {
        warren_core::network::Target::Name(n) => n,
        warren_core::network::Target::Ip(std::net::IpAddr::V4(ip)) => ip.to_string(),
        warren_core::network::Target::Ip(_) => return Err(bad()),
    };
    if warren_core::labels::validate_value(crate::MASK_HOST_LABEL, &host).is_err() {
        return Err(bad());
    }
    Ok([
        (crate::MASK_HOST_LABEL, host),
        (crate::MASK_PORT_LABEL, port),
    ])
}

/// E2B's "all traffic" (`ALL_TRAFFIC` in its SDKs).
const ALL_TRAFFIC: &str = "0.0.0.0/0";

/// Warren's egress for E2B's network settings. E2B sandboxes reach the
/// internet unless `allowInternetAccess: false` or `denyOut: [ALL_TRAFFIC]`
/// says otherwise, with `allowOut` as exceptions to `denyOut`. Warren gives
/// that (mode `open`) where an operator permits open egress (`open`, some
/// node started with `--egress-open`); elsewhere a sandbox reaches only what
/// `allowOut` lists (mode `allowlist`) or nothing, and a deny list alone
/// (E2B's "everything but") is refused with what to send instead. E2B's
/// entries are hosts, IPs or CIDRs for every port, which Warren's proxy
/// reaches per port: a bare entry becomes that host on 80 and 443, and
/// `HOST:PORT` is taken as it is.
fn egress(
    n: Network,
    internet: bool,
    open: bool,
) -> E2bResult<(NetworkMode, Vec<String>, Vec<String>)> {
    let deny_all = n
        .deny_out
        .as_ref()
        .is_some_and(|d| d.iter().any(|e| e.trim() == ALL_TRAFFIC));
    let rules = |entries: Vec<String>| -> Vec<String> {
        entries
            .into_iter()
            .map(|e| e.trim().to_string())
            .filter(|e| !e.is_empty() && e != ALL_TRAFFIC)
            .flat_map(|e| {
                let has_port = e
                    .rsplit_once(':')
                    .is_some_and(|(_, p)| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
                if has_port {
                    vec![e]
                } else {
                    vec![format!("{e}:80"), format!("{e}:443")]
                }
            })
            .collect()
    };
    let allow = rules(n.allow_out.unwrap_or_default());
    let deny = rules(n.deny_out.unwrap_or_default());
    if internet && !deny_all && open {
        return Ok((NetworkMode::Open, allow, deny));
    }
    if allow.is_empty() && !deny.is_empty() {
        return Err(E2bError::new(
            StatusCode::BAD_REQUEST,
            "this Warren does not permit open egress (no node runs with --egress-open), so a sandbox reaches nothing unless allowed: list what it may reach in allowOut (denyOut alone cannot open the rest)",
        ));
    }
    let mode = if allow.is_empty() {
        NetworkMode::None
    } else {
        NetworkMode::Allowlist
    };
    Ok((mode, allow, deny))
}

pub(crate) async fn create(
    State(e2b): St,
    Extension(who): Extension<Principal>,
    headers: HeaderMap,
    raw: Bytes,
) -> E2bResult<Response> {
    let req: NewSandbox = body(&raw)?;
    let control = control(&e2b)?;
    if req.template_id.trim().is_empty() {
        return Err(E2bError::new(
            StatusCode::BAD_REQUEST,
            "templateID is empty: name an image or an alias from e2b-templates.toml",
        ));
    }
    let mut labels: Labels = req.metadata.unwrap_or_default();
    labels.insert(FRONT_LABEL.0.into(), FRONT_LABEL.1.into());
    if warren_core::labels::validate_value(TEMPLATE_LABEL, &req.template_id).is_ok() {
        labels.insert(TEMPLATE_LABEL.into(), req.template_id.clone());
    }
    if let Err(e) = warren_core::labels::validate(&labels) {
        return Err(E2bError::new(
            StatusCode::BAD_REQUEST,
            format!("metadata becomes Warren labels, and {e}"),
        ));
    }
    let template = e2b.template(&who, &req.template_id);
    let mut spec = SandboxSpec {
        image: template.image.clone(),
        cmd: template.cmd.clone(),
        cpu: template_size(&req.template_id, "cpu", &template.cpu)?,
        memory: template_size(&req.template_id, "memory", &template.memory)?,
        isolation: template.isolation,
        env: req.env_vars.unwrap_or_default(),
        labels,
        ttl: Some(ttl(req.timeout.unwrap_or(DEFAULT_TIMEOUT_SECS))?),
        request_id: headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .map(|k| format!("e2b-{k}")),
        ..Default::default()
    };
    let network = req.network.unwrap_or_default();
    if network.allow_public_traffic == Some(false) {
        spec.labels
            .insert(crate::PRIVATE_TRAFFIC_LABEL.into(), "true".into());
    }
    if let Some(mask) = network.mask_request_host.as_deref() {
        for (k, v) in mask_labels(mask)? {
            spec.labels.insert(k.into(), v);
        }
    }
    (spec.network.mode, spec.network.allow, spec.network.deny) = egress(
        network,
        req.allow_internet_access.unwrap_or(true),
        control.node_set().offers_open_egress(),
    )?;
    // Secrets as variables, egress header rules refused, volumes mounted.
    crate::secrets::refuse_transforms(&raw, "/network")?;
    crate::secrets::take_fills(&mut spec)?;
    crate::volumes::take_mounts(&e2b, &who, &raw, &mut spec).await?;
    if req.auto_pause {
        if req.auto_pause_memory == Some(false) {
            return Err(E2bError::new(
                StatusCode::BAD_REQUEST,
                "Warren pauses a sandbox with its memory (its processes frozen); a pause that keeps only the filesystem (keep_memory=False) is not available",
            ));
        }
        // Paused at the timeout for keep_for (1 h), resumed by a connect.
        spec.reclaim = ReclaimPolicy::Pause;
    }
    if req.auto_resume.as_ref().is_some_and(AutoResume::enabled) {
        if !req.auto_pause {
            return Err(E2bError::new(
                StatusCode::BAD_REQUEST,
                "autoResume wakes a paused sandbox: it needs autoPause (on_timeout: pause)",
            ));
        }
        let timeout = req.timeout.unwrap_or(DEFAULT_TIMEOUT_SECS);
        spec.labels
            .insert(crate::AUTO_RESUME_LABEL.into(), timeout.to_string());
    }
    let (info, _) = control.create(&who, spec, true).await.map_err(|e| {
        if e.code == ErrorCode::NotFound {
            E2bError::new(
                StatusCode::NOT_FOUND,
                format!("{}; {}", e.message, e2b.templates.hint(&req.template_id)),
            )
        } else {
            e.into()
        }
    })?;
    if info.state != SandboxState::Running {
        return Err(E2bError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "sandbox {} did not start: it is {} ({})",
                info.id, info.state, info.reason
            ),
        ));
    }
    let ready = match (template.ready_port, &template.ready_cmd) {
        (Some(port), _) => wait_ready(&control, &info.id, Ready::Port(port)).await,
        (None, Some(cmd)) => wait_ready(&control, &info.id, Ready::Command(cmd)).await,
        (None, None) => Ok(()),
    };
    if let Err(e) = ready {
        let _ = control.destroy(&info.id, reason::CREATE_FAILED).await;
        return Err(e);
    }
    Ok((StatusCode::CREATED, Json(sandbox(&e2b, &info))).into_response())
}

/// How long a template's server may take to listen.
const READY_WITHIN: Duration = Duration::from_secs(60);

/// Waits until the template's server is ready, as E2B's create waits for
/// a template's ready command: its port accepts a connection (checked from
/// outside, so the image needs no `ss`), or its ready command (`sh -c`)
/// exits 0 in the sandbox.
async fn wait_ready(control: &Control, id: &str, ready: Ready<'_>) -> E2bResult<()> {
    let deadline = tokio::time::Instant::now() + READY_WITHIN;
    loop {
        let passed = match ready {
            Ready::Port(port) => control.io().connect_port(id, port).await.is_ok(),
            Ready::Command(cmd) => command_passes(control, id, cmd).await,
        };
        if passed {
            return Ok(());
        }
        let state = control.records().get(id).await.map(|r| r.state);
        let gone = !matches!(state, Ok(SandboxState::Running));
        if gone || tokio::time::Instant::now() >= deadline {
            let what = match ready {
                Ready::Port(port) => format!("the template's server did not listen on port {port}"),
                Ready::Command(cmd) => format!("the template's ready command ({cmd}) did not pass"),
            };
            return Err(E2bError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!(
                    "{what} {}; see `warren logs {id}` for its output",
                    if gone {
                        "before the server exited"
                    } else {
                        "within 60 s"
                    }
                ),
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What a template's sandbox is ready by.
#[derive(Clone, Copy)]
enum Ready<'a> {
    Port(u16),
    Command(&'a str),
}

/// Whether `cmd` (`sh -c`) exits 0 in the sandbox.
async fn command_passes(control: &Control, id: &str, cmd: &str) -> bool {
    use futures_util::StreamExt;
    let req = warren_core::ExecRequest {
        cmd: vec!["/bin/sh".into(), "-c".into(), cmd.to_string()],
        timeout: warren_core::spec::Dur::new(Duration::from_secs(10)).ok(),
        ..Default::default()
    };
    let Ok(mut events) = control.io().exec(id, &req).await else {
        return false;
    };
    while let Some(event) = events.next().await {
        if let warren_core::ExecEvent::Exit { code, .. } = event {
            return code == 0;
        }
    }
    false
}

/// A size from the templates file (`"2"`, `"500m"`, `"2G"`), as the API
/// reads it.
fn template_size<T: serde::de::DeserializeOwned>(
    template: &str,
    what: &str,
    v: &Option<String>,
) -> E2bResult<Option<T>> {
    v.as_ref()
        .map(|v| serde_json::from_value(Value::String(v.clone())))
        .transpose()
        .map_err(|e| {
            E2bError::new(
                StatusCode::BAD_REQUEST,
                format!(
                    "template {template:?}: {what} {v:?} in {} is not valid: {e}",
                    crate::templates::FILE
                ),
            )
        })
}

/// The template a sandbox was made from, as E2B names it.
pub(crate) fn template_of(info: &SandboxInfo) -> String {
    info.spec
        .labels
        .get(TEMPLATE_LABEL)
        .cloned()
        .unwrap_or_else(|| info.spec.image.clone())
}

/// What a client may not see of the labels: Warren's own.
fn metadata(info: &SandboxInfo) -> BTreeMap<String, String> {
    info.spec
        .labels
        .iter()
        .filter(|(k, _)| !crate::INTERNAL_LABELS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// E2B's `Sandbox`: what create and connect answer.
pub(crate) fn sandbox(e2b: &E2b, info: &SandboxInfo) -> Value {
    json!({
        "templateID": template_of(info),
        "sandboxID": info.id,
        "clientID": info.node,
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": e2b.access_token(&info.id),
        "trafficAccessToken": e2b.traffic_token(&info.id),
        "domain": e2b.domain.as_ref().map(crate::SandboxDomain::as_str),
    })
}

fn e2b_state(state: SandboxState) -> &'static str {
    if state == SandboxState::Paused {
        "paused"
    } else {
        "running"
    }
}

/// When the sandbox's TTL ends, to the second: the node reports what is
/// left, so now + left moves by the milliseconds between two reads, and
/// E2B's clients compare end times for equality (a connect that must not
/// shorten a timeout).
fn end_at(info: &SandboxInfo) -> String {
    let left = Duration::from_millis(info.ttl_remaining_ms.unwrap_or(0));
    let end = time::OffsetDateTime::now_utc() + left;
    let whole = end.unix_timestamp() + i64::from(end.millisecond() >= 500);
    time::OffsetDateTime::from_unix_timestamp(whole)
        .unwrap_or(end)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// E2B's `ListedSandbox` (and the common part of `SandboxDetail`).
fn listed(info: &SandboxInfo) -> Value {
    json!({
        "templateID": template_of(info),
        "sandboxID": info.id,
        "clientID": info.node,
        "startedAt": info.started_at.clone().unwrap_or_else(|| info.created_at.clone()),
        "endAt": end_at(info),
        "cpuCount": info.resources.cpu_millis.div_ceil(1000).max(1),
        "memoryMB": info.resources.memory >> 20,
        "diskSizeMB": info.resources.disk >> 20,
        "state": e2b_state(info.state),
        "envdVersion": ENVD_VERSION,
        "metadata": metadata(info),
        "volumeMounts": crate::volumes::mounts_of(info),
    })
}

/// A live sandbox (running or paused), or 404 as E2B answers for one that
/// was killed.
pub(crate) async fn live(control: &Control, id: &str) -> E2bResult<SandboxInfo> {
    let info = control.records().inspect(id, false).await.map_err(|e| {
        if e.code == ErrorCode::NotFound {
            E2bError::not_found(id)
        } else {
            e.into()
        }
    })?;
    if !matches!(info.state, SandboxState::Running | SandboxState::Paused) {
        return Err(E2bError::not_found(id));
    }
    Ok(info)
}

pub(crate) async fn detail(State(e2b): St, Path(id): Path<String>) -> E2bResult<Json<Value>> {
    let control = control(&e2b)?;
    let info = live(&control, &id).await?;
    let mut v = listed(&info);
    if let Value::Object(m) = &mut v {
        m.insert("envdAccessToken".into(), e2b.access_token(&id).into());
        m.insert("trafficAccessToken".into(), e2b.traffic_token(&id).into());
        m.insert(
            "domain".into(),
            e2b.domain.as_ref().map(crate::SandboxDomain::as_str).into(),
        );
        m.insert(
            "lifecycle".into(),
            json!({
                "autoResume": info.spec.labels.contains_key(crate::AUTO_RESUME_LABEL),
                "onTimeout": if info.spec.reclaim == ReclaimPolicy::Pause { "pause" } else { "kill" },
            }),
        );
    }
    Ok(Json(v))
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ListQuery {
    metadata: Option<String>,
    state: Option<String>,
    limit: Option<usize>,
    next_token: Option<String>,
    /// `asc` or `desc` (the default: newest first, as E2B lists).
    order: Option<String>,
    /// Only sandboxes started after this time (RFC 3339; one without an
    /// offset is UTC, as Python's isoformat of a naive time sends it).
    started_after: Option<String>,
    /// Only sandboxes of this template.
    template: Option<String>,
}

/// A time as E2B's clients send it: RFC 3339, or ISO 8601 without an
/// offset (UTC).
fn parse_time(field: &str, text: &str) -> E2bResult<time::OffsetDateTime> {
    use time::format_description::well_known::{Iso8601, Rfc3339};
    time::OffsetDateTime::parse(text, &Rfc3339)
        .or_else(|_| {
            time::PrimitiveDateTime::parse(text, &Iso8601::DEFAULT).map(|t| t.assume_utc())
        })
        .map_err(|e| {
            E2bError::new(
                StatusCode::BAD_REQUEST,
                format!("{field} {text:?} is not an RFC 3339 time: {e}"),
            )
        })
}

/// When a listed sandbox started (its creation while it had not).
fn started(info: &SandboxInfo) -> Option<time::OffsetDateTime> {
    let at = info.started_at.as_deref().unwrap_or(&info.created_at);
    time::OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339).ok()
}

pub(crate) async fn list(
    State(e2b): St,
    Extension(who): Extension<Principal>,
    Query(q): Query<ListQuery>,
) -> E2bResult<Response> {
    let control = control(&e2b)?;
    let states: Vec<SandboxState> = match q.state.as_deref().filter(|s| !s.is_empty()) {
        None => vec![SandboxState::Running, SandboxState::Paused],
        Some(s) => s
            .split(',')
            .map(|st| match st.trim() {
                "running" => Ok(SandboxState::Running),
                "paused" => Ok(SandboxState::Paused),
                other => Err(E2bError::new(
                    StatusCode::BAD_REQUEST,
                    format!("unknown state {other:?}: use running and/or paused"),
                )),
            })
            .collect::<Result<_, _>>()?,
    };
    // `metadata` is itself URL-encoded `k=v&k2=v2`.
    let mut selector = format!("{}={}", FRONT_LABEL.0, FRONT_LABEL.1);
    if let Some(m) = q.metadata.as_deref().filter(|m| !m.is_empty()) {
        for pair in m.split('&') {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let (k, v) = (percent_decode(k), percent_decode(v));
            if warren_core::labels::validate_key(&k).is_err()
                || warren_core::labels::validate_value(&k, &v).is_err()
            {
                // No sandbox can carry it as a label, so none matches.
                return Ok(Json(Vec::<Value>::new()).into_response());
            }
            selector.push_str(&format!(",{k}={v}"));
        }
    }
    let selector = Selector::parse(&selector)
        .map_err(|e| E2bError::new(StatusCode::BAD_REQUEST, format!("metadata filter: {e}")))?;
    let after = q
        .started_after
        .as_deref()
        .filter(|t| !t.is_empty())
        .map(|t| parse_time("startedAfter", t))
        .transpose()?;
    let newest_first = match q.order.as_deref() {
        None | Some("") | Some("desc") => true,
        Some("asc") => false,
        Some(other) => {
            return Err(E2bError::new(
                StatusCode::BAD_REQUEST,
                format!("order {other:?}: use asc or desc"),
            ))
        }
    };
    let mut all = control.records().list(&who, &states, &selector).await?;
    all.retain(|s| {
        after.is_none_or(|t| started(s).is_some_and(|at| at > t))
            && q.template
                .as_deref()
                .filter(|t| !t.is_empty())
                .is_none_or(|t| template_of(s) == t)
    });
    all.sort_by(|a, b| (&a.created_at, &a.id).cmp(&(&b.created_at, &b.id)));
    if newest_first {
        all.reverse();
    }
    Ok(page(
        &all,
        |s| s.id.clone(),
        q.next_token.as_deref(),
        q.limit,
        listed,
    ))
}

/// A query value as forms encode it (`+` for space, `%XX`).
fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(&s.replace('+', " "))
        .decode_utf8_lossy()
        .into_owned()
}

#[derive(Deserialize, Default)]
struct Timeout {
    #[serde(default)]
    timeout: Option<u64>,
}

/// Connect (and resume): a paused sandbox is resumed (201), a running one
/// answered as it is (200); a timeout given becomes its new TTL.
pub(crate) async fn connect(
    State(e2b): St,
    Path(id): Path<String>,
    raw: Bytes,
) -> E2bResult<Response> {
    let req: Timeout = body(&raw)?;
    let control = control(&e2b)?;
    let info = live(&control, &id).await?;
    let resumed = info.state == SandboxState::Paused;
    if resumed {
        control.set_paused(&id, false).await?;
    }
    // A connect only ever extends a sandbox's life, never shortens it.
    if let Some(t) = req.timeout.filter(|t| *t > 0) {
        let wanted = ttl(t)?;
        let left = info.ttl_remaining_ms.unwrap_or(0);
        if wanted.get().as_millis() > u128::from(left) {
            control.set_ttl(&id, wanted).await?;
        }
    }
    let info = live(&control, &id).await?;
    let status = if resumed {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(sandbox(&e2b, &info))).into_response())
}

pub(crate) async fn set_timeout(
    State(e2b): St,
    Path(id): Path<String>,
    raw: Bytes,
) -> E2bResult<StatusCode> {
    let req: Timeout = body(&raw)?;
    let control = control(&e2b)?;
    let Some(secs) = req.timeout else {
        return Err(E2bError::new(
            StatusCode::BAD_REQUEST,
            "timeout (seconds from now) is required",
        ));
    };
    let ttl = ttl(secs)?;
    live(&control, &id).await?;
    control.set_ttl(&id, ttl).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// E2B's `timeout` (seconds from now, at least one) as a TTL; one longer
/// than Warren keeps a sandbox is E2B's 400.
pub(crate) fn ttl(secs: u64) -> E2bResult<warren_core::spec::Dur> {
    warren_core::spec::Dur::from_secs(secs.max(1))
        .map_err(|e| E2bError::new(StatusCode::BAD_REQUEST, format!("timeout: {e}")))
}

pub(crate) async fn kill(State(e2b): St, Path(id): Path<String>) -> E2bResult<StatusCode> {
    let control = control(&e2b)?;
    live(&control, &id).await?;
    control.destroy(&id, reason::USER_DELETED).await?;
    e2b.processes.forget_sandbox(&id);
    Ok(StatusCode::NO_CONTENT)
}

pub(crate) async fn pause(State(e2b): St, Path(id): Path<String>) -> E2bResult<StatusCode> {
    let control = control(&e2b)?;
    let info = live(&control, &id).await?;
    if info.state == SandboxState::Paused {
        return Err(E2bError::new(
            StatusCode::CONFLICT,
            format!("sandbox {id} is already paused"),
        ));
    }
    control.set_paused(&id, true).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `updateNetwork`: the sandbox's allowOut/denyOut replaced, as at create
/// (see `egress`). Warren fixes the mode at create: the rules of an
/// allowlist sandbox change at once (live connections they no longer allow
/// are closed); a sandbox made without allowOut can reach nothing and
/// stays so (409).
pub(crate) async fn update_network(
    State(e2b): St,
    Path(id): Path<String>,
    raw: Bytes,
) -> E2bResult<StatusCode> {
    let n: Network = body(&raw)?;
    crate::secrets::refuse_transforms(&raw, "")?;
    let control = control(&e2b)?;
    let info = live(&control, &id).await?;
    // Who may reach its ports and the Host they see are fixed at create
    // (kept with the sandbox): a change is refused, not dropped.
    let labels = &info.spec.labels;
    let private = labels.contains_key(crate::PRIVATE_TRAFFIC_LABEL);
    let fixed = |what: &str| {
        Err(E2bError::new(
            StatusCode::CONFLICT,
            format!("sandbox {id}: {what} is fixed at create"),
        ))
    };
    if n.allow_public_traffic
        .is_some_and(|public| public == private)
    {
        return fixed("allowPublicTraffic");
    }
    if let Some(mask) = n.mask_request_host.as_deref() {
        let same = mask_labels(mask)?
            .iter()
            .all(|(k, v)| labels.get(*k) == Some(v));
        if !same {
            return fixed("maskRequestHost");
        }
    }
    let open = info.spec.network.mode == NetworkMode::Open;
    let (mode, allow, deny) = egress(n, open, open)?;
    if mode != info.spec.network.mode && mode != NetworkMode::None {
        return Err(E2bError::new(
            StatusCode::CONFLICT,
            format!(
                "sandbox {id} has network mode '{}', fixed at create; these settings need '{}'",
                info.spec.network.mode.as_str(),
                mode.as_str()
            ),
        ));
    }
    control.set_network(&id, allow, deny).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The sandbox's usage now, as one E2B metric point (Warren samples usage
/// but keeps the running summary, not a series).
#[derive(Deserialize, Default)]
pub(crate) struct MetricsRange {
    /// Unix seconds: only points within [start, end].
    start: Option<i64>,
    end: Option<i64>,
}

/// The sandbox's usage as one point, now (Warren keeps no series per
/// sandbox here): none when `start`..`end` leaves now out.
pub(crate) async fn metrics(
    State(e2b): St,
    Path(id): Path<String>,
    Query(range): Query<MetricsRange>,
) -> E2bResult<Json<Value>> {
    let control = control(&e2b)?;
    let info = control
        .records()
        .inspect(&id, true)
        .await
        .map_err(|_| E2bError::not_found(&id))?;
    let Some(u) = &info.usage else {
        return Ok(Json(json!([])));
    };
    let now = time::OffsetDateTime::now_utc();
    let unix = now.unix_timestamp();
    if range.start.is_some_and(|s| unix < s) || range.end.is_some_and(|e| unix > e) {
        return Ok(Json(json!([])));
    }
    let cpus = info.resources.cpu_millis.div_ceil(1000).max(1);
    let cpu_pct = u.cpu_millis_mean as f64 / (cpus * 1000) as f64 * 100.0;
    Ok(Json(json!([{
        "timestamp": now.format(&time::format_description::well_known::Rfc3339).unwrap_or_default(),
        "timestampUnix": now.unix_timestamp(),
        "cpuCount": cpus,
        "cpuUsedPct": (cpu_pct * 100.0).round() / 100.0,
        "memUsed": u.memory_bytes,
        "memTotal": info.resources.memory,
        "memCache": 0,
        "diskUsed": u.disk_bytes,
        "diskTotal": info.resources.disk,
    }])))
}

#[cfg(test)]
mod tests {
    #[test]
    fn e2b_egress_becomes_an_allowlist() {
        use super::{egress, Network, NetworkMode, ALL_TRAFFIC};
        let n = |allow: &[&str], deny: &[&str]| Network {
            allow_out: Some(allow.iter().map(|s| s.to_string()).collect()),
            deny_out: Some(deny.iter().map(|s| s.to_string()).collect()),
            ..Default::default()
        };
        // Where no node permits open egress: allowlists or nothing.
        let closed = |n| egress(n, true, false);
        let (mode, allow, deny) =
            closed(n(&["pypi.org", "10.0.0.0/8:5000"], &[ALL_TRAFFIC])).expect("allowed");
        assert_eq!(mode, NetworkMode::Allowlist);
        assert_eq!(allow, ["pypi.org:80", "pypi.org:443", "10.0.0.0/8:5000"]);
        assert!(deny.is_empty());
        let (_, _, deny) = closed(n(&["a.io"], &["b.a.io"])).expect("deny");
        assert_eq!(deny, ["b.a.io:80", "b.a.io:443"]);
        assert_eq!(
            closed(n(&[], &[ALL_TRAFFIC])).expect("none").0,
            NetworkMode::None
        );
        assert_eq!(
            closed(Network::default()).expect("none").0,
            NetworkMode::None
        );
        assert!(closed(n(&[], &["evil.example"])).is_err());
        // Where it is permitted: E2B's internet, unless turned off.
        let open = |n, internet| egress(n, internet, true).expect("open").0;
        assert_eq!(open(Network::default(), true), NetworkMode::Open);
        assert_eq!(open(n(&[], &["evil.example"]), true), NetworkMode::Open);
        assert_eq!(open(Network::default(), false), NetworkMode::None);
        assert_eq!(open(n(&["a.io"], &[]), false), NetworkMode::Allowlist);
        assert_eq!(
            open(n(&["a.io"], &[ALL_TRAFFIC]), true),
            NetworkMode::Allowlist
        );
    }

    #[test]
    fn mask_request_host_is_a_host_and_a_port() {
        use super::mask_labels;
        let m = |s: &str| mask_labels(s).map(|[(_, h), (_, p)]| (h, p));
        assert_eq!(
            m("localhost:${PORT}").ok(),
            Some(("localhost".into(), "port".into()))
        );
        assert_eq!(
            m("Example.com:8080").ok(),
            Some(("example.com".into(), "8080".into()))
        );
        assert_eq!(m("10.0.0.5").ok(), Some(("10.0.0.5".into(), String::new())));
        for bad in ["a b", "x:99999", "x:${HOST}", "[::1]:80", ""] {
            assert!(m(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn metadata_filters_are_percent_decoded() {
        assert_eq!(super::percent_decode("a%3Db%20c+d"), "a=b c d");
        assert_eq!(super::percent_decode("100%"), "100%");
        assert_eq!(super::percent_decode("%zz"), "%zz");
    }
}

//! E2B's template builds (`Template.build` in the `e2b` SDKs), run by
//! Warren's own build engine: the template's steps become a Dockerfile,
//! the files its `COPY` steps uploaded become the build context, and the
//! build is `POST /v1/builds`'s (the control plane's `start_build`). Its
//! events are the build's log as E2B's status polls read it. A built
//! template is an alias for its image, with the start and ready commands
//! its sandboxes start with; the aliases are kept in
//! `<home>/e2b-built-templates.json`.
//!
//! The calls, in the order the SDK makes them: `POST /v3/templates` (a
//! template id and build id for a name), `GET /templates/{id}/files/{hash}`
//! (an upload link for each `COPY`'s files unless they are here), `PUT`
//! of a tar (gzip or not) to that link (signed: the SDK sends no key),
//! `POST /v2/templates/{id}/builds/{build}` (the steps; the build starts),
//! `GET /templates/{id}/builds/{build}/status?logsOffset=N` (state and log
//! from N), and `GET /templates/aliases/{alias}`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use warren_core::build::{BuildEvent, BuildRequest};
use warren_core::sync::lock;
use warren_core::tenant::{Principal, TenantName};

use crate::templates::Template;

/// Where the uploaded files and the built aliases live, under the home.
const FILES_DIR: &str = "e2b-template-files";
const BUILT_FILE: &str = "e2b-built-templates.json";
/// The repository built templates' images are named in.
const IMAGE_REPO: &str = "e2b-template";
/// E2B's default base when a template names none.
pub const DEFAULT_BASE: &str = "e2bdev/base";

#[derive(Debug, thiserror::Error)]
pub enum TemplateBuildError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    NotFound(String),
    /// A name another tenant's template holds.
    #[error("{0}")]
    Taken(String),
    #[error("{0}")]
    Io(String),
}

/// A template's definition as the SDK sends it.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Definition {
    #[serde(default)]
    pub from_image: Option<String>,
    #[serde(default)]
    pub from_template: Option<String>,
    #[serde(default)]
    pub from_image_registry: Option<serde_json::Value>,
    #[serde(default)]
    pub force: bool,
    #[serde(default)]
    pub steps: Vec<StepDef>,
    #[serde(default)]
    pub start_cmd: Option<String>,
    #[serde(default)]
    pub ready_cmd: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepDef {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub files_hash: Option<String>,
    #[serde(default)]
    pub force: bool,
}

/// A built template, as kept.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Built {
    pub template_id: String,
    /// The image's name (`e2b-template/NAME[:TAG]`).
    pub image: String,
    /// The image this build made: what its sandboxes run (the name may
    /// have moved on to a newer build since).
    #[serde(default)]
    pub digest: Option<String>,
    pub start_cmd: Option<String>,
    pub ready_cmd: Option<String>,
    pub cpu: Option<u32>,
    pub memory_mb: Option<u64>,
    /// Set for a snapshot of a sandbox (`create_snapshot`), not a build.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<SnapshotOf>,
    /// Whose it is: another tenant's key neither sees, starts, builds on
    /// nor removes it (one kept before tenants is the operator's).
    #[serde(default)]
    pub tenant: TenantName,
}

/// What a snapshot was taken of.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SnapshotOf {
    pub sandbox_id: String,
    /// The names it can be started by besides its id.
    pub names: Vec<String>,
    pub created_at: String,
}

impl Built {
    /// What its sandboxes are made of.
    pub fn template(&self) -> Template {
        let (ready_port, ready_cmd) = match self.ready_cmd.as_deref().map(str::trim) {
            None | Some("") => (None, None),
            Some(cmd) => match port_of_ready(cmd) {
                Some(port) => (Some(port), None),
                None => (None, Some(cmd.to_string())),
            },
        };
        Template {
            // Pinned to the digest, under the name: a node that lacks it
            // pulls it from the cluster registry the build published to.
            image: match &self.digest {
                Some(digest) => format!("{}@{digest}", repository(&self.image)),
                None => self.image.clone(),
            },
            cmd: self
                .start_cmd
                .clone()
                .map(|c| vec!["/bin/sh".into(), "-c".into(), c]),
            ready_port,
            ready_cmd,
            cpu: self.cpu.map(|c| c.to_string()),
            memory: self.memory_mb.map(|m| format!("{m}M")),
            // E2B's build API names no class: its node's default.
            isolation: None,
        }
    }
}

/// `wait_for_port(P)`'s command (`[ -n "$(ss -Htuln sport = :P)" ]`): the
/// port, which Warren checks from outside (images need no `ss`).
fn port_of_ready(cmd: &str) -> Option<u16> {
    let rest = cmd.strip_prefix("[ -n \"$(ss -Htuln sport = :")?;
    let port = rest.strip_suffix(")\" ]")?;
    port.parse().ok()
}

/// One line of a build's log, as E2B's status answers it.
#[derive(Debug, Clone, Serialize)]
pub struct LogEntry {
    pub timestamp: String,
    pub level: &'static str,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
}

/// A build as its status polls see it.
#[derive(Debug, Clone, Default)]
pub struct Progress {
    /// `waiting` (asked, not started), `building`, `ready`, `error`.
    pub status: &'static str,
    pub entries: Vec<LogEntry>,
    pub reason: Option<(String, Option<String>)>,
}

/// A template id's request (`POST /v3/templates`).
#[derive(Debug, Clone)]
struct Requested {
    name: String,
    build_id: String,
    cpu: Option<u32>,
    memory_mb: Option<u64>,
    progress: Arc<Mutex<Progress>>,
    /// Who asked for it: only that tenant (or the operator) follows it.
    tenant: TenantName,
}

pub struct TemplateBuilds {
    home: PathBuf,
    requested: Mutex<BTreeMap<String, Requested>>,
    built: Mutex<BTreeMap<String, Built>>,
}

impl TemplateBuilds {
    pub fn load(home: &Path) -> Result<TemplateBuilds, TemplateBuildError> {
        let path = home.join(BUILT_FILE);
        let built = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                TemplateBuildError::Io(format!("{} is not valid: {e}", path.display()))
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => {
                return Err(TemplateBuildError::Io(format!(
                    "reading {}: {e}",
                    path.display()
                )))
            }
        };
        Ok(TemplateBuilds {
            home: home.to_path_buf(),
            requested: Mutex::new(BTreeMap::new()),
            built: Mutex::new(built),
        })
    }

    /// A built template (or snapshot) `who` reaches, by its name (alias)
    /// or template id: its own first (two tenants' snapshots may share a
    /// name).
    pub fn get(&self, who: &Principal, name: &str) -> Option<Built> {
        let built = lock(&self.built);
        let named = |b: &&Built| {
            b.template_id == name
                || b.snapshot
                    .as_ref()
                    .is_some_and(|s| s.names.iter().any(|n| n == name))
        };
        let reached: Vec<&Built> = built
            .get(name)
            .into_iter()
            .chain(built.values().filter(named))
            .filter(|b| who.reaches(&b.tenant))
            .collect();
        let own = who.tenant();
        reached
            .iter()
            .find(|b| b.tenant == own)
            .or(reached.first())
            .map(|b| (*b).clone())
    }

    /// Every snapshot `who` reaches, oldest first.
    pub fn snapshots(&self, who: &Principal) -> Vec<Built> {
        let mut all: Vec<Built> = lock(&self.built)
            .values()
            .filter(|b| b.snapshot.is_some() && who.reaches(&b.tenant))
            .cloned()
            .collect();
        all.sort_by(|a, b| {
            let at = |x: &Built| x.snapshot.as_ref().map(|s| s.created_at.clone());
            (at(a), &a.template_id).cmp(&(at(b), &b.template_id))
        });
        all
    }

    /// Keeps a snapshot under its id.
    pub fn keep_snapshot(&self, built: Built) -> Result<(), TemplateBuildError> {
        let id = built.template_id.clone();
        self.keep(&id, built)
    }

    /// Forgets a template or snapshot `who` reaches (by name or id); what
    /// it was.
    pub fn remove(&self, who: &Principal, name: &str) -> Result<Option<Built>, TemplateBuildError> {
        let Some(found) = self.get(who, name) else {
            return Ok(None);
        };
        self.write(|all| all.retain(|_, b| b.template_id != found.template_id))?;
        Ok(Some(found))
    }

    /// `POST /v3/templates`: ids for a build of `name` by `who`'s tenant;
    /// a template name another tenant's template holds is taken.
    pub fn request(
        &self,
        who: &Principal,
        name: &str,
        cpu: Option<u32>,
        memory_mb: Option<u64>,
    ) -> Result<(String, String), TemplateBuildError> {
        image_name(name)?;
        let tenant = who.tenant();
        // Built, or asked for and not yet built.
        let built = lock(&self.built).get(name).map(|b| b.tenant.clone());
        let held = built.or_else(|| {
            let requested = lock(&self.requested);
            let asked = requested.values().find(|r| r.name == name);
            asked.map(|r| r.tenant.clone())
        });
        if held.is_some_and(|t| t != tenant && !who.is_operator()) {
            return Err(TemplateBuildError::Taken(format!(
                "the template name {name:?} is taken; choose another"
            )));
        }
        let template_id = self
            .get(who, name)
            .map(|b| b.template_id)
            .unwrap_or_else(|| warren_control::new_id_with("tpl"));
        let build_id = warren_control::new_id_with("bld");
        lock(&self.requested).insert(
            template_id.clone(),
            Requested {
                name: name.to_string(),
                build_id: build_id.clone(),
                cpu,
                memory_mb,
                progress: Arc::new(Mutex::new(Progress {
                    status: "waiting",
                    ..Default::default()
                })),
                tenant,
            },
        );
        Ok((template_id, build_id))
    }

    fn requested(
        &self,
        who: &Principal,
        template_id: &str,
        build_id: &str,
    ) -> Result<Requested, TemplateBuildError> {
        lock(&self.requested)
            .get(template_id)
            .filter(|r| r.build_id == build_id && who.reaches(&r.tenant))
            .cloned()
            .ok_or_else(|| {
                TemplateBuildError::NotFound(format!(
                    "no build {build_id} of template {template_id} (ask POST /v3/templates first)"
                ))
            })
    }

    pub fn progress(
        &self,
        who: &Principal,
        template_id: &str,
        build_id: &str,
    ) -> Result<Progress, TemplateBuildError> {
        let r = self.requested(who, template_id, build_id)?;
        let p = lock(&r.progress).clone();
        Ok(p)
    }

    /// Whether a `COPY`'s files (by the SDK's hash of them) are here.
    pub fn has_files(&self, hash: &str) -> Result<bool, TemplateBuildError> {
        Ok(self.files_path(hash)?.exists())
    }

    fn files_path(&self, hash: &str) -> Result<PathBuf, TemplateBuildError> {
        if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(TemplateBuildError::Invalid(format!(
                "files hash {hash:?} is not 64 hex digits"
            )));
        }
        Ok(self.home.join(FILES_DIR).join(hash.to_ascii_lowercase()))
    }

    /// Where an upload is spooled before it is kept under its hash.
    pub fn upload_target(&self, hash: &str) -> Result<(PathBuf, PathBuf), TemplateBuildError> {
        let path = self.files_path(hash)?;
        let dir = self.home.join(FILES_DIR);
        std::fs::create_dir_all(&dir)
            .map_err(|e| TemplateBuildError::Io(format!("creating {}: {e}", dir.display())))?;
        let tmp = dir.join(format!(".upload-{}", warren_control::new_id_with("u")));
        Ok((tmp, path))
    }

    /// `POST /v2/templates/{id}/builds/{build}`: the build's context (a
    /// Dockerfile and the uploaded files) and request; the caller starts it
    /// and feeds its events to [`TemplateBuilds::follow`].
    pub fn prepare(
        &self,
        who: &Principal,
        template_id: &str,
        build_id: &str,
        def: &Definition,
        base_user: &dyn Fn(&str) -> Option<String>,
        allow: &[String],
    ) -> Result<Prepared, TemplateBuildError> {
        let r = self.requested(who, template_id, build_id)?;
        if def.from_image_registry.is_some() {
            return Err(TemplateBuildError::Invalid(
                "fromImageRegistry (registry credentials) is not supported: Warren pulls with the credentials in <home>/registries.toml".into(),
            ));
        }
        let base = match (&def.from_image, &def.from_template) {
            (Some(_), Some(_)) => {
                return Err(TemplateBuildError::Invalid(
                    "fromImage and fromTemplate are both given; name one".into(),
                ))
            }
            (_, Some(t)) => self.get(who, t).map(|b| b.image).ok_or_else(|| {
                TemplateBuildError::NotFound(format!("template {t:?} was not built here"))
            })?,
            (Some(i), None) => i.clone(),
            (None, None) => DEFAULT_BASE.to_string(),
        };
        let (dockerfile, lines) = dockerfile(&base, &def.steps, base_user)?;
        let mut hashes: Vec<&str> = def
            .steps
            .iter()
            .filter_map(|s| s.files_hash.as_deref())
            .collect();
        hashes.dedup();
        let mut files = Vec::new();
        for h in hashes {
            let path = self.files_path(h)?;
            if !path.exists() {
                return Err(TemplateBuildError::Invalid(format!(
                    "the files of hash {h} were not uploaded (GET /templates/{template_id}/files/{h} gives the link)"
                )));
            }
            files.push((h.to_ascii_lowercase(), path));
        }
        let context = context_archive(&dockerfile, &files)?;
        let tag = image_name(&r.name)?;
        let mut pairs = vec![("tag".to_string(), tag.clone())];
        for rule in allow {
            pairs.push(("allow".into(), rule.clone()));
        }
        if def.force || def.steps.iter().any(|s| s.force) {
            pairs.push(("no_cache".into(), "true".into()));
        }
        let request = BuildRequest::from_pairs(&pairs)
            .map_err(|e| TemplateBuildError::Invalid(e.to_string()))?;
        {
            let mut p = lock(&r.progress);
            p.status = "building";
        }
        Ok(Prepared {
            request,
            context,
            lines,
            built: Built {
                template_id: template_id.to_string(),
                image: tag,
                digest: None,
                start_cmd: def.start_cmd.clone().filter(|c| !c.trim().is_empty()),
                ready_cmd: def.ready_cmd.clone(),
                cpu: r.cpu,
                memory_mb: r.memory_mb,
                snapshot: None,
                tenant: r.tenant,
            },
            name: r.name,
            progress: r.progress,
        })
    }

    /// Turns a build's events into the template's log. A finished build
    /// answers its template, which [`TemplateBuilds::ready`] then keeps.
    pub fn follow(&self, prepared: &Prepared, event: &BuildEvent) -> Option<Built> {
        let now = time::OffsetDateTime::now_utc()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default();
        let step_of = |line: &usize| prepared.lines.get(line).cloned();
        let entry = |level, message: String, step: Option<String>| LogEntry {
            timestamp: now.clone(),
            level,
            message,
            step,
        };
        let mut entries = Vec::new();
        let mut finished = None;
        match event {
            BuildEvent::Build { id } => {
                entries.push(entry("info", format!("Warren build {id}"), None))
            }
            BuildEvent::Step {
                step,
                of,
                line,
                instruction,
                ..
            } => entries.push(entry(
                "info",
                format!("[{step}/{of}] {instruction}"),
                step_of(line),
            )),
            BuildEvent::Output { stderr, text } => {
                for l in text.lines().filter(|l| !l.is_empty()) {
                    entries.push(entry(
                        if *stderr { "warn" } else { "info" },
                        l.to_string(),
                        None,
                    ));
                }
            }
            BuildEvent::StepDone { cached: true, .. } => {
                entries.push(entry("debug", "CACHED".into(), None))
            }
            BuildEvent::StepDone { seconds, .. } => {
                entries.push(entry("debug", format!("done in {seconds:.2}s"), None))
            }
            BuildEvent::Warning { message } => entries.push(entry("warn", message.clone(), None)),
            BuildEvent::Test { command } => {
                entries.push(entry("info", format!("test: {command}"), None))
            }
            BuildEvent::Published { reference } => {
                entries.push(entry("info", format!("published as {reference}"), None))
            }
            BuildEvent::Done {
                digest, seconds, ..
            } => {
                entries.push(entry(
                    "info",
                    format!("built {digest} in {seconds:.2}s"),
                    Some("finalize".into()),
                ));
                finished = Some(Ok(Built {
                    digest: Some(digest.clone()),
                    ..prepared.built.clone()
                }));
            }
            BuildEvent::Failed { message, line } => {
                let step = line
                    .as_ref()
                    .and_then(step_of)
                    .unwrap_or_else(|| "finalize".into());
                entries.push(entry("error", message.clone(), Some(step.clone())));
                finished = Some(Err((message.clone(), Some(step))));
            }
        }
        let mut p = lock(&prepared.progress);
        p.entries.extend(entries);
        match finished {
            Some(Ok(built)) => Some(built),
            Some(Err(reason)) => {
                p.status = "error";
                p.reason = Some(reason);
                None
            }
            None => None,
        }
    }

    /// The build is done (and its warm pool filled): the name is the
    /// template's from now on.
    pub fn ready(&self, prepared: &Prepared, built: Built, note: Option<String>) {
        let now = time::OffsetDateTime::now_utc()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default();
        let kept = self.keep(&prepared.name, built);
        let mut p = lock(&prepared.progress);
        if let Some(message) = note {
            p.entries.push(LogEntry {
                timestamp: now.clone(),
                level: "info",
                message,
                step: Some("finalize".into()),
            });
        }
        match kept {
            Ok(()) => p.status = "ready",
            Err(e) => {
                p.entries.push(LogEntry {
                    timestamp: now,
                    level: "error",
                    message: e.to_string(),
                    step: Some("finalize".into()),
                });
                p.status = "error";
                p.reason = Some((e.to_string(), Some("finalize".into())));
            }
        }
    }

    /// The name a template's warm pool has (a label value).
    pub fn pool_name(&self, prepared: &Prepared) -> String {
        let mut name: String = format!("e2b-{}", prepared.name)
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                    c
                } else {
                    '-'
                }
            })
            .collect();
        name.truncate(63);
        name
    }

    /// A build that could not start.
    pub fn failed(&self, template_id: &str, build_id: &str, message: String) {
        if let Ok(r) = self.requested(&Principal::Operator, template_id, build_id) {
            let mut p = lock(&r.progress);
            p.status = "error";
            p.reason = Some((message, Some("base".into())));
        }
    }

    fn keep(&self, name: &str, built: Built) -> Result<(), TemplateBuildError> {
        self.write(|all| {
            all.insert(name.to_string(), built);
        })
    }

    /// Changes the kept templates, on disk first (whole or not at all).
    fn write(
        &self,
        change: impl FnOnce(&mut BTreeMap<String, Built>),
    ) -> Result<(), TemplateBuildError> {
        let mut all = lock(&self.built);
        let mut next = all.clone();
        change(&mut next);
        let bytes = serde_json::to_vec_pretty(&next)
            .map_err(|e| TemplateBuildError::Io(format!("encoding built templates: {e}")))?;
        let path = self.home.join(BUILT_FILE);
        let tmp = self.home.join(format!(".{BUILT_FILE}.tmp"));
        let written = std::fs::File::create(&tmp)
            .and_then(|mut f| f.write_all(&bytes).and_then(|()| f.sync_all()))
            .and_then(|()| std::fs::rename(&tmp, &path));
        written.map_err(|e| TemplateBuildError::Io(format!("writing {}: {e}", path.display())))?;
        *all = next;
        Ok(())
    }
}

/// A build made ready by [`TemplateBuilds::prepare`].
pub struct Prepared {
    pub request: BuildRequest,
    /// The context archive (Dockerfile and files), a temporary file.
    pub context: std::fs::File,
    /// Dockerfile line → E2B step (`base`, `1`, `2`, …).
    pub lines: BTreeMap<usize, String>,
    built: Built,
    name: String,
    progress: Arc<Mutex<Progress>>,
}

/// The image a template `name` (`name` or `name:tag`) is built as.
fn image_name(name: &str) -> Result<String, TemplateBuildError> {
    let ok = !name.is_empty()
        && name.len() <= 200
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/' | ':'))
        && !name.split('/').any(str::is_empty)
        && name.matches(':').count() <= 1;
    if !ok {
        return Err(TemplateBuildError::Invalid(format!(
            "template name {name:?} is not NAME or NAME:TAG of letters, digits and . _ - /"
        )));
    }
    Ok(format!("{IMAGE_REPO}/{name}"))
}

/// `repo:tag` without its tag (a template's name has no registry port).
fn repository(image: &str) -> &str {
    match image.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => repo,
        _ => image,
    }
}

/// A Dockerfile string literal: double quotes, with `\`, `"` and `$`
/// escaped (E2B's values are literal).
fn quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        if matches!(c, '\\' | '"' | '$') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// The steps as a Dockerfile, and which E2B step each line is.
fn dockerfile(
    base: &str,
    steps: &[StepDef],
    base_user: &dyn Fn(&str) -> Option<String>,
) -> Result<(String, BTreeMap<usize, String>), TemplateBuildError> {
    let mut text = String::new();
    let mut lines = BTreeMap::new();
    let mut push = |text: &mut String, step: String, line: String| {
        if line.contains('\n') {
            return Err(TemplateBuildError::Invalid(format!(
                "step {step}: a line break is not allowed here"
            )));
        }
        text.push_str(&line);
        text.push('\n');
        lines.insert(text.matches('\n').count(), step);
        Ok(())
    };
    push(&mut text, "base".into(), format!("FROM {base}"))?;
    // The user later RUNs go back to after one that names its own.
    let mut user: Option<String> = None;
    for (i, s) in steps.iter().enumerate() {
        let n = (i + 1).to_string();
        let bad =
            |what: &str| TemplateBuildError::Invalid(format!("step {n} ({}): {what}", s.kind));
        match s.kind.as_str() {
            "RUN" => {
                let cmd = s.args.first().ok_or_else(|| bad("no command"))?;
                let as_user = s.args.get(1).filter(|u| !u.is_empty());
                let exec = serde_json::to_string(&["/bin/sh", "-c", cmd.as_str()])
                    .map_err(|e| bad(&e.to_string()))?;
                // Who RUN runs as now: the last USER, else the base's.
                let current = user
                    .clone()
                    .or_else(|| base_user(base))
                    .unwrap_or_else(|| "root".into());
                let same = |a: &str, b: &str| {
                    let root = |u: &str| u == "root" || u == "0";
                    a == b || (root(a) && root(b))
                };
                match as_user.filter(|u| !same(u, &current)) {
                    Some(u) => {
                        push(&mut text, n.clone(), format!("USER {}", quoted(u)))?;
                        push(&mut text, n.clone(), format!("RUN {exec}"))?;
                        push(&mut text, n.clone(), format!("USER {}", quoted(&current)))?;
                    }
                    None => push(&mut text, n.clone(), format!("RUN {exec}"))?,
                }
            }
            "COPY" => {
                let hash = s.files_hash.as_deref().ok_or_else(|| bad("no filesHash"))?;
                let src = s.args.first().ok_or_else(|| bad("no source"))?;
                let dest = s.args.get(1).ok_or_else(|| bad("no destination"))?;
                let mut flags = String::new();
                if let Some(u) = s.args.get(2).filter(|u| !u.is_empty()) {
                    flags.push_str(&format!("--chown={u} "));
                }
                if let Some(m) = s.args.get(3).filter(|m| !m.is_empty()) {
                    flags.push_str(&format!("--chmod={m} "));
                }
                let src = format!(
                    "files/{}/{}",
                    hash.to_ascii_lowercase(),
                    src.trim_start_matches("./")
                );
                let json = serde_json::to_string(&[src.as_str(), dest.as_str()])
                    .map_err(|e| bad(&e.to_string()))?;
                push(&mut text, n, format!("COPY {flags}{json}"))?;
            }
            "ENV" => {
                if s.args.len() % 2 != 0 || s.args.is_empty() {
                    return Err(bad("args are not key, value pairs"));
                }
                let pairs: Vec<String> = s
                    .args
                    .chunks(2)
                    .map(|kv| format!("{}={}", kv[0], quoted(&kv[1])))
                    .collect();
                if let Some(k) = s
                    .args
                    .chunks(2)
                    .map(|kv| &kv[0])
                    .find(|k| !warren_core::build::is_arg_name(k))
                {
                    return Err(bad(&format!("{k:?} is not a variable name")));
                }
                push(&mut text, n, format!("ENV {}", pairs.join(" ")))?;
            }
            "WORKDIR" => {
                let dir = s.args.first().ok_or_else(|| bad("no directory"))?;
                push(&mut text, n, format!("WORKDIR {}", quoted(dir)))?;
            }
            "USER" => {
                let u = s
                    .args
                    .first()
                    .filter(|u| !u.is_empty())
                    .ok_or_else(|| bad("no user"))?;
                user = Some(u.clone());
                push(&mut text, n, format!("USER {}", quoted(u)))?;
            }
            other => {
                return Err(bad(&format!(
                    "step type {other:?} is not one of RUN, COPY, ENV, WORKDIR, USER"
                )))
            }
        }
    }
    Ok((text, lines))
}

/// The build context: the Dockerfile, and each upload's entries under
/// `files/<hash>/` (gzip or plain tar, as the SDK sent it).
fn context_archive(
    dockerfile: &str,
    files: &[(String, PathBuf)],
) -> Result<std::fs::File, TemplateBuildError> {
    let io = |e: std::io::Error| TemplateBuildError::Io(format!("making the build context: {e}"));
    let mut out = tempfile_in_tmp().map_err(io)?;
    {
        let mut tar = tar::Builder::new(&mut out);
        let mut h = tar::Header::new_gnu();
        h.set_size(dockerfile.len() as u64);
        h.set_mode(0o644);
        tar.append_data(&mut h, "Dockerfile", dockerfile.as_bytes())
            .map_err(io)?;
        for (hash, path) in files {
            let file = std::fs::File::open(path).map_err(io)?;
            let mut upload = tar::Archive::new(warren_control::tar_bytes(file).map_err(io)?);
            let bad = |e: std::io::Error| {
                TemplateBuildError::Invalid(format!(
                    "the upload of files {hash} is not a tar archive: {e}"
                ))
            };
            for entry in upload.entries().map_err(bad)? {
                let mut entry = entry.map_err(bad)?;
                let name = entry.path().map_err(bad)?.into_owned();
                let mut header = entry.header().clone();
                let kind = header.entry_type();
                if !matches!(
                    kind,
                    tar::EntryType::Regular | tar::EntryType::Directory | tar::EntryType::Symlink
                ) {
                    continue;
                }
                let at = Path::new("files").join(hash).join(&name);
                // The archive's own names are checked by the build's
                // context index ('..' and absolute names are refused).
                if kind == tar::EntryType::Symlink {
                    let target = entry
                        .link_name()
                        .map_err(bad)?
                        .map(|t| t.into_owned())
                        .unwrap_or_default();
                    tar.append_link(&mut header, &at, target).map_err(io)?;
                } else {
                    tar.append_data(&mut header, &at, &mut entry).map_err(io)?;
                }
            }
        }
        tar.finish().map_err(io)?;
    }
    use std::io::Seek;
    out.seek(std::io::SeekFrom::Start(0)).map_err(io)?;
    Ok(out)
}

fn tempfile_in_tmp() -> std::io::Result<std::fs::File> {
    let path = std::env::temp_dir().join(format!(
        ".warren-e2b-context-{}",
        warren_control::new_id_with("c")
    ));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)?;
    // Anonymous from here on: removed when closed.
    std::fs::remove_file(&path)?;
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(kind: &str, args: &[&str]) -> StepDef {
        StepDef {
            kind: kind.into(),
            args: args.iter().map(|a| a.to_string()).collect(),
            files_hash: (kind == "COPY").then(|| "a".repeat(64)),
            force: false,
        }
    }

    #[test]
    fn steps_become_a_dockerfile_with_each_line_s_step() {
        let steps = [
            step(
                "RUN",
                &["apt-get update && apt-get install -y curl", "root"],
            ),
            step("COPY", &["app/", "/app/", "user", "0755"]),
            step("ENV", &["A", "1 $x \"q\""]),
            step("WORKDIR", &["/app"]),
            step("USER", &["user"]),
            step("RUN", &["echo hi"]),
        ];
        let (text, lines) =
            dockerfile("debian:bookworm", &steps, &|_| Some("1000".into())).unwrap();
        let hash = "a".repeat(64);
        assert_eq!(
            text,
            format!(
                "FROM debian:bookworm\nUSER \"root\"\nRUN [\"/bin/sh\",\"-c\",\"apt-get update && apt-get install -y curl\"]\nUSER \"1000\"\n\
                 COPY --chown=user --chmod=0755 [\"files/{hash}/app/\",\"/app/\"]\nENV A=\"1 \\$x \\\"q\\\"\"\nWORKDIR \"/app\"\nUSER \"user\"\n\
                 RUN [\"/bin/sh\",\"-c\",\"echo hi\"]\n"
            )
        );
        let want: BTreeMap<usize, String> = [
            (1, "base"),
            (2, "1"),
            (3, "1"),
            (4, "1"),
            (5, "2"),
            (6, "3"),
            (7, "4"),
            (8, "5"),
            (9, "6"),
        ]
        .into_iter()
        .map(|(l, s)| (l, s.to_string()))
        .collect();
        assert_eq!(lines, want);
        // The Dockerfile is one Warren's builder reads back as written.
        // A root RUN on a base that runs as root needs no USER around it.
        let (text, _) =
            dockerfile("b", &[step("RUN", &["apt-get update", "root"])], &|_| None).unwrap();
        assert_eq!(
            text,
            "FROM b\nRUN [\"/bin/sh\",\"-c\",\"apt-get update\"]\n"
        );
        let e = dockerfile("b", &[step("EXPOSE", &["1"])], &|_| None).unwrap_err();
        assert!(e.to_string().contains("step 1 (EXPOSE)"), "{e}");
        assert!(dockerfile("b", &[step("ENV", &["A"])], &|_| None).is_err());
        assert!(dockerfile("b", &[step("ENV", &["1A", "x"])], &|_| None).is_err());
        assert!(dockerfile("b", &[step("WORKDIR", &["/a\nRUN evil"])], &|_| None).is_err());
    }

    #[test]
    fn ready_commands_for_a_port_become_the_port() {
        assert_eq!(
            port_of_ready("[ -n \"$(ss -Htuln sport = :8000)\" ]"),
            Some(8000)
        );
        assert_eq!(port_of_ready("sleep 20"), None);
        let b = Built {
            template_id: "t".into(),
            image: "e2b-template/i:v1".into(),
            digest: Some("sha256:d".into()),
            start_cmd: Some("serve".into()),
            ready_cmd: Some("[ -f /ready ]".into()),
            cpu: Some(2),
            memory_mb: Some(1024),
            snapshot: None,
            tenant: Default::default(),
        };
        let t = b.template();
        assert_eq!(t.image, "e2b-template/i@sha256:d");
        assert_eq!(
            t.cmd,
            Some(vec!["/bin/sh".to_string(), "-c".into(), "serve".into()])
        );
        assert_eq!(
            (t.ready_port, t.ready_cmd.as_deref()),
            (None, Some("[ -f /ready ]"))
        );
        assert_eq!(
            (t.cpu.as_deref(), t.memory.as_deref()),
            (Some("2"), Some("1024M"))
        );
        assert!(image_name("my-template:v1").is_ok());
        assert!(image_name("a b").is_err() && image_name("a:b:c").is_err());
    }
}

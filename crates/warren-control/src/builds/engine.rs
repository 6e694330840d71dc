//! Running a build: every step on one node. `RUN` runs in a Warren sandbox
//! made from the previous step's image (the same isolation as any
//! sandbox; no network unless the build allows hosts) and its changes are
//! committed as one layer; `COPY`/`ADD` write the chosen context files
//! into such a sandbox and commit them; config instructions change the
//! image config without a layer. Each step's result is kept in the node's
//! step cache under a key of everything it depends on (its parent image
//! digest, the instruction with its variables substituted, the build args
//! it sees, the digests of the files it copies), so a build whose inputs
//! did not change takes every step from the cache.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use base64::Engine as _;
use futures_util::StreamExt;
use sha2::{Digest as _, Sha256};
use warren_core::build::{BuildEvent, BuildRequest, ImageSettings};
use warren_core::spec::Dur;
use warren_core::sync::lock;
use warren_core::{ExecEvent, ExecRequest, SandboxSpec};
use warren_node_api::{
    CommitImage, DeriveImage, FileKind, ImageInfo, ImageTarget, NodeApi, PathKind, PathOp,
    WriteFile,
};

use super::context::{Context, Selection};
use super::dockerfile::{Cmd, Copy, Dockerfile, Op, Stage};
use super::words::{self, Vars};
use super::Build;
use crate::control::{node_error, Control};

/// How long one step's sandbox may live (a step that runs longer is
/// ended with its sandbox).
const STEP_TTL: std::time::Duration = std::time::Duration::from_secs(3 * 3600);
/// Memory limit of a step's sandbox (package installs and compilers need
/// more than a sandbox's default).
const STEP_MEMORY: u64 = 4 << 30;
/// The label a build's sandboxes carry: its id.
pub(crate) const BUILD_LABEL: &str = "warren.dev/build";

/// A failure, and the Dockerfile line at fault.
struct Failure {
    message: String,
    line: Option<usize>,
}

impl Failure {
    fn at(line: usize, message: impl std::fmt::Display) -> Failure {
        Failure {
            message: message.to_string(),
            line: Some(line),
        }
    }
}

impl From<warren_core::ApiError> for Failure {
    fn from(e: warren_core::ApiError) -> Failure {
        Failure {
            message: e.message,
            line: None,
        }
    }
}

/// What a stage has made so far: its image, and what the next steps see.
#[derive(Clone)]
struct State {
    digest: String,
    /// The image config's environment, `KEY=VALUE`.
    env: Vec<String>,
    /// `ARG`s declared in this stage, with their values.
    args: BTreeMap<String, String>,
    workdir: String,
    user: String,
    shell: Vec<String>,
    /// Whether this stage set `CMD` (else `ENTRYPOINT` clears the base's).
    cmd_set: bool,
}

impl State {
    fn of(image: &ImageInfo) -> State {
        let config = &image.record["config"];
        let strings = |v: &serde_json::Value| -> Vec<String> {
            v.as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|s| s.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default()
        };
        State {
            digest: image.digest.clone(),
            env: strings(&config["env"]),
            args: BTreeMap::new(),
            workdir: config["working_dir"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            user: config["user"].as_str().unwrap_or_default().to_string(),
            shell: vec!["/bin/sh".into(), "-c".into()],
            cmd_set: false,
        }
    }

    /// Variables a step's words see: its ARGs, then ENV over them.
    fn vars(&self) -> Vars {
        let mut vars = self.args.clone();
        for kv in &self.env {
            if let Some((k, v)) = kv.split_once('=') {
                vars.insert(k.to_string(), v.to_string());
            }
        }
        vars
    }

    fn set_env(&mut self, key: &str, value: &str) {
        self.env
            .retain(|kv| kv.split_once('=').map(|(k, _)| k) != Some(key));
        self.env.push(format!("{key}={value}"));
    }

    /// A path in the image: absolute, or relative to the working directory.
    fn path(&self, p: &str) -> String {
        if p.starts_with('/') {
            return p.to_string();
        }
        let base = if self.workdir.is_empty() {
            "/"
        } else {
            &self.workdir
        };
        format!("{}/{p}", base.trim_end_matches('/'))
    }
}

fn key(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    h.update(b"warren-build-step v1");
    for p in parts {
        h.update([0]);
        h.update(p.as_bytes());
    }
    hex::encode(h.finalize())
}

struct Run {
    control: Arc<Control>,
    build: Arc<Build>,
    req: BuildRequest,
    node: String,
    api: Arc<dyn NodeApi>,
    context: Arc<Mutex<Context>>,
    file: Dockerfile,
    /// The global ARGs' values (before the first FROM).
    global: Vars,
    /// Build args some ARG took.
    used_args: std::collections::BTreeSet<String>,
    stages: Vec<Option<State>>,
    step: usize,
    total: usize,
}

/// Runs a build to its end and reports it on `build`.
pub(crate) async fn run(
    control: Arc<Control>,
    build: Arc<Build>,
    req: BuildRequest,
    spooled: std::fs::File,
) {
    let started = Instant::now();
    let result = prepare_and_run(control, build.clone(), req.clone(), spooled).await;
    match result {
        Ok(digest) => build.emit(BuildEvent::Done {
            digest,
            tag: req.tag.clone(),
            seconds: started.elapsed().as_secs_f64(),
        }),
        Err(f) => build.emit(BuildEvent::Failed {
            message: f.message,
            line: f.line,
        }),
    }
}

async fn prepare_and_run(
    control: Arc<Control>,
    build: Arc<Build>,
    req: BuildRequest,
    spooled: std::fs::File,
) -> Result<String, Failure> {
    let dockerfile = req.dockerfile.clone();
    let (context, text) = tokio::task::spawn_blocking(move || Context::index(spooled, &dockerfile))
        .await
        .map_err(|e| Failure {
            message: format!("build task: {e}"),
            line: None,
        })?
        .map_err(|e| Failure {
            message: e.to_string(),
            line: None,
        })?;
    let text = text.ok_or_else(|| Failure {
        message: format!(
            "there is no {} in the build context (the Dockerfile must be inside it)",
            req.dockerfile
        ),
        line: None,
    })?;
    let file = Dockerfile::parse(&text).map_err(|e| Failure {
        message: e.to_string(),
        line: Some(e.line),
    })?;
    let node = control.resolving_node(&Default::default())?;
    let mut run = Run {
        control: control.clone(),
        build,
        req,
        node: node.name.clone(),
        api: node.api.clone(),
        context: Arc::new(Mutex::new(context)),
        file,
        global: Vars::new(),
        used_args: Default::default(),
        stages: Vec::new(),
        step: 0,
        total: 0,
    };
    run.all().await
}

impl Run {
    async fn all(&mut self) -> Result<String, Failure> {
        for (line, arg) in self.file.global_args.clone() {
            let (name, value) = self.arg(line, &arg, &self.global.clone())?;
            self.global.insert(name, value);
        }
        let target = match &self.req.target {
            Some(t) => self
                .file
                .stage_index(t, self.file.stages.len())
                .ok_or_else(|| Failure {
                    message: format!("the Dockerfile has no stage {t:?}"),
                    line: None,
                })?,
            None => self.file.stages.len() - 1,
        };
        let needed = self.needed(target);
        self.stages = vec![None; self.file.stages.len()];
        self.total = needed
            .iter()
            .map(|&i| self.file.stages[i].steps.len() + 1)
            .sum();
        for i in needed {
            let state = self.stage(i).await?;
            self.stages[i] = Some(state);
        }
        let unused: Vec<&String> = self
            .req
            .build_args
            .keys()
            .filter(|k| !self.used_args.contains(*k))
            .collect();
        if !unused.is_empty() {
            self.build.emit(BuildEvent::Warning {
                message: format!("build args not used by any ARG: {unused:?}"),
            });
        }
        let digest = self.stages[target]
            .as_ref()
            .map(|s| s.digest.clone())
            .unwrap_or_default();
        self.finish(&digest).await?;
        Ok(digest)
    }

    /// The stages `target` needs (by FROM or COPY --from), in order.
    fn needed(&self, target: usize) -> Vec<usize> {
        let mut need = vec![false; self.file.stages.len()];
        need[target] = true;
        for i in (0..=target).rev() {
            if !need[i] {
                continue;
            }
            let stage = &self.file.stages[i];
            let named = |raw: &str| {
                let name = words::expand(raw, &self.global, self.file.escape).unwrap_or_default();
                self.file.stage_index(&name, i)
            };
            if let Some(j) = named(&stage.from) {
                need[j] = true;
            }
            for step in &stage.steps {
                if let Op::Copy(Copy { from: Some(f), .. }) = &step.op {
                    if let Some(j) = named(f) {
                        need[j] = true;
                    }
                }
            }
        }
        (0..=target).filter(|&i| need[i]).collect()
    }

    fn begin(&mut self, stage: &Stage, line: usize, text: &str) -> Instant {
        self.step += 1;
        self.build.emit(BuildEvent::Step {
            step: self.step,
            of: self.total,
            stage: stage.name.clone().unwrap_or_else(|| "-".into()),
            line,
            instruction: text.to_string(),
        });
        Instant::now()
    }

    fn done(&self, at: Instant, cached: bool, digest: &str) {
        self.build.emit(BuildEvent::StepDone {
            step: self.step,
            cached,
            seconds: at.elapsed().as_secs_f64(),
            digest: digest.to_string(),
        });
    }

    async fn stage(&mut self, index: usize) -> Result<State, Failure> {
        let stage = self.file.stages[index].clone();
        let from = words::expand(&stage.from, &self.global, self.file.escape)
            .map_err(|e| Failure::at(stage.line, e))?;
        let at = self.begin(&stage, stage.line, &format!("FROM {from}"));
        let mut state = match self.file.stage_index(&from, index) {
            Some(j) => {
                let mut s = self.stages[j].clone().ok_or_else(|| {
                    Failure::at(stage.line, format!("stage {from:?} was not built"))
                })?;
                s.args.clear();
                s
            }
            None if from == "scratch" => {
                let image = self
                    .api
                    .image_derive(DeriveImage {
                        base: "scratch".into(),
                        into: ImageTarget::Step(key(&["scratch"])),
                        settings: None,
                        created_by: None,
                    })
                    .await
                    .map_err(|e| Failure::at(stage.line, node_error(e).message))?;
                State::of(&image)
            }
            None => {
                let image = self
                    .api
                    .image_for_create(&from)
                    .await
                    .map_err(|e| Failure::at(stage.line, node_error(e).message))?;
                State::of(&image)
            }
        };
        self.done(at, true, &state.digest);
        for step in &stage.steps {
            let at = self.begin(&stage, step.line, &step.text);
            let cached = self
                .step(&mut state, &step.op, step.line, &step.text)
                .await
                .map_err(|mut f| {
                    f.line.get_or_insert(step.line);
                    f
                })?;
            self.done(at, cached, &state.digest);
        }
        Ok(state)
    }

    /// `ARG name[=default]`: the build arg's value, else the default.
    fn arg(&mut self, line: usize, text: &str, vars: &Vars) -> Result<(String, String), Failure> {
        let text = text.trim();
        let (name, default) = match text.split_once('=') {
            Some((n, d)) => {
                let d = words::words(d, vars, self.file.escape)
                    .map_err(|e| Failure::at(line, e))?
                    .join(" ");
                (n.to_string(), Some(d))
            }
            None => (text.to_string(), None),
        };
        if !warren_core::build::is_arg_name(&name) {
            return Err(Failure::at(line, format!("ARG {name:?} is not a name")));
        }
        let value = match self.req.build_args.get(&name) {
            Some(v) => {
                self.used_args.insert(name.clone());
                v.clone()
            }
            None => default.unwrap_or_default(),
        };
        Ok((name, value))
    }

    /// Runs one step (or takes it from the cache: true).
    async fn step(
        &mut self,
        state: &mut State,
        op: &Op,
        line: usize,
        text: &str,
    ) -> Result<bool, Failure> {
        let esc = self.file.escape;
        let vars = state.vars();
        let bad = |e: words::WordError| Failure::at(line, e);
        let mut settings = ImageSettings::default();
        match op {
            Op::Arg(a) => {
                let (name, value) = self.arg(line, a, &vars)?;
                // A global ARG redeclared without a default keeps its value.
                let value = match (a.contains('='), self.global.get(&name)) {
                    (false, Some(g)) if !self.req.build_args.contains_key(&name) => g.clone(),
                    _ => value,
                };
                state.args.insert(name, value);
                return Ok(true);
            }
            Op::Shell(argv) => {
                if argv.is_empty() {
                    return Err(Failure::at(line, "SHELL needs a command in JSON form"));
                }
                state.shell = argv.clone();
                return Ok(true);
            }
            Op::Run(cmd) => return self.run_step(state, cmd, text).await,
            Op::Copy(c) => return self.copy_step(state, c, line, text).await,
            Op::Workdir(w) => {
                let dir = state.path(&words::expand(w, &vars, esc).map_err(bad)?);
                return self.workdir_step(state, &dir, text).await;
            }
            Op::Env(e) => {
                for (k, v) in words::pairs(e, &vars, esc).map_err(bad)? {
                    state.set_env(&k, &v);
                }
                settings.env = Some(state.env.clone());
            }
            Op::Label(l) => {
                settings.labels = words::pairs(l, &vars, esc)
                    .map_err(bad)?
                    .into_iter()
                    .collect()
            }
            Op::User(u) => {
                let user = words::expand(u, &vars, esc).map_err(bad)?;
                state.user = user.clone();
                settings.user = Some(user);
            }
            Op::Expose(ports) => {
                for p in ports {
                    let p = words::expand(p, &vars, esc).map_err(bad)?;
                    let (port, proto) = p.split_once('/').unwrap_or((&p, "tcp"));
                    if port.parse::<u16>().is_err() || !matches!(proto, "tcp" | "udp") {
                        return Err(Failure::at(
                            line,
                            format!("EXPOSE {p:?} is not PORT[/tcp|/udp]"),
                        ));
                    }
                    settings.exposed_ports.push(format!("{port}/{proto}"));
                }
            }
            Op::Cmd(c) => {
                state.cmd_set = true;
                settings.cmd = Some(self.argv(state, c));
            }
            Op::Entrypoint(c) => {
                settings.entrypoint = Some(self.argv(state, c));
                if !state.cmd_set {
                    settings.cmd = Some(Vec::new());
                }
            }
        }
        let settings_json = serde_json::to_string(&settings).unwrap_or_default();
        let k = key(&[&state.digest, "config", &settings_json]);
        if let Some(hit) = self.cached(&k).await? {
            state.digest = hit;
            return Ok(true);
        }
        let image = self
            .api
            .image_derive(DeriveImage {
                base: state.digest.clone(),
                into: ImageTarget::Step(k),
                settings: Some(settings),
                created_by: Some(text.to_string()),
            })
            .await
            .map_err(node_error)?;
        state.digest = image.digest;
        Ok(false)
    }

    fn argv(&self, state: &State, c: &Cmd) -> Vec<String> {
        match c {
            Cmd::Exec(argv) => argv.clone(),
            Cmd::Shell(s) => {
                let mut argv = state.shell.clone();
                argv.push(s.clone());
                argv
            }
        }
    }

    async fn cached(&self, key: &str) -> Result<Option<String>, Failure> {
        if self.req.no_cache {
            return Ok(None);
        }
        Ok(self
            .api
            .image_step(key)
            .await
            .map_err(node_error)?
            .map(|i| i.digest))
    }

    /// A sandbox of the node from `digest` for one step.
    async fn sandbox(&self, digest: &str, network: bool) -> Result<Sandbox, Failure> {
        let mut labels = warren_core::Labels::new();
        let build_id = lock(&self.build.info).id.clone();
        labels.insert(BUILD_LABEL.to_string(), build_id);
        let spec = SandboxSpec {
            image: digest.to_string(),
            memory: Some(warren_core::spec::ByteSize(STEP_MEMORY)),
            labels,
            ttl: Dur::new(STEP_TTL).ok(),
            network: if network {
                self.req.network()
            } else {
                Default::default()
            },
            ..Default::default()
        };
        let (info, _) = self
            .control
            .create_pinned(spec, true, Some(&self.node))
            .await?;
        Ok(Sandbox {
            control: self.control.clone(),
            id: info.id,
        })
    }

    /// Runs `argv` in the sandbox, its output shown as the build's; its
    /// exit code.
    async fn exec(
        &self,
        sandbox: &Sandbox,
        argv: Vec<String>,
        env: BTreeMap<String, String>,
        state: &State,
    ) -> Result<i32, Failure> {
        let req = ExecRequest {
            cmd: argv,
            env,
            cwd: (!state.workdir.is_empty()).then(|| state.workdir.clone()),
            user: (!state.user.is_empty()).then(|| state.user.clone()),
            ..Default::default()
        };
        let mut events = self.control.exec(&sandbox.id, &req).await?;
        let b64 = base64::engine::general_purpose::STANDARD;
        while let Some(event) = events.next().await {
            match event {
                ExecEvent::Stdout { data } | ExecEvent::Stderr { data } if data.is_empty() => {}
                ExecEvent::Stdout { data } => self.build.emit(BuildEvent::Output {
                    stderr: false,
                    text: String::from_utf8_lossy(&b64.decode(data).unwrap_or_default()).into(),
                }),
                ExecEvent::Stderr { data } => self.build.emit(BuildEvent::Output {
                    stderr: true,
                    text: String::from_utf8_lossy(&b64.decode(data).unwrap_or_default()).into(),
                }),
                ExecEvent::Exit { code, .. } => return Ok(code),
                ExecEvent::Error { message } => {
                    return Err(Failure {
                        message,
                        line: None,
                    })
                }
                ExecEvent::Start { .. } | ExecEvent::Keepalive => {}
            }
        }
        Err(Failure {
            message: "the command's output ended without an exit status".into(),
            line: None,
        })
    }

    async fn commit(&self, sandbox: &Sandbox, key: String, text: &str) -> Result<String, Failure> {
        let row = self.control.get(&sandbox.id).await?;
        let image = self
            .control
            .api(&row.node)?
            .commit(
                &sandbox.id,
                CommitImage {
                    into: ImageTarget::Step(key),
                    created_by: Some(text.to_string()),
                },
            )
            .await
            .map_err(node_error)?;
        Ok(image.digest)
    }

    async fn run_step(&self, state: &mut State, cmd: &Cmd, text: &str) -> Result<bool, Failure> {
        let argv = self.argv(state, cmd);
        // ARGs are the RUN's environment (ENV, in the image, wins).
        let env: BTreeMap<String, String> = state
            .args
            .iter()
            .filter(|(k, _)| {
                !state
                    .env
                    .iter()
                    .any(|kv| kv.split_once('=').map(|(n, _)| n) == Some(k.as_str()))
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let k = key(&[
            &state.digest,
            "run",
            &serde_json::to_string(&argv).unwrap_or_default(),
            &serde_json::to_string(&env).unwrap_or_default(),
            &self.req.allow.join(","),
        ]);
        if let Some(hit) = self.cached(&k).await? {
            state.digest = hit;
            return Ok(true);
        }
        let sandbox = self.sandbox(&state.digest, true).await?;
        let result = async {
            let code = self.exec(&sandbox, argv, env, state).await?;
            if code != 0 {
                return Err(Failure {
                    message: format!("{text}: exited with code {code}"),
                    line: None,
                });
            }
            self.commit(&sandbox, k, text).await
        }
        .await;
        sandbox.remove().await;
        state.digest = result?;
        Ok(false)
    }

    async fn workdir_step(
        &self,
        state: &mut State,
        dir: &str,
        text: &str,
    ) -> Result<bool, Failure> {
        let k = key(&[&state.digest, "workdir", dir]);
        state.workdir = dir.to_string();
        if let Some(hit) = self.cached(&k).await? {
            state.digest = hit;
            return Ok(true);
        }
        // The directory is made (as `docker build` does) in a layer of its
        // own, when the image lacks it.
        let sandbox = self.sandbox(&state.digest, false).await?;
        let made = self
            .control
            .path_op(
                &sandbox.id,
                PathOp::MakeDir {
                    path: dir.to_string(),
                },
            )
            .await;
        let base = match made {
            Ok(_) => self.commit(&sandbox, k.clone(), text).await,
            Err(e) if e.code == warren_core::ErrorCode::Conflict => Ok(state.digest.clone()),
            Err(e) => Err(e.into()),
        };
        sandbox.remove().await;
        let image = self
            .api
            .image_derive(DeriveImage {
                base: base?,
                into: ImageTarget::Step(k),
                settings: Some(ImageSettings {
                    working_dir: Some(dir.to_string()),
                    ..Default::default()
                }),
                created_by: Some(text.to_string()),
            })
            .await
            .map_err(node_error)?;
        state.digest = image.digest;
        Ok(false)
    }

    async fn copy_step(
        &self,
        state: &mut State,
        c: &Copy,
        line: usize,
        text: &str,
    ) -> Result<bool, Failure> {
        let vars = state.vars();
        let esc = self.file.escape;
        let bad = |e: words::WordError| Failure::at(line, e);
        let sources: Vec<String> = c
            .sources
            .iter()
            .map(|s| words::expand(s, &vars, esc))
            .collect::<Result<_, _>>()
            .map_err(bad)?;
        let raw_dest = words::expand(&c.dest, &vars, esc).map_err(bad)?;
        let dest = state.path(&raw_dest);
        let dest_is_dir = raw_dest.ends_with('/') || sources.len() > 1;
        let chmod = c
            .chmod
            .as_deref()
            .map(|m| u32::from_str_radix(m, 8).ok().filter(|m| *m <= 0o7777))
            .map(|m| {
                m.ok_or_else(|| {
                    Failure::at(line, format!("--chmod={:?} is not an octal mode", c.chmod))
                })
            })
            .transpose()?;
        let chown = c
            .chown
            .as_deref()
            .map(|o| words::expand(o, &vars, esc))
            .transpose()
            .map_err(bad)?;
        if let Some(from) = &c.from {
            let from = words::expand(from, &vars, esc).map_err(bad)?;
            return self
                .copy_from(
                    state,
                    &from,
                    &sources,
                    &dest,
                    dest_is_dir,
                    chown,
                    line,
                    text,
                )
                .await;
        }
        let context = self.context.clone();
        let selected = {
            let ctx = lock(&context);
            let mut all = Vec::new();
            for s in &sources {
                all.push(ctx.select(s).map_err(|e| Failure::at(line, e))?);
            }
            let digests: Vec<String> = all.iter().map(|s| ctx.digest(s)).collect();
            (all, digests.join(","))
        };
        let (selections, digests) = selected;
        let single_file = selections.len() == 1 && selections[0].single_file;
        let unpack = c.add && single_file && is_archive(&selections[0].items[0].0);
        let k = key(&[
            &state.digest,
            "copy",
            &serde_json::to_string(&(&sources, &dest, dest_is_dir, unpack, &chown, chmod))
                .unwrap_or_default(),
            &digests,
        ]);
        if let Some(hit) = self.cached(&k).await? {
            state.digest = hit;
            return Ok(true);
        }
        let sandbox = self.sandbox(&state.digest, false).await?;
        let result = async {
            // One file to a path that is not an existing directory: the
            // file takes that name.
            let rename = if single_file && !dest_is_dir && !unpack {
                let st = self
                    .control
                    .path_op(&sandbox.id, PathOp::Stat { path: dest.clone() })
                    .await;
                match st {
                    Ok(entries) if entries.first().is_some_and(|e| e.kind == PathKind::Dir) => None,
                    _ => Some(dest.rsplit('/').next().unwrap_or_default().to_string()),
                }
            } else {
                None
            };
            let dir = match &rename {
                Some(_) => parent(&dest),
                None => dest.clone(),
            };
            let mut top = Vec::new();
            for sel in &selections {
                let body = archive_of(context.clone(), sel, rename.clone(), chmod, unpack).await?;
                self.control
                    .write_file(
                        &sandbox.id,
                        WriteFile {
                            path: dir.clone(),
                            mode: 0o755,
                            tar: true,
                        },
                        body,
                    )
                    .await?;
                top.extend(tops(sel, rename.as_deref()));
            }
            if let Some(owner) = &chown {
                self.chown(&sandbox, owner, &dir, top, state).await?;
            }
            self.commit(&sandbox, k, text).await
        }
        .await;
        sandbox.remove().await;
        state.digest = result?;
        Ok(false)
    }

    /// `--chown`: the copied paths' owner, set by the image's own `chown`
    /// (it reads the image's users and groups by name).
    async fn chown(
        &self,
        sandbox: &Sandbox,
        owner: &str,
        dir: &str,
        top: Vec<String>,
        state: &State,
    ) -> Result<(), Failure> {
        let mut argv = vec!["chown".to_string(), "-hR".into(), owner.to_string()];
        argv.extend(
            top.iter()
                .map(|t| format!("{}/{t}", dir.trim_end_matches('/'))),
        );
        let root = State {
            user: "0".into(),
            workdir: String::new(),
            ..state.clone()
        };
        let code = self.exec(sandbox, argv, BTreeMap::new(), &root).await?;
        if code != 0 {
            return Err(Failure {
                message: format!("--chown={owner}: chown exited with code {code} (does the image have chown and that user?)"),
                line: None,
            });
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    async fn copy_from(
        &self,
        state: &mut State,
        from: &str,
        sources: &[String],
        dest: &str,
        dest_is_dir: bool,
        chown: Option<String>,
        line: usize,
        text: &str,
    ) -> Result<bool, Failure> {
        let source_digest = match self.file.stage_index(from, self.stages.len()) {
            Some(j) => self.stages[j]
                .as_ref()
                .map(|s| s.digest.clone())
                .ok_or_else(|| {
                    Failure::at(line, format!("stage {from:?} is not built before this one"))
                })?,
            None => {
                self.api
                    .image_for_create(from)
                    .await
                    .map_err(|e| Failure::at(line, node_error(e).message))?
                    .digest
            }
        };
        if sources.iter().any(|s| s.contains(['*', '?', '['])) {
            return Err(Failure::at(
                line,
                "COPY --from with wildcards is not supported yet; name the paths",
            ));
        }
        let k = key(&[
            &state.digest,
            "copy-from",
            &source_digest,
            &serde_json::to_string(&(sources, dest, dest_is_dir, &chown)).unwrap_or_default(),
        ]);
        if let Some(hit) = self.cached(&k).await? {
            state.digest = hit;
            return Ok(true);
        }
        let source = self.sandbox(&source_digest, false).await?;
        let target = match self.sandbox(&state.digest, false).await {
            Ok(t) => t,
            Err(e) => {
                source.remove().await;
                return Err(e);
            }
        };
        let result = async {
            let mut top = Vec::new();
            for s in sources {
                let path = if s.starts_with('/') {
                    s.clone()
                } else {
                    format!("/{s}")
                };
                let read = self.control.read_file(&source.id, &path).await?;
                let name = path
                    .trim_end_matches('/')
                    .rsplit('/')
                    .next()
                    .unwrap_or_default()
                    .to_string();
                match read.kind {
                    FileKind::Dir => {
                        self.control
                            .write_file(
                                &target.id,
                                WriteFile {
                                    path: dest.to_string(),
                                    mode: 0o755,
                                    tar: true,
                                },
                                read.body,
                            )
                            .await?;
                        top.push(dest.to_string());
                    }
                    FileKind::File { .. } => {
                        let mode = self
                            .control
                            .path_op(&source.id, PathOp::Stat { path: path.clone() })
                            .await?
                            .first()
                            .map_or(0o644, |e| e.mode);
                        let to = if dest_is_dir || dest.ends_with('/') {
                            format!("{}/{name}", dest.trim_end_matches('/'))
                        } else {
                            dest.to_string()
                        };
                        self.control
                            .write_file(
                                &target.id,
                                WriteFile {
                                    path: to.clone(),
                                    mode,
                                    tar: false,
                                },
                                read.body,
                            )
                            .await?;
                        top.push(to);
                    }
                }
            }
            if let Some(owner) = &chown {
                self.chown(
                    &target,
                    owner,
                    "/",
                    top.iter()
                        .map(|t| t.trim_start_matches('/').to_string())
                        .collect(),
                    state,
                )
                .await?;
            }
            self.commit(&target, k, text).await
        }
        .await;
        source.remove().await;
        target.remove().await;
        state.digest = result?;
        Ok(false)
    }

    /// `--test`, the tag, and `--push`.
    async fn finish(&self, digest: &str) -> Result<(), Failure> {
        if let Some(test) = &self.req.test {
            self.build.emit(BuildEvent::Test {
                command: test.clone(),
            });
            let sandbox = self.sandbox(digest, false).await?;
            let state = State {
                digest: digest.to_string(),
                env: Vec::new(),
                args: BTreeMap::new(),
                workdir: String::new(),
                user: String::new(),
                shell: Vec::new(),
                cmd_set: false,
            };
            let code = self
                .exec(
                    &sandbox,
                    vec!["/bin/sh".into(), "-c".into(), test.clone()],
                    BTreeMap::new(),
                    &state,
                )
                .await;
            sandbox.remove().await;
            let code = code?;
            if code != 0 {
                let kept = match &self.req.tag {
                    Some(tag) => format!("; {tag} was not moved"),
                    None => String::new(),
                };
                return Err(Failure {
                    message: format!("the test failed (exit code {code}){kept}"),
                    line: None,
                });
            }
        }
        if let Some(tag) = &self.req.tag {
            self.api
                .image_derive(DeriveImage {
                    base: digest.to_string(),
                    into: ImageTarget::Name(tag.clone()),
                    settings: None,
                    created_by: None,
                })
                .await
                .map_err(node_error)?;
        }
        if let Some(push) = &self.req.push {
            let source = self.req.tag.clone().unwrap_or_else(|| digest.to_string());
            self.control.push_image(push, Some(&source)).await?;
        }
        Ok(())
    }
}

/// A step's sandbox, removed when the step is done with it.
struct Sandbox {
    control: Arc<Control>,
    id: String,
}

impl Sandbox {
    async fn remove(self) {
        if let Err(e) = self.control.destroy(&self.id, "build step done").await {
            tracing::warn!(sandbox = %self.id, error = %e.message, "removing a build step's sandbox; its TTL ends it");
        }
    }
}

fn parent(path: &str) -> String {
    match path.trim_end_matches('/').rsplit_once('/') {
        Some(("", _)) | None => "/".into(),
        Some((dir, _)) => dir.to_string(),
    }
}

/// The names a selection puts directly below the destination.
fn tops(sel: &Selection, rename: Option<&str>) -> Vec<String> {
    if let Some(r) = rename {
        return vec![r.to_string()];
    }
    let mut names: Vec<String> = sel
        .items
        .iter()
        .map(|(_, rel)| rel.split('/').next().unwrap_or_default().to_string())
        .collect();
    names.dedup();
    names
}

fn is_archive(path: &str) -> bool {
    [".tar", ".tar.gz", ".tgz"]
        .iter()
        .any(|s| path.ends_with(s))
}

/// The tar a sandbox unpacks for one selection: the context's files, or
/// for ADD of an archive, the archive's own entries.
async fn archive_of(
    context: Arc<Mutex<Context>>,
    sel: &Selection,
    rename: Option<String>,
    chmod: Option<u32>,
    unpack: bool,
) -> Result<warren_node_api::ByteStream, Failure> {
    let items = Selection {
        items: sel.items.clone(),
        single_file: sel.single_file,
    };
    let spooled = tokio::task::spawn_blocking(move || -> Result<std::fs::File, String> {
        use std::io::{Seek, SeekFrom};
        let mut out = tempfile::tempfile().map_err(|e| e.to_string())?;
        let mut ctx = lock(&context);
        if unpack {
            let path = &items.items[0].0;
            let mut reader = std::io::BufReader::new(ctx.open(path).map_err(|e| e.to_string())?);
            let gzip = std::io::BufRead::fill_buf(&mut reader)
                .map_err(|e| e.to_string())?
                .starts_with(&[0x1f, 0x8b]);
            let copied = if gzip {
                std::io::copy(&mut flate2::read::GzDecoder::new(reader), &mut out)
            } else {
                std::io::copy(&mut reader, &mut out)
            };
            copied.map_err(|e| format!("unpacking {path}: {e}"))?;
        } else {
            ctx.write_tar(&items, rename.as_deref(), chmod, &mut out)
                .map_err(|e| e.to_string())?;
        }
        out.seek(SeekFrom::Start(0)).map_err(|e| e.to_string())?;
        Ok(out)
    })
    .await
    .map_err(|e| Failure {
        message: format!("build task: {e}"),
        line: None,
    })?
    .map_err(|message| Failure {
        message,
        line: None,
    })?;
    let stream = tokio_util::io::ReaderStream::new(tokio::fs::File::from_std(spooled))
        .map(|r| r.map_err(|e| warren_node_api::NodeError::internal(e.to_string())))
        .boxed();
    Ok(stream)
}

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
use tracing::Instrument;
use warren_core::build::{BuildEvent, BuildRequest, ImageSettings};
use warren_core::spec::Dur;
use warren_core::{ExecEvent, ExecRequest, SandboxSpec};
use warren_node_api::{CommitImage, DeriveImage, ImageTarget, NodeApi, PathOp};

use super::context::Context;
use super::dockerfile::{Cmd, Copy, Dockerfile, Op, Stage};
use super::state::{key, Failure, State};
use super::words::{self, Vars};
use super::Build;
use crate::control::Control;
use crate::node_errors::node_error;

/// How long one step's sandbox may live (a step that runs longer is
/// ended with its sandbox).
const STEP_TTL: std::time::Duration = std::time::Duration::from_secs(3 * 3600);
/// Memory limit of a step's sandbox (package installs and compilers need
/// more than a sandbox's default).
const STEP_MEMORY: u64 = 4 << 30;
/// The label a build's sandboxes carry: its id.
pub(crate) const BUILD_LABEL: &str = "warren.dev/build";

pub(super) struct Run {
    pub(super) control: Arc<Control>,
    /// Whose build it is.
    pub(super) tenant: warren_core::tenant::TenantName,
    pub(super) build: Arc<Build>,
    pub(super) req: BuildRequest,
    pub(super) node: String,
    pub(super) api: Arc<dyn NodeApi>,
    pub(super) context: Arc<Mutex<Context>>,
    pub(super) file: Dockerfile,
    /// The global ARGs' values (before the first FROM).
    pub(super) global: Vars,
    /// Build args some ARG took.
    pub(super) used_args: std::collections::BTreeSet<String>,
    pub(super) stages: Vec<Option<State>>,
    pub(super) step: usize,
    pub(super) total: usize,
}

/// Runs a build to its end and reports it on `build`.
pub(crate) async fn run(
    control: Arc<Control>,
    build: Arc<Build>,
    req: BuildRequest,
    spooled: std::fs::File,
) {
    let started = Instant::now();
    // The build's trace: a span per step below it, and below a `RUN`
    // step the create and exec of its sandbox.
    let span = tracing::info_span!(
        "image build",
        warren.build.id = build.id(),
        warren.build.tag = req.tag.as_deref().unwrap_or(""),
    );
    let result = prepare_and_run(control, build.clone(), req.clone(), spooled)
        .instrument(span.clone())
        .await;
    if let Err(f) = &result {
        crate::traces::failed(&span, &f.message);
    }
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
        .map_err(|e| Failure::new(format!("build task: {e}")))?
        .map_err(Failure::new)?;
    let text = text.ok_or_else(|| {
        Failure::new(format!(
            "there is no {} in the build context (the Dockerfile must be inside it)",
            req.dockerfile
        ))
    })?;
    let file = Dockerfile::parse(&text).map_err(|e| Failure {
        message: e.to_string(),
        line: Some(e.line),
    })?;
    let node = control.images().resolving_node(&Default::default())?;
    let mut run = Run {
        control: control.clone(),
        tenant: build.tenant().clone(),
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
                .ok_or_else(|| Failure::new(format!("the Dockerfile has no stage {t:?}")))?,
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

    /// A step begins: its event, and its span.
    fn begin(&mut self, stage: &Stage, line: usize, text: &str) -> (Instant, tracing::Span) {
        self.step += 1;
        let span = tracing::info_span!(
            "build step",
            // As i64: tracing-opentelemetry exports other integers as
            // their text (a Dockerfile has far fewer lines).
            warren.build.step = self.step as i64,
            warren.build.line = line as i64,
            warren.build.instruction = text,
            warren.build.cached = tracing::field::Empty,
        );
        self.build.emit(BuildEvent::Step {
            step: self.step,
            of: self.total,
            stage: stage.name.clone().unwrap_or_else(|| "-".into()),
            line,
            instruction: text.to_string(),
        });
        (Instant::now(), span)
    }

    fn done(&self, (at, span): (Instant, tracing::Span), cached: bool, digest: &str) {
        span.record("warren.build.cached", cached);
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
        let span = at.1.clone();
        let mut state = async {
            Ok(match self.file.stage_index(&from, index) {
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
                        .control
                        .images()
                        .for_create(&self.tenant, self.api.as_ref(), &from)
                        .await
                        .map_err(|e| Failure::at(stage.line, node_error(e).message))?;
                    State::of(&image)
                }
            })
        }
        .instrument(span.clone())
        .await
        .inspect_err(|f: &Failure| crate::traces::failed(&span, &f.message))?;
        self.done(at, true, &state.digest);
        for step in &stage.steps {
            let at = self.begin(&stage, step.line, &step.text);
            let span = at.1.clone();
            let cached = self
                .step(&mut state, &step.op, step.line, &step.text)
                .instrument(span.clone())
                .await
                .map_err(|mut f| {
                    crate::traces::failed(&span, &f.message);
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
                settings.cmd = Some(state.argv(c));
            }
            Op::Entrypoint(c) => {
                settings.entrypoint = Some(state.argv(c));
                if !state.cmd_set {
                    settings.cmd = Some(Vec::new());
                }
            }
        }
        let settings_json = serde_json::to_string(&settings).unwrap_or_default();
        let k = key(&[&state.digest, "config", &settings_json]);
        if self.reuse(state, &k).await? {
            return Ok(true);
        }
        state.digest = self.derive(&state.digest, k, settings, text).await?;
        Ok(false)
    }

    /// Takes the step whose key is `key` from the cache, if it holds it
    /// (and the build does not say `--no-cache`): true.
    pub(super) async fn reuse(&self, state: &mut State, key: &str) -> Result<bool, Failure> {
        if self.req.no_cache {
            return Ok(false);
        }
        match self.api.image_step(key).await.map_err(node_error)? {
            Some(image) => {
                state.digest = image.digest;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// `base` with its config changed, kept as step `key`: its digest.
    async fn derive(
        &self,
        base: &str,
        key: String,
        settings: ImageSettings,
        text: &str,
    ) -> Result<String, Failure> {
        let image = self
            .api
            .image_derive(DeriveImage {
                base: base.to_string(),
                into: ImageTarget::Step(key),
                settings: Some(settings),
                created_by: Some(text.to_string()),
            })
            .await
            .map_err(node_error)?;
        Ok(image.digest)
    }

    /// A sandbox of the node from `digest` for one step.
    pub(super) async fn sandbox(&self, digest: &str, network: bool) -> Result<Sandbox, Failure> {
        let mut labels = warren_core::Labels::new();
        let build_id = self.build.id();
        labels.insert(BUILD_LABEL.to_string(), build_id);
        let spec = SandboxSpec {
            image: digest.to_string(),
            memory: Some(warren_core::spec::ByteSize(STEP_MEMORY)),
            // A limit, not a reservation: a build fits any node.
            memory_request: Some(warren_core::spec::ByteSize(
                warren_core::spec::DEFAULT_MEMORY_REQUEST,
            )),
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
            .create_pinned(&self.tenant, spec, true, Some(&self.node))
            .await?;
        Ok(Sandbox {
            control: self.control.clone(),
            id: info.id,
        })
    }

    /// Runs `req` in the sandbox, its output shown as the build's; its
    /// exit code.
    pub(super) async fn exec(&self, sandbox: &Sandbox, req: ExecRequest) -> Result<i32, Failure> {
        let mut events = self.control.io().exec(&sandbox.id, &req).await?;
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
                ExecEvent::Error { message } => return Err(Failure::new(message)),
                ExecEvent::Start { .. } | ExecEvent::Keepalive => {}
            }
        }
        Err(Failure::new(
            "the command's output ended without an exit status",
        ))
    }

    pub(super) async fn commit(
        &self,
        sandbox: &Sandbox,
        key: String,
        text: &str,
    ) -> Result<String, Failure> {
        let image = self
            .control
            .commit(
                // A step names no image, so there is no name to claim.
                &warren_core::tenant::Principal::Operator,
                &sandbox.id,
                CommitImage {
                    into: ImageTarget::Step(key),
                    created_by: Some(text.to_string()),
                },
            )
            .await?;
        Ok(image.digest)
    }

    async fn run_step(&self, state: &mut State, cmd: &Cmd, text: &str) -> Result<bool, Failure> {
        let argv = state.argv(cmd);
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
        if self.reuse(state, &k).await? {
            return Ok(true);
        }
        let sandbox = self.sandbox(&state.digest, true).await?;
        let result = async {
            let code = self.exec(&sandbox, state.exec_request(argv, env)).await?;
            if code != 0 {
                return Err(Failure::new(format!("{text}: exited with code {code}")));
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
        if self.reuse(state, &k).await? {
            return Ok(true);
        }
        // The directory is made (as `docker build` does) in a layer of its
        // own, when the image lacks it.
        let sandbox = self.sandbox(&state.digest, false).await?;
        let made = self
            .control
            .io()
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
        let settings = ImageSettings {
            working_dir: Some(dir.to_string()),
            ..Default::default()
        };
        state.digest = self.derive(&base?, k, settings, text).await?;
        Ok(false)
    }

    /// `--test`, the tag, and `--push`.
    async fn finish(&self, digest: &str) -> Result<(), Failure> {
        if let Some(test) = &self.req.test {
            self.build.emit(BuildEvent::Test {
                command: test.clone(),
            });
            let sandbox = self.sandbox(digest, false).await?;
            let req = ExecRequest {
                cmd: vec!["/bin/sh".into(), "-c".into(), test.clone()],
                ..Default::default()
            };
            let code = self.exec(&sandbox, req).await;
            sandbox.remove().await;
            let code = code?;
            if code != 0 {
                let kept = match &self.req.tag {
                    Some(tag) => format!("; {tag} was not moved"),
                    None => String::new(),
                };
                return Err(Failure::new(format!(
                    "the test failed (exit code {code}){kept}"
                )));
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
            if let Some(reference) = self
                .control
                .images()
                .publish(self.api.as_ref(), tag)
                .await?
            {
                self.build.emit(BuildEvent::Published { reference });
            }
        }
        if let Some(push) = &self.req.push {
            let source = self.req.tag.clone().unwrap_or_else(|| digest.to_string());
            self.control.images().push(push, Some(&source)).await?;
        }
        Ok(())
    }
}

/// A step's sandbox, removed when the step is done with it.
pub(super) struct Sandbox {
    pub(super) control: Arc<Control>,
    pub(super) id: String,
}

impl Sandbox {
    pub(super) async fn remove(self) {
        if let Err(e) = self.control.destroy(&self.id, "build step done").await {
            tracing::warn!(sandbox = %self.id, error = %e.message, "removing a build step's sandbox; its TTL ends it");
        }
    }
}

//! What a build carries from step to step: a stage's image and what its
//! next steps see, the step cache's keys, and a failure with its line.

use std::collections::BTreeMap;

use sha2::{Digest as _, Sha256};
use warren_core::ExecRequest;
use warren_node_api::ImageInfo;

use super::dockerfile::Cmd;
use super::words::Vars;

/// A failure, and the Dockerfile line at fault.
pub(super) struct Failure {
    pub(super) message: String,
    pub(super) line: Option<usize>,
}

impl Failure {
    /// A failure of the build as a whole (no line of its own).
    pub(super) fn new(message: impl std::fmt::Display) -> Failure {
        Failure {
            message: message.to_string(),
            line: None,
        }
    }

    pub(super) fn at(line: usize, message: impl std::fmt::Display) -> Failure {
        Failure {
            message: message.to_string(),
            line: Some(line),
        }
    }
}

impl From<warren_core::ApiError> for Failure {
    fn from(e: warren_core::ApiError) -> Failure {
        Failure::new(e.message)
    }
}

/// What a stage has made so far: its image, and what the next steps see.
#[derive(Clone)]
pub(super) struct State {
    pub(super) digest: String,
    /// The image config's environment, `KEY=VALUE`.
    pub(super) env: Vec<String>,
    /// `ARG`s declared in this stage, with their values.
    pub(super) args: BTreeMap<String, String>,
    pub(super) workdir: String,
    pub(super) user: String,
    pub(super) shell: Vec<String>,
    /// Whether this stage set `CMD` (else `ENTRYPOINT` clears the base's).
    pub(super) cmd_set: bool,
}

impl State {
    pub(super) fn of(image: &ImageInfo) -> State {
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

    /// A command as the image runs it: exec form as written, shell form
    /// through `SHELL`.
    pub(super) fn argv(&self, c: &Cmd) -> Vec<String> {
        match c {
            Cmd::Exec(argv) => argv.clone(),
            Cmd::Shell(s) => {
                let mut argv = self.shell.clone();
                argv.push(s.clone());
                argv
            }
        }
    }

    /// `argv` run as a step runs it: in the working directory, as the
    /// user, with `env` besides the image's.
    pub(super) fn exec_request(
        &self,
        argv: Vec<String>,
        env: BTreeMap<String, String>,
    ) -> ExecRequest {
        ExecRequest {
            cmd: argv,
            env,
            cwd: (!self.workdir.is_empty()).then(|| self.workdir.clone()),
            user: (!self.user.is_empty()).then(|| self.user.clone()),
            ..Default::default()
        }
    }

    /// Variables a step's words see: its ARGs, then ENV over them.
    pub(super) fn vars(&self) -> Vars {
        let mut vars = self.args.clone();
        for kv in &self.env {
            if let Some((k, v)) = kv.split_once('=') {
                vars.insert(k.to_string(), v.to_string());
            }
        }
        vars
    }

    pub(super) fn set_env(&mut self, key: &str, value: &str) {
        self.env
            .retain(|kv| kv.split_once('=').map(|(k, _)| k) != Some(key));
        self.env.push(format!("{key}={value}"));
    }

    /// A path in the image: absolute, or relative to the working directory.
    pub(super) fn path(&self, p: &str) -> String {
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

pub(super) fn key(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    h.update(b"warren-build-step v1");
    for p in parts {
        h.update([0]);
        h.update(p.as_bytes());
    }
    hex::encode(h.finalize())
}

//! Image builds (`warren build`, `POST /v1/builds`): what a build is asked
//! to do, what it reports as it goes, and the image settings a Dockerfile's
//! config instructions change. Every door (CLI, API, SDK, E2B templates)
//! makes a [`BuildRequest`] through [`BuildRequest::from_pairs`], so none
//! can start a build the API would refuse.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::spec::{NetworkMode, NetworkSpec};

/// Longest `--test` command, in bytes (it runs as `sh -c`).
const MAX_TEST_LEN: usize = 64 * 1024;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BuildRequestError {
    #[error("unknown build parameter {0:?}; known: tag, dockerfile, build_arg, target, allow, test, push, no_cache")]
    Unknown(String),
    #[error("{0} is given twice")]
    Twice(&'static str),
    #[error("build_arg {0:?} is not KEY=VALUE with KEY a name of letters, digits and _")]
    BuildArg(String),
    #[error("dockerfile {0:?} must be a relative path inside the context (no '..')")]
    Dockerfile(String),
    #[error("tag {0:?} is not an image name (repo[:tag], letters, digits and . _ - / :)")]
    Tag(String),
    #[error("push {0:?} names no registry; push takes host[:port]/repository:tag")]
    Push(String),
    #[error("target {0:?} is not a stage name")]
    Target(String),
    #[error("test is empty, or longer than 64 KiB")]
    Test,
    #[error("no_cache is {0:?}; use true or false")]
    NoCache(String),
    #[error("allow: {0}")]
    Allow(String),
}

/// What `POST /v1/builds` is asked: its query parameters (the body is the
/// build context, a tar archive).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BuildRequest {
    /// The name the result gets (`repo[:tag]`); None: the digest only.
    pub tag: Option<String>,
    /// The Dockerfile's path inside the context.
    pub dockerfile: String,
    /// `--build-arg K=V`: values for the Dockerfile's `ARG`s.
    pub build_args: BTreeMap<String, String>,
    /// The stage to build (and those it needs); None: the last.
    pub target: Option<String>,
    /// `HOST:PORT` rules `RUN` steps may reach (a package index); none:
    /// `RUN` has no network.
    pub allow: Vec<String>,
    /// A smoke test (`sh -c`) run in a fresh sandbox of the result before
    /// the tag moves; a failing test leaves the tag where it was.
    pub test: Option<String>,
    /// A registry reference the tagged result is pushed to.
    pub push: Option<String>,
    /// Run every step, even those the step cache holds.
    pub no_cache: bool,
}

impl BuildRequest {
    /// Reads and checks query pairs (`build_arg` and `allow` may repeat).
    pub fn from_pairs(pairs: &[(String, String)]) -> Result<BuildRequest, BuildRequestError> {
        let mut req = BuildRequest {
            tag: None,
            dockerfile: "Dockerfile".into(),
            build_args: BTreeMap::new(),
            target: None,
            allow: Vec::new(),
            test: None,
            push: None,
            no_cache: false,
        };
        let once = |slot: &mut Option<String>, name: &'static str, v: &str| {
            if slot.replace(v.to_string()).is_some() {
                return Err(BuildRequestError::Twice(name));
            }
            Ok(())
        };
        let mut dockerfile = None;
        for (k, v) in pairs {
            match k.as_str() {
                "tag" => once(&mut req.tag, "tag", v)?,
                "dockerfile" => once(&mut dockerfile, "dockerfile", v)?,
                "target" => once(&mut req.target, "target", v)?,
                "test" => once(&mut req.test, "test", v)?,
                "push" => once(&mut req.push, "push", v)?,
                "build_arg" => {
                    let (key, value) = v
                        .split_once('=')
                        .filter(|(key, _)| is_arg_name(key))
                        .ok_or_else(|| BuildRequestError::BuildArg(v.clone()))?;
                    req.build_args.insert(key.to_string(), value.to_string());
                }
                "allow" => req.allow.push(v.clone()),
                "no_cache" => {
                    req.no_cache = match v.as_str() {
                        "true" | "1" => true,
                        "false" | "0" => false,
                        _ => return Err(BuildRequestError::NoCache(v.clone())),
                    }
                }
                other => return Err(BuildRequestError::Unknown(other.to_string())),
            }
        }
        if let Some(d) = dockerfile {
            req.dockerfile = d;
        }
        req.validate()?;
        Ok(req)
    }

    /// The query pairs [`BuildRequest::from_pairs`] reads back.
    pub fn to_pairs(&self) -> Vec<(String, String)> {
        let mut pairs = vec![("dockerfile".to_string(), self.dockerfile.clone())];
        let mut opt = |k: &str, v: &Option<String>| {
            if let Some(v) = v {
                pairs.push((k.to_string(), v.clone()));
            }
        };
        opt("tag", &self.tag);
        opt("target", &self.target);
        opt("test", &self.test);
        opt("push", &self.push);
        for (k, v) in &self.build_args {
            pairs.push(("build_arg".into(), format!("{k}={v}")));
        }
        for rule in &self.allow {
            pairs.push(("allow".into(), rule.clone()));
        }
        if self.no_cache {
            pairs.push(("no_cache".into(), "true".into()));
        }
        pairs
    }

    pub fn validate(&self) -> Result<(), BuildRequestError> {
        let d = &self.dockerfile;
        if d.is_empty() || d.starts_with('/') || d.split('/').any(|p| p == "..") {
            return Err(BuildRequestError::Dockerfile(d.clone()));
        }
        if let Some(tag) = &self.tag {
            if !is_image_name(tag) {
                return Err(BuildRequestError::Tag(tag.clone()));
            }
        }
        if let Some(push) = &self.push {
            if !is_image_name(push) || crate::image_ref::registry_host(push).is_none() {
                return Err(BuildRequestError::Push(push.clone()));
            }
        }
        if let Some(target) = &self.target {
            if !is_stage_name(target) {
                return Err(BuildRequestError::Target(target.clone()));
            }
        }
        if self
            .test
            .as_ref()
            .is_some_and(|t| t.trim().is_empty() || t.len() > MAX_TEST_LEN)
        {
            return Err(BuildRequestError::Test);
        }
        self.network()
            .validate()
            .map_err(|e| BuildRequestError::Allow(e.to_string()))
    }

    /// The network a `RUN` step gets: none, or the `allow` rules.
    pub fn network(&self) -> NetworkSpec {
        if self.allow.is_empty() {
            return NetworkSpec::default();
        }
        NetworkSpec {
            mode: NetworkMode::Allowlist,
            allow: self.allow.clone(),
            deny: Vec::new(),
        }
    }
}

/// `ARG` and `ENV` names: letters, digits and `_`, not starting with a digit.
pub fn is_arg_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A stage name (`FROM … AS name`), as Docker allows them.
pub fn is_stage_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

/// The shape of an image name (the node's store checks the rest).
fn is_image_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 255
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/' | ':'))
        && !s.split('/').any(str::is_empty)
}

/// Image settings a build step changes (Dockerfile `ENV`, `CMD`,
/// `ENTRYPOINT`, `WORKDIR`, `USER`, `LABEL`, `EXPOSE`): each field that is
/// set replaces the image config's; labels and ports are added.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ImageSettings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entrypoint: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmd: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// `PORT/PROTO` (`8080/tcp`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exposed_ports: Vec<String>,
}

/// One line of a build's NDJSON stream (`POST /v1/builds`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum BuildEvent {
    /// First: the build's id (`GET /v1/builds/{id}`).
    Build {
        id: String,
    },
    /// A step begins: `step` of `of`, at `line` of the Dockerfile.
    Step {
        step: usize,
        of: usize,
        stage: String,
        line: usize,
        instruction: String,
    },
    /// Output of a `RUN` step or of the test, as text.
    Output {
        stderr: bool,
        text: String,
    },
    /// A step ended: taken from the step cache, or run in `seconds`.
    StepDone {
        step: usize,
        cached: bool,
        seconds: f64,
        digest: String,
    },
    Warning {
        message: String,
    },
    /// The smoke test starts.
    Test {
        command: String,
    },
    /// The tagged image was pushed to the cluster registry, where every
    /// node pulls it.
    Published {
        reference: String,
    },
    /// Last, on success: the image, and the tag it now has.
    Done {
        digest: String,
        tag: Option<String>,
        seconds: f64,
    },
    /// Last, on failure (`line`: the Dockerfile line at fault).
    Failed {
        message: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        line: Option<usize>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BuildState {
    Running,
    Succeeded,
    Failed,
}

/// A build as `GET /v1/builds/{id}` shows it: its state, result and
/// every event so far.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BuildInfo {
    pub id: String,
    pub state: BuildState,
    pub tag: Option<String>,
    pub digest: Option<String>,
    pub error: Option<String>,
    pub started_at: String,
    pub finished_at: Option<String>,
    pub events: Vec<BuildEvent>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_request_round_trips_through_its_query() {
        let req = BuildRequest::from_pairs(&pairs(&[
            ("tag", "app:1"),
            ("build_arg", "A=x=y"),
            ("build_arg", "B="),
            ("allow", "pypi.org:443"),
            ("test", "python3 -c 1"),
            ("no_cache", "true"),
        ]))
        .unwrap();
        assert_eq!(req.build_args["A"], "x=y");
        assert_eq!(req.build_args["B"], "");
        assert_eq!(req.dockerfile, "Dockerfile");
        assert_eq!(req.network().mode, NetworkMode::Allowlist);
        assert_eq!(BuildRequest::from_pairs(&req.to_pairs()).unwrap(), req);
    }

    #[test]
    fn bad_requests_say_what_is_wrong() {
        let bad = |p: &[(&str, &str)]| BuildRequest::from_pairs(&pairs(p)).unwrap_err();
        assert_eq!(
            bad(&[("dockerfile", "../x")]),
            BuildRequestError::Dockerfile("../x".into())
        );
        assert_eq!(
            bad(&[("build_arg", "1A=b")]),
            BuildRequestError::BuildArg("1A=b".into())
        );
        assert_eq!(
            bad(&[("tag", "a"), ("tag", "b")]),
            BuildRequestError::Twice("tag")
        );
        assert_eq!(bad(&[("tag", "a b")]), BuildRequestError::Tag("a b".into()));
        assert_eq!(
            bad(&[("push", "app:1")]),
            BuildRequestError::Push("app:1".into())
        );
        assert_eq!(bad(&[("test", " ")]), BuildRequestError::Test);
        assert!(matches!(
            bad(&[("allow", "nope")]),
            BuildRequestError::Allow(_)
        ));
        assert!(matches!(
            bad(&[("nocache", "1")]),
            BuildRequestError::Unknown(_)
        ));
    }
}

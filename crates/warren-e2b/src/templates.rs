//! E2B templates are Warren images: a `templateID` is an image reference
//! (`debian:bookworm`, `registry:5000/team/env@sha256:…`) or an alias from
//! `<home>/e2b-templates.toml`. An alias names an image, or an image with
//! what its sandboxes start with: a main process (a template's server), the
//! port that server answers on (a create answers once it does, as E2B's
//! does once the template's ready command passes), sizes, and the isolation
//! class its sandboxes run in (`gvisor`: gVisor's user-space kernel; none:
//! the node's default).
//!
//! ```toml
//! [templates]
//! base = "debian:bookworm"
//!
//! [templates.code-interpreter-v1]
//! image = "registry.local:5000/e2b/code-interpreter:1"
//! cmd = ["/root/.jupyter/start-up.sh"]
//! ready_port = 49999
//! cpu = "2"
//! memory = "2G"
//!
//! [templates.untrusted]
//! image = "python:3.12"
//! isolation = "gvisor"
//!
//! # What template builds' RUN steps may reach (a package mirror), and
//! # how many started sandboxes a built template with a start command
//! # keeps ready (default 1).
//! [build]
//! allow = ["deb.debian.org:80"]
//! warm_pool = 2
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

pub const FILE: &str = "e2b-templates.toml";

#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not valid: {source} (expected a [templates] table of alias = \"image reference\")")]
    Parse {
        path: PathBuf,
        source: toml::de::Error,
    },
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    templates: BTreeMap<String, Entry>,
    #[serde(default)]
    build: BuildSettings,
}

/// `[build]`: what template builds' RUN steps may reach (`allow`, as
/// `warren build --allow`); nothing when absent.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BuildSettings {
    #[serde(default)]
    allow: Vec<String>,
    /// Started sandboxes kept per built template with a start command.
    #[serde(default = "one")]
    warm_pool: u32,
}

impl Default for BuildSettings {
    fn default() -> Self {
        BuildSettings {
            allow: Vec::new(),
            warm_pool: one(),
        }
    }
}

fn one() -> u32 {
    1
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Entry {
    Image(String),
    Full(Template),
}

/// What sandboxes of a template are made of.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Template {
    pub image: String,
    /// The main process each sandbox starts with.
    #[serde(default)]
    pub cmd: Option<Vec<String>>,
    /// A create answers once this port in the sandbox accepts connections.
    #[serde(default)]
    pub ready_port: Option<u16>,
    /// Or once this command (`sh -c`) exits 0 in the sandbox.
    #[serde(default)]
    pub ready_cmd: Option<String>,
    #[serde(default)]
    pub cpu: Option<String>,
    #[serde(default)]
    pub memory: Option<String>,
    /// The isolation class its sandboxes run in; none: the node's default.
    #[serde(default)]
    pub isolation: Option<warren_core::Isolation>,
}

#[derive(Debug, Default)]
pub struct Templates {
    aliases: BTreeMap<String, Template>,
    build_allow: Vec<String>,
    warm_pool: u32,
    path: PathBuf,
}

impl Templates {
    pub fn load(home: &Path) -> Result<Templates, TemplateError> {
        let path = home.join(FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(source) => return Err(TemplateError::Read { path, source }),
        };
        let file: File = toml::from_str(&text).map_err(|source| TemplateError::Parse {
            path: path.clone(),
            source,
        })?;
        let aliases = file
            .templates
            .into_iter()
            .map(|(name, e)| {
                let t = match e {
                    Entry::Image(image) => Template {
                        image,
                        ..Default::default()
                    },
                    Entry::Full(t) => t,
                };
                (name, t)
            })
            .collect();
        Ok(Templates {
            aliases,
            build_allow: file.build.allow,
            warm_pool: file.build.warm_pool,
            path,
        })
    }

    /// What a template names: its alias, or an image by that reference.
    pub fn get(&self, template: &str) -> Template {
        self.aliases
            .get(template)
            .cloned()
            .unwrap_or_else(|| Template {
                image: template.to_string(),
                ..Default::default()
            })
    }

    /// Whether `name` is an alias of the templates file.
    pub fn has_alias(&self, name: &str) -> bool {
        self.aliases.contains_key(name)
    }

    /// Started sandboxes kept per built template with a start command.
    pub fn warm_pool(&self) -> u32 {
        self.warm_pool
    }

    /// What template builds' RUN steps may reach.
    pub fn build_allow(&self) -> Vec<String> {
        self.build_allow.clone()
    }

    /// Said with an image that could not be found, to show the way out.
    pub fn hint(&self, template: &str) -> String {
        if self.aliases.contains_key(template) {
            format!(
                "template {template:?} is an alias in {} for an image Warren does not have; pull or import it (`warren image pull REF`)",
                self.path.display()
            )
        } else {
            format!(
                "template {template:?} is neither an image Warren has nor an alias in {}; pull or import the image, or add `{template} = \"IMAGE\"` under [templates] there and restart",
                self.path.display()
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aliases_map_and_anything_else_is_an_image_reference() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            dir.path().join(FILE),
            "[templates]\nbase = \"bb:1\"\n[templates.ci]\nimage = \"ci:1\"\ncmd = [\"serve\"]\nready_port = 49999\n",
        )
        .expect("write");
        let t = Templates::load(dir.path()).expect("loads");
        assert_eq!(t.get("base").image, "bb:1");
        assert_eq!(t.get("reg:5000/x:y").image, "reg:5000/x:y");
        let ci = t.get("ci");
        assert_eq!((ci.image.as_str(), ci.ready_port), ("ci:1", Some(49999)));
        assert_eq!(ci.cmd, Some(vec!["serve".to_string()]));
        assert_eq!(ci.isolation, None);
        std::fs::write(dir.path().join(FILE), "[templatez]\n").expect("write");
        let e = Templates::load(dir.path()).expect_err("unknown table");
        assert!(e.to_string().contains("[templates]"), "{e}");
    }

    #[test]
    fn a_template_names_its_isolation_class() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            dir.path().join(FILE),
            "[templates.untrusted]\nimage = \"bb:1\"\nisolation = \"gvisor\"\n",
        )
        .expect("write");
        let t = Templates::load(dir.path()).expect("loads");
        assert_eq!(
            t.get("untrusted").isolation,
            Some(warren_core::Isolation::Gvisor)
        );
        // An image by reference runs in the node's default.
        assert_eq!(t.get("bb:1").isolation, None);
        // A class Warren does not know is refused when the file is read.
        std::fs::write(
            dir.path().join(FILE),
            "[templates.vm]\nimage = \"bb:1\"\nisolation = \"kata\"\n",
        )
        .expect("write");
        assert!(Templates::load(dir.path()).is_err());
    }
}

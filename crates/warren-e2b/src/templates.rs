//! E2B templates are Warren images: a `templateID` is an image reference
//! (`debian:bookworm`, `registry:5000/team/env@sha256:…`) or an alias from
//! `<home>/e2b-templates.toml`:
//!
//! ```toml
//! [templates]
//! base = "debian:bookworm"
//! code-interpreter-v1 = "registry.local/e2b/code-interpreter:1"
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
    templates: BTreeMap<String, String>,
}

#[derive(Debug, Default)]
pub struct Templates {
    aliases: BTreeMap<String, String>,
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
        Ok(Templates {
            aliases: file.templates,
            path,
        })
    }

    /// The image a template names.
    pub fn image(&self, template: &str) -> String {
        self.aliases
            .get(template)
            .cloned()
            .unwrap_or_else(|| template.to_string())
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
        std::fs::write(dir.path().join(FILE), "[templates]\nbase = \"bb:1\"\n").expect("write");
        let t = Templates::load(dir.path()).expect("loads");
        assert_eq!(t.image("base"), "bb:1");
        assert_eq!(t.image("reg:5000/x:y"), "reg:5000/x:y");
        std::fs::write(dir.path().join(FILE), "[templatez]\n").expect("write");
        let e = Templates::load(dir.path()).expect_err("unknown table");
        assert!(e.to_string().contains("[templates]"), "{e}");
    }
}

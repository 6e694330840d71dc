//! Images as a node stores them and as clients see them, and where an
//! image a sandbox's changes make is recorded.

use serde::{Deserialize, Serialize};

/// An image as a node stores it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ImageInfo {
    /// Normalised `repo:tag`.
    pub name: String,
    /// Manifest digest `sha256:…`.
    pub digest: String,
    /// Number of layers.
    pub layers: usize,
    /// The whole record, as the node's image store keeps it (layers,
    /// config, source): shown to clients as it is.
    #[schema(value_type = Object)]
    pub record: serde_json::Value,
}

/// Where an image a node makes (a commit, a build step) is recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "value", rename_all = "snake_case")]
pub enum ImageTarget {
    /// Under a name, as any image (`repo:tag`).
    Name(String),
    /// In the node's step cache under a key (64 hex digits: a sha256 of
    /// what the step depends on); not listed, pruned first.
    Step(String),
}

/// A sandbox's filesystem changes as one new layer (`commit`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitImage {
    pub into: ImageTarget,
    /// The history's `created_by` (default: `warren commit <id>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_by: Option<String>,
}

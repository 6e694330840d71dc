//! One line of `warren doctor`: what a check found and what it means for
//! Warren's guarantees. Its own module so that every part that checks the
//! host (host, cdi) reports in the same shape without depending on another.

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Ok,
    /// Works with a reduced guarantee.
    Degraded,
    /// Warren cannot run sandboxes (or this guarantee) here.
    Missing,
}

#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub status: Status,
    pub found: String,
    /// What this means for Warren's guarantees.
    pub meaning: String,
}

pub(crate) fn check(
    name: &'static str,
    status: Status,
    found: impl Into<String>,
    meaning: impl Into<String>,
) -> Check {
    Check {
        name,
        status,
        found: found.into(),
        meaning: meaning.into(),
    }
}

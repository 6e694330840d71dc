//! Errors across the node contract carry a category, not an HTTP status:
//! the control plane decides what a client sees, and a transport carries
//! the category unchanged.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// No such sandbox, image, file or log on this node.
    NotFound,
    /// The sandbox is not in a state that allows this (not running, being
    /// destroyed, an image in use).
    Conflict,
    /// The node has no room: disk, slots, processes.
    NoRoom,
    /// The request itself is wrong (a bad path, rule or reference).
    Invalid,
    /// Not now: a sandbox's init did not answer in time, the node is
    /// starting or stopping, a transport could not reach the node.
    Unavailable,
    /// Something a node depends on failed (an image registry).
    Upstream,
    /// A bug or an unexpected failure of the host.
    Internal,
    /// The caller is a control plane that another replica replaced (a
    /// lower leader epoch than the node has seen): it must stop acting.
    Fenced,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct NodeError {
    pub kind: ErrorKind,
    pub message: String,
}

impl NodeError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> NodeError {
        NodeError {
            kind,
            message: message.into(),
        }
    }
    pub fn not_found(m: impl Into<String>) -> NodeError {
        Self::new(ErrorKind::NotFound, m)
    }
    pub fn conflict(m: impl Into<String>) -> NodeError {
        Self::new(ErrorKind::Conflict, m)
    }
    pub fn invalid(m: impl Into<String>) -> NodeError {
        Self::new(ErrorKind::Invalid, m)
    }
    pub fn unavailable(m: impl Into<String>) -> NodeError {
        Self::new(ErrorKind::Unavailable, m)
    }
    pub fn internal(m: impl Into<String>) -> NodeError {
        Self::new(ErrorKind::Internal, m)
    }
}

pub type NodeResult<T> = Result<T, NodeError>;

//! Warren's plain types, shared by every other crate. Nothing here performs
//! I/O (but for reading the clock).

#![forbid(unsafe_code)]

pub mod audit;
pub mod batch;
pub mod build;
pub mod clock;
pub mod error;
pub mod event;
pub mod exec;
pub mod files;
pub mod fleet;
pub mod history;
pub mod image;
pub mod image_ref;
pub mod isolation;
pub mod labels;
pub mod network;
pub mod pool;
pub mod profile;
pub mod quantity;
pub mod run;
pub mod sandbox;
pub mod sandbox_name;
pub mod secret;
pub mod spec;
pub mod state;
pub mod sync;
pub mod tenant;
pub mod units;
pub mod volume;

pub use batch::{BatchInfo, BatchRequest};
pub use error::{ApiError, ErrorBody, ErrorCode};
pub use event::Event;
pub use exec::{ExecEvent, ExecRequest, WindowSize};
pub use isolation::Isolation;
pub use labels::{Labels, Selector};
pub use run::{RunEvent, RunRequest};
pub use sandbox::{SandboxInfo, Usage};
pub use spec::{ResolvedResources, SandboxSpec};
pub use state::SandboxState;

/// Prefix of every host resource Warren creates (cgroups, mounts, dirs), so an
/// orphan sweep can find its own leftovers and nothing else.
pub const RESOURCE_PREFIX: &str = "warren";

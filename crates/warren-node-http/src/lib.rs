//! The node contract ([`warren_node_api::NodeApi`]) over HTTP.
//!
//! A node serves [`router`] under `/node/v2`, behind its node credential;
//! the control plane drives it through [`HttpNode`], which implements the
//! same trait, so the control plane does not know whether its node runs
//! in-process or on another host.
//!
//! What crosses the wire (each call is `POST /node/v2/{call}`, made from
//! the one call list, [`warren_node_api::node_calls!`]):
//! - answers and request bodies are JSON, errors a [`warren_node_api::NodeError`]
//!   as JSON: the HTTP status is chosen from its kind for people reading logs,
//!   but the client rebuilds the error from the body alone;
//! - the event feed, exec output and pull progress are NDJSON, one value a
//!   line, written as they happen;
//! - files, logs and image archives are raw bytes streamed both ways, never
//!   held whole in memory;
//! - a port tunnel is an HTTP/1 upgrade (`Upgrade: tcp`), after which the
//!   connection carries the port's bytes;
//! - every call of a `warren server` replica carries its leader epoch
//!   ([`fence`]): a node refuses the calls of a leader that was replaced;
//! - a call made inside a trace carries its W3C `traceparent`, and the node
//!   traces its side of the call under it (`trace_context`).
//!
//! A node joined to a `warren server` serves its API over TLS with a
//! self-signed certificate the control plane pins ([`tls`]); `warren up
//! --node-transport http` keeps plain HTTP on loopback.

#![forbid(unsafe_code)]

mod access;
mod client;
pub mod fence;
mod listen;
mod ndjson;
mod node_url;
mod server;
pub mod tls;
mod trace_context;
mod wire;

pub use access::Credential;
pub use client::HttpNode;
pub use fence::Fence;
pub use listen::{serve, serve_tls};
pub use server::router;

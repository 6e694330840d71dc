//! What the `warren` binary shares with `warren-bench` (crates/warren-bench),
//! the benchmarks and simulator kept out of the product binary: the API
//! client, whole-line messages on stderr, the node agent's join loop, and
//! how the long-running processes listen and stop. A library target of the
//! CLI's own package, not a crate of its own: it is the CLI's code, with
//! its errors as the CLI reports them (anyhow), used by one more binary.

#[macro_use]
pub mod say;

pub mod agent;
pub mod client;
pub mod serving;

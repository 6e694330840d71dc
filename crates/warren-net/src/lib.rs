//! Sandbox networking. A sandbox in network mode `allowlist` keeps its own
//! network namespace with nothing in it but loopback: there is no device,
//! so no packet can leave. The node then places sockets *inside* that
//! namespace, owned by the daemon:
//!
//! - an explicit HTTP proxy at `127.0.0.1:3128` (CONNECT and plain HTTP),
//!   which `HTTP_PROXY`/`HTTPS_PROXY` point at;
//! - a transparent listener on every port an allow rule names, reached
//!   through a local route for all of IPv4, so clients that ignore the proxy
//!   settings are checked too (TLS SNI or HTTP Host decides);
//! - a DNS stub on port 53 that answers only allowlisted names.
//!
//! A connection is attributed to a sandbox by the socket it arrived on,
//! never by anything the sandbox sends. The proxy resolves names itself,
//! refuses non-public addresses unless a rule allows them, and connects to
//! the address it checked.

mod conns;
pub mod dns;
mod egress;
mod explicit;
mod limits;
mod netns;
mod route;
mod sandbox;
mod settings;
pub mod sniff;
mod splice;
mod transparent;
mod upstream;

pub use egress::{Egress, PolicyChange};
pub use netns::connect_in;
pub use settings::{Limits, LogFn, Settings};

/// Where the explicit proxy listens, inside every `allowlist` sandbox.
pub const PROXY_PORT: u16 = 3128;

/// The proxy variables every `allowlist` sandbox gets (upper and lower case,
/// as different clients read either).
pub fn proxy_env() -> Vec<(String, String)> {
    let url = format!("http://127.0.0.1:{PROXY_PORT}");
    let mut env = Vec::new();
    for (k, v) in [
        ("HTTP_PROXY", url.as_str()),
        ("HTTPS_PROXY", url.as_str()),
        ("NO_PROXY", "localhost,127.0.0.1"),
    ] {
        env.push((k.to_string(), v.to_string()));
        env.push((k.to_ascii_lowercase(), v.to_string()));
    }
    env
}

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("network setup in sandbox {id}: {source}")]
    Setup { id: String, source: std::io::Error },
    #[error(transparent)]
    Rule(#[from] warren_core::network::RuleError),
    #[error("sandbox {0} has no egress attachment (its network mode is 'none')")]
    NotAttached(String),
    #[error("this node does not permit open egress (network mode 'open'); its operator enables it with --egress-open")]
    OpenOff,
}

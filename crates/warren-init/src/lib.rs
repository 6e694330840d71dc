//! Warren's init, PID 1 of every sandbox, and the frames the daemon and
//! init exchange. warren-runtime builds the `warren-init` binary as a
//! static, fixed-address executable and embeds it (see its build.rs); the
//! daemon side of the protocol uses this library.

mod exec_cgroups;
mod exec_tree;
mod procstat;
pub mod proto;
mod relay;
mod serve;

pub use exec_cgroups::ENV as EXEC_CGROUPS_ENV;
pub use serve::{main, LISTEN_AGAIN, LISTEN_FD, SOCKET_ENV, TITLE};

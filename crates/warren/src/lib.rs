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

use std::future::Future;
use std::path::PathBuf;

/// Where a command finds the daemon's API and its token: the global
/// options of `warren` and `warren-bench` alike.
#[derive(clap::Args)]
pub struct ApiArgs {
    /// The API of the `warren up` or `warren server` to talk to (client
    /// commands).
    #[arg(
        long,
        env = "WARREN_URL",
        default_value = "http://127.0.0.1:7070",
        global = true,
        help_heading = "Global options"
    )]
    pub url: String,
    /// API token; default: the token file in --home.
    #[arg(
        long,
        env = "WARREN_TOKEN",
        global = true,
        hide_env_values = true,
        help_heading = "Global options"
    )]
    pub token: Option<String>,
    /// Warren's state directory: where `warren up` keeps everything, and
    /// where client commands read its token.
    #[arg(
        long,
        env = "WARREN_HOME",
        default_value = "/var/lib/warren",
        global = true,
        help_heading = "Global options"
    )]
    pub home: PathBuf,
}

impl ApiArgs {
    /// A client of that API.
    pub fn client(&self) -> anyhow::Result<client::Client> {
        client::Client::new(&self.url, self.token.clone(), &self.home)
    }
}

/// The flags, arguments and commands of `cmd` (named `path`) that do not
/// say what they are for: each binary's test of its command line wants
/// none.
pub fn undescribed(cmd: &clap::Command, path: &str) -> Vec<String> {
    let mut missing = Vec::new();
    for arg in cmd.get_arguments() {
        let builtin = matches!(arg.get_id().as_str(), "help" | "version");
        if !builtin && !arg.is_hide_set() && arg.get_help().is_none() {
            missing.push(format!("{path} {}", arg.get_id()));
        }
    }
    for sub in cmd.get_subcommands().filter(|c| !c.is_hide_set()) {
        if sub.get_about().is_none() && sub.get_name() != "help" {
            missing.push(format!("{path} {} (the command)", sub.get_name()));
        }
        missing.extend(undescribed(sub, &format!("{path} {}", sub.get_name())));
    }
    missing
}

/// Runs a command's future on a new runtime and exits with its code (an
/// error is said first): the end of both binaries' `main`. Streams may
/// still be open in background tasks, so it exits rather than returns.
pub fn run_async(command: impl Future<Output = anyhow::Result<i32>>) -> ! {
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            say!("error: cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    let code = rt.block_on(async {
        match command.await {
            Ok(code) => code,
            Err(e) => {
                say!("error: {e:#}");
                1
            }
        }
    });
    std::process::exit(code)
}

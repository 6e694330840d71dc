//! `warren-bench`: Warren's benchmarks and workload simulator, a binary of
//! their own so that the product binary, `warren`, carries none of their
//! code and no test-only feature (the fake nodes need the node contract's
//! `fake`). It shares the API client with `warren` (its library target).

#[macro_use]
extern crate warren_cli;

mod cli;
mod creates;
mod fake_nodes;
mod floor;
mod lifecycle;
mod net;
mod placement;
mod simulate;
mod tenants;

use anyhow::Result;
use clap::Parser;

use cli::{Cli, Command};

fn main() {
    let args = Cli::parse();
    // The floor probe forks: before any runtime thread exists.
    if let Command::Floor { rootfs } = &args.command {
        std::process::exit(floor::run(rootfs));
    }
    // Piped into `head`, end quietly instead of panicking on a broken pipe.
    // SAFETY: setting a signal disposition to SIG_DFL before any thread exists.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    // The client's reqwest needs rustls' process-wide provider, as in `warren`.
    warren_image::install_tls_provider();
    warren_cli::run_async(run(args))
}

async fn run(cli: Cli) -> Result<i32> {
    let client = || cli.api.client();
    match cli.command {
        Command::Lifecycle(args) => lifecycle::run(&client()?, args).await,
        Command::Net(args) => net::run(&client()?, args).await,
        Command::Creates(args) => creates::run(&client()?, &args).await,
        Command::Placement(args) => placement::run(&args),
        Command::Simulate(args) => simulate::run(args),
        Command::Tenants(args) => tenants::run(&args),
        Command::FakeNodes(args) => fake_nodes::run(args).await,
        Command::Floor { .. } => anyhow::bail!("floor runs before the async runtime starts"),
    }
}

//! `warren`: the daemon (`up`, `spawner`) and the client commands.

// `say!` and `say_partial!`, and the client, are in the library target
// (src/lib.rs), which `warren-bench` shares.
#[macro_use]
extern crate warren_cli;

mod cli;
mod commands;
mod daemon;

use clap::Parser;

fn main() {
    let args = cli::Cli::parse();
    // The spawner must stay single-threaded: dispatch it before any runtime
    // or logging thread exists.
    if let cli::Command::Spawner = args.command {
        // A synchronous writer: no logging thread in the spawner.
        tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_env("WARREN_LOG")
                    .unwrap_or_else(|_| format!("warn,{}", daemon::QUIET_LIBRARIES).into()),
            )
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_writer(std::io::stderr)
            .init();
        warren_runtime::spawner::main();
    }
    // The doctor forks to try namespaces and mounts: also before any thread.
    if let cli::Command::Doctor {
        json,
        cdi_dirs,
        runsc,
        runsc_platform,
    } = args.command
    {
        let runsc = warren_runtime::gvisor::RunscSettings {
            path: runsc,
            platform: runsc_platform,
        };
        let code =
            commands::doctor::run(&args.api.home, json, &cdi_dirs, &runsc).unwrap_or_else(|e| {
                say!("error: {e:#}");
                1
            });
        std::process::exit(code);
    }
    let daemon = match &args.command {
        cli::Command::Up(_) | cli::Command::Server(_) => true,
        cli::Command::Node(n) => n.command.is_none(),
        _ => false,
    };
    if !daemon {
        // A client command piped into `head` should end quietly, like any
        // Unix tool, instead of panicking on a broken pipe.
        // SAFETY: setting a signal disposition to SIG_DFL before any thread exists.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    warren_image::install_tls_provider();
    warren_cli::run_async(commands::run(args))
}

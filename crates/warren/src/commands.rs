//! The client commands: one module per command group, each calling the
//! typed API client; this file only dispatches.

use anyhow::Result;
use warren_core::quantity;

use crate::cli::{Cli, Command};

mod batches;
mod build;
pub mod doctor;
mod files;
mod fork;
mod images;
mod logs;
mod network;
mod nodes;
mod paths;
mod pools;
mod port_forward;
mod profiles;
mod sandboxes;
mod secrets;
mod spec;
mod stats;
mod tenants;
mod terminal;
mod volumes;

pub async fn run(cli: Cli) -> Result<i32> {
    let client = || cli.api.client();
    match cli.command {
        Command::Up(args) => crate::daemon::up::run(&cli.api.home, *args).await,
        Command::Server(args) => crate::daemon::server::run(&cli.api.home, args).await,
        Command::Node(args) => match args.command {
            Some(cmd) => nodes::run(&client()?, cmd).await,
            None => crate::daemon::node_agent::run(&cli.api.home, args).await,
        },
        Command::Spawner => unreachable!("dispatched before the runtime starts"),
        Command::Image(cmd) => images::run(&client()?, cmd).await,
        Command::Create { create, cmd } => sandboxes::create(&client()?, &create, cmd).await,
        Command::Run {
            create,
            rm,
            detach,
            cmd,
        } => sandboxes::run(&client()?, &create, cmd, rm, detach).await,
        Command::Exec(args) => sandboxes::exec(&client()?, args).await,
        Command::Cp { src, dst } => files::cp(&client()?, &src, &dst).await,
        Command::Ls {
            id,
            path,
            depth,
            json,
        } => paths::ls(&client()?, &id, &path, depth, json).await,
        Command::Mkdir { id, path } => paths::mkdir(&client()?, &id, &path).await,
        Command::Mv { id, from, to } => paths::mv(&client()?, &id, &from, &to).await,
        Command::Ps {
            label,
            state,
            all,
            json,
            quiet,
        } => sandboxes::ps(&client()?, label, state, all, json, quiet).await,
        Command::Stats { ids, no_stream } => stats::stats(&client()?, ids, no_stream).await,
        Command::Fork(args) => fork::fork(&client()?, &args).await,
        Command::Build(args) => build::build(&client()?, &args).await,
        Command::Commit { id, name } => images::commit(&client()?, &id, &name).await,
        Command::Inspect { id } => sandboxes::inspect(&client()?, &id).await,
        Command::Logs {
            id: Some(id),
            usage: true,
            ..
        } => logs::usage(&client()?, &id).await,
        Command::Logs {
            id: Some(id),
            follow,
            json,
            ..
        } => logs::logs(&client()?, &id, follow, json).await,
        Command::Logs {
            id: None,
            label,
            json,
            since,
            ..
        } => logs::logs_by_label(&client()?, &label, since.as_deref(), json).await,
        Command::Rm { ids, label } => match paths::removal(&ids, &label)? {
            Some((id, path)) => paths::rm(&client()?, id, path).await,
            None => sandboxes::rm(&client()?, ids, label).await,
        },
        // Run by main before the async runtime starts (it forks).
        Command::Doctor { .. } => anyhow::bail!("doctor runs before the async runtime starts"),
        Command::Batch(cmd) => batches::run(&client()?, cmd).await,
        Command::Profile(cmd) => profiles::run(&client()?, cmd).await,
        Command::Pool(cmd) => pools::run(&client()?, cmd).await,
        Command::Volume(cmd) => volumes::run(&client()?, cmd).await,
        Command::Secret(cmd) => secrets::run(&client()?, cmd).await,
        Command::Tenant(cmd) => tenants::tenant(&client()?, cmd).await,
        Command::Token(cmd) => tenants::token(&client()?, cmd).await,
        Command::Audit {
            tenant,
            since,
            until,
            limit,
            json,
        } => tenants::audit(&client()?, tenant, since, until, limit, json).await,
        Command::Events {
            sandbox,
            label,
            batch,
            kind,
            follow,
        } => logs::events(&client()?, sandbox, label, batch, kind, follow).await,
        Command::Pause { id } => sandboxes::pause(&client()?, &id).await,
        Command::Resume { id } => sandboxes::resume(&client()?, &id).await,
        Command::Heartbeat { id } => sandboxes::heartbeat(&client()?, &id).await,
        Command::Ttl { id, ttl } => {
            // Checked before the client is made: a bad TTL is reported as
            // such even without a token.
            quantity::parse_duration(&ttl)?;
            sandboxes::ttl(&client()?, &id, &ttl).await
        }
        Command::Reclaim {
            id,
            reclaim,
            keep_for,
        } => {
            if let Some(k) = &keep_for {
                quantity::parse_duration(k)?;
            }
            sandboxes::reclaim(&client()?, &id, &reclaim, keep_for.as_deref()).await
        }
        Command::Network { id, allow, deny } => {
            network::set_rules(&client()?, &id, &allow, &deny).await
        }
        Command::PortForward { id, ports, address } => {
            port_forward::run(&client()?, &id, &ports, address).await
        }
    }
}

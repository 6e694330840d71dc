//! `warren tenant` and `warren token`: who shares this Warren.

use anyhow::{Context, Result};
use reqwest::Method;
use warren_core::tenant::{
    NewToken, Quota, Role, TenantInfo, TenantName, TenantSpec, TokenInfo, TokenRequest,
};
use warren_core::units::{ByteSize, Cpu};

use crate::cli::{TenantArgs, TenantCmd, TokenCmd};
use warren_cli::client::Client;

/// The spec the flags give, checked as the API checks it.
fn spec(a: TenantArgs) -> Result<TenantSpec> {
    let cpu = a
        .cpu
        .map(|c| serde_json::from_value::<Cpu>(serde_json::json!(c)))
        .transpose()
        .context("--cpu")?;
    let memory = a
        .memory
        .map(|m| serde_json::from_value::<ByteSize>(serde_json::json!(m)))
        .transpose()
        .context("--memory")?;
    Ok(TenantSpec {
        quota: Quota {
            cpu,
            memory,
            gpus: a.gpus,
            sandboxes: a.sandboxes,
        },
        weight: a.weight.try_into()?,
        priority: a.priority,
        preempt: a.preempt,
        egress: (!a.egress.is_empty()).then_some(a.egress),
    })
}

fn quota_text(q: &Option<impl std::fmt::Display>) -> String {
    q.as_ref().map_or("-".into(), |v| v.to_string())
}

fn print_tenants(tenants: &[TenantInfo]) {
    println!(
        "{:<20} {:>6} {:>8} {:>15} {:>21} {:>9} {:>11} {:>6}",
        "NAME", "WEIGHT", "PRIORITY", "CPU", "MEMORY", "GPUS", "SANDBOXES", "QUEUED"
    );
    for t in tenants {
        let q = &t.spec.quota;
        let cpu = format!(
            "{}/{}",
            t.usage.cpu_millis as f64 / 1000.0,
            quota_text(&q.cpu.map(|c| c.0 as f64 / 1000.0))
        );
        let memory = format!(
            "{}/{}",
            warren_core::quantity::format_size(t.usage.memory),
            quota_text(&q.memory.map(|m| warren_core::quantity::format_size(m.0)))
        );
        println!(
            "{:<20} {:>6} {:>8} {:>15} {:>21} {:>9} {:>11} {:>6}",
            t.name,
            t.spec.weight.get(),
            t.spec.priority,
            cpu,
            memory,
            format!("{}/{}", t.usage.gpus, quota_text(&q.gpus)),
            format!("{}/{}", t.usage.sandboxes, quota_text(&q.sandboxes)),
            t.queued
        );
    }
}

fn print_token(t: &NewToken) {
    println!("{}", t.token);
    eprintln!(
        "token {} ({} of tenant {}): shown this once; use it as WARREN_TOKEN or E2B_API_KEY",
        t.info.id, t.info.role, t.info.tenant
    );
}

pub(super) async fn tenant(client: &Client, cmd: TenantCmd) -> Result<i32> {
    match cmd {
        TenantCmd::Create { name, spec: args } => {
            let name: TenantName = name.parse()?;
            let body = warren_core::tenant::TenantRequest {
                name: name.clone(),
                spec: spec(args)?,
            };
            let _: TenantInfo = client
                .call(Method::POST, "/v1/tenants", &[], Some(&body))
                .await?;
            let req = TokenRequest {
                tenant: name,
                role: Role::Admin,
                description: "made with the tenant".into(),
            };
            let made: NewToken = client
                .call(Method::POST, "/v1/tokens", &[], Some(&req))
                .await?;
            print_token(&made);
        }
        TenantCmd::Ls { json } => {
            let tenants: Vec<TenantInfo> = client
                .call(Method::GET, "/v1/tenants", &[], None::<&()>)
                .await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&tenants)?);
            } else {
                print_tenants(&tenants);
            }
        }
        TenantCmd::Set { name, spec: args } => {
            let name: TenantName = name.parse()?;
            let path = format!("/v1/tenants/{name}");
            let t: TenantInfo = client
                .call(Method::PUT, &path, &[], Some(&spec(args)?))
                .await?;
            print_tenants(&[t]);
        }
        TenantCmd::Rm { names } => {
            let mut failed = 0;
            for name in names {
                match client
                    .call_only(Method::DELETE, &format!("/v1/tenants/{name}"))
                    .await
                {
                    Ok(()) => println!("{name}"),
                    Err(e) => {
                        eprintln!("warren: tenant {name}: {e:#}");
                        failed += 1;
                    }
                }
            }
            return Ok(i32::from(failed > 0));
        }
    }
    Ok(0)
}

pub(super) async fn token(client: &Client, cmd: TokenCmd) -> Result<i32> {
    match cmd {
        TokenCmd::Create {
            tenant,
            role,
            description,
        } => {
            let req = TokenRequest {
                tenant: tenant.parse()?,
                role: role.parse()?,
                description,
            };
            let made: NewToken = client
                .call(Method::POST, "/v1/tokens", &[], Some(&req))
                .await?;
            print_token(&made);
        }
        TokenCmd::Ls { json } => {
            let tokens: Vec<TokenInfo> = client
                .call(Method::GET, "/v1/tokens", &[], None::<&()>)
                .await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&tokens)?);
                return Ok(0);
            }
            println!(
                "{:<18} {:<20} {:<7} {:<25} DESCRIPTION",
                "ID", "TENANT", "ROLE", "CREATED"
            );
            for t in tokens {
                println!(
                    "{:<18} {:<20} {:<7} {:<25} {}",
                    t.id, t.tenant, t.role, t.created_at, t.description
                );
            }
        }
        TokenCmd::Revoke { ids } => {
            let mut failed = 0;
            for id in ids {
                let path = format!("/v1/tokens/{id}");
                match client
                    .call::<TokenInfo>(Method::DELETE, &path, &[], None::<&()>)
                    .await
                {
                    Ok(t) => println!("{}", t.id),
                    Err(e) => {
                        eprintln!("warren: token {id}: {e:#}");
                        failed += 1;
                    }
                }
            }
            return Ok(i32::from(failed > 0));
        }
    }
    Ok(0)
}

pub(super) async fn audit(
    client: &Client,
    tenant: Option<String>,
    since: Option<String>,
    until: Option<String>,
    limit: usize,
    json: bool,
) -> Result<i32> {
    let mut query = vec![("limit", limit.to_string())];
    if let Some(t) = tenant {
        query.push(("tenant", t.parse::<TenantName>()?.to_string()));
    }
    // The server reads a duration (30m: that long ago) or an RFC 3339 time.
    query.extend(since.map(|s| ("since", s)));
    query.extend(until.map(|u| ("until", u)));
    let lines: Vec<warren_core::audit::AuditEntry> = client
        .call(Method::GET, "/v1/audit", &query, None::<&()>)
        .await?;
    if json {
        for l in &lines {
            println!("{}", serde_json::to_string(l)?);
        }
        return Ok(0);
    }
    println!(
        "{:<25} {:<16} {:<18} {:<4} {:<6} {:<44} {:<20} STATUS",
        "TIME", "TENANT", "TOKEN", "DOOR", "METHOD", "ROUTE", "TARGET"
    );
    for l in lines {
        println!(
            "{:<25} {:<16} {:<18} {:<4} {:<6} {:<44} {:<20} {}",
            l.time, l.tenant, l.token, l.door, l.method, l.route, l.target, l.status
        );
    }
    Ok(0)
}

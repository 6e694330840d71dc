//! `warren secret`: values kept sealed by the server, given to sandboxes
//! with `--secret`.

use std::collections::BTreeMap;
use std::io::Read;

use anyhow::{Context, Result};
use warren_core::secret::{SecretMetadata, SecretName, SecretValue};

use crate::cli::SecretCmd;
use warren_cli::client::Client;

/// The value from FILE, or standard input for `-`, checked as the API
/// checks it.
fn read_value(file: &str) -> Result<SecretValue> {
    let mut text = String::new();
    if file == "-" {
        std::io::stdin()
            .read_to_string(&mut text)
            .context("reading the secret from standard input")?;
    } else {
        text = std::fs::read_to_string(file).with_context(|| format!("reading {file}"))?;
    }
    Ok(SecretValue::try_from(text)?)
}

fn metadata(pairs: &[String]) -> Result<SecretMetadata> {
    let map = pairs
        .iter()
        .map(|p| {
            p.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .ok_or_else(|| anyhow::anyhow!("--metadata {p:?}: write KEY=VALUE"))
        })
        .collect::<Result<BTreeMap<_, _>>>()?;
    Ok(SecretMetadata::try_from(map)?)
}

pub(super) async fn run(client: &Client, cmd: SecretCmd) -> Result<i32> {
    match cmd {
        SecretCmd::Create {
            name,
            file,
            metadata: meta,
        } => {
            let name = SecretName::try_from(name)?;
            let meta = metadata(&meta)?;
            let value = read_value(&file)?;
            let body = serde_json::json!({"name": name, "value": value.expose(), "metadata": meta});
            let s = client.put_secret(true, name.as_str(), &body).await?;
            println!("{} {} version {}", s.name, s.id, s.version);
        }
        SecretCmd::Set {
            name,
            file,
            metadata: meta,
        } => {
            let meta = (!meta.is_empty()).then(|| metadata(&meta)).transpose()?;
            let value = read_value(&file)?;
            let mut body = serde_json::json!({"value": value.expose()});
            if let Some(m) = meta {
                body["metadata"] = serde_json::to_value(m)?;
            }
            let s = client.put_secret(false, &name, &body).await?;
            println!("{} {} version {}", s.name, s.id, s.version);
        }
        SecretCmd::Ls { json } => {
            let secrets = client.secrets().await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&secrets)?);
                return Ok(0);
            }
            println!(
                "{:<32} {:<28} {:>7}  {:<25} METADATA",
                "NAME", "ID", "VERSION", "UPDATED"
            );
            for s in secrets {
                let meta: BTreeMap<String, String> = s.metadata.into();
                let meta: Vec<String> = meta.iter().map(|(k, v)| format!("{k}={v}")).collect();
                println!(
                    "{:<32} {:<28} {:>7}  {:<25} {}",
                    s.name,
                    s.id,
                    s.version,
                    s.updated_at,
                    meta.join(",")
                );
            }
        }
        SecretCmd::Rm { names } => {
            for name in names {
                let s = client.remove_secret(&name).await?;
                println!("{} removed", s.name);
            }
        }
    }
    Ok(0)
}

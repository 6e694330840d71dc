//! Reading what sandboxes said and what happened to them: `logs` and
//! `events`.

use std::io::Write;

use anyhow::Result;
use base64::Engine;

use crate::client::{Client, EventQuery};

/// Streams a sandbox log; with `output_only` prints the main process's
/// output as raw bytes instead of JSON lines.
pub(super) async fn follow_log(client: &Client, id: &str, output_only: bool) -> Result<()> {
    let mut lines = client.follow_sandbox_log(id).await?;
    while let Some(line) = lines.next_line().await? {
        if !output_only {
            std::io::stdout().write_all(&line)?;
            std::io::stdout().write_all(b"\n")?;
            continue;
        }
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(&line) else {
            continue;
        };
        let bytes = match (v["text"].as_str(), v["data"].as_str()) {
            (Some(t), _) => t.as_bytes().to_vec(),
            (None, Some(d)) => base64::engine::general_purpose::STANDARD
                .decode(d)
                .unwrap_or_default(),
            _ => continue,
        };
        match v["kind"].as_str() {
            Some("stdout") => {
                std::io::stdout().write_all(&bytes)?;
                std::io::stdout().flush()?;
            }
            Some("stderr") => std::io::stderr().write_all(&bytes)?,
            _ => {}
        }
    }
    Ok(())
}

pub(super) async fn logs(client: &Client, id: &str, follow: bool) -> Result<i32> {
    if follow {
        follow_log(client, id, false).await?;
    } else {
        let text = client.sandbox_log(id).await?;
        std::io::stdout().write_all(&text)?;
    }
    Ok(0)
}

/// `warren logs --label`: the logs of every matching sandbox.
pub(super) async fn logs_by_label(client: &Client, label: &[String]) -> Result<i32> {
    let text = client.logs_by_label(label).await?;
    std::io::stdout().write_all(&text)?;
    Ok(0)
}

pub(super) async fn events(
    client: &Client,
    sandbox: Option<String>,
    label: Vec<String>,
    batch: Option<String>,
    kind: Option<String>,
    follow: bool,
) -> Result<i32> {
    let query = EventQuery {
        sandbox,
        labels: label,
        batch,
        kind,
    };
    if follow {
        let mut lines = client.follow_events(&query).await?;
        while let Some(line) = lines.next_line().await? {
            std::io::stdout().write_all(&line)?;
            std::io::stdout().write_all(b"\n")?;
            std::io::stdout().flush()?;
        }
    } else {
        let evs = client.events(&query).await?;
        for e in evs {
            println!("{e}");
        }
    }
    Ok(0)
}

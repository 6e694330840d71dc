//! `warren stats`: live CPU and memory use, as `docker stats` shows it,
//! from `/v1/usage` (one answer for every sandbox, each with the CPU rate
//! of its newest reading).

use std::io::{IsTerminal, Write};

use anyhow::{bail, Result};

use super::images::human;
use warren_cli::client::{Client, SandboxQuery};

/// The table of the sandboxes asked for (every live one when none are).
async fn table(client: &Client, ids: &[String]) -> Result<String> {
    let answer = client.usage(&SandboxQuery::default()).await?;
    let rows = answer["sandboxes"].as_array().cloned().unwrap_or_default();
    let mut t = format!(
        "{:<18} {:<16} {:>8} {:>24} {:>7}\n",
        "ID", "NAME", "CPU %", "MEM USAGE / LIMIT", "MEM %"
    );
    let mut shown = Vec::new();
    for row in &rows {
        let id = row["id"].as_str().unwrap_or("");
        let name = row["name"].as_str().unwrap_or("-");
        if !ids.is_empty() && !ids.iter().any(|w| w == id || w == name) {
            continue;
        }
        let (Some(cpu), Some(memory)) = (row["cpu_millis"].as_u64(), row["memory_bytes"].as_u64())
        else {
            continue;
        };
        let limit = row["memory_limit"].as_u64().unwrap_or(0);
        let mem_pct = if limit > 0 {
            memory as f64 / limit as f64 * 100.0
        } else {
            0.0
        };
        // Percent of one core, as docker stats shows it.
        t.push_str(&format!(
            "{:<18} {:<16} {:>7.2}% {:>24} {:>6.2}%\n",
            id,
            name,
            cpu as f64 / 10.0,
            format!("{} / {}", human(memory), human(limit)),
            mem_pct
        ));
        shown.push((id.to_string(), name.to_string()));
    }
    for want in ids {
        if !shown.iter().any(|(id, name)| id == want || name == want) {
            bail!("no live sandbox {want} (`warren ps` lists them)");
        }
    }
    Ok(t)
}

pub(super) async fn stats(client: &Client, ids: Vec<String>, no_stream: bool) -> Result<i32> {
    let redraw = !no_stream && std::io::stdout().is_terminal();
    loop {
        let text = table(client, &ids).await?;
        let mut out = std::io::stdout().lock();
        if redraw {
            // Home and clear, as docker stats redraws.
            write!(out, "\x1b[H\x1b[2J")?;
        }
        write!(out, "{text}")?;
        out.flush()?;
        if no_stream {
            return Ok(0);
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

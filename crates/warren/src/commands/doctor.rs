//! `warren doctor`: what this host lets Warren guarantee.

use anyhow::Result;
use warren_runtime::host::{probe, Status};

pub fn run(home: &std::path::Path, json: bool) -> Result<i32> {
    let checks = probe(home);
    if json {
        println!("{}", serde_json::to_string_pretty(&checks)?);
    } else {
        for c in &checks {
            let mark = match c.status {
                Status::Ok => "ok  ",
                Status::Degraded => "warn",
                Status::Missing => "FAIL",
            };
            println!("[{mark}] {:<16} {}", c.name, c.found);
            println!("       {:<16} {}", "", c.meaning);
        }
    }
    let fatal = checks.iter().any(|c| c.status == Status::Missing);
    if !json {
        println!();
        println!(
            "{}",
            if fatal {
                "Warren cannot give its guarantees on this host: fix the FAIL lines first."
            } else {
                "Warren can run sandboxes here with the guarantees above (warn lines say what is weaker)."
            }
        );
    }
    Ok(if fatal { 1 } else { 0 })
}

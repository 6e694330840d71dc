//! `warren doctor`: what this host lets Warren guarantee.

use anyhow::Result;
use warren_runtime::host::{probe, Status};

pub fn run(
    home: &std::path::Path,
    json: bool,
    cdi_dirs: &[std::path::PathBuf],
    runsc: &warren_runtime::gvisor::RunscSettings,
) -> Result<i32> {
    let mut checks = probe(home);
    let dirs: Vec<std::path::PathBuf> = if cdi_dirs.is_empty() {
        warren_runtime::cdi::DEFAULT_DIRS
            .iter()
            .map(std::path::PathBuf::from)
            .collect()
    } else {
        cdi_dirs.to_vec()
    };
    checks.extend(warren_runtime::cdi::checks(&dirs));
    checks.push(nvml_check());
    // The probe sandbox's files go under the home when it exists (the node
    // keeps its own there), else the system's temporary directory.
    let scratch = if home.is_dir() {
        home.join("tmp")
    } else {
        std::env::temp_dir()
    };
    checks.extend(warren_runtime::gvisor::doctor::checks(runsc, &scratch));
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

/// Whether NVML loads: without it GPUs still work in sandboxes, but their
/// use is not measured.
fn nvml_check() -> warren_runtime::host::Check {
    use warren_node::gpu::Nvml;
    match Nvml::load() {
        Ok(nvml) => warren_runtime::host::Check {
            name: "nvml",
            status: Status::Ok,
            found: nvml.describe(),
            meaning: "GPU memory and utilisation are sampled per sandbox".into(),
        },
        Err(e) => warren_runtime::host::Check {
            name: "nvml",
            status: Status::Ok,
            found: format!("not loaded ({e})"),
            meaning:
                "no NVIDIA driver here: GPU use is not sampled (devices from CDI specs still work)"
                    .into(),
        },
    }
}

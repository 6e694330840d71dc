//! GPU usage per sandbox from NVIDIA's management library (NVML).
//!
//! NVML is loaded at run time (`nvml-wrapper` opens `libnvidia-ml.so.1`
//! with dlopen), so a node without NVIDIA's driver starts and runs as
//! before, only without GPU figures. NVML lists the processes using each
//! GPU with their memory; a process belongs to the sandbox whose cgroup it
//! is in. The reading sits behind [`GpuReader`] so the attribution can be
//! checked against recorded readings.

use std::collections::BTreeMap;

use nvml_wrapper::error::NvmlError;
use thiserror::Error;

/// The library NVML is loaded from (the driver's, not the -dev package's
/// unversioned link).
pub const NVML_LIB: &str = "libnvidia-ml.so.1";

/// One process on one GPU, as NVML reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuProcess {
    /// Host pid.
    pub pid: u32,
    /// GPU memory it holds; None where the driver does not say.
    pub used_memory: Option<u64>,
}

/// One GPU at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuReading {
    pub index: u32,
    /// Share of the last sample period a kernel ran on it, in percent.
    pub utilization_percent: u32,
    pub processes: Vec<GpuProcess>,
}

/// Why NVML could not be loaded or read.
#[derive(Debug, Error)]
pub enum GpuError {
    /// No library, no driver loaded, no permission.
    #[error("{lib}: {source}")]
    Load {
        lib: &'static str,
        source: NvmlError,
    },
    #[error("{what}: {source}")]
    Read {
        what: &'static str,
        source: NvmlError,
    },
}

/// Where GPU readings come from (NVML on a real node, recordings in tests).
pub trait GpuReader: Send + Sync {
    fn read(&self) -> Result<Vec<GpuReading>, GpuError>;
}

/// A sandbox's GPU use in one reading.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxGpu {
    /// GPU memory its processes hold, over all its GPUs.
    pub memory: u64,
    /// The busiest of the GPUs its processes use, in percent. A GPU is
    /// given to one sandbox at a time, so its utilisation is that
    /// sandbox's.
    pub utilization_percent: u32,
    /// Indexes of the GPUs its processes use.
    pub gpus: Vec<u32>,
}

/// Splits a reading by sandbox: `owner` names the sandbox a host pid
/// belongs to (None: a process of no sandbox, e.g. the host's own).
pub fn attribute(
    readings: &[GpuReading],
    owner: impl Fn(u32) -> Option<String>,
) -> BTreeMap<String, SandboxGpu> {
    let mut out: BTreeMap<String, SandboxGpu> = BTreeMap::new();
    for gpu in readings {
        for p in &gpu.processes {
            let Some(id) = owner(p.pid) else { continue };
            let s = out.entry(id).or_default();
            s.memory += p.used_memory.unwrap_or(0);
            if !s.gpus.contains(&gpu.index) {
                s.gpus.push(gpu.index);
                s.utilization_percent = s.utilization_percent.max(gpu.utilization_percent);
            }
        }
    }
    out
}

/// The Warren sandbox whose cgroup holds `pid`, from /proc/PID/cgroup
/// (a path `/<cgroup parent>/sbx-…`, possibly with an exec's cgroup below
/// it; the parent is the node's own, `warren` unless told otherwise).
pub fn sandbox_of_pid(pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    sandbox_in_cgroup_file(&text)
}

fn sandbox_in_cgroup_file(text: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let path = line.splitn(3, ':').nth(2)?;
        path.split('/')
            .find(|name| warren_runtime::is_sandbox_id(name))
            .map(str::to_string)
    })
}

/// NVML, loaded.
pub struct Nvml(nvml_wrapper::Nvml);

impl Nvml {
    /// Loads and initialises NVML; an error says why not (no library, no
    /// driver loaded, no permission).
    pub fn load() -> Result<Nvml, GpuError> {
        nvml_wrapper::Nvml::builder()
            .lib_path(std::ffi::OsStr::new(NVML_LIB))
            .init()
            .map(Nvml)
            .map_err(|source| GpuError::Load {
                lib: NVML_LIB,
                source,
            })
    }

    /// Driver version and GPU count, for `warren doctor`.
    pub fn describe(&self) -> String {
        let driver = self
            .0
            .sys_driver_version()
            .unwrap_or_else(|e| format!("unknown ({e})"));
        let count = self
            .0
            .device_count()
            .map_or_else(|e| format!("unknown ({e})"), |n| n.to_string());
        format!("driver {driver}, {count} GPU(s)")
    }
}

impl GpuReader for Nvml {
    fn read(&self) -> Result<Vec<GpuReading>, GpuError> {
        use nvml_wrapper::enums::device::UsedGpuMemory;
        let count = self.0.device_count().map_err(|source| GpuError::Read {
            what: "count the GPUs",
            source,
        })?;
        let mut out = Vec::new();
        for index in 0..count {
            let device = self
                .0
                .device_by_index(index)
                .map_err(|source| GpuError::Read {
                    what: "open a GPU",
                    source,
                })?;
            // A GPU that cannot say (fallen off the bus, MIG parent) is
            // left out of this reading rather than failing the others.
            let Ok(procs) = device.running_compute_processes() else {
                continue;
            };
            let utilization_percent = device.utilization_rates().map_or(0, |u| u.gpu);
            out.push(GpuReading {
                index,
                utilization_percent,
                processes: procs
                    .into_iter()
                    .map(|p| GpuProcess {
                        pid: p.pid,
                        used_memory: match p.used_gpu_memory {
                            UsedGpuMemory::Used(b) => Some(b),
                            UsedGpuMemory::Unavailable => None,
                        },
                    })
                    .collect(),
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reading recorded from `nvidia-smi`'s view of two GPUs: sandbox A
    /// runs two processes on GPU 0, sandbox B one on GPU 1, and a host
    /// process (no sandbox) also uses GPU 1.
    struct Recorded(Vec<GpuReading>);

    impl GpuReader for Recorded {
        fn read(&self) -> Result<Vec<GpuReading>, GpuError> {
            Ok(self.0.clone())
        }
    }

    fn proc(pid: u32, mib: Option<u64>) -> GpuProcess {
        GpuProcess {
            pid,
            used_memory: mib.map(|m| m << 20),
        }
    }

    #[test]
    fn memory_and_utilisation_go_to_the_sandbox_of_each_process() {
        let reader = Recorded(vec![
            GpuReading {
                index: 0,
                utilization_percent: 87,
                processes: vec![proc(100, Some(1500)), proc(101, Some(500))],
            },
            GpuReading {
                index: 1,
                utilization_percent: 12,
                processes: vec![proc(200, Some(300)), proc(1, Some(64)), proc(201, None)],
            },
            GpuReading {
                index: 2,
                utilization_percent: 0,
                processes: vec![],
            },
        ]);
        let owners: BTreeMap<u32, &str> = [
            (100, "sbx-aaaaaaaaaaaa"),
            (101, "sbx-aaaaaaaaaaaa"),
            (200, "sbx-bbbbbbbbbbbb"),
            (201, "sbx-bbbbbbbbbbbb"),
        ]
        .into();
        let readings = reader.read().expect("reads");
        let by = attribute(&readings, |pid| owners.get(&pid).map(|s| s.to_string()));
        assert_eq!(by.len(), 2, "the host process is nobody's: {by:?}");
        assert_eq!(
            by["sbx-aaaaaaaaaaaa"],
            SandboxGpu {
                memory: 2000 << 20,
                utilization_percent: 87,
                gpus: vec![0],
            }
        );
        assert_eq!(
            by["sbx-bbbbbbbbbbbb"],
            SandboxGpu {
                memory: 300 << 20,
                utilization_percent: 12,
                gpus: vec![1],
            }
        );
    }

    #[test]
    fn a_sandbox_on_two_gpus_sums_memory_and_takes_the_busier() {
        let readings = vec![
            GpuReading {
                index: 0,
                utilization_percent: 40,
                processes: vec![proc(7, Some(100))],
            },
            GpuReading {
                index: 1,
                utilization_percent: 95,
                processes: vec![proc(8, Some(200))],
            },
        ];
        let by = attribute(&readings, |_| Some("sbx-cccccccccccc".into()));
        let s = &by["sbx-cccccccccccc"];
        assert_eq!((s.memory, s.utilization_percent), (300 << 20, 95));
        assert_eq!(s.gpus, [0, 1]);
    }

    #[test]
    fn the_sandbox_is_read_from_the_process_cgroup() {
        let prefix = warren_core::RESOURCE_PREFIX;
        let v1 = format!(
            "12:pids:/{prefix}/sbx-abcdefghij12\n4:memory:/{prefix}/sbx-abcdefghij12/exec-7\n1:name=systemd:/user.slice\n"
        );
        assert_eq!(
            sandbox_in_cgroup_file(&v1).as_deref(),
            Some("sbx-abcdefghij12")
        );
        let v2 = format!("0::/{prefix}/ci-7/sbx-zyxwvutsrq98/exec-1\n");
        assert_eq!(
            sandbox_in_cgroup_file(&v2).as_deref(),
            Some("sbx-zyxwvutsrq98")
        );
        assert_eq!(
            sandbox_in_cgroup_file("0::/system.slice/sshd.service\n"),
            None
        );
        assert_eq!(
            sandbox_in_cgroup_file(&format!("0::/{prefix}/not-a-sandbox\n")),
            None
        );
    }

    #[test]
    fn loading_nvml_without_a_driver_is_an_error_not_a_crash() {
        // This host has no NVIDIA driver; where one exists the load works.
        match Nvml::load() {
            Ok(n) => assert!(n.describe().contains("driver")),
            Err(e) => assert!(e.to_string().contains(NVML_LIB), "{e}"),
        }
    }
}

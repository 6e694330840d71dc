//! Requests that learn: finished sandboxes feed their task's profile, and a
//! create that names a profile without sizes gets its current request.

use std::sync::Arc;

use warren_core::clock::now_rfc3339;
use warren_core::profile::{Policy, Profile, Request, Run};
use warren_core::tenant::TenantName;
use warren_core::{ApiError, SandboxSpec, Usage};

use crate::store::{SandboxRow, Store};

/// The profile a spec belongs to: its `profile` field, else its `task` label.
///
/// A tenant's profiles are its own, `TENANT/NAME` (a label value has no
/// `/`): another tenant's runs neither size its sandboxes nor learn from
/// them. The operator's (the default tenant's) are plain `NAME`.
pub fn profile_name(tenant: &TenantName, spec: &SandboxSpec) -> Option<String> {
    let name = spec
        .profile
        .clone()
        .or_else(|| spec.labels.get("task").cloned())
        .filter(|n| !n.is_empty())?;
    Some(match tenant.is_default() {
        true => name,
        false => format!("{tenant}/{name}"),
    })
}

/// The profiles service: the learned profiles in the store and how they
/// learn.
pub struct Profiles {
    store: Arc<dyn Store>,
    /// How profiles learn (margins, window, growth cap).
    policy: Policy,
    /// Profile updates are read-modify-write; runs finishing together must
    /// not lose each other's update.
    lock: tokio::sync::Mutex<()>,
}

/// No profile of that name.
fn not_found(name: &str) -> ApiError {
    ApiError::not_found(format!(
        "no profile named {name:?}; see `warren profile ls`"
    ))
}

impl Profiles {
    pub(crate) fn new(store: Arc<dyn Store>, policy: Policy) -> Profiles {
        Profiles {
            store,
            policy,
            lock: Default::default(),
        }
    }

    /// Every profile.
    pub async fn list(&self) -> Result<Vec<Profile>, ApiError> {
        Ok(self.store.profiles().await?)
    }

    /// A profile, what it would recommend now, and the runs it learned from.
    pub async fn detail(
        &self,
        name: &str,
    ) -> Result<(Profile, Option<Request>, Vec<Run>), ApiError> {
        let profile = self
            .store
            .profile(name)
            .await?
            .ok_or_else(|| not_found(name))?;
        let policy = self.policy();
        let runs = self.store.runs(name, policy.window).await?;
        let recommendation = warren_core::profile::recommend(&runs, &policy);
        Ok((profile, recommendation, runs))
    }

    /// The profile table as TOML, to edit by hand and load again.
    pub async fn export(&self) -> Result<String, ApiError> {
        let profiles = self.store.profiles().await?;
        Ok(table::export(&profiles)?)
    }

    /// Loads a TOML profile table; listed profiles are replaced.
    pub async fn import(&self, text: &str) -> Result<Vec<Profile>, ApiError> {
        let profiles = table::import(text)?;
        let now = now_rfc3339();
        for p in &profiles {
            self.store.put_profile(p, &now).await?;
        }
        Ok(profiles)
    }

    /// How profiles learn.
    pub fn policy(&self) -> Policy {
        self.policy.clone()
    }

    /// Fills the sizes a spec leaves out from its profile, if it has one.
    pub async fn apply(&self, tenant: &TenantName, spec: &mut SandboxSpec) -> Result<(), ApiError> {
        let Some(name) = profile_name(tenant, spec) else {
            return Ok(());
        };
        let Some(p) = self.store.profile(&name).await? else {
            return Ok(());
        };
        use warren_core::spec::{ByteSize, Cpu};
        // The profile sets the requests (what the scheduler reserves: the
        // learned peak with its margin) and, where the spec names none, the
        // limits too; a request never exceeds the limit it runs under.
        let cpu = *spec.cpu.get_or_insert(Cpu(p.current.cpu_millis));
        let memory = *spec.memory.get_or_insert(ByteSize(p.current.memory));
        spec.cpu_request
            .get_or_insert(Cpu(p.current.cpu_millis.min(cpu.0)));
        spec.memory_request
            .get_or_insert(ByteSize(p.current.memory.min(memory.0)));
        Ok(())
    }

    /// Records a finished sandbox in its profile (once) and lets the profile
    /// learn from it.
    pub(crate) async fn record_run(
        &self,
        row: &SandboxRow,
        usage: &Usage,
        oom_killed: bool,
    ) -> Result<(), ApiError> {
        let Some(name) = profile_name(&row.tenant, &row.spec) else {
            return Ok(());
        };
        let run = Run {
            // Never above the quota it ran under: a rate over it is a
            // measuring artefact (a short burst within one CFS period), and
            // a sandbox that needed more shows as throttled instead.
            cpu_millis_peak: usage
                .cpu_millis_peak
                .max(usage.cpu_millis_mean)
                .min(row.resources.cpu_millis),
            memory_peak: usage.memory_peak_bytes,
            runtime_ms: usage.runtime_ms,
            oom_killed: oom_killed || usage.oom_kills > 0,
            throttled_ratio: if usage.cpu_periods > 0 {
                usage.cpu_throttled_periods as f64 / usage.cpu_periods as f64
            } else {
                0.0
            },
            requested: Request {
                cpu_millis: row.resources.cpu_millis,
                memory: row.resources.memory,
                gpu_memory: 0,
            },
            gpu_memory_peak: usage.gpu_memory_peak_bytes,
        };
        let now = now_rfc3339();
        let _serial = self.lock.lock().await;
        if !self.store.add_run(&name, &row.id, &run, &now).await? {
            return Ok(());
        }
        let policy = self.policy();
        let mut profile = self
            .store
            .profile(&name)
            .await?
            .unwrap_or_else(|| Profile::new(&name, run.requested));
        let window = self.store.runs(&name, policy.window).await?;
        if profile.learn(&window, &policy) {
            tracing::warn!(profile = %name, anomaly = %profile.anomaly, "profile flagged anomalous");
            self.store
                .profile_event(&row.id, &name, &profile.anomaly, &now)
                .await?;
        }
        self.store.put_profile(&profile, &now).await?;
        Ok(())
    }

    /// Forgets a profile's runs and anomaly; it restarts from its original
    /// request.
    pub async fn reset(&self, name: &str) -> Result<Profile, ApiError> {
        let p = self
            .store
            .profile(name)
            .await?
            .ok_or_else(|| not_found(name))?;
        let _serial = self.lock.lock().await;
        let fresh = Profile::new(name, p.original);
        self.store.delete_runs(name).await?;
        self.store.put_profile(&fresh, &now_rfc3339()).await?;
        Ok(fresh)
    }
}

/// The baseline table as TOML: `[profiles.NAME]` with `cpu` (cores),
/// `memory` ("4G"), `original_cpu`, `original_memory`, `gpu_memory` and
/// `original_gpu_memory` (only for tasks that used a GPU) and `anomalous`.
pub mod table {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Serialize};
    use warren_core::labels::LabelError;
    use warren_core::profile::{Profile, Request};
    use warren_core::quantity::{self, QuantityError};
    use warren_core::ApiError;

    /// Why a profile table could not be written or read.
    #[derive(Debug, thiserror::Error)]
    pub enum TableError {
        /// The profiles could not be written as TOML (a bug: every field
        /// has a TOML form).
        #[error("writing the profile table: {0}")]
        Write(#[source] toml::ser::Error),
        #[error("invalid profile table: {0}")]
        Parse(#[source] toml::de::Error),
        /// A profile's name is not a label value.
        #[error(transparent)]
        Name(#[from] LabelError),
        /// A tenant's profile (`TENANT/NAME`) names no valid tenant.
        #[error(transparent)]
        Tenant(#[from] warren_core::tenant::TenantError),
        #[error("profile {name}: cpu must be a positive number of cores")]
        Cpu { name: String },
        #[error("profile {name}: {source}")]
        Memory { name: String, source: QuantityError },
        #[error("profile {name}: gpu_memory: {source}")]
        GpuMemory { name: String, source: QuantityError },
    }

    /// A table that cannot be written is the server's fault; one that
    /// cannot be read, the caller's.
    impl From<TableError> for ApiError {
        fn from(e: TableError) -> ApiError {
            match e {
                TableError::Write(_) => ApiError::internal(e.to_string()),
                _ => ApiError::bad_request(e.to_string()),
            }
        }
    }

    #[derive(Serialize, Deserialize)]
    struct Entry {
        cpu: f64,
        memory: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        original_cpu: Option<f64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        original_memory: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        gpu_memory: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        original_gpu_memory: Option<String>,
        #[serde(default)]
        anomalous: bool,
    }

    fn gpu_size(bytes: u64) -> Option<String> {
        (bytes > 0).then(|| quantity::format_size(bytes))
    }

    #[derive(Serialize, Deserialize, Default)]
    struct Table {
        #[serde(default)]
        profiles: BTreeMap<String, Entry>,
    }

    fn cores(millis: u64) -> f64 {
        millis as f64 / 1000.0
    }

    pub fn export(profiles: &[Profile]) -> Result<String, TableError> {
        let mut t = Table::default();
        for p in profiles {
            t.profiles.insert(
                p.name.clone(),
                Entry {
                    cpu: cores(p.current.cpu_millis),
                    memory: quantity::format_size(p.current.memory),
                    original_cpu: Some(cores(p.original.cpu_millis)),
                    original_memory: Some(quantity::format_size(p.original.memory)),
                    gpu_memory: gpu_size(p.current.gpu_memory),
                    original_gpu_memory: gpu_size(p.original.gpu_memory),
                    anomalous: p.anomalous,
                },
            );
        }
        toml::to_string_pretty(&t).map_err(TableError::Write)
    }

    pub fn import(text: &str) -> Result<Vec<Profile>, TableError> {
        let t: Table = toml::from_str(text).map_err(TableError::Parse)?;
        let parse = |name: &str, cpu: f64, mem: &str| -> Result<Request, TableError> {
            if !(cpu > 0.0 && cpu.is_finite()) {
                return Err(TableError::Cpu { name: name.into() });
            }
            let memory = quantity::parse_size(mem).map_err(|source| TableError::Memory {
                name: name.into(),
                source,
            })?;
            Ok(Request {
                cpu_millis: (cpu * 1000.0).round() as u64,
                memory,
                gpu_memory: 0,
            })
        };
        let mut out = Vec::new();
        for (name, e) in t.profiles {
            // A tenant's is `TENANT/NAME` (see `profile_name`).
            match name.split_once('/') {
                Some((tenant, short)) => {
                    tenant.parse::<warren_core::tenant::TenantName>()?;
                    warren_core::labels::validate_value("profile", short)?;
                }
                None => warren_core::labels::validate_value("profile", &name)?,
            }
            let gpu = |given: Option<&str>| -> Result<u64, TableError> {
                given.map_or(Ok(0), |g| {
                    quantity::parse_size(g).map_err(|source| TableError::GpuMemory {
                        name: name.clone(),
                        source,
                    })
                })
            };
            let mut current = parse(&name, e.cpu, &e.memory)?;
            current.gpu_memory = gpu(e.gpu_memory.as_deref())?;
            let mut original = match (e.original_cpu, e.original_memory.as_deref()) {
                (Some(c), Some(m)) => parse(&name, c, m)?,
                _ => current,
            };
            if e.original_gpu_memory.is_some() {
                original.gpu_memory = gpu(e.original_gpu_memory.as_deref())?;
            }
            let mut p = Profile::new(&name, original);
            p.current = current;
            p.anomalous = e.anomalous;
            if p.anomalous {
                p.anomaly = "imported as anomalous".into();
            }
            out.push(p);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::table;
    use warren_core::profile::{Profile, Request};

    #[test]
    fn the_table_keeps_gpu_memory_and_omits_it_for_cpu_tasks() {
        let mut gpu = Profile::new(
            "infer",
            Request {
                cpu_millis: 1000,
                memory: 1 << 30,
                gpu_memory: 15 << 30,
            },
        );
        gpu.current.gpu_memory = 24 << 30;
        let cpu = Profile::new(
            "explore",
            Request {
                cpu_millis: 2000,
                memory: 512 << 20,
                gpu_memory: 0,
            },
        );
        let text = table::export(&[gpu.clone(), cpu.clone()]).expect("export");
        assert!(text.contains("gpu_memory = \"24G\""), "{text}");
        assert_eq!(text.matches("gpu_memory").count(), 2, "{text}");
        let back = table::import(&text).expect("import");
        let by_name = |n: &str| back.iter().find(|p| p.name == n).cloned();
        assert_eq!(
            by_name("infer").map(|p| (p.current, p.original)),
            Some((gpu.current, gpu.original))
        );
        assert_eq!(by_name("explore").map(|p| p.current), Some(cpu.current));
        let bad = "[profiles.x]\ncpu = 1.0\nmemory = \"1G\"\ngpu_memory = \"lots\"\n";
        let err = table::import(bad).expect_err("no size");
        assert!(
            matches!(err, table::TableError::GpuMemory { ref name, .. } if name == "x"),
            "{err}"
        );
        assert!(err.to_string().contains("gpu_memory"), "{err}");
    }
}

//! `GET /metrics` in the Prometheus text format. Latency histograms are
//! recorded as things happen; everything that is state (capacity, counts,
//! per-sandbox usage, profiles) is read fresh at each scrape, so the series
//! of a destroyed sandbox disappear with it.

use crate::admission::Need;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use warren_core::SandboxState;

type Labels = Vec<(String, String)>;
type FloatGauge = Gauge<f64, AtomicU64>;

/// What the gauges are set from at a scrape, gathered by the control
/// plane (so that this module needs none of it).
pub struct Snapshot {
    pub nodes: Vec<crate::admission::NodeUse>,
    pub queued: usize,
    /// Each node's CPU busy fraction, as it last reported.
    pub cpu_busy: Vec<f64>,
    pub pools: Vec<warren_core::pool::PoolInfo>,
    /// Every sandbox record; None when the store could not be read.
    pub sandboxes: Option<Vec<crate::store::SandboxRow>>,
    /// What the nodes hold now, by sandbox id (their usage).
    pub held: std::collections::HashMap<String, warren_node_api::SandboxStatus>,
    pub profiles: Option<Vec<warren_core::profile::Profile>>,
    /// Every tenant with what its sandboxes hold and its queue; None when
    /// the store could not be read.
    pub tenants: Option<Vec<warren_core::tenant::TenantInfo>>,
}

/// Create latency: the histogram `/metrics` shows, and the creates since
/// the history's last sample (`crate::history`).
pub struct CreateSeconds {
    histogram: Histogram,
    recent: crate::samples::Latencies,
}

impl CreateSeconds {
    pub fn observe(&self, seconds: f64) {
        self.histogram.observe(seconds);
        self.recent.observe(seconds);
    }

    /// How many creates were answered since the last take, and a sample of
    /// their latencies (seconds).
    pub(crate) fn take_recent(&self) -> (u64, Vec<f64>) {
        self.recent.take()
    }
}

pub struct Metrics {
    registry: Registry,
    pub create_seconds: CreateSeconds,
    /// The last hour of queue length, create latency and node CPU, for
    /// the console's charts (`crate::history`).
    pub history: crate::samples::Recorder,
    pub exec_start_seconds: Histogram,
    pub queue_wait_seconds: Histogram,
    create_phase_seconds: Family<Labels, Histogram, fn() -> Histogram>,
    allocatable: Family<Labels, FloatGauge>,
    allocated: Family<Labels, FloatGauge>,
    sandboxes: Family<Labels, Gauge>,
    queue_length: Gauge,
    profile_request: Family<Labels, FloatGauge>,
    profile_anomalous: Family<Labels, Gauge>,
    sandbox_cpu: Family<Labels, FloatGauge>,
    sandbox_memory: Family<Labels, Gauge>,
    sandbox_gpu_memory: Family<Labels, Gauge>,
    sandbox_gpu_busy: Family<Labels, FloatGauge>,
    sandbox_throttled: Family<Labels, Gauge>,
    pool_ready: Family<Labels, Gauge>,
    pool_claimed: Family<Labels, Gauge>,
    tenant_requested: Family<Labels, FloatGauge>,
    tenant_quota: Family<Labels, FloatGauge>,
    tenant_queued: Family<Labels, Gauge>,
    tenant_weight: Family<Labels, Gauge>,
    cpu_busy: FloatGauge,
}

fn l(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("warren");
        let latency = || Histogram::new(exponential_buckets(0.0005, 2.0, 18));
        let m = Metrics {
            create_seconds: CreateSeconds {
                histogram: latency(),
                recent: Default::default(),
            },
            history: Default::default(),
            exec_start_seconds: latency(),
            queue_wait_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 22)),
            create_phase_seconds: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.00005, 2.0, 20))
            }),
            allocatable: Family::default(),
            allocated: Family::default(),
            sandboxes: Family::default(),
            queue_length: Gauge::default(),
            profile_request: Family::default(),
            profile_anomalous: Family::default(),
            sandbox_cpu: Family::default(),
            sandbox_memory: Family::default(),
            sandbox_gpu_memory: Family::default(),
            sandbox_gpu_busy: Family::default(),
            sandbox_throttled: Family::default(),
            pool_ready: Family::default(),
            pool_claimed: Family::default(),
            tenant_requested: Family::default(),
            tenant_quota: Family::default(),
            tenant_queued: Family::default(),
            tenant_weight: Family::default(),
            cpu_busy: Gauge::default(),
            registry: Registry::default(),
        };
        registry.register(
            "sandbox_create_seconds",
            "Create to ready, through the API",
            m.create_seconds.histogram.clone(),
        );
        registry.register(
            "exec_start_seconds",
            "Exec request to the process running",
            m.exec_start_seconds.clone(),
        );
        registry.register(
            "queue_wait_seconds",
            "Time creates spent in the node's FIFO queue",
            m.queue_wait_seconds.clone(),
        );
        registry.register(
            "create_phase_seconds",
            "Time a create spent in each of its phases (docs/benchmarks.md)",
            m.create_phase_seconds.clone(),
        );
        registry.register(
            "node_allocatable",
            "Allocatable capacity (cpu in cores, memory in bytes, slots)",
            m.allocatable.clone(),
        );
        registry.register(
            "node_allocated",
            "Capacity held by live and kept sandboxes",
            m.allocated.clone(),
        );
        registry.register("sandboxes", "Sandboxes by state", m.sandboxes.clone());
        registry.register(
            "tenant_requested",
            "What a tenant's live sandboxes request (cpu in cores, memory in bytes, gpus, sandboxes)",
            m.tenant_requested.clone(),
        );
        registry.register(
            "tenant_quota",
            "A tenant's quota, where it has one (as tenant_requested)",
            m.tenant_quota.clone(),
        );
        registry.register(
            "tenant_queued",
            "A tenant's creates waiting for quota or capacity",
            m.tenant_queued.clone(),
        );
        registry.register(
            "tenant_weight",
            "A tenant's weight in the fair share",
            m.tenant_weight.clone(),
        );
        registry.register(
            "queue_length",
            "Creates waiting for capacity",
            m.queue_length.clone(),
        );
        registry.register(
            "profile_request",
            "A profile's current request (cpu in cores, memory in bytes)",
            m.profile_request.clone(),
        );
        registry.register(
            "profile_anomalous",
            "1 when a profile hit its growth cap",
            m.profile_anomalous.clone(),
        );
        registry.register(
            "sandbox_cpu_cores",
            "Mean CPU rate of a live sandbox",
            m.sandbox_cpu.clone(),
        );
        registry.register(
            "sandbox_memory_bytes",
            "Memory in use by a live sandbox",
            m.sandbox_memory.clone(),
        );
        registry.register(
            "sandbox_gpu_memory_bytes",
            "GPU memory held by a live sandbox's processes (sandboxes holding devices; NVML)",
            m.sandbox_gpu_memory.clone(),
        );
        registry.register(
            "sandbox_gpu_busy_ratio",
            "Busiest GPU of a live sandbox over NVML's last sample period (sandboxes holding devices)",
            m.sandbox_gpu_busy.clone(),
        );
        registry.register(
            "sandbox_cpu_throttled_periods",
            "CFS periods in which a live sandbox hit its quota",
            m.sandbox_throttled.clone(),
        );
        registry.register(
            "pool_ready_sandboxes",
            "Ready sandboxes a warm pool holds",
            m.pool_ready.clone(),
        );
        registry.register(
            "pool_claimed",
            "Creates a warm pool served since the control plane started",
            m.pool_claimed.clone(),
        );
        registry.register(
            "node_cpu_busy_ratio",
            "Share of the node's CPU time spent busy (saturation signal)",
            m.cpu_busy.clone(),
        );
        Metrics { registry, ..m }
    }

    /// Records how long one phase of a create took (`image_resolve`,
    /// `admission`, `store_insert`, `node_create`, `answer`, …).
    pub fn create_phase(&self, phase: &str, took: std::time::Duration) {
        self.create_phase_seconds
            .get_or_create(&l(&[("phase", phase)]))
            .observe(took.as_secs_f64());
    }

    /// The metrics in the text format, gauges set from `now`.
    pub fn render(&self, now: Snapshot) -> String {
        let (mut total, mut used) = (Need::default(), Need::default());
        for n in &now.nodes {
            for (sum, add) in [(&mut total, n.total), (&mut used, n.used)] {
                sum.cpu_millis += add.cpu_millis;
                sum.memory += add.memory;
                sum.slots += add.slots;
                sum.gpus += add.gpus;
            }
        }
        let queued = now.queued;
        for (fam, need) in [(&self.allocatable, total), (&self.allocated, used)] {
            fam.get_or_create(&l(&[("resource", "cpu")]))
                .set(need.cpu_millis as f64 / 1000.0);
            fam.get_or_create(&l(&[("resource", "memory")]))
                .set(need.memory as f64);
            fam.get_or_create(&l(&[("resource", "slots")]))
                .set(need.slots as f64);
            fam.get_or_create(&l(&[("resource", "gpus")]))
                .set(f64::from(need.gpus));
        }
        self.queue_length.set(queued as i64);
        // The cluster's mean (the one node's figure for `warren up`).
        let busy = &now.cpu_busy;
        self.cpu_busy
            .set(busy.iter().sum::<f64>() / busy.len().max(1) as f64);
        self.sandboxes.clear();
        self.sandbox_cpu.clear();
        self.sandbox_memory.clear();
        self.sandbox_gpu_memory.clear();
        self.sandbox_gpu_busy.clear();
        self.sandbox_throttled.clear();
        self.pool_ready.clear();
        self.pool_claimed.clear();
        for p in &now.pools {
            let labels = l(&[("pool", p.name.as_str())]);
            self.pool_ready
                .get_or_create(&labels)
                .set(i64::from(p.ready));
            self.pool_claimed
                .get_or_create(&labels)
                .set(p.claimed as i64);
        }
        if let Some(rows) = &now.sandboxes {
            let held = &now.held;
            for st in SandboxState::ALL {
                self.sandboxes
                    .get_or_create(&l(&[("state", st.as_str())]))
                    .set(0);
            }
            for r in rows {
                self.sandboxes
                    .get_or_create(&l(&[("state", r.state.as_str())]))
                    .inc();
                if r.state.is_live() {
                    if let Some(u) = held.get(&r.id).and_then(|s| s.usage.as_ref()) {
                        let labels = l(&[("sandbox", &r.id)]);
                        self.sandbox_cpu
                            .get_or_create(&labels)
                            .set(u.cpu_millis_mean as f64 / 1000.0);
                        self.sandbox_memory
                            .get_or_create(&labels)
                            .set(u.memory_bytes as i64);
                        self.sandbox_throttled
                            .get_or_create(&labels)
                            .set(u.cpu_throttled_periods as i64);
                        if r.resources.gpus > 0 || !r.spec.devices.is_empty() {
                            self.sandbox_gpu_memory
                                .get_or_create(&labels)
                                .set(i64::try_from(u.gpu_memory_bytes).unwrap_or(i64::MAX));
                            self.sandbox_gpu_busy
                                .get_or_create(&labels)
                                .set(f64::from(u.gpu_utilization_percent) / 100.0);
                        }
                    }
                }
            }
        }
        self.tenant_requested.clear();
        self.tenant_quota.clear();
        self.tenant_queued.clear();
        self.tenant_weight.clear();
        for t in now.tenants.iter().flatten() {
            let name = t.name.as_str();
            let q = &t.spec.quota;
            let u = &t.usage;
            for (resource, used, quota) in [
                (
                    "cpu",
                    u.cpu_millis as f64 / 1000.0,
                    q.cpu.map(|c| c.0 as f64 / 1000.0),
                ),
                ("memory", u.memory as f64, q.memory.map(|m| m.0 as f64)),
                ("gpus", f64::from(u.gpus), q.gpus.map(f64::from)),
                (
                    "sandboxes",
                    f64::from(u.sandboxes),
                    q.sandboxes.map(f64::from),
                ),
            ] {
                let labels = l(&[("tenant", name), ("resource", resource)]);
                self.tenant_requested.get_or_create(&labels).set(used);
                if let Some(quota) = quota {
                    self.tenant_quota.get_or_create(&labels).set(quota);
                }
            }
            self.tenant_queued
                .get_or_create(&l(&[("tenant", name)]))
                .set(i64::from(t.queued));
            self.tenant_weight
                .get_or_create(&l(&[("tenant", name)]))
                .set(i64::from(t.spec.weight.get()));
        }
        self.profile_request.clear();
        self.profile_anomalous.clear();
        if let Some(profiles) = &now.profiles {
            for p in profiles {
                self.profile_request
                    .get_or_create(&l(&[("profile", &p.name), ("resource", "cpu")]))
                    .set(p.current.cpu_millis as f64 / 1000.0);
                self.profile_request
                    .get_or_create(&l(&[("profile", &p.name), ("resource", "memory")]))
                    .set(p.current.memory as f64);
                self.profile_anomalous
                    .get_or_create(&l(&[("profile", &p.name)]))
                    .set(p.anomalous as i64);
            }
        }
        let mut out = String::new();
        if encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

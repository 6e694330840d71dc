//! The control plane's recent history for charts over time
//! (`GET /v1/history`): queue length, create latency and each node's CPU,
//! sampled at a fixed interval, and the alert events of the same span.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::Event;

/// One sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct HistoryPoint {
    /// When it was taken (Unix milliseconds).
    pub time_ms: u64,
    /// Creates waiting in the queue at that moment.
    pub queued: u64,
    /// Creates answered since the sample before, and the 50th and 99th
    /// percentiles of their latency (request to ready, milliseconds);
    /// absent when there were none.
    pub creates: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create_p50_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create_p99_ms: Option<f64>,
    /// Each node's CPU busy share (0 to 1) as it last reported, by name.
    pub node_cpu: BTreeMap<String, f64>,
}

/// The answer of `GET /v1/history`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct History {
    /// The time between samples, and how far back they are kept.
    pub interval_ms: u64,
    pub kept_ms: u64,
    /// The window as asked (e.g. `15m`).
    pub since: String,
    /// The samples within the window, oldest first.
    pub points: Vec<HistoryPoint>,
    /// The alert events (a node's CPU saturated or silent, an OOM kill, a
    /// disk limit, memory pressure) recorded within the window, oldest
    /// first.
    pub alerts: Vec<Event>,
}

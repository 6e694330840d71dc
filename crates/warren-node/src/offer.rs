//! What a node is and lends: its name and labels, its capacity, and the
//! defaults a spec that names none gets. Fixed at start; reported in every
//! `NodeInfo`.

use std::collections::BTreeMap;

use warren_node_api::Resources;

pub(crate) struct Offer {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// What admission may hand out (GPUs are counted by `devices`).
    pub allocatable: Resources,
    /// Most processes all sandboxes together may run.
    pub max_pids: u32,
    /// The class of a sandbox whose spec names none.
    pub default_isolation: warren_core::Isolation,
    /// The disk limit of a sandbox that asks for none, enforced by
    /// measuring its writable layer (0: none of its own).
    pub default_disk: u64,
}

//! `/v1/nodes`: what each node lends and holds.

use axum::extract::State;
use axum::Json;

use super::St;

#[derive(serde::Serialize, utoipa::ToSchema)]
pub(crate) struct NodeInfo {
    name: String,
    allocatable: crate::admission::Need,
    allocated: crate::admission::Need,
    queued: usize,
}

/// Nodes with their allocatable and allocated capacity and queue length.
#[utoipa::path(get, path = "/v1/nodes", responses((status = 200, body = [NodeInfo])))]
pub(crate) async fn nodes(State(st): St) -> Json<Vec<NodeInfo>> {
    let admission = &st.control.admission;
    Json(vec![NodeInfo {
        name: st.control.node_name.clone(),
        allocatable: admission.total(),
        allocated: admission.used(),
        queued: admission.queued(),
    }])
}

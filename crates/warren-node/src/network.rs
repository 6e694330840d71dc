//! A sandbox's network: its egress proxy and DNS stub for an allowlist,
//! policy changes, and inbound connections to its ports.

use std::sync::Arc;

use warren_core::sync::lock;
use warren_core::SandboxSpec;

use crate::logs::SandboxLog;
use crate::{Node, NodeError};

impl Node {
    /// Gives an `allowlist` sandbox its proxy, DNS stub and transparent
    /// listeners; `none` needs nothing (its namespace has only loopback).
    pub(crate) async fn attach_network(
        &self,
        id: &str,
        pid: i32,
        spec: &SandboxSpec,
        log: &Arc<SandboxLog>,
    ) -> Result<(), NodeError> {
        if !spec.network.mode.is_proxied() {
            return Ok(());
        }
        let log = log.clone();
        let sink: warren_net::LogFn = Arc::new(move |line| log.record("net", line));
        self.egress.attach(id, pid, &spec.network, sink).await?;
        Ok(())
    }

    /// Replaces a running sandbox's network rules; says which connections
    /// the change closed and which ports got no transparent listener.
    pub async fn update_network(
        &self,
        id: &str,
        network: &warren_core::spec::NetworkSpec,
    ) -> Result<warren_net::PolicyChange, NodeError> {
        let live = self.get(id)?;
        let change = self.egress.update(id, network).await?;
        {
            let mut c = lock(&live.create);
            c.spec.network = network.clone();
        }
        self.journal(&live)?;
        Ok(change)
    }

    /// Checks rules against the node's global defaults.
    pub fn check_network(&self, network: &warren_core::spec::NetworkSpec) -> Result<(), NodeError> {
        if network.mode.is_proxied() {
            self.egress.parse(network)?;
        }
        Ok(())
    }

    /// Inbound: a connection to `port` on the sandbox's loopback.
    pub async fn connect_port(
        &self,
        id: &str,
        port: u16,
    ) -> Result<Box<dyn warren_node_api::Tunnel>, NodeError> {
        let live = self.get(id)?;
        if live.traits.ports_through_init {
            // A network stack of its own: init connects inside and relays.
            let forward = warren_runtime::exec::forward(&live.socket, port);
            return match forward.await? {
                Ok(stream) => Ok(Box::new(stream)),
                Err(refused) => Err(NodeError::Conflict(format!("sandbox {id}: {refused}"))),
            };
        }
        // A frozen sandbox with a full listen backlog would hold the
        // connect forever.
        let connect = warren_net::connect_in(live.pid, port);
        match tokio::time::timeout(warren_runtime::exec::INIT_DEADLINE, connect).await {
            Ok(r) => r.map(|s| Box::new(s) as Box<dyn warren_node_api::Tunnel>).map_err(|e| {
                NodeError::Conflict(format!(
                    "nothing accepts connections on port {port} in sandbox {id}: {e}"
                ))
            }),
            Err(_) => Err(NodeError::Conflict(format!(
                "port {port} in sandbox {id} did not accept the connection within {}s (is the sandbox paused?)",
                warren_runtime::exec::INIT_DEADLINE.as_secs()
            ))),
        }
    }
}

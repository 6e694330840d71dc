//! One `allowlist` sandbox's network state: its policy, limits, live
//! connections, the names its DNS stub handed out, and how a connection
//! out of it is opened (resolved, checked, limited, logged, revocable). The
//! explicit proxy, the transparent listeners and the DNS stub all use it;
//! it uses none of them.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex, RwLock};

use serde_json::json;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use warren_core::network::{Policy, Target};
use warren_core::sync::lock;

use crate::conns::{Conn, ConnGuard, Conns};
use crate::limits::Bucket;
use crate::settings::{LogFn, Settings};

pub(crate) struct Shared {
    pub settings: Settings,
    pub node_conns: Arc<Semaphore>,
    pub node_rate: Bucket,
}

/// Why the proxy refused, as the HTTP status and header it answers with.
#[derive(Debug)]
pub(crate) struct Refusal {
    pub status: u16,
    pub reason: String,
    pub rule: Option<String>,
}

pub(crate) struct Opened {
    pub stream: TcpStream,
    pub guard: ConnGuard,
    pub cancel: CancellationToken,
}

pub(crate) struct SandboxNet {
    pub(crate) id: String,
    pub(crate) pid: i32,
    pub(crate) shared: Arc<Shared>,
    pub(crate) policy: RwLock<Arc<Policy>>,
    /// Names the DNS stub handed out, by the loopback address it gave.
    pub(crate) fake: Mutex<FakeIps>,
    pub(crate) conn_rate: Bucket,
    pub(crate) dns_rate: Bucket,
    pub(crate) conn_slots: Arc<Semaphore>,
    pub(crate) bytes: Option<Bucket>,
    pub(crate) conns: Arc<Conns>,
    pub(crate) cancel: CancellationToken,
    pub(crate) ports: Mutex<HashMap<u16, CancellationToken>>,
    pub(crate) log: LogFn,
}

#[derive(Default)]
pub(crate) struct FakeIps {
    by_name: HashMap<String, Ipv4Addr>,
    by_ip: HashMap<Ipv4Addr, String>,
}

/// The block the DNS stub's addresses come from: loopback, so they stay
/// inside the sandbox's namespace even without the local route.
const FAKE_BASE: u32 = 0x7F4D_0000; // 127.77.0.0/16

impl SandboxNet {
    pub(crate) fn policy(&self) -> Arc<Policy> {
        self.policy
            .read()
            .map(|p| p.clone())
            .unwrap_or_else(|_| Arc::new(Policy::default()))
    }

    pub(crate) fn log(&self, v: serde_json::Value) {
        (self.log)(v)
    }

    /// The name behind an address the DNS stub handed out.
    pub(crate) fn fake_name(&self, ip: IpAddr) -> Option<String> {
        let IpAddr::V4(v4) = ip else { return None };
        lock(&self.fake).by_ip.get(&v4).cloned()
    }

    pub(crate) fn fake_ip(&self, name: &str) -> Option<Ipv4Addr> {
        let mut f = lock(&self.fake);
        if let Some(ip) = f.by_name.get(name) {
            return Some(*ip);
        }
        let n = f.by_name.len() as u32 + 1;
        if n >= 0xFFFF {
            return None;
        }
        let ip = Ipv4Addr::from(FAKE_BASE + n);
        f.by_name.insert(name.to_string(), ip);
        f.by_ip.insert(ip, name.to_string());
        Some(ip)
    }

    /// Counts a new connection from the sandbox (to the explicit proxy or a
    /// transparent listener) against the rate limits. Requests on a kept-alive
    /// connection are not new connections; the byte budget covers them.
    pub(crate) fn rate_ok(&self) -> Result<(), Refusal> {
        if !self.conn_rate.try_take() {
            return Err(Refusal {
                status: 429,
                reason: format!(
                    "sandbox {} is over its new-connection rate ({}/s)",
                    self.id, self.shared.settings.sandbox.conn_rate
                ),
                rule: Some("limit:conn_rate".into()),
            });
        }
        if !self.shared.node_rate.try_take() {
            return Err(Refusal {
                status: 429,
                reason: "the node is over its new-connection rate".into(),
                rule: Some("limit:node_conn_rate".into()),
            });
        }
        Ok(())
    }

    /// Checks and opens one upstream connection: limits, policy, resolution
    /// (every address checked), then a connection to a checked address.
    /// Every outcome is logged.
    pub(crate) async fn open(
        &self,
        target: &Target,
        port: u16,
        via: &str,
    ) -> Result<Opened, Refusal> {
        let result = self.open_inner(target, port).await;
        let mut line = json!({
            "decision": if result.is_ok() { "allow" } else { "deny" },
            "via": via,
            "host": target.to_string(),
            "port": port,
        });
        match &result {
            Ok((opened, rule)) => {
                line["address"] = json!(opened
                    .stream
                    .peer_addr()
                    .map(|a| a.ip().to_string())
                    .unwrap_or_default());
                line["rule"] = json!(rule);
            }
            Err(r) => {
                line["reason"] = json!(r.reason);
                line["rule"] = json!(r.rule);
                line["status"] = json!(r.status);
            }
        }
        self.log(line);
        result.map(|(o, _)| o)
    }

    pub(crate) async fn open_inner(
        &self,
        target: &Target,
        port: u16,
    ) -> Result<(Opened, Option<String>), Refusal> {
        let policy = self.policy();
        let verdict = policy.check(target, port);
        if !verdict.allowed {
            return Err(Refusal {
                status: 403,
                reason: verdict.reason,
                rule: verdict.rule,
            });
        }
        let over = |what: &str| Refusal {
            status: 429,
            reason: format!("{what} connections are all in use"),
            rule: Some(format!("limit:{what}_max_conns")),
        };
        let sandbox_slot = self
            .conn_slots
            .clone()
            .try_acquire_owned()
            .map_err(|_| over("sandbox"))?;
        let node_slot = self
            .shared
            .node_conns
            .clone()
            .try_acquire_owned()
            .map_err(|_| over("node"))?;
        let (addresses, pinned) = match target {
            Target::Ip(ip) => (vec![*ip], false),
            Target::Name(name) => {
                let (ips, pinned) =
                    crate::upstream::resolve(&self.shared.settings.resolve, name, port)
                        .await
                        .map_err(|e| Refusal {
                            status: 502,
                            reason: format!("cannot resolve {name}: {e}"),
                            rule: verdict.rule.clone(),
                        })?;
                // Any bad address refuses the name: a name that sometimes
                // points inside is a rebinding attempt.
                for ip in &ips {
                    let v = policy.check_resolved(name, *ip, port, pinned);
                    if !v.allowed {
                        return Err(Refusal {
                            status: 403,
                            reason: v.reason,
                            rule: v.rule,
                        });
                    }
                }
                (ips, pinned)
            }
        };
        let Some(address) = addresses.iter().copied().find(IpAddr::is_ipv4) else {
            return Err(Refusal {
                status: 502,
                reason: format!("{target} has no IPv4 address"),
                rule: verdict.rule,
            });
        };
        let stream = crate::upstream::connect(address, port)
            .await
            .map_err(|e| Refusal {
                status: 502,
                reason: format!("cannot connect to {target}:{port} ({address}): {e}"),
                rule: verdict.rule.clone(),
            })?;
        let cancel = self.cancel.child_token();
        let guard = self.conns.register(
            Conn {
                target: target.clone(),
                port,
                address,
                pinned,
                cancel: cancel.clone(),
            },
            (sandbox_slot, node_slot),
        );
        Ok((
            Opened {
                stream,
                guard,
                cancel,
            },
            verdict.rule,
        ))
    }
}

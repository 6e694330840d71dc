//! The node's egress proxy: one `Egress` per node; it attaches a
//! `SandboxNet` (sandbox.rs) to each `allowlist` sandbox, places the proxy's
//! sockets in its network namespace and starts the explicit proxy, the
//! transparent listeners and the DNS stub on them.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};

use serde_json::json;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use warren_core::network::{Policy, Target};
use warren_core::spec::{NetworkMode, NetworkSpec};

use crate::conns::Conns;
use crate::limits::Bucket;
use crate::sandbox::{FakeIps, SandboxNet, Shared};
use crate::settings::{LogFn, Settings};
use crate::{netns, route, NetError, PROXY_PORT};
use warren_core::sync::lock;

pub struct Egress {
    shared: Arc<Shared>,
    sandboxes: Mutex<HashMap<String, Arc<SandboxNet>>>,
}

impl Egress {
    pub fn new(settings: Settings) -> Arc<Egress> {
        Arc::new(Egress {
            shared: Arc::new(Shared {
                node_conns: Arc::new(Semaphore::new(settings.node_max_conns.max(1))),
                node_rate: Bucket::new(settings.node_conn_rate, settings.node_conn_rate * 2.0),
                settings,
            }),
            sandboxes: Mutex::new(HashMap::new()),
        })
    }

    /// Checks a sandbox's network against the node's defaults and whether
    /// the operator permits its mode, without attaching anything.
    pub fn parse(&self, network: &NetworkSpec) -> Result<Policy, NetError> {
        if network.mode == NetworkMode::Open && !self.shared.settings.open {
            return Err(NetError::OpenOff);
        }
        Ok(network.policy(&self.shared.settings.defaults)?)
    }

    /// Whether the operator permits open egress on this node.
    pub fn open_permitted(&self) -> bool {
        self.shared.settings.open
    }

    /// Places the proxy's sockets in the network namespace of `pid` and
    /// starts serving them. Also used when a restarted daemon adopts a
    /// sandbox: the old sockets died with the old daemon, so egress failed
    /// closed in between.
    pub async fn attach(
        &self,
        id: &str,
        pid: i32,
        network: &NetworkSpec,
        log: LogFn,
    ) -> Result<(), NetError> {
        let policy = Arc::new(self.parse(network)?);
        let ports = listen_ports(&policy);
        let setup = |source| NetError::Setup {
            id: id.to_string(),
            source,
        };
        let (proxy, dns, listeners) = netns::run_in(pid, move || {
            match route::add_local_default() {
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
                other => other?,
            }
            let proxy = netns::listen(SocketAddr::from(([127, 0, 0, 1], PROXY_PORT)))?;
            let dns = netns::bind_udp(SocketAddr::from(([0, 0, 0, 0], 53)))?;
            let mut listeners = Vec::new();
            for port in ports {
                listeners.push((port, netns::listen(SocketAddr::from(([0, 0, 0, 0], port)))?));
            }
            Ok((proxy, dns, listeners))
        })
        .await
        .map_err(setup)?;
        let limits = &self.shared.settings.sandbox;
        let net = Arc::new(SandboxNet {
            id: id.to_string(),
            pid,
            shared: self.shared.clone(),
            policy: RwLock::new(policy),
            fake: Mutex::new(FakeIps::default()),
            conn_rate: Bucket::new(limits.conn_rate, limits.conn_burst),
            dns_rate: Bucket::new(50.0, 100.0),
            conn_slots: Arc::new(Semaphore::new(limits.max_conns.max(1))),
            bytes: limits
                .bytes_per_sec
                .map(|b| Bucket::new(b as f64, (b as f64 / 10.0).max(64.0 * 1024.0))),
            conns: Arc::new(Conns::default()),
            cancel: CancellationToken::new(),
            ports: Mutex::new(HashMap::new()),
            log,
        });
        let std_to_tokio =
            |l: std::net::TcpListener| tokio::net::TcpListener::from_std(l).map_err(setup);
        crate::explicit::serve(net.clone(), std_to_tokio(proxy)?);
        let dns = tokio::net::UdpSocket::from_std(dns).map_err(setup)?;
        tokio::spawn(serve_dns(net.clone(), dns));
        for (port, l) in listeners {
            serve_port(&net, port, std_to_tokio(l)?);
        }
        {
            let mut m = lock(&self.sandboxes);
            if let Some(old) = m.insert(id.to_string(), net) {
                old.cancel.cancel();
            }
        }
        Ok(())
    }

    /// Closes the sandbox's proxy sockets and connections.
    pub fn detach(&self, id: &str) {
        let net = lock(&self.sandboxes).remove(id);
        if let Some(net) = net {
            net.cancel.cancel();
        }
    }

    /// Replaces the sandbox's rules atomically: new connections see the new
    /// policy at once, and live connections it no longer allows are closed.
    /// Returns the closed connections as `host:port`.
    /// Replaces a sandbox's rules. The switch itself cannot fail: a port
    /// the new rules add that cannot get a transparent listener (something
    /// in the sandbox already listens there) is reported, and served by the
    /// explicit proxy only, so a revocation always takes effect.
    pub async fn update(&self, id: &str, network: &NetworkSpec) -> Result<PolicyChange, NetError> {
        let policy = Arc::new(self.parse(network)?);
        let (allow, deny) = (&network.allow, &network.deny);
        let net = lock(&self.sandboxes)
            .get(id)
            .cloned()
            .ok_or_else(|| NetError::NotAttached(id.to_string()))?;
        // Listeners for ports the new rules add, before the switch, so the
        // switch itself cannot fail half-way.
        let wanted = listen_ports(&policy);
        let have: BTreeSet<u16> = lock(&net.ports).keys().copied().collect();
        let added: Vec<u16> = wanted.difference(&have).copied().collect();
        let attempts = netns::run_in(net.pid, move || {
            Ok(added
                .into_iter()
                .map(|p| (p, netns::listen(SocketAddr::from(([0, 0, 0, 0], p)))))
                .collect::<Vec<_>>())
        })
        .await
        .unwrap_or_default();
        let mut listeners = Vec::new();
        let mut unlistened = Vec::new();
        for (port, l) in attempts {
            match l {
                Ok(l) => listeners.push((port, l)),
                Err(_) => unlistened.push(port),
            }
        }
        if let Ok(mut p) = net.policy.write() {
            *p = policy.clone();
        }
        // (Pooled plain-HTTP connections, checked under the old rules, are
        // dropped by the explicit proxy when it sees the new policy.)
        for (port, l) in listeners {
            if let Ok(l) = tokio::net::TcpListener::from_std(l) {
                serve_port(&net, port, l);
            }
        }
        {
            let mut ports = lock(&net.ports);
            ports.retain(|port, cancel| {
                let keep = wanted.contains(port);
                if !keep {
                    cancel.cancel();
                }
                keep
            });
        }
        let closed = net.conns.revoke(&policy);
        (net.log)(
            json!({ "decision": "policy", "allow": allow, "deny": deny, "closed": closed, "unlistened_ports": unlistened }),
        );
        Ok(PolicyChange { closed, unlistened })
    }

    /// Open proxied connections of a sandbox.
    pub fn connections(&self, id: &str) -> Option<usize> {
        lock(&self.sandboxes).get(id).map(|n| n.conns.count())
    }
}

/// What a rule change did besides switching the rules.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyChange {
    /// Live connections the new rules refuse, now closed (`host:port`).
    pub closed: Vec<String>,
    /// Ports the new rules name that something in the sandbox already
    /// listens on: reachable through the explicit proxy only.
    pub unlistened: Vec<u16>,
}

/// The ports the transparent path listens on: every port a rule names,
/// except the explicit proxy's and DNS's own.
fn listen_ports(policy: &Policy) -> BTreeSet<u16> {
    policy
        .ports()
        .into_iter()
        .filter(|p| *p != PROXY_PORT && *p != 53)
        .collect()
}

/// Serves a transparent listener of the sandbox on `port` (replacing an
/// older one on that port).
fn serve_port(net: &Arc<SandboxNet>, port: u16, listener: tokio::net::TcpListener) {
    let cancel = net.cancel.child_token();
    {
        let mut p = lock(&net.ports);
        if let Some(old) = p.insert(port, cancel.clone()) {
            old.cancel();
        }
    }
    tokio::spawn(crate::transparent::serve(
        net.clone(),
        port,
        listener,
        cancel,
    ));
}

async fn serve_dns(net: Arc<SandboxNet>, sock: tokio::net::UdpSocket) {
    let mut buf = [0u8; 1500];
    loop {
        let (n, from) = tokio::select! {
            r = sock.recv_from(&mut buf) => match r {
                Ok(x) => x,
                Err(_) => continue,
            },
            _ = net.cancel.cancelled() => return,
        };
        if !net.dns_rate.try_take() {
            continue;
        }
        let q = match crate::dns::parse(&buf[..n]) {
            Ok(q) => q,
            Err(Some(reply)) => {
                let _ = sock.send_to(&reply, from).await;
                continue;
            }
            Err(None) => continue,
        };
        let allowed = warren_core::network::normalize_host(&q.name)
            .ok()
            .and_then(|t| match t {
                Target::Name(n) if net.policy().names(&n) => Some(n),
                _ => None,
            });
        let address = allowed.as_deref().and_then(|n| net.fake_ip(n));
        net.log(json!({
            "decision": if address.is_some() { "allow" } else { "deny" },
            "via": "dns",
            "host": q.name,
            "qtype": q.qtype,
        }));
        let _ = sock.send_to(&crate::dns::answer(&q, address), from).await;
    }
}

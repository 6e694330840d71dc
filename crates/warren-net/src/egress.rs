//! The node's egress proxy: one `Egress` per node, one `SandboxNet` per
//! `allowlist` sandbox, holding its policy, limits, live connections and
//! the sockets the node placed in its network namespace.

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, RwLock};

use serde_json::json;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use warren_core::network::{Policy, Target};

use crate::conns::{Conn, ConnGuard, Conns};
use crate::limits::Bucket;
use crate::{netns, route, NetError, PROXY_PORT};
use warren_core::sync::lock;

/// Where a sandbox's decisions go: one JSON object per decision.
pub type LogFn = Arc<dyn Fn(serde_json::Value) + Send + Sync>;

/// Per-sandbox limits.
#[derive(Debug, Clone)]
pub struct Limits {
    /// New connections (and plain-HTTP requests) per second, with a burst.
    pub conn_rate: f64,
    pub conn_burst: f64,
    /// Connections open at once.
    pub max_conns: usize,
    /// Bytes per second through all of the sandbox's connections, both ways.
    pub bytes_per_sec: Option<u64>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            conn_rate: 100.0,
            conn_burst: 200.0,
            max_conns: 512,
            bytes_per_sec: None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Settings {
    /// Allow rules merged into every `allowlist` sandbox's policy (object
    /// storage, log service, model registry).
    pub defaults: Vec<String>,
    /// Names the proxy resolves to fixed addresses instead of asking DNS.
    pub resolve: HashMap<String, Vec<IpAddr>>,
    pub sandbox: Limits,
    /// Node-wide caps over all sandboxes.
    pub node_max_conns: usize,
    pub node_conn_rate: f64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            defaults: Vec::new(),
            resolve: HashMap::new(),
            sandbox: Limits::default(),
            node_max_conns: 16384,
            node_conn_rate: 5000.0,
        }
    }
}

pub(crate) struct Shared {
    pub settings: Settings,
    node_conns: Arc<Semaphore>,
    node_rate: Bucket,
}

pub struct Egress {
    shared: Arc<Shared>,
    sandboxes: Mutex<HashMap<String, Arc<SandboxNet>>>,
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
    pub id: String,
    pid: i32,
    shared: Arc<Shared>,
    policy: RwLock<Arc<Policy>>,
    /// Names the DNS stub handed out, by the loopback address it gave.
    fake: Mutex<FakeIps>,
    conn_rate: Bucket,
    dns_rate: Bucket,
    conn_slots: Arc<Semaphore>,
    pub bytes: Option<Bucket>,
    conns: Arc<Conns>,
    pub cancel: CancellationToken,
    ports: Mutex<HashMap<u16, CancellationToken>>,
    log: LogFn,
    pub http: RwLock<crate::explicit::Client>,
}

#[derive(Default)]
struct FakeIps {
    by_name: HashMap<String, Ipv4Addr>,
    by_ip: HashMap<Ipv4Addr, String>,
}

/// The block the DNS stub's addresses come from: loopback, so they stay
/// inside the sandbox's namespace even without the local route.
const FAKE_BASE: u32 = 0x7F4D_0000; // 127.77.0.0/16

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

    /// Checks rules against the node's defaults without attaching anything.
    pub fn parse(&self, allow: &[String], deny: &[String]) -> Result<Policy, NetError> {
        Ok(Policy::parse(allow, deny, &self.shared.settings.defaults)?)
    }

    /// Places the proxy's sockets in the network namespace of `pid` and
    /// starts serving them. Also used when a restarted daemon adopts a
    /// sandbox: the old sockets died with the old daemon, so egress failed
    /// closed in between.
    pub async fn attach(
        &self,
        id: &str,
        pid: i32,
        allow: &[String],
        deny: &[String],
        log: LogFn,
    ) -> Result<(), NetError> {
        let policy = Arc::new(self.parse(allow, deny)?);
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
        let net = Arc::new_cyclic(|weak| SandboxNet {
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
            http: RwLock::new(crate::explicit::client(weak.clone())),
        });
        let std_to_tokio =
            |l: std::net::TcpListener| tokio::net::TcpListener::from_std(l).map_err(setup);
        crate::explicit::serve(net.clone(), std_to_tokio(proxy)?);
        let dns = tokio::net::UdpSocket::from_std(dns).map_err(setup)?;
        tokio::spawn(serve_dns(net.clone(), dns));
        for (port, l) in listeners {
            net.serve_port(port, std_to_tokio(l)?);
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
    pub async fn update(
        &self,
        id: &str,
        allow: &[String],
        deny: &[String],
    ) -> Result<PolicyChange, NetError> {
        let policy = Arc::new(self.parse(allow, deny)?);
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
        // Pooled plain-HTTP connections were checked under the old rules.
        if let Ok(mut c) = net.http.write() {
            *c = crate::explicit::client(Arc::downgrade(&net));
        }
        for (port, l) in listeners {
            if let Ok(l) = tokio::net::TcpListener::from_std(l) {
                net.serve_port(port, l);
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

    fn fake_ip(&self, name: &str) -> Option<Ipv4Addr> {
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

    async fn open_inner(
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

    fn serve_port(self: &Arc<Self>, port: u16, listener: tokio::net::TcpListener) {
        let cancel = self.cancel.child_token();
        {
            let mut p = lock(&self.ports);
            if let Some(old) = p.insert(port, cancel.clone()) {
                old.cancel();
            }
        }
        tokio::spawn(crate::transparent::serve(
            self.clone(),
            port,
            listener,
            cancel,
        ));
    }
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

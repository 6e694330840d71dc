//! `warren server`: a cluster's control plane. It serves the public API,
//! places sandboxes on the nodes that joined it (through their node API)
//! and keeps its state in its store; a clean stop or a crash leaves every
//! node and sandbox as it is.

use std::sync::Arc;

use anyhow::{Context, Result};
use warren_control::nodes::{ConnectError, Connector, Liveness, ProofError};
use warren_control::{replica, NodeSource, UpConfig};
use warren_node_api::NodeApi;

use crate::cli::{ServerArgs, ServerCmd};

/// Where the token nodes join with is kept.
fn join_token_path(home: &std::path::Path) -> std::path::PathBuf {
    home.join("join-token")
}

pub async fn run(home: &std::path::Path, args: ServerArgs) -> Result<i32> {
    if let Some(ServerCmd::JoinToken { rotate }) = args.command {
        return join_token(home, rotate);
    }
    let (log_path, _traces) =
        super::init_logging(home, "warren-server.log", &args.traces, "warren-server")?;
    let policy = super::policy(&args.control)?;
    let join_token = warren_control::ensure_secret(&join_token_path(home))
        .with_context(|| format!("join token {}", join_token_path(home).display()))?;
    let nofile = warren_runtime::host_tables::raise_nofile();
    // The lease's epoch, set once this replica leads (before its control
    // plane connects to any node): every node call carries it.
    let epoch = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let connect: Connector = {
        let epoch = epoch.clone();
        Arc::new(move |url: &str, credential: &str, pin: Option<&str>| {
            match pin {
                Some(pin) => warren_node_http::HttpNode::pinned(url, credential, pin),
                None => warren_node_http::HttpNode::new(url, credential),
            }
            .map(|n| n.with_leader_epoch(epoch.load(std::sync::atomic::Ordering::Acquire)))
            .map(|n| Arc::new(n) as Arc<dyn NodeApi>)
            .map_err(ConnectError::from)
        })
    };
    let ports = super::port_door::bind(&args.control)?;
    // The server pulls nothing itself: its registries.toml says what every
    // node takes beneath its own (the cluster's pull-through cache).
    let registries_file = home.join(warren_image::REGISTRY_CONFIG_FILE);
    let registries = warren_image::RegistryConfig::shared(&registries_file)
        .with_context(|| format!("{} (given to joining nodes)", registries_file.display()))?;
    let cfg = UpConfig {
        home: home.to_path_buf(),
        listen: args.listen,
        queue_limit: args.control.queue_limit,
        public_url: args.control.public_url.clone(),
        ports_url: Some(ports.url.clone()),
        alert_webhooks: args.control.alert_webhooks.clone(),
        log_limits: super::log_limits(&args.log_retention, args.control.log_max_total.as_deref())?,
        policy,
        database: args.database.clone(),
        destroy_on_stop: false,
        nodes: NodeSource::Cluster {
            join_token,
            connect,
            check_proof: std::sync::Arc::new(|req: &warren_node_api::JoinRequest| {
                warren_node_http::tls::check_join_proof(req, warren_core::clock::unix_now())
                    .map_err(ProofError::new)
            }),
            liveness: Liveness::default(),
            registries,
            cluster_registry: args.cluster_registry.clone(),
        },
    };
    let listener = super::listen(args.listen)
        .with_context(|| format!("listen on {} (--listen)", args.listen))?;
    let advertise = args
        .advertise
        .clone()
        .unwrap_or_else(|| format!("http://{}", args.listen));
    say!(
        "warren server: listening on http://{} (home {}, API token in {}, join token in {}, log in {})",
        args.listen,
        home.display(),
        home.join("token").display(),
        join_token_path(home).display(),
        log_path.display()
    );
    let switch = Arc::new(replica::Switch::default());
    let leading: super::Running = Default::default();
    super::compat::start("warren server", home, &args.compat, leading.clone(), nofile).await?;
    super::port_door::serve("warren server", ports, home, leading.clone(), nofile)?;
    let lease = tokio::spawn(hold_lease(
        home.to_path_buf(),
        advertise,
        epoch,
        cfg,
        switch.clone(),
        leading.clone(),
    ));
    super::serve_until_signal(
        "warren server",
        listener,
        switch.router(),
        nofile,
        leading.clone(),
    )
    .await?;
    lease.abort();
    // Stops without touching a node: sandboxes run on, and a restarted
    // control plane reconciles with them.
    if let Some(control) = leading.get() {
        control.shutdown(super::SHUTDOWN_GRACE).await;
    }
    say!("warren server: stopped (nodes and their sandboxes keep running)");
    Ok(0)
}

/// Claims the leader lease every half second. Once it holds it, this
/// replica starts its control plane and renews the lease; should a renewal
/// fail past the lease's length, or another replica hold it, the process
/// exits at once (its supervisor restarts it as a follower), so two
/// replicas never place sandboxes at the same time. Should it stall past
/// its lease and act before it notices, the nodes refuse it: they have seen
/// the new leader's higher epoch.
async fn hold_lease(
    home: std::path::PathBuf,
    advertise: String,
    epoch: Arc<std::sync::atomic::AtomicU64>,
    cfg: UpConfig,
    switch: Arc<replica::Switch>,
    leading: super::Running,
) {
    // A restarted replica is the same holder: it takes its lease back at
    // once instead of waiting for it to expire.
    let me = match warren_control::ensure_secret(&home.join("replica-id")) {
        Ok(id) => id,
        Err(e) => fatal(&format!("replica id under {}: {e}", home.display())),
    };
    let store = match warren_control::open_store(&home, cfg.database.as_deref()).await {
        Ok(store) => store,
        Err(e) => fatal(&e.to_string()),
    };
    let mut cfg = Some(cfg);
    let mut renewed = std::time::Instant::now();
    loop {
        match store.claim_leader(&me, &advertise, replica::LEASE_MS).await {
            Ok(lease) if lease.holder == me => {
                renewed = std::time::Instant::now();
                let leads_in = epoch.load(std::sync::atomic::Ordering::Acquire);
                if leads_in != 0 && leads_in != lease.epoch {
                    // Another replica led in between: what this control
                    // plane holds in memory is stale.
                    fatal(&format!(
                        "the leader lease went to another replica and back (epoch {leads_in} → {}): \
                         stopping so that a fresh start takes over",
                        lease.epoch
                    ));
                }
                if let Some(cfg) = cfg.take() {
                    epoch.store(lease.epoch, std::sync::atomic::Ordering::Release);
                    say!(
                        "warren server: this replica leads ({advertise}, epoch {})",
                        lease.epoch
                    );
                    match warren_control::start(cfg).await {
                        Ok((up, router)) => {
                            let _ = leading.set(up.control.clone());
                            switch.lead(router);
                        }
                        Err(e) => fatal(&e.to_string()),
                    }
                }
            }
            Ok(lease) => {
                if switch.leads() {
                    fatal(&format!(
                        "the leader lease went to {}: stopping so that only one replica places",
                        lease.url
                    ));
                }
                switch.follow(&lease.url);
            }
            Err(e) => {
                tracing::warn!(error = %e, "claiming the leader lease");
                if switch.leads()
                    && renewed.elapsed().as_millis() as i64 >= replica::LEASE_MS - 1000
                {
                    fatal("the leader lease could not be renewed: stopping so that only one replica places");
                }
            }
        }
        let every = if switch.leads() { 1000 } else { 500 };
        tokio::time::sleep(std::time::Duration::from_millis(every)).await;
    }
}

fn fatal(message: &str) -> ! {
    say!("warren server: {message}");
    std::process::exit(75)
}

/// Prints the join token, making it first (or anew with `rotate`).
fn join_token(home: &std::path::Path, rotate: bool) -> Result<i32> {
    super::private_home(home)?;
    let path = join_token_path(home);
    let token = if rotate {
        warren_control::write_secret(&path, &warren_control::new_secret())
    } else {
        warren_control::ensure_secret(&path)
    }
    .with_context(|| format!("join token {}", path.display()))?;
    println!("{token}");
    if rotate {
        say!("rotated: a running `warren server` takes the new token after a restart; nodes already joined stay joined");
    }
    Ok(0)
}

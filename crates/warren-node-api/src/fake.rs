//! A node that does no kernel work: it keeps its sandboxes in memory, so
//! the control plane's logic (reclaim rules, reconciliation, the queue,
//! races) can be tested by an ordinary user. Tests steer it: push events,
//! make calls fail or wait, read what was asked of it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::watch;

use crate::calls::prelude::*;
use crate::error::{NodeError, NodeResult};
use warren_core::sync::lock;

#[derive(Default)]
struct State {
    sandboxes: BTreeMap<String, SandboxStatus>,
    /// Every call that changed something, in order (`create sbx-…`).
    calls: Vec<String>,
    /// Errors the next call of a method (by name) answers.
    fail: HashMap<String, NodeError>,
    logs: HashMap<String, Vec<LogNote>>,
    /// The spec each sandbox was last given (by its create or a claim).
    specs: HashMap<String, warren_core::SandboxSpec>,
}

pub struct FakeNode {
    name: String,
    allocatable: Resources,
    state: Mutex<State>,
    events: Arc<Mutex<Vec<Sequenced>>>,
    /// The newest event's sequence number.
    last: watch::Sender<u64>,
    /// How long `create` takes.
    create_delay: Mutex<Duration>,
    /// Its shipping journal (`ship`): entry `seq` is at index `seq - 1`.
    shipped: Mutex<Vec<Shipped>>,
    shipped_last: watch::Sender<u64>,
    /// The isolation classes it reports, its default first.
    isolation: Mutex<Vec<warren_core::Isolation>>,
}

impl FakeNode {
    pub fn new(name: &str, allocatable: Resources) -> Arc<FakeNode> {
        Arc::new(FakeNode {
            name: name.into(),
            allocatable,
            state: Mutex::new(State::default()),
            events: Arc::default(),
            last: watch::Sender::new(0),
            create_delay: Mutex::new(Duration::ZERO),
            shipped: Mutex::default(),
            shipped_last: watch::Sender::new(0),
            isolation: Mutex::new(vec![warren_core::Isolation::Container]),
        })
    }

    /// The isolation classes it reports from now on (its default first);
    /// a create that names another is refused, as a real node does.
    pub fn set_isolation(&self, classes: Vec<warren_core::Isolation>) {
        *lock(&self.isolation) = classes;
    }

    /// The spec the sandbox was last given (by its create or a claim).
    pub fn spec_of(&self, id: &str) -> Option<warren_core::SandboxSpec> {
        self.state().specs.get(id).cloned()
    }

    /// The journal id `ship` answers with.
    pub const JOURNAL: &'static str = "fake-journal";

    /// A log line the sandbox wrote, as the node would ship it; its seq.
    pub fn log_line(&self, id: &str, body: &str) -> u64 {
        self.ship_entry(id, ShippedKind::Log, body)
    }

    /// A usage sample of the sandbox, as the node would ship it; its seq.
    pub fn usage_sample(&self, id: &str, usage: &Usage) -> u64 {
        let body = serde_json::to_string(usage).unwrap_or_default();
        self.ship_entry(id, ShippedKind::Usage, &body)
    }

    fn ship_entry(&self, id: &str, kind: ShippedKind, body: &str) -> u64 {
        let mut shipped = lock(&self.shipped);
        let seq = shipped.len() as u64 + 1;
        shipped.push(Shipped {
            seq,
            sandbox_id: id.into(),
            kind,
            time_ms: 1_700_000_000_000 + seq as i64,
            body: body.into(),
        });
        self.shipped_last.send_replace(seq);
        seq
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Reports an event, as the node would.
    pub fn push(&self, event: NodeEvent) {
        let mut events = lock(&self.events);
        let seq = events.len() as u64 + 1;
        events.push(Sequenced { seq, event });
        self.last.send_replace(seq);
    }

    /// The next call of `method` answers `error`.
    pub fn fail_next(&self, method: &str, error: NodeError) {
        self.state().fail.insert(method.into(), error);
    }

    pub fn set_create_delay(&self, d: Duration) {
        *lock(&self.create_delay) = d;
    }

    /// A sandbox the node holds as if a create (or a restart) left it.
    pub fn hold_sandbox(&self, id: &str, phase: Phase) {
        self.state().sandboxes.insert(id.into(), status(id, phase));
    }

    pub fn phase(&self, id: &str) -> Option<Phase> {
        self.state().sandboxes.get(id).map(|s| s.phase)
    }

    pub fn ids(&self) -> Vec<String> {
        self.state().sandboxes.keys().cloned().collect()
    }

    pub fn calls(&self) -> Vec<String> {
        self.state().calls.clone()
    }

    /// The notes written to a sandbox's log.
    pub fn notes(&self, id: &str) -> Vec<LogNote> {
        self.state().logs.get(id).cloned().unwrap_or_default()
    }

    fn call(&self, method: &str, id: &str) -> NodeResult<()> {
        let mut s = self.state();
        s.calls.push(format!("{method} {id}").trim().to_string());
        s.fail.remove(method).map_or(Ok(()), Err)
    }

    fn log(&self, id: &str, note: LogNote) {
        self.state().logs.entry(id.into()).or_default().push(note);
    }

    fn with<T>(&self, id: &str, f: impl FnOnce(&mut SandboxStatus) -> T) -> NodeResult<T> {
        let mut s = self.state();
        let sandbox = s.sandboxes.get_mut(id);
        sandbox
            .map(f)
            .ok_or_else(|| NodeError::not_found(format!("sandbox {id} is not on this node")))
    }
}

fn status(id: &str, phase: Phase) -> SandboxStatus {
    SandboxStatus {
        id: id.into(),
        phase,
        image_digest: "sha256:fake".into(),
        pid: 1,
        host_id_base: None,
        ttl_remaining_ms: 3_600_000,
        lease_remaining_ms: None,
        usage: Some(Usage::default()),
        phases: Vec::new(),
    }
}

/// The calls the fake node has no body for answer this.
fn unsupported<T>(call: &str) -> NodeResult<T> {
    Err(NodeError::invalid(format!("the fake node has no {call}")))
}

crate::node_impl! { FakeNode, else unsupported;
    info(self) {
        let sandboxes = self.state().sandboxes.len() as u32;
        Ok(NodeInfo {
            name: self.name.clone(),
            labels: Default::default(),
            allocatable: self.allocatable,
            max_pids: 4096,
            load: Load {
                sandboxes,
                ..Default::default()
            },
            images: Vec::new(),
            devices: Vec::new(),
            isolation: lock(&self.isolation).clone(),
        })
    }

    inventory(self) {
        self.call("inventory", "")?;
        Ok(self.state().sandboxes.values().cloned().collect())
    }

    status(self, id, _read_usage) { self.with(id, |s| s.clone()) }

    ship(self, journal, after, max, wait) {
        // Not in `calls`: the control plane asks all the time.
        if let Some(e) = self.state().fail.remove("ship") {
            return Err(e);
        }
        let after = if journal == Some(Self::JOURNAL) { after } else { 0 };
        let mut rx = self.shipped_last.subscribe();
        let _ = tokio::time::timeout(wait, rx.wait_for(|last| *last > after)).await;
        let entries: Vec<Shipped> = lock(&self.shipped)
            .iter()
            .skip(after as usize)
            .take(max as usize)
            .cloned()
            .collect();
        Ok(ShipBatch {
            journal: Self::JOURNAL.into(),
            last: entries.last().map_or(after, |e| e.seq),
            entries,
            dropped: 0,
        })
    }

    events(self, since) {
        // Sequence numbers count from 1 without gaps: the event after `seen`
        // is at index `seen`.
        let (feed, rx) = (self.events.clone(), self.last.subscribe());
        Ok(futures_util::stream::unfold((since, rx), move |(seen, mut rx)| {
            let feed = feed.clone();
            async move {
                loop {
                    rx.borrow_and_update();
                    let next = lock(&feed).get(seen as usize).cloned();
                    if let Some(ev) = next {
                        let seq = ev.seq;
                        return Some((ev, (seq, rx)));
                    }
                    rx.changed().await.ok()?;
                }
            }
        })
        .boxed())
    }

    create(self, req) {
        let delay = *lock(&self.create_delay);
        tokio::time::sleep(delay).await;
        self.call("create", &req.id)?;
        if let Some(class) = req.spec.isolation {
            if !class.offered_by(&lock(&self.isolation)) {
                return Err(NodeError::invalid(format!(
                    "this node does not offer isolation class {class}"
                )));
            }
        }
        let mut s = self.state();
        if s.sandboxes.contains_key(&req.id) {
            return Err(NodeError::conflict(format!("sandbox {} exists", req.id)));
        }
        let st = status(&req.id, Phase::Running);
        s.sandboxes.insert(req.id.clone(), st.clone());
        s.specs.insert(req.id.clone(), req.spec);
        Ok(st)
    }

    start_main(self, id) {
        self.call("start_main", id)?;
        self.with(id, |_| ())
    }

    destroy(self, id, why) {
        self.call("destroy", id)?;
        let (state, reason, message) = ("destroyed".into(), why.into(), String::new());
        self.log(id, LogNote { state, reason, message });
        Ok(self.state().sandboxes.remove(id).and_then(|st| st.usage))
    }

    set_paused(self, id, paused) {
        self.call(if paused { "pause" } else { "resume" }, id)?;
        let phase = if paused { Phase::Paused } else { Phase::Running };
        self.with(id, |s| s.phase = phase)
    }

    hold(self, id, hold_for, note) {
        self.call("hold", id)?;
        let usage = self.with(id, |s| {
            s.phase = Phase::Held;
            s.ttl_remaining_ms = hold_for.as_millis() as u64;
            s.lease_remaining_ms = None;
            s.usage.clone()
        })?;
        self.log(id, note);
        Ok(usage)
    }

    set_ttl(self, id, ttl) {
        self.call("set_ttl", id)?;
        self.with(id, |s| s.ttl_remaining_ms = ttl.as_millis() as u64)
    }

    claim(self, id, spec) {
        self.call("claim", id)?;
        let st = self.with(id, |s| {
            s.ttl_remaining_ms = spec.ttl().as_millis() as u64;
            s.clone()
        })?;
        self.state().specs.insert(id.to_string(), spec);
        Ok(st)
    }

    renew_lease(self, _id) { Ok(()) }

    note(self, id, note) {
        self.log(id, note);
        Ok(())
    }

    exec(self, id, _req) {
        self.call("exec", id)?;
        self.with(id, |_| ())?;
        Ok(futures_util::stream::empty().boxed())
    }

    write_file(self, id, _req, _body) {
        self.call("write_file", id)?;
        self.with(id, |_| ())
    }

    check_network(self, _network) { Ok(()) }

    set_network(self, id, _network) {
        self.call("set_network", id)?;
        self.with(id, |_| PolicyChange::default())
    }

    fork_layer(self, id, _processes) {
        self.call("fork_layer", id)?;
        self.with(id, |_| ())?;
        let n = self.state().calls.len();
        Ok(ForkLayer {
            layers: vec![format!("fk-fake{n:08}")],
            bytes: 0,
            entries: 0,
            frozen_ms: 0,
            memory_bytes: 0,
        })
    }

    release_fork_layer(self, layer) { self.call("release_fork_layer", layer) }

    image_list(self) { Ok(vec![]) }

    image_for_create(self, reference) {
        self.call("image_for_create", reference)?;
        Ok(ImageInfo {
            name: reference.into(),
            digest: "sha256:fake".into(),
            layers: 1,
            record: serde_json::json!({"name": reference}),
        })
    }

    image_gc(self, _budget) { Ok(GcReport::default()) }

    volume_list(self) { Ok(Vec::new()) }
}

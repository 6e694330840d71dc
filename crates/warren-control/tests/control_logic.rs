//! The control plane's decisions against a fake node: no root, no kernel
//! work, run by `cargo test`. Reclaim rules, reconciliation after a
//! restart, the FIFO queue, and creates racing destroys.

// Tests may unwrap (clippy.toml covers only #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

/// Tests call as the operator (tenants have their own tests).
const OP: warren_core::tenant::Principal = warren_core::tenant::Principal::Operator;

use warren_control::control::{Control, Options};
use warren_control::store::SqliteStore;
use warren_core::state::reason;
use warren_core::{SandboxSpec, SandboxState};
use warren_node_api::fake::FakeNode;
use warren_node_api::{Exit, NodeApi, NodeError, NodeEvent, Phase, Resources};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Room for `slots` sandboxes of 1 CPU and 1 GiB.
fn node(slots: u32) -> Arc<FakeNode> {
    FakeNode::new(
        "fake",
        Resources {
            cpu_millis: 1000 * slots as u64,
            memory: (slots as u64) << 30,
            slots,
            gpus: 0,
        },
    )
}

struct Plane {
    control: Arc<Control>,
    dir: tempfile::TempDir,
}

/// A control plane over `node` on a store in `dir`, recovered and following
/// the node's events.
async fn plane_in(
    node: &Arc<FakeNode>,
    dir: tempfile::TempDir,
) -> Result<Plane, Box<dyn std::error::Error>> {
    plane_with(node, dir, true).await
}

/// `plane_in`, with a clean stop that destroys every sandbox or (a
/// cluster's control plane) none.
async fn plane_with(
    node: &Arc<FakeNode>,
    dir: tempfile::TempDir,
    destroy_on_stop: bool,
) -> Result<Plane, Box<dyn std::error::Error>> {
    let store = Arc::new(SqliteStore::open(&dir.path().join("warren.db")).await?);
    let info = node.info().await?;
    let control = Arc::new(Control::new(
        store,
        Options {
            queue_limit: 16,
            destroy_on_stop,
            ..Default::default()
        },
    ));
    control
        .node_set()
        .add(node.clone(), info, String::new(), String::new(), false);
    // Reconciling the node starts following its events.
    control.recover().await.map_err(|e| e.message)?;
    control.lifecycle().set_ready();
    Ok(Plane { control, dir })
}

async fn plane(node: &Arc<FakeNode>) -> Result<Plane, Box<dyn std::error::Error>> {
    plane_in(node, tempfile::tempdir()?).await
}

fn spec(json: serde_json::Value) -> SandboxSpec {
    let mut v = serde_json::json!({"image": "img", "cpu": 1, "memory": "1G"});
    if let (Some(base), Some(extra)) = (v.as_object_mut(), json.as_object()) {
        for (k, x) in extra {
            base.insert(k.clone(), x.clone());
        }
    }
    serde_json::from_value(v).unwrap_or_else(|e| panic!("spec: {e}"))
}

/// Waits until the sandbox's record is in `state`.
async fn settles(c: &Control, id: &str, state: SandboxState) -> Result<String, String> {
    for _ in 0..200 {
        let row = c.records().get(id).await.map_err(|e| e.message)?;
        if row.state == state {
            return Ok(row.reason);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let row = c.records().get(id).await.map_err(|e| e.message)?;
    Err(format!(
        "{id} is {} ({}), not {state}",
        row.state, row.reason
    ))
}

fn exited(id: &str, code: i32, signal: Option<i32>, oom_killed: bool) -> NodeEvent {
    NodeEvent::MainExited {
        id: id.into(),
        exit: Exit {
            code,
            signal,
            timed_out: false,
        },
        oom_killed,
    }
}

#[tokio::test]
async fn reclaim_rules_decide_what_happens_when_a_sandbox_ends() -> TestResult {
    // (reclaim policy, what the node reports, state it ends in, reason,
    // whether the node still holds it, frozen)
    type Case = (
        &'static str,
        fn(&str) -> NodeEvent,
        SandboxState,
        &'static str,
        bool,
    );
    let cases: Vec<Case> = vec![
        (
            "destroy",
            |id| exited(id, 0, None, false),
            SandboxState::Destroyed,
            reason::MAIN_EXITED,
            false,
        ),
        (
            "destroy",
            |id| exited(id, 1, None, false),
            SandboxState::Destroyed,
            reason::MAIN_EXITED,
            false,
        ),
        (
            "keep_on_failure",
            |id| exited(id, 0, None, false),
            SandboxState::Destroyed,
            reason::MAIN_EXITED,
            false,
        ),
        (
            "keep_on_failure",
            |id| exited(id, 3, None, false),
            SandboxState::Kept,
            reason::MAIN_EXITED,
            true,
        ),
        (
            "keep_on_failure",
            |id| exited(id, 137, Some(9), true),
            SandboxState::Kept,
            reason::OOM_KILLED,
            true,
        ),
        (
            "keep",
            |id| exited(id, 0, None, false),
            SandboxState::Kept,
            reason::MAIN_EXITED,
            true,
        ),
        (
            "keep",
            |id| NodeEvent::Expired {
                id: id.into(),
                reason: reason::TTL_EXPIRED.into(),
            },
            SandboxState::Kept,
            reason::TTL_EXPIRED,
            true,
        ),
        (
            "destroy",
            |id| NodeEvent::Expired {
                id: id.into(),
                reason: reason::LEASE_EXPIRED.into(),
            },
            SandboxState::Destroyed,
            reason::LEASE_EXPIRED,
            false,
        ),
        // A dead init leaves nothing worth keeping.
        (
            "keep",
            |id| NodeEvent::InitDied {
                id: id.into(),
                oom_killed: false,
            },
            SandboxState::Destroyed,
            reason::INIT_DIED,
            false,
        ),
        (
            "keep",
            |id| NodeEvent::InitDied {
                id: id.into(),
                oom_killed: true,
            },
            SandboxState::Destroyed,
            reason::OOM_KILLED,
            false,
        ),
        // A sandbox over its own disk limit may be kept (frozen, it writes
        // no more); one that filled the node's disk may not.
        (
            "keep_on_failure",
            |id| NodeEvent::DiskExceeded {
                id: id.into(),
                used: 9,
                limit: 1,
                node_full: false,
            },
            SandboxState::Kept,
            reason::DISK_EXCEEDED,
            true,
        ),
        (
            "keep_on_failure",
            |id| NodeEvent::DiskExceeded {
                id: id.into(),
                used: 9,
                limit: 1,
                node_full: true,
            },
            SandboxState::Destroyed,
            reason::DISK_EXCEEDED,
            false,
        ),
        // Delay: frozen for its grace period, still `stopping`.
        (
            "delay",
            |id| exited(id, 0, None, false),
            SandboxState::Stopping,
            reason::MAIN_EXITED,
            true,
        ),
    ];
    let node = node(32);
    let p = plane(&node).await?;
    for (policy, event, state, why, held) in cases {
        let (info, _) = p
            .control
            .create(&OP, spec(serde_json::json!({"reclaim": policy})), true)
            .await
            .map_err(|e| e.message)?;
        node.push(event(&info.id));
        let got = settles(&p.control, &info.id, state).await?;
        assert_eq!(got, why, "{policy}: reason");
        let phase = node.phase(&info.id);
        assert_eq!(phase.is_some(), held, "{policy} -> {state}: node holds it");
        if held {
            assert_eq!(phase, Some(Phase::Held), "{policy}: frozen while held");
        }
    }
    Ok(())
}

#[tokio::test]
async fn a_held_sandbox_goes_when_its_hold_ends() -> TestResult {
    let node = node(4);
    let p = plane(&node).await?;
    for (policy, end) in [
        ("keep", reason::KEEP_EXPIRED),
        ("delay", reason::MAIN_EXITED),
    ] {
        let (info, _) = p
            .control
            .create(&OP, spec(serde_json::json!({"reclaim": policy})), true)
            .await
            .map_err(|e| e.message)?;
        node.push(exited(&info.id, 0, None, false));
        let held = if policy == "keep" {
            SandboxState::Kept
        } else {
            SandboxState::Stopping
        };
        settles(&p.control, &info.id, held).await?;
        node.push(NodeEvent::Expired {
            id: info.id.clone(),
            reason: reason::TTL_EXPIRED.into(),
        });
        assert_eq!(
            settles(&p.control, &info.id, SandboxState::Destroyed).await?,
            end
        );
        assert_eq!(node.phase(&info.id), None);
    }
    // Capacity came back: four more fit at once.
    for _ in 0..4 {
        let (info, _) = p
            .control
            .create(&OP, spec(serde_json::json!({})), false)
            .await
            .map_err(|e| e.message)?;
        assert_eq!(info.state, SandboxState::Running);
    }
    Ok(())
}

#[tokio::test]
async fn the_queue_is_first_in_first_out_and_frees_on_destroy() -> TestResult {
    let node = node(2);
    let p = plane(&node).await?;
    let c = &p.control;
    let mut ids = Vec::new();
    for i in 0..5 {
        let (info, _) = c
            .create(&OP, spec(serde_json::json!({})), false)
            .await
            .map_err(|e| e.message)?;
        let expected = if i < 2 {
            SandboxState::Running
        } else {
            SandboxState::Queued
        };
        assert_eq!(info.state, expected, "create {i}");
        if i >= 2 {
            assert_eq!(info.queue_position, Some(i - 1), "create {i}");
        }
        ids.push(info.id);
    }
    // A queued create deleted never reaches the node.
    c.destroy(&ids[3], reason::USER_DELETED)
        .await
        .map_err(|e| e.message)?;
    assert!(!node.calls().contains(&format!("create {}", ids[3])));
    c.destroy(&ids[0], reason::USER_DELETED)
        .await
        .map_err(|e| e.message)?;
    settles(c, &ids[2], SandboxState::Running).await?;
    assert_eq!(
        c.records().get(&ids[4]).await.map_err(|e| e.message)?.state,
        SandboxState::Queued
    );
    c.destroy(&ids[1], reason::USER_DELETED)
        .await
        .map_err(|e| e.message)?;
    settles(c, &ids[4], SandboxState::Running).await?;
    let creates: Vec<String> = node
        .calls()
        .into_iter()
        .filter(|c| c.starts_with("create "))
        .collect();
    let order: Vec<String> = [0, 1, 2, 4]
        .iter()
        .map(|&i| format!("create {}", ids[i]))
        .collect();
    assert_eq!(creates, order);
    Ok(())
}

#[tokio::test]
async fn a_failed_create_is_recorded_and_gives_its_capacity_back() -> TestResult {
    let node = node(1);
    let p = plane(&node).await?;
    node.fail_next("create", NodeError::invalid("no such user: nobody2"));
    let err = p
        .control
        .create(&OP, spec(serde_json::json!({})), true)
        .await
        .err()
        .ok_or("create should fail")?;
    assert_eq!(err.code, warren_core::ErrorCode::BadRequest);
    assert!(err.message.contains("nobody2"), "{}", err.message);
    let failed = p
        .control
        .records()
        .list(&OP, &[SandboxState::Failed], &Default::default())
        .await
        .map_err(|e| e.message)?;
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].reason, reason::CREATE_FAILED);
    let (info, _) = p
        .control
        .create(&OP, spec(serde_json::json!({})), false)
        .await
        .map_err(|e| e.message)?;
    assert_eq!(info.state, SandboxState::Running, "the slot came back");
    Ok(())
}

#[tokio::test]
async fn a_destroy_racing_a_create_leaves_nothing_behind() -> TestResult {
    let node = node(1);
    let p = plane(&node).await?;
    node.set_create_delay(Duration::from_millis(200));
    let c = p.control.clone();
    let creating =
        tokio::spawn(async move { c.create(&OP, spec(serde_json::json!({})), true).await });
    // The record exists while the node creates.
    let id = loop {
        let rows = p
            .control
            .records()
            .list(&OP, &[], &Default::default())
            .await
            .map_err(|e| e.message)?;
        if let Some(r) = rows.first() {
            break r.id.clone();
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let destroyed = p
        .control
        .destroy(&id, reason::USER_DELETED)
        .await
        .map_err(|e| e.message)?;
    assert_eq!(destroyed.state, SandboxState::Destroyed);
    let _ = creating.await?;
    assert_eq!(
        p.control
            .records()
            .get(&id)
            .await
            .map_err(|e| e.message)?
            .state,
        SandboxState::Destroyed
    );
    assert!(node.ids().is_empty(), "the node holds {:?}", node.ids());
    let (info, _) = p
        .control
        .create(&OP, spec(serde_json::json!({})), false)
        .await
        .map_err(|e| e.message)?;
    assert_eq!(info.state, SandboxState::Running, "the slot came back");
    Ok(())
}

#[tokio::test]
async fn a_restart_reconciles_records_with_what_the_node_holds() -> TestResult {
    let node = node(8);
    let dir = tempfile::tempdir()?;
    let first = plane_in(&node, dir).await?;
    let c = &first.control;
    let (kept_on_node, _) = c
        .create(&OP, spec(serde_json::json!({})), true)
        .await
        .map_err(|e| e.message)?;
    let (gone, _) = c
        .create(&OP, spec(serde_json::json!({})), true)
        .await
        .map_err(|e| e.message)?;
    let (paused, _) = c
        .create(&OP, spec(serde_json::json!({})), true)
        .await
        .map_err(|e| e.message)?;
    c.set_paused(&paused.id, true)
        .await
        .map_err(|e| e.message)?;
    let (kept, _) = c
        .create(&OP, spec(serde_json::json!({"reclaim": "keep"})), true)
        .await
        .map_err(|e| e.message)?;
    node.push(exited(&kept.id, 0, None, false));
    settles(c, &kept.id, SandboxState::Kept).await?;
    // What a crash leaves: the node lost one sandbox, un-paused another
    // (the crash came between its thaw and the record), and holds one the
    // control plane never recorded.
    node.destroy(&gone.id, "crash").await?;
    node.set_paused(&paused.id, false).await?;
    node.hold_sandbox("sbx-unrecorded00", Phase::Running);
    // The same store, a new control plane (as after a restart).
    let store_dir = first.dir;
    drop(first.control);
    let second = plane_in(&node, store_dir).await?;
    let c = &second.control;
    assert_eq!(
        c.records()
            .get(&kept_on_node.id)
            .await
            .map_err(|e| e.message)?
            .state,
        SandboxState::Running
    );
    let lost = c.records().get(&gone.id).await.map_err(|e| e.message)?;
    assert_eq!(
        (lost.state, lost.reason.as_str()),
        (SandboxState::Lost, reason::NODE_LOST)
    );
    assert_eq!(
        c.records()
            .get(&paused.id)
            .await
            .map_err(|e| e.message)?
            .state,
        SandboxState::Paused
    );
    assert_eq!(
        node.phase(&paused.id),
        Some(Phase::Paused),
        "the node follows the record"
    );
    assert_eq!(
        c.records()
            .get(&kept.id)
            .await
            .map_err(|e| e.message)?
            .state,
        SandboxState::Kept
    );
    assert_eq!(
        node.phase("sbx-unrecorded00"),
        None,
        "unrecorded sandbox destroyed"
    );
    // Capacity: three held (running, paused, kept) of eight.
    assert_eq!(c.node_set().usage()[0].used.slots, 3);
    Ok(())
}

#[tokio::test]
async fn a_clean_stop_of_a_cluster_control_plane_leaves_the_nodes_alone() -> TestResult {
    let node = node(2);
    let p = plane_with(&node, tempfile::tempdir()?, false).await?;
    let c = &p.control;
    let (s, _) = c
        .create(&OP, spec(serde_json::json!({})), true)
        .await
        .map_err(|e| e.message)?;
    c.shutdown(Duration::from_secs(1)).await;
    assert_eq!(node.phase(&s.id), Some(Phase::Running));
    assert_eq!(
        c.records().get(&s.id).await.map_err(|e| e.message)?.state,
        SandboxState::Running
    );
    Ok(())
}

#[tokio::test]
async fn a_fork_makes_all_its_children_or_none() -> TestResult {
    use warren_core::spec::{ForkRequest, FORK_LABEL};
    let node = node(4);
    let p = plane(&node).await?;
    let c = &p.control;
    let (source, _) = c
        .create(
            &OP,
            spec(serde_json::json!({"labels": {"task": "t"}})),
            true,
        )
        .await
        .map_err(|e| e.message)?;
    let fork = |count| ForkRequest {
        count,
        labels: [("run".to_string(), "2".to_string())].into(),
        ..Default::default()
    };
    let children = c.fork(&source.id, fork(2)).await.map_err(|e| e.message)?;
    assert_eq!(children.len(), 2);
    let calls = node.calls();
    let layer = children[0].spec.fork.as_ref().map(|f| f.layers.clone());
    for child in &children {
        assert_eq!(child.state, SandboxState::Running);
        assert_eq!(child.spec.labels[FORK_LABEL], source.id);
        assert_eq!(child.spec.labels["task"], "t");
        assert_eq!(child.spec.labels["run"], "2");
        assert_eq!(child.spec.fork.as_ref().map(|f| f.layers.clone()), layer);
        assert_eq!(node.phase(&child.id), Some(Phase::Running));
        assert_eq!(
            c.records()
                .get(&child.id)
                .await
                .map_err(|e| e.message)?
                .reason,
            "ready"
        );
        let first = c
            .records()
            .events(Some(&child.id), 0, 10)
            .await
            .map_err(|e| e.message)?;
        assert_eq!(first[0].reason, reason::FORKED);
    }
    let top = layer.and_then(|l| l.first().cloned()).unwrap_or_default();
    let at = |call: &str| calls.iter().position(|c| c == call);
    assert!(
        at(&format!("fork_layer {}", source.id)) < at(&format!("create {}", children[0].id)),
        "{calls:?}"
    );
    assert!(
        at(&format!("create {}", children[1].id)) < at(&format!("release_fork_layer {top}")),
        "{calls:?}"
    );
    let noted = c
        .records()
        .events(Some(&source.id), 0, 100)
        .await
        .map_err(|e| e.message)?;
    assert!(noted
        .iter()
        .any(|e| e.reason == reason::FORKED && e.message.contains(&children[1].id)));

    // Bad input changes nothing.
    let before = (node.calls().len(), c.node_set().usage()[0].used.slots);
    for (count, code) in [(0, 400), (257, 400)] {
        let e = c.fork(&source.id, fork(count)).await.unwrap_err();
        assert_eq!(e.code.http_status(), code, "{}", e.message);
    }
    let e = c.fork("sbx-nosuchsandbx", fork(1)).await.unwrap_err();
    assert_eq!(e.code.http_status(), 404);
    // More children than there is room and queue for: refused whole.
    let e = c.fork(&source.id, fork(40)).await.unwrap_err();
    assert_eq!(e.code.http_status(), 429, "{}", e.message);
    let mut forged = spec(serde_json::json!({}));
    forged.fork = children[0].spec.fork.clone();
    let e = c.create(&OP, forged, true).await.unwrap_err();
    assert_eq!(e.code.http_status(), 400, "{}", e.message);
    assert_eq!(
        before,
        (node.calls().len(), c.node_set().usage()[0].used.slots)
    );

    // A child that cannot be made takes its siblings with it.
    node.fail_next("create", NodeError::internal("disk on fire"));
    let e = c.fork(&source.id, fork(1)).await.unwrap_err();
    assert!(e.message.contains("disk on fire"), "{}", e.message);
    assert_eq!(c.node_set().usage()[0].used.slots, 3);
    assert!(
        node.calls()
            .iter()
            .filter(|c| c.starts_with("release_fork_layer"))
            .count()
            == 2
    );

    // Only a running or paused sandbox forks.
    c.set_paused(&source.id, true)
        .await
        .map_err(|e| e.message)?;
    let more = c.fork(&source.id, fork(1)).await.map_err(|e| e.message)?;
    c.destroy(&more[0].id, reason::USER_DELETED)
        .await
        .map_err(|e| e.message)?;
    c.destroy(&source.id, reason::USER_DELETED)
        .await
        .map_err(|e| e.message)?;
    let e = c.fork(&source.id, fork(1)).await.unwrap_err();
    assert_eq!(e.code.http_status(), 409, "{}", e.message);
    // The children live on without their source.
    assert_eq!(node.phase(&children[0].id), Some(Phase::Running));
    Ok(())
}

#[tokio::test]
async fn a_fork_child_that_waits_for_room_is_made_when_room_frees() -> TestResult {
    use warren_core::spec::ForkRequest;
    let node = node(3);
    let p = plane(&node).await?;
    let c = p.control.clone();
    let (source, _) = c
        .create(&OP, spec(serde_json::json!({})), true)
        .await
        .map_err(|e| e.message)?;
    let (other, _) = c
        .create(&OP, spec(serde_json::json!({})), true)
        .await
        .map_err(|e| e.message)?;
    let req = ForkRequest {
        count: 2,
        ..Default::default()
    };
    let forking = {
        let c = c.clone();
        let id = source.id.clone();
        tokio::spawn(async move { c.fork(&id, req).await })
    };
    // One child fits now; the other waits in the queue, recorded as queued.
    let queued = async {
        loop {
            let rows = c
                .records()
                .list(&OP, &[SandboxState::Queued], &Default::default())
                .await
                .map_err(|e| e.message)?;
            if let Some(q) = rows.first() {
                return Ok::<_, String>(q.id.clone());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    let waiting = tokio::time::timeout(Duration::from_secs(5), queued).await??;
    assert!(!forking.is_finished());
    c.destroy(&other.id, reason::USER_DELETED)
        .await
        .map_err(|e| e.message)?;
    let children = forking.await?.map_err(|e| e.message)?;
    assert_eq!(children.len(), 2);
    assert!(children.iter().any(|ch| ch.id == waiting));
    for ch in &children {
        assert_eq!(node.phase(&ch.id), Some(Phase::Running));
    }
    Ok(())
}

#[tokio::test]
async fn a_class_goes_where_it_is_offered_and_is_recorded() -> TestResult {
    use warren_core::Isolation::{Container, Gvisor};
    let node = node(2);
    let p = plane(&node).await?;
    let c = &p.control;
    // The node runs containers alone: gvisor is refused at once, nothing
    // is recorded and the node is not asked.
    let e = c
        .create(&OP, spec(serde_json::json!({"isolation": "gvisor"})), true)
        .await
        .unwrap_err();
    assert_eq!(e.code, warren_core::ErrorCode::NoCapacity, "{}", e.message);
    assert!(
        e.message
            .starts_with("no node offers isolation class gvisor (")
            && e.message.contains("runsc"),
        "{}",
        e.message
    );
    assert!(c
        .records()
        .list(&OP, &[], &Default::default())
        .await
        .map_err(|e| e.message)?
        .is_empty());
    assert!(!node.calls().iter().any(|c| c.starts_with("create ")));
    // A create that names none runs in the node's default, and says so.
    let (plain, _) = c
        .create(&OP, spec(serde_json::json!({})), true)
        .await
        .map_err(|e| e.message)?;
    assert_eq!(plain.spec.isolation, Some(Container));
    let told = node.spec_of(&plain.id).map(|s| s.isolation);
    assert_eq!(told, Some(Some(Container)));
    let recorded = c.records().get(&plain.id).await.map_err(|e| e.message)?;
    assert_eq!(recorded.spec.isolation, Some(Container));
    // The node offers gvisor as its default now.
    node.set_isolation(vec![Gvisor, Container]);
    assert!(p.control.heartbeat("fake", node.info().await?));
    let (g, _) = c
        .create(&OP, spec(serde_json::json!({})), true)
        .await
        .map_err(|e| e.message)?;
    assert_eq!(g.spec.isolation, Some(Gvisor));
    // Full: a create that names none waits with no class yet, and gets its
    // node's default when its turn comes.
    let (queued, _) = c
        .create(&OP, spec(serde_json::json!({})), false)
        .await
        .map_err(|e| e.message)?;
    assert_eq!(
        (queued.state, queued.spec.isolation),
        (SandboxState::Queued, None)
    );
    c.destroy(&plain.id, reason::USER_DELETED)
        .await
        .map_err(|e| e.message)?;
    settles(c, &queued.id, SandboxState::Running).await?;
    let row = c.records().get(&queued.id).await.map_err(|e| e.message)?;
    assert_eq!(row.spec.isolation, Some(Gvisor));
    assert_eq!(
        node.spec_of(&queued.id).and_then(|s| s.isolation),
        Some(Gvisor)
    );
    // A class named is kept as named.
    c.destroy(&g.id, reason::USER_DELETED)
        .await
        .map_err(|e| e.message)?;
    let (named, _) = c
        .create(
            &OP,
            spec(serde_json::json!({"isolation": "container"})),
            true,
        )
        .await
        .map_err(|e| e.message)?;
    assert_eq!(named.spec.isolation, Some(Container));
    Ok(())
}

#[tokio::test]
async fn fork_children_keep_their_sources_class() -> TestResult {
    use warren_core::spec::ForkRequest;
    use warren_core::Isolation::{Container, Gvisor};
    let node = node(4);
    node.set_isolation(vec![Container, Gvisor]);
    let p = plane(&node).await?;
    let c = &p.control;
    let (source, _) = c
        .create(&OP, spec(serde_json::json!({"isolation": "gvisor"})), true)
        .await
        .map_err(|e| e.message)?;
    let req = ForkRequest {
        count: 2,
        ..Default::default()
    };
    let children = c
        .fork(&source.id, req.clone())
        .await
        .map_err(|e| e.message)?;
    for child in &children {
        assert_eq!(child.spec.isolation, Some(Gvisor));
        assert_eq!(
            node.spec_of(&child.id).and_then(|s| s.isolation),
            Some(Gvisor)
        );
    }
    // Its node gave up gvisor (restarted without runsc): the children
    // could go nowhere else, so the fork is refused, and nothing is made.
    node.set_isolation(vec![Container]);
    assert!(p.control.heartbeat("fake", node.info().await?));
    let before = node.calls().len();
    let e = c.fork(&source.id, req).await.unwrap_err();
    assert!(
        e.message
            .starts_with("no node named fake offers isolation class gvisor"),
        "{}",
        e.message
    );
    assert_eq!(node.calls().len(), before);
    Ok(())
}

#[tokio::test]
async fn a_create_queued_across_a_restart_gets_its_nodes_class() -> TestResult {
    use warren_core::Isolation::Gvisor;
    let node = node(1);
    let first = plane_with(&node, tempfile::tempdir()?, false).await?;
    let c = &first.control;
    let (running, _) = c
        .create(&OP, spec(serde_json::json!({})), true)
        .await
        .map_err(|e| e.message)?;
    let (queued, _) = c
        .create(&OP, spec(serde_json::json!({})), false)
        .await
        .map_err(|e| e.message)?;
    assert_eq!(queued.state, SandboxState::Queued);
    c.shutdown(Duration::from_secs(1)).await;
    // The node comes back offering gvisor first.
    node.set_isolation(vec![Gvisor]);
    let second = plane_in(&node, first.dir).await?;
    let c = &second.control;
    c.destroy(&running.id, reason::USER_DELETED)
        .await
        .map_err(|e| e.message)?;
    settles(c, &queued.id, SandboxState::Running).await?;
    let row = c.records().get(&queued.id).await.map_err(|e| e.message)?;
    assert_eq!(row.spec.isolation, Some(Gvisor));
    assert_eq!(
        node.spec_of(&queued.id).and_then(|s| s.isolation),
        Some(Gvisor)
    );
    Ok(())
}

#[tokio::test]
async fn a_batch_of_a_class_no_node_offers_is_refused_whole() -> TestResult {
    let node = node(2);
    let p = plane(&node).await?;
    let c = &p.control;
    let req: warren_core::BatchRequest = serde_json::from_value(serde_json::json!({
        "count": 3,
        "spec": {"image": "img", "cpu": 1, "memory": "1G", "isolation": "gvisor"},
    }))?;
    let e = c.create_batch(&OP, req).await.unwrap_err();
    assert_eq!(e.code, warren_core::ErrorCode::NoCapacity, "{}", e.message);
    assert!(
        e.message.contains("no node offers isolation class gvisor"),
        "{}",
        e.message
    );
    assert!(c
        .batches()
        .list(&OP)
        .await
        .map_err(|e| e.message)?
        .is_empty());
    assert!(!node.calls().iter().any(|c| c.starts_with("create ")));
    // A class the node runs: every member is made in it.
    node.set_isolation(vec![warren_core::Isolation::Gvisor]);
    assert!(p.control.heartbeat("fake", node.info().await?));
    let req: warren_core::BatchRequest = serde_json::from_value(serde_json::json!({
        "count": 2,
        "spec": {"image": "img", "cpu": 1, "memory": "1G", "isolation": "gvisor"},
    }))?;
    let batch = c.create_batch(&OP, req).await.map_err(|e| e.message)?;
    let selector =
        warren_core::Selector::parse(&format!("{}={}", warren_core::batch::BATCH_LABEL, batch.id))?;
    for _ in 0..200 {
        let members = c
            .records()
            .list(&OP, &[SandboxState::Running], &selector)
            .await
            .map_err(|e| e.message)?;
        if members.len() == 2 {
            for m in members {
                assert_eq!(m.spec.isolation, Some(warren_core::Isolation::Gvisor));
            }
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Err("the batch's members did not start".into())
}

#[tokio::test]
async fn a_pool_of_a_class_no_node_offers_is_refused() -> TestResult {
    let node = node(2);
    let p = plane(&node).await?;
    let c = &p.control;
    let spec: warren_core::pool::PoolSpec = serde_json::from_value(serde_json::json!({
        "image": "img", "memory": "1G", "isolation": "gvisor", "size": 1,
    }))?;
    let e = c.set_pool(&OP, "g", spec).await.unwrap_err();
    assert_eq!(e.code, warren_core::ErrorCode::NoCapacity, "{}", e.message);
    assert!(
        e.message.contains("no node offers isolation class gvisor"),
        "{}",
        e.message
    );
    assert!(c.pools().infos().is_empty());
    Ok(())
}

/// The fleet over a window sums every page the store gives (more than one
/// of each walk), counts what ended in the window and what has not ended,
/// and leaves out what ended before it.
#[tokio::test]
async fn the_fleet_sums_every_page_of_its_window() -> TestResult {
    use warren_control::store::{SandboxRow, Store, Transition};
    let dir = tempfile::tempdir()?;
    let store = Arc::new(SqliteStore::open(&dir.path().join("warren.db")).await?);
    let control = Control::new(store.clone(), Options::default());
    let resources = warren_core::ResolvedResources {
        cpu_millis: 1000,
        memory: 1 << 30,
        pids: 128,
        disk: 0,
        gpus: 0,
        cpu_request_millis: Some(100),
        memory_request: Some(64 << 20),
    };
    let record = |id: &str, task: Option<&str>, state| {
        let labels = match task {
            Some(t) => serde_json::json!({ "task": t }),
            None => serde_json::json!({}),
        };
        let s = spec(serde_json::json!({ "labels": labels }));
        SandboxRow::new(
            id,
            s,
            resources.clone(),
            String::new(),
            "sha256:x".into(),
            state,
        )
    };
    // 1,100 waiting (two pages of the walk of those not ended).
    for i in 0..1100 {
        let task = if i % 11 == 0 { None } else { Some("a") };
        store
            .insert(
                &record(&format!("sbx-q{i:05}"), task, SandboxState::Queued),
                None,
            )
            .await?;
    }
    // 1,050 ended just now (two pages of the walk by end time): every
    // third with exit code 3, and one that ended two hours ago.
    let now = warren_core::clock::now_rfc3339();
    let ended = |id: String, task, code, at: String| {
        let (store, row) = (store.clone(), record(&id, task, SandboxState::Running));
        async move {
            store.insert(&row, None).await?;
            let t = Transition {
                finished_at: Some(&at),
                exit_code: Some(code),
                ..Default::default()
            };
            store
                .transition(&id, SandboxState::Destroyed, reason::MAIN_EXITED, &at, t)
                .await
        }
    };
    for i in 0..1050 {
        let code = if i % 3 == 0 { 3 } else { 0 };
        ended(format!("sbx-e{i:05}"), Some("b"), code, now.clone()).await?;
    }
    ended(
        "sbx-old".into(),
        Some("b"),
        0,
        "2000-01-01T00:00:00Z".into(),
    )
    .await?;
    let f = control
        .records()
        .fleet(&OP, "task", "1h")
        .await
        .map_err(|e| e.message)?;
    let b = f
        .groups
        .iter()
        .find(|g| g.value.as_deref() == Some("b"))
        .ok_or("no row b")?;
    assert_eq!((b.sandboxes, b.ended, b.succeeded), (1050, 1050, 700));
    assert_eq!(b.counts.get("failed"), Some(&350));
    assert_eq!(b.success_rate, Some(700.0 / 1050.0));
    let a = f
        .groups
        .iter()
        .find(|g| g.value.as_deref() == Some("a"))
        .ok_or("no row a")?;
    assert_eq!(a.counts.get("queued"), Some(&1000));
    assert_eq!(f.unlabelled.counts.get("queued"), Some(&100));
    assert_eq!(f.total.sandboxes, 2150);
    // The longest window still ends short of 2000; a longer one is refused.
    let all = control
        .records()
        .fleet(&OP, "task", "30d")
        .await
        .map_err(|e| e.message)?;
    assert_eq!(all.total.sandboxes, 2150);
    let bad = control
        .records()
        .fleet(&OP, "task", "40d")
        .await
        .err()
        .ok_or("40d accepted")?;
    assert_eq!(bad.code, warren_core::ErrorCode::BadRequest);
    Ok(())
}

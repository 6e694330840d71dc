//! Admission between tenants, by behaviour: quotas, fair share, borrowing,
//! preemption, priority and the per-tenant queue bound.

use warren_core::tenant::{Quota, TenantSpec, Weight};
use warren_core::units::Cpu;

use super::*;

fn name(t: &str) -> TenantName {
    t.parse().expect("a valid tenant name")
}

/// One sandbox of `cpu` millicores for tenant `t`.
fn of(t: &str, cpu: u64, priority: i32) -> Request {
    super::tests::req(cpu).for_tenant(name(t), priority)
}

fn spec(weight: u32, preempt: bool) -> TenantSpec {
    TenantSpec {
        weight: Weight::try_from(weight).expect("a valid weight"),
        preempt,
        ..TenantSpec::default()
    }
}

/// A node of `cpu` millicores (memory and slots to spare).
fn node(a: &Admission, n: &str, cpu: u64) {
    a.set_node(
        n,
        Need {
            cpu_millis: cpu,
            memory: 1 << 40,
            slots: 1000,
            gpus: 0,
        },
        u32::MAX,
        Labels::new(),
        &[],
    );
    a.set_schedulable(n, true);
}

fn now(a: &Admission, id: &str, r: Request) {
    assert!(
        matches!(a.admit(id, r), Ok(Admit::Now(_))),
        "{id} should start at once"
    );
}

fn queued(a: &Admission, id: &str, r: Request) -> oneshot::Receiver<String> {
    match a.admit(id, r) {
        Ok(Admit::Queued { ready, .. }) => ready,
        Ok(Admit::Now(_)) => panic!("{id} should wait, but started"),
        Err(e) => panic!("{id} should wait: {e}"),
    }
}

fn running(a: &Admission, t: &str) -> u32 {
    a.tenant_usage(&name(t)).0.sandboxes
}

#[test]
fn a_create_over_its_tenants_quota_waits_even_with_room() {
    let a = Admission::new(10);
    node(&a, "n", 8000);
    let quota = Quota {
        cpu: Some(Cpu(1000)),
        ..Quota::default()
    };
    a.set_tenant(
        &name("team-a"),
        &TenantSpec {
            quota,
            ..TenantSpec::default()
        },
    );
    now(&a, "a1", of("team-a", 600, 0));
    let mut a2 = queued(&a, "a2", of("team-a", 600, 0));
    let why = a.waiting_reason("a2").expect("a2 waits");
    assert_eq!(
        why.to_string(),
        "tenant team-a's cpu quota (1 core) is in use"
    );
    // Another tenant is not held up by team-a's quota, nor are pools.
    now(&a, "b1", of("team-b", 600, 0));
    assert!(a.try_admit("pool-1", of("team-b", 100, 0)).is_some());
    assert_eq!(a.tenant_usage(&name("team-a")).1, 1);
    a.release("a1");
    assert_eq!(a2.try_recv().ok().as_deref(), Some("n"));
    assert_eq!(a.tenant_usage(&name("team-a")).0.cpu_millis, 600);
}

#[test]
fn a_create_larger_than_the_quota_is_refused_at_once() {
    let a = Admission::new(10);
    node(&a, "n", 8000);
    let quota = Quota {
        cpu: Some(Cpu(1000)),
        sandboxes: Some(3),
        ..Quota::default()
    };
    a.set_tenant(
        &name("team-a"),
        &TenantSpec {
            quota,
            ..TenantSpec::default()
        },
    );
    let Err(e) = a.admit("a1", of("team-a", 2000, 0)) else {
        panic!("2 cores cannot fit a 1-core quota")
    };
    assert!(matches!(
        &e,
        AdmitError::OverQuota {
            resource: Resource::Cpu,
            ..
        }
    ));
    assert!(e.to_string().contains("tenant team-a's cpu quota (1 core)"));
    assert_eq!(admit_error(e).code, ErrorCode::BadRequest);
    // The sandbox-count quota waits instead: one may end.
    for i in 0..3 {
        now(&a, &format!("s{i}"), of("team-a", 100, 0));
    }
    let _wait = queued(&a, "s3", of("team-a", 100, 0));
    assert!(matches!(
        a.waiting_reason("s3"),
        Some(Waiting::Quota {
            resource: Resource::Sandboxes,
            ..
        })
    ));
}

/// Three tenants of weights 1:1:2 waiting on a full node share what frees
/// 2:2:4.
#[test]
fn freed_room_goes_by_weighted_dominant_share() {
    let a = Admission::new(100);
    node(&a, "n", 8000);
    a.set_tenant(&name("a"), &spec(1, false));
    a.set_tenant(&name("b"), &spec(1, false));
    a.set_tenant(&name("c"), &spec(2, false));
    now(&a, "full", of("z", 8000, 0));
    for i in 0..8 {
        for t in ["a", "b", "c"] {
            drop(queued(&a, &format!("{t}{i}"), of(t, 1000, 0)));
        }
    }
    a.release("full");
    assert_eq!(
        (running(&a, "a"), running(&a, "b"), running(&a, "c")),
        (2, 2, 4)
    );
    assert_eq!(a.queued(), 16);
    // One of c's ends: c is now the lowest, and takes it back.
    a.release("c0");
    assert_eq!(running(&a, "c"), 4);
    let shares: Vec<(String, u32, usize)> = a
        .tenants()
        .into_iter()
        .map(|(n, u, q)| (n.to_string(), u.sandboxes, q))
        .collect();
    assert_eq!(
        shares,
        vec![("a".into(), 2, 6), ("b".into(), 2, 6), ("c".into(), 4, 3)]
    );
}

#[test]
fn a_tenant_alone_borrows_everything_and_gives_it_back_as_it_ends() {
    let a = Admission::new(100);
    node(&a, "n", 8000);
    for i in 0..8 {
        now(&a, &format!("a{i}"), of("a", 1000, 0));
    }
    let _a8 = queued(&a, "a8", of("a", 1000, 0));
    for i in 0..4 {
        drop(queued(&a, &format!("b{i}"), of("b", 1000, 0)));
    }
    // b is below a: it takes each room a frees until they are even.
    for i in 0..4 {
        a.release(&format!("a{i}"));
        assert_eq!(running(&a, "b"), i + 1);
    }
    assert_eq!(running(&a, "a"), 4);
    // Without preempt, nothing of a's was taken.
    assert!(a.preemptions().is_empty());
}

#[test]
fn a_preempting_tenant_takes_its_share_back_from_the_newest_lowest_priority() {
    let a = Admission::new(100);
    node(&a, "n", 8000);
    a.set_tenant(&name("b"), &spec(1, true));
    let signal = a.preemption_signal();
    for i in 0..8 {
        // a7 is the newest but matters more than the rest.
        let priority = if i == 7 { 5 } else { 0 };
        now(&a, &format!("a{i}"), of("a", 1000, priority));
    }
    let mut waits: Vec<_> = (0..5)
        .map(|i| queued(&a, &format!("b{i}"), of("b", 1000, 0)))
        .collect();
    // b's fair share is half: four of a's, not five.
    let mut victims: Vec<Preemption> = a.preemptions();
    victims.sort_by(|x, y| x.id.cmp(&y.id));
    let ids: Vec<&str> = victims.iter().map(|p| p.id.as_str()).collect();
    assert_eq!(ids, ["a3", "a4", "a5", "a6"]);
    assert!(victims
        .iter()
        .all(|p| p.tenant == name("a") && p.for_tenant == name("b")));
    assert!(tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime")
        .block_on(async {
            tokio::time::timeout(std::time::Duration::from_secs(1), signal.notified())
                .await
                .is_ok()
        }));
    assert!(matches!(
        a.waiting_reason("b0"),
        Some(Waiting::Reclaiming { .. })
    ));
    // The room they free is b's: a's own new create does not take it.
    let _a8 = queued(&a, "a8", of("a", 1000, 0));
    for v in &victims {
        a.release(&v.id);
    }
    assert_eq!(running(&a, "b"), 4);
    assert_eq!(running(&a, "a"), 4);
    for w in waits.iter_mut().take(4) {
        assert_eq!(w.try_recv().ok().as_deref(), Some("n"));
    }
    // At its share, b preempts no more: its fifth waits its turn.
    assert!(a.preemptions().is_empty());
    assert_eq!(a.waiting_reason("b4"), Some(Waiting::Room));
}

#[test]
fn within_a_tenant_higher_priority_goes_first() {
    let a = Admission::new(100);
    node(&a, "n", 1000);
    now(&a, "full", of("a", 1000, 0));
    let mut low = queued(&a, "low", of("a", 1000, 0));
    let mut high = queued(&a, "high", of("a", 1000, 3));
    assert_eq!(a.position("high"), Some(1));
    assert_eq!(a.position("low"), Some(2));
    a.release("full");
    assert_eq!(high.try_recv().ok().as_deref(), Some("n"));
    assert!(low.try_recv().is_err());
}

#[test]
fn each_tenants_queue_is_bounded_on_its_own() {
    let a = Admission::new(2);
    node(&a, "n", 1000);
    now(&a, "full", of("a", 1000, 0));
    let _w = [
        queued(&a, "a1", of("a", 100, 0)),
        queued(&a, "a2", of("a", 100, 0)),
    ];
    assert_eq!(
        a.admit("a3", of("a", 100, 0)).err(),
        Some(AdmitError::QueueFull(2))
    );
    let _b = queued(&a, "b1", of("b", 100, 0));
    assert_eq!(a.queued(), 3);
}

/// A big head of the lowest share is not starved by smaller creates of
/// others: the room it waits for is kept for it.
#[test]
fn the_lowest_shares_head_keeps_the_room_it_waits_for() {
    let a = Admission::new(100);
    node(&a, "n", 1000);
    now(&a, "b1", of("b", 500, 0));
    let mut big = queued(&a, "a1", of("a", 800, 0));
    // 300 would fit beside b1, but not beside the room kept for a1.
    let _small = queued(&a, "b2", of("b", 300, 0));
    assert!(a.try_admit("pool", of("c", 100, 0)).is_none());
    a.release("b1");
    assert_eq!(big.try_recv().ok().as_deref(), Some("n"));
    assert_eq!(running(&a, "b"), 0);
}

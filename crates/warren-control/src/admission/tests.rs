//! Admission within one tenant: the FIFO queue, placement and refusals.

use super::*;

/// One sandbox of `cpu` millicores, of the default tenant.
pub(super) fn req(cpu: u64) -> Request {
    Request {
        need: Need {
            cpu_millis: cpu,
            memory: 1,
            slots: 1,
            gpus: 0,
        },
        pids: 8,
        selector: Labels::new(),
        placement: Placement::Spread,
        image: None,
        node: None,
        isolation: None,
        tenant: TenantName::default_tenant(),
        priority: 0,
    }
}

fn one_node(a: &Admission, name: &str, cpu: u64) {
    a.set_node(
        name,
        Need {
            cpu_millis: cpu,
            memory: 100,
            slots: 10,
            gpus: 0,
        },
        u32::MAX,
        Labels::new(),
        &[],
    );
    a.set_schedulable(name, true);
}

#[test]
fn fifo_queue_starts_on_release_and_is_bounded() {
    let a = Admission::new(2);
    one_node(&a, "n", 1000);
    assert!(matches!(a.admit("a", req(600)), Ok(Admit::Now(n)) if n == "n"));
    let Ok(Admit::Queued {
        position: 1,
        ready: mut b,
        ..
    }) = a.admit("b", req(600))
    else {
        panic!("b should queue first")
    };
    // A small request does not overtake the head of the queue.
    let Ok(Admit::Queued {
        position: 2,
        ready: mut c,
        ..
    }) = a.admit("c", req(100))
    else {
        panic!("c should queue second")
    };
    assert_eq!(a.admit("d", req(100)).err(), Some(AdmitError::QueueFull(2)));
    assert!(b.try_recv().is_err());
    a.release("a");
    assert_eq!(b.try_recv().ok().as_deref(), Some("n"));
    assert_eq!(c.try_recv().ok().as_deref(), Some("n"));
    assert_eq!(a.nodes()[0].used.cpu_millis, 700);
    a.release("b");
    a.release("b");
    assert_eq!(a.nodes()[0].used.cpu_millis, 100);
    assert!(matches!(
        a.admit("e", req(5000)),
        Err(AdmitError::NeverFits { .. })
    ));
}

#[test]
fn the_queue_waits_for_any_node_and_starts_where_room_frees() {
    let a = Admission::new(10);
    assert!(matches!(a.admit("x", req(100)), Err(AdmitError::NoNode(_))));
    one_node(&a, "n1", 1000);
    one_node(&a, "n2", 1000);
    // Spread: the second goes to the other node.
    let Ok(Admit::Now(first)) = a.admit("a", req(800)) else {
        panic!("a fits")
    };
    let Ok(Admit::Now(second)) = a.admit("b", req(800)) else {
        panic!("b fits")
    };
    assert_ne!(first, second);
    let Ok(Admit::Queued { mut ready, .. }) = a.admit("c", req(800)) else {
        panic!("c waits")
    };
    // A cordoned node takes nothing, even when it has room.
    a.set_schedulable(&second, false);
    a.release("b");
    assert!(ready.try_recv().is_err());
    a.release("a");
    assert_eq!(ready.try_recv().ok(), Some(first.clone()));
    assert_eq!(a.node_of("c"), Some(first));
}

#[test]
fn a_pinned_request_goes_to_its_node_or_waits_for_it() {
    let a = Admission::new(10);
    one_node(&a, "n1", 1000);
    one_node(&a, "n2", 1000);
    let on = |node: &str, cpu| Request {
        node: Some(node.into()),
        ..req(cpu)
    };
    assert!(matches!(a.admit("a", on("n2", 800)), Ok(Admit::Now(n)) if n == "n2"));
    // n1 has room, but the request is n2's.
    let Ok(Admit::Queued { mut ready, .. }) = a.admit("b", on("n2", 800)) else {
        panic!("b waits for n2")
    };
    a.release("a");
    assert_eq!(ready.try_recv().ok().as_deref(), Some("n2"));
    assert!(
        matches!(a.admit("c", on("gone", 1)), Err(AdmitError::NoNode(m)) if m.contains("gone"))
    );
}

#[test]
fn a_class_waits_only_for_nodes_that_run_it_and_none_is_refused() {
    use Isolation::{Container, Gvisor};
    let a = Admission::new(10);
    let classes = |name: &str, isolation: &[Isolation]| {
        a.set_node(
            name,
            Need {
                cpu_millis: 1000,
                memory: 100,
                slots: 10,
                gpus: 0,
            },
            u32::MAX,
            [("zone".to_string(), name.to_string())].into(),
            isolation,
        );
        a.set_schedulable(name, true);
    };
    let of = |class, cpu| Request {
        isolation: class,
        ..req(cpu)
    };
    // An old node (no list) runs containers alone: gvisor is refused at
    // once, as a selector no node matches, not queued for ever.
    classes("old", &[]);
    let refused = a.admit("g", of(Some(Gvisor), 100)).err();
    assert_eq!(
        refused,
        Some(AdmitError::NoClass {
            class: Gvisor,
            among: String::new()
        })
    );
    let said = admit_error(refused.expect("refused"));
    assert_eq!(said.code, ErrorCode::NoCapacity);
    assert!(
        said.message
            .starts_with("no node offers isolation class gvisor (")
            && said.message.contains("runsc"),
        "{}",
        said.message
    );
    assert!(matches!(a.admit("c", of(Some(Container), 100)), Ok(Admit::Now(n)) if n == "old"));
    // A node that offers gvisor joins: gvisor goes there only, and waits
    // for it when it is full though "old" has room.
    classes("both", &[Container, Gvisor]);
    assert!(matches!(a.admit("g1", of(Some(Gvisor), 900)), Ok(Admit::Now(n)) if n == "both"));
    let Ok(Admit::Queued { mut ready, .. }) = a.admit("g2", of(Some(Gvisor), 900)) else {
        panic!("g2 waits for the gvisor node")
    };
    a.release("c");
    assert!(ready.try_recv().is_err());
    a.release("g1");
    assert_eq!(ready.try_recv().ok().as_deref(), Some("both"));
    // A selector and a class: the error says both.
    let mut zoned = of(Some(Gvisor), 1);
    zoned.selector = [("zone".to_string(), "old".to_string())].into();
    let e = a.admit("z", zoned).err().expect("refused");
    assert!(
        e.to_string()
            .starts_with("no node carrying the labels zone=old offers isolation class gvisor"),
        "{e}"
    );
    // Pinned to a node that does not run it (a fork's child).
    let pinned = Request {
        node: Some("old".into()),
        ..of(Some(Gvisor), 1)
    };
    let e = a.admit("p", pinned).err().expect("refused");
    assert!(e.to_string().starts_with("no node named old offers"), "{e}");
}

//! Which node a sandbox goes to: filter, then score (the seed's rule).
//!
//! A node qualifies when it takes placements (ready, not cordoned), carries
//! every label of the request's node selector, runs the isolation class the
//! request names (if any), and has room for the request after what it
//! already lends. Among those, `spread` takes the node with
//! the most left of the resource the request makes scarcest (the smallest
//! remaining share, after placing, of cpu, memory and sandbox slots), and
//! `pack` the one with the least; ties go to a node that holds the image
//! already (no download), then to fewer sandboxes initialising, then fewer
//! sandboxes, then the name (so a decision is reproducible).

use warren_core::spec::Placement;
use warren_core::{Isolation, Labels};
use warren_node_api::Resources;

/// What placement needs to know of a node.
#[derive(Debug, Clone)]
pub struct Candidate<'a> {
    pub name: &'a str,
    pub labels: &'a Labels,
    pub total: Resources,
    /// `reciprocals(total)`, kept with the node: a division per resource
    /// per node would be most of a decision's cost.
    pub inv_total: [f64; 3],
    pub used: Resources,
    pub max_pids: u32,
    pub schedulable: bool,
    pub initializing: u32,
    pub sandboxes: u32,
    /// Digests of the images it holds.
    pub images: &'a std::collections::HashSet<String>,
    /// The isolation classes it runs, its default first (empty: an old
    /// node, `container` alone).
    pub isolation: &'a [Isolation],
}

/// One request.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub need: Resources,
    pub pids: u32,
    pub selector: &'a Labels,
    pub placement: Placement,
    /// The image's digest, when known (locality breaks ties).
    pub image: Option<&'a str>,
    /// Only this node may take it (a fork's children go to their source's).
    pub node: Option<&'a str>,
    /// Only a node that runs this class may take it (none: any node, in
    /// its default class).
    pub isolation: Option<Isolation>,
}

pub fn fits(need: &Resources, used: &Resources, total: &Resources) -> bool {
    used.cpu_millis + need.cpu_millis <= total.cpu_millis
        && used.memory + need.memory <= total.memory
        && used.slots + need.slots <= total.slots
        && used.gpus + need.gpus <= total.gpus
}

/// Whether the node carries every label the selector asks for.
pub fn selects(selector: &Labels, labels: &Labels) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// Whether the node runs the isolation class the request names (any node
/// runs a request that names none).
pub fn runs(class: Option<Isolation>, offered: &[Isolation]) -> bool {
    class.is_none_or(|c| c.offered_by(offered))
}

/// Whether the node could run the request if it were empty (a request no
/// node can ever hold is refused instead of queued forever).
pub fn could_ever(req: &Request<'_>, c: &Candidate<'_>) -> bool {
    selects(req.selector, c.labels)
        && req.node.is_none_or(|n| n == c.name)
        && runs(req.isolation, c.isolation)
        && req.pids <= c.max_pids
        && fits(&req.need, &Resources::default(), &c.total)
}

/// 1/total per resource (cpu, memory, slots); 0 where the node has none.
pub fn reciprocals(total: &Resources) -> [f64; 3] {
    let inv = |t: u64| if t == 0 { 0.0 } else { 1.0 / t as f64 };
    [
        inv(total.cpu_millis),
        inv(total.memory),
        inv(u64::from(total.slots)),
    ]
}

/// The smallest share left, after placing (the request fits), of what
/// the request asks for.
fn scarcest_share_left(need: &Resources, c: &Candidate<'_>) -> f64 {
    let (used, total) = (&c.used, &c.total);
    let mut left: f64 = 1.0;
    if need.cpu_millis > 0 {
        let rest = total.cpu_millis - used.cpu_millis - need.cpu_millis;
        left = left.min(rest as f64 * c.inv_total[0]);
    }
    if need.memory > 0 {
        let rest = total.memory - used.memory - need.memory;
        left = left.min(rest as f64 * c.inv_total[1]);
    }
    if need.slots > 0 {
        let rest = total.slots - used.slots - need.slots;
        left = left.min(f64::from(rest) * c.inv_total[2]);
    }
    // Only GPU requests pay for this division (`fits` has checked room).
    if need.gpus > 0 {
        let rest = total.gpus - used.gpus - need.gpus;
        left = left.min(f64::from(rest) / f64::from(total.gpus));
    }
    left
}

/// The node the request goes to now, if any has room. One pass over the
/// candidates with no allocation: this loop is the scheduler's cost
/// (`warren bench-placement`).
pub fn choose<'a, I>(req: &Request<'_>, candidates: I) -> Option<&'a str>
where
    I: IntoIterator<Item = Candidate<'a>>,
{
    struct Best<'a> {
        score: f64,
        initializing: u32,
        sandboxes: u32,
        name: &'a str,
        images: &'a std::collections::HashSet<String>,
    }
    // Looked at only on a tie, so the common pass stays a few compares.
    let holds =
        |images: &std::collections::HashSet<String>| req.image.is_some_and(|d| images.contains(d));
    let mut best: Option<Best<'a>> = None;
    let any_label = !req.selector.is_empty();
    for c in candidates {
        if !c.schedulable
            || req.pids > c.max_pids
            || !fits(&req.need, &c.used, &c.total)
            || (any_label && !selects(req.selector, c.labels))
            || req.node.is_some_and(|n| n != c.name)
            || !runs(req.isolation, c.isolation)
        {
            continue;
        }
        let left = scarcest_share_left(&req.need, &c);
        let score = match req.placement {
            Placement::Spread => left,
            Placement::Pack => -left,
        };
        let better = match &best {
            None => true,
            Some(b) if score != b.score => score > b.score,
            Some(b) => {
                (!holds(c.images), c.initializing, c.sandboxes, c.name)
                    < (!holds(b.images), b.initializing, b.sandboxes, b.name)
            }
        };
        if better {
            best = Some(Best {
                score,
                initializing: c.initializing,
                sandboxes: c.sandboxes,
                name: c.name,
                images: c.images,
            });
        }
    }
    best.map(|b| b.name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(cpu: u64, mem: u64, slots: u32) -> Resources {
        Resources {
            cpu_millis: cpu,
            memory: mem,
            slots,
            gpus: 0,
        }
    }

    struct N {
        name: &'static str,
        labels: Labels,
        total: Resources,
        used: Resources,
        schedulable: bool,
        initializing: u32,
        images: std::collections::HashSet<String>,
        isolation: Vec<Isolation>,
    }

    fn n(name: &'static str, total: Resources, used: Resources) -> N {
        N {
            name,
            labels: Labels::new(),
            total,
            used,
            schedulable: true,
            initializing: 0,
            images: Default::default(),
            isolation: Vec::new(),
        }
    }

    fn pick<'a>(req: &Request<'_>, nodes: &'a [N]) -> Option<&'a str> {
        choose(
            req,
            nodes.iter().map(|n| Candidate {
                schedulable: n.schedulable,
                initializing: n.initializing,
                sandboxes: n.used.slots,
                ..candidate(n)
            }),
        )
    }

    #[test]
    fn placement_decisions() {
        let none = Labels::new();
        let gpu: Labels = [("gpu".to_string(), "h200".to_string())].into();
        let req = |cpu, mem, placement| Request {
            need: res(cpu, mem, 1),
            pids: 64,
            selector: &none,
            placement,
            image: Some("sha256:img"),
            node: None,
            isolation: None,
        };
        let spread = Placement::Spread;
        let pack = Placement::Pack;
        // (what, request, nodes, expected)
        let cases: Vec<(&str, Request<'_>, Vec<N>, Option<&str>)> = vec![
            (
                "the most remaining share of the scarcest resource wins",
                req(1000, 1 << 30, spread),
                vec![
                    // a: cpu plentiful, memory nearly gone → memory decides
                    n("a", res(8000, 4 << 30, 100), res(0, 3 << 30, 3)),
                    n("b", res(4000, 4 << 30, 100), res(2000, 1 << 30, 1)),
                ],
                Some("b"),
            ),
            (
                "pack takes the fullest node that still fits",
                req(1000, 1 << 30, pack),
                vec![
                    n("a", res(8000, 8 << 30, 100), res(0, 0, 0)),
                    n("b", res(8000, 8 << 30, 100), res(6000, 6 << 30, 6)),
                ],
                Some("b"),
            ),
            (
                "a node without room is filtered out",
                req(3000, 1 << 30, pack),
                vec![
                    n("a", res(8000, 8 << 30, 100), res(0, 0, 0)),
                    n("b", res(8000, 8 << 30, 100), res(6000, 6 << 30, 6)),
                ],
                Some("a"),
            ),
            (
                "nothing fits anywhere",
                req(9000, 1 << 30, spread),
                vec![n("a", res(8000, 8 << 30, 100), res(0, 0, 0))],
                None,
            ),
            (
                "slots count as a resource",
                req(1, 1, spread),
                vec![n("a", res(8000, 8 << 30, 2), res(0, 0, 2))],
                None,
            ),
            (
                "an unschedulable (cordoned or unreachable) node takes nothing",
                req(1000, 1 << 20, spread),
                vec![
                    N {
                        schedulable: false,
                        ..n("a", res(8000, 8 << 30, 100), res(0, 0, 0))
                    },
                    n("b", res(8000, 8 << 30, 100), res(7000, 0, 7)),
                ],
                Some("b"),
            ),
            (
                "ties go first to a node that holds the image",
                req(1000, 1 << 20, spread),
                vec![
                    N {
                        initializing: 2,
                        images: ["sha256:img".to_string()].into(),
                        ..n("c", res(8000, 8 << 30, 100), res(0, 0, 0))
                    },
                    n("a", res(8000, 8 << 30, 100), res(0, 0, 0)),
                ],
                Some("c"),
            ),
            (
                "ties go to fewer initialising, then the name",
                req(1000, 1 << 20, spread),
                vec![
                    N {
                        initializing: 2,
                        ..n("a", res(8000, 8 << 30, 100), res(0, 0, 0))
                    },
                    n("c", res(8000, 8 << 30, 100), res(0, 0, 0)),
                    n("b", res(8000, 8 << 30, 100), res(0, 0, 0)),
                ],
                Some("b"),
            ),
        ];
        for (what, req, nodes, want) in &cases {
            assert_eq!(pick(req, nodes), *want, "{what}");
        }
        // GPUs: a node without enough free ones is filtered out; pack
        // fills the GPU node already in use, spread the emptier one.
        let gpus = |total: u32, used: u32, name: &'static str| N {
            total: Resources {
                gpus: total,
                ..res(8000, 8 << 30, 100)
            },
            used: Resources {
                gpus: used,
                ..res(0, 0, used)
            },
            ..n(name, res(0, 0, 0), res(0, 0, 0))
        };
        let want_gpus = |count: u32, placement| Request {
            need: Resources {
                gpus: count,
                ..res(100, 1 << 20, 1)
            },
            ..req(100, 1 << 20, placement)
        };
        let gpu_nodes = vec![
            gpus(0, 0, "cpu-only"),
            gpus(8, 6, "busy"),
            gpus(8, 1, "idle"),
        ];
        assert_eq!(pick(&want_gpus(2, spread), &gpu_nodes), Some("idle"));
        assert_eq!(pick(&want_gpus(2, pack), &gpu_nodes), Some("busy"));
        assert_eq!(pick(&want_gpus(3, pack), &gpu_nodes), Some("idle"));
        assert_eq!(pick(&want_gpus(8, spread), &gpu_nodes), None);
        assert_eq!(
            pick(&want_gpus(0, spread), &gpu_nodes[..1]),
            Some("cpu-only")
        );
        // The node selector filters by label.
        let mut nodes = vec![
            n("a", res(8000, 8 << 30, 100), res(0, 0, 0)),
            n("b", res(8000, 8 << 30, 100), res(7000, 7 << 30, 7)),
        ];
        nodes[1].labels = gpu.clone();
        let on_gpu = Request {
            selector: &gpu,
            ..req(500, 1 << 20, spread)
        };
        assert_eq!(pick(&on_gpu, &nodes), Some("b"));
        assert!(!could_ever(&on_gpu, &candidate(&nodes[0])));
        assert!(could_ever(&on_gpu, &candidate(&nodes[1])));
    }

    /// A test node as placement sees it: schedulable, idle (`pick` puts
    /// in its state).
    fn candidate(n: &N) -> Candidate<'_> {
        Candidate {
            name: n.name,
            labels: &n.labels,
            total: n.total,
            inv_total: reciprocals(&n.total),
            used: n.used,
            max_pids: 1024,
            schedulable: true,
            initializing: 0,
            sandboxes: 0,
            images: &n.images,
            isolation: &n.isolation,
        }
    }

    #[test]
    fn a_class_goes_only_to_nodes_that_run_it() {
        use Isolation::{Container, Gvisor};
        let none = Labels::new();
        let ask = |isolation| Request {
            need: res(100, 1 << 20, 1),
            pids: 64,
            selector: &none,
            placement: Placement::Spread,
            image: None,
            node: None,
            isolation,
        };
        // "old" lists no class (container alone); "both" is the emptiest.
        let with = |name, isolation: Vec<Isolation>, used| N {
            isolation,
            ..n(name, res(8000, 8 << 30, 100), res(used, 0, 0))
        };
        let nodes = vec![
            with("old", vec![], 4000),
            with("both", vec![Gvisor, Container], 0),
            with("plain", vec![Container], 2000),
        ];
        assert_eq!(pick(&ask(Some(Gvisor)), &nodes), Some("both"));
        assert_eq!(pick(&ask(None), &nodes), Some("both"));
        assert_eq!(pick(&ask(Some(Container)), &nodes), Some("both"));
        // Without "both", gvisor fits nowhere, and never could.
        let rest = &nodes[..1];
        assert_eq!(pick(&ask(Some(Gvisor)), rest), None);
        assert_eq!(pick(&ask(Some(Container)), rest), Some("old"));
        assert!(!could_ever(&ask(Some(Gvisor)), &candidate(&nodes[0])));
        assert!(could_ever(&ask(Some(Gvisor)), &candidate(&nodes[1])));
        assert!(could_ever(&ask(None), &candidate(&nodes[0])));
        // A gvisor-only node takes no create that asks for containers.
        let only = with("only", vec![Gvisor], 0);
        assert!(!could_ever(&ask(Some(Container)), &candidate(&only)));
        assert!(could_ever(&ask(None), &candidate(&only)));
    }
}

"""The per-phase breakdown of a create on /metrics
(warren_create_phase_seconds{phase=...}), which `warren-bench lifecycle` reports."""

import time

from prometheus_client.parser import text_string_to_metric_families

PHASES = ("image_resolve", "admission", "store_insert", "node_create", "answer")
# Measured on the node, inside node_create, and carried on its answer.
NODE_PHASES = ("node_image", "node_layers", "node_slot_wait", "runtime_prepare",
               "runtime_spawn", "node_network", "node_register")
# Measured in the spawner process, inside runtime_spawn.
# (Unmounting the root from the spawner's namespace happens after its
# answer, outside any create.)
SPAWNER_PHASES = ("spawn_mounts", "spawn_build", "spawn_loopback", "spawn_start")


def phase_totals(warren):
    totals = {}
    text = warren.http.get("/metrics").text
    for family in text_string_to_metric_families(text):
        if family.name != "warren_create_phase_seconds":
            continue
        for s in family.samples:
            phase = s.labels.get("phase")
            t = totals.setdefault(phase, [0.0, 0.0])
            if s.name.endswith("_sum"):
                t[0] = s.value
            elif s.name.endswith("_count"):
                t[1] = s.value
    return totals


def test_create_phases_are_on_metrics_and_fit_the_create(warren):
    before = phase_totals(warren)
    n = 3
    wall = 0.0
    for _ in range(n):
        t = time.monotonic()
        s = warren.create()
        wall += time.monotonic() - t
        warren.destroy(s["id"])
    after = phase_totals(warren)
    means = {}
    for phase in PHASES + NODE_PHASES + SPAWNER_PHASES:
        assert phase in after, (phase, sorted(after))
        s1, c1 = after[phase]
        s0, c0 = before.get(phase, (0.0, 0.0))
        assert c1 - c0 >= n, (phase, before, after)
        # node_network is no work at all without an allowlist.
        if phase not in ("node_network", "spawn_loopback"):
            assert s1 - s0 > 0, (phase, before, after)
        means[phase] = (s1 - s0) / (c1 - c0)
    # The phases run one after another (store_insert beside node_create),
    # so their means cannot add up to more than a create as its client saw it.
    serial = sum(means[k] for k in PHASES if k != "store_insert")
    assert serial <= wall / n, (means, wall / n)
    on_node = sum(means[k] for k in NODE_PHASES)
    assert on_node <= means["node_create"] * 1.01 + 1e-4, means
    in_spawner = sum(means[k] for k in SPAWNER_PHASES)
    assert in_spawner <= means["runtime_spawn"] * 1.01 + 1e-4, means

"""Logs and usage kept centrally (issue 44): nodes ship every sandbox's log
lines and usage samples to the control plane, which keeps them in its store,
so `warren logs`, `inspect` and label queries answer after the sandbox's node
is gone, and a restarted control plane goes on where it stopped."""

import json
import re
import shutil
import time

import pytest

from cluster import Cluster, wait_until
from conftest import UP_ARGS

BB = "busybox:latest"

pytestmark = pytest.mark.skipif(bool(UP_ARGS), reason="cluster mode always uses the HTTP transport; run once")

# A main process that prints numbered lines, `per_s` a second, `count` in all.
def printer(count, per_s):
    return ["sh", "-c", f"i=0; while [ $i -lt {count} ]; do i=$((i+1)); echo line-$i; usleep {1_000_000 // per_s}; done; sleep 3600"]


def numbers(text):
    """The line numbers printed, in the order the log shows them."""
    found = []
    for raw in text.splitlines():
        if not raw.strip():
            continue
        line = json.loads(raw)
        for m in re.finditer(r"line-(\d+)", line.get("text") or ""):
            found.append(int(m.group(1)))
    return found


def node_lines(node, sid):
    """The numbers in the node's own copy of the sandbox's log."""
    path = node.home / "logs" / f"{sid}.jsonl"
    return numbers(path.read_text()) if path.exists() else []


def test_logs_and_usage_outlive_a_killed_node(images):
    with Cluster(images, nodes=[dict(name="a")]) as c:
        r = c.server.http.post("/v1/sandboxes", json={
            "image": BB, "cpu": 0.2, "memory": "32M", "labels": {"code": "v3"},
            "cmd": printer(100_000, 50)})
        assert r.status_code in (200, 201), r.text
        sid = r.json()["id"]
        node = c.nodes["a"]
        # Running a while: lines, and a usage sample (its first goes at once).
        wait_until("lines in the node's log", lambda: len(node_lines(node, sid)) >= 100)
        time.sleep(1.0)
        acknowledged = max(node_lines(node, sid))
        time.sleep(1.0)
        node.proc.kill()
        node.proc.wait()
        # The node's own copies are gone with it.
        shutil.rmtree(node.home / "logs")
        shutil.rmtree(node.home / "ship")
        out = c.server.cli("logs", sid, "--json").stdout.decode()
        got = numbers(out)
        assert got[:acknowledged] == list(range(1, acknowledged + 1)), (acknowledged, got[:20])
        assert len(got) == len(set(got)), "no line twice"
        # Usage: the last sample as the sandbox's, and its history.
        info = c.server.http.get(f"/v1/sandboxes/{sid}").json()
        assert info["usage"] and info["usage"]["cpu_usage_ns"] > 0, info
        history = c.server.http.get(f"/v1/sandboxes/{sid}/logs", params={"usage": "true"}).text
        samples = [json.loads(l) for l in history.splitlines() if l.strip()]
        assert samples and samples[-1]["usage"]["cpu_usage_ns"] > 0, history
        # By label across the batch, with a window.
        by_label = c.server.cli("logs", "--label", "code=v3", "--since", "1h", "--json").stdout.decode()
        assert numbers(by_label)[:acknowledged] == list(range(1, acknowledged + 1))
        # Lost once the node stays silent; still readable.
        wait_until("the sandbox to be lost", lambda: c.server.http.get(f"/v1/sandboxes/{sid}").json()["state"] == "lost",
                   timeout=30)
        again = numbers(c.server.cli("logs", sid, "--json").stdout.decode())
        assert again == got
        # The node comes back with a new journal (its ship/ was removed):
        # reconciled, and shipping from the new journal's start.
        node.start()
        wait_until("the lost sandbox to be removed from the node", lambda: node.leftovers() == [], timeout=30)


def test_a_restarted_control_plane_resumes_shipping_without_gap_or_duplicate(images):
    count = 600
    with Cluster(images, nodes=[dict(name="a")]) as c:
        r = c.server.http.post("/v1/sandboxes", json={
            "image": BB, "cpu": 0.2, "memory": "32M", "labels": {"task": "resume"},
            "cmd": printer(count, 100)})
        assert r.status_code in (200, 201), r.text
        sid = r.json()["id"]
        node = c.nodes["a"]
        wait_until("some lines", lambda: len(node_lines(node, sid)) >= 100)
        # Killed mid-stream, and again after its restart.
        for _ in range(2):
            c.server.proc.kill()
            c.server.proc.wait()
            time.sleep(0.5)
            c.server.start()
            time.sleep(0.5)

        # Every line printed; then the node's own copy of the log goes, so
        # that what answers is the kept copy alone (its journal ships on).
        wait_until("every line printed", lambda: len(node_lines(node, sid)) >= count)
        (node.home / "logs" / f"{sid}.jsonl").unlink()

        def kept():
            text = c.server.http.get("/v1/logs", params={"label": "task=resume", "since": "1h"}).text
            got = numbers(text)
            return got if len(got) >= count else None

        got = wait_until("every line kept", kept, timeout=30)
        assert got == list(range(1, count + 1)), [n for n in got if got.count(n) > 1][:10]

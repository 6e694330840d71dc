"""Cluster mode: one `warren server` placing sandboxes on node agents
(`warren node`) that joined it, each with its own home and a small declared
capacity, all on this machine."""

import hashlib
import secrets
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from cluster import Cluster, wait_until
from conftest import UP_ARGS
from helpers import sh_ok

BB = "busybox:latest"

# A cluster's server drives its nodes over the node API's HTTP (TLS)
# transport in every pass; the suite's second pass only changes `warren up`.
pytestmark = pytest.mark.skipif(bool(UP_ARGS), reason="cluster mode always uses the HTTP transport; run once")


def database(request, store):
    """None (the server's SQLite) or a fresh database on the session's
    PostgreSQL server."""
    if store == "sqlite":
        return None
    pg = request.getfixturevalue("postgres")
    url = pg.create_database()
    request.addfinalizer(lambda: pg.drop_database(url))
    return url


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def cluster(images, request):
    # Only n3 finds runsc: the gvisor class is offered there alone.
    no_runsc = ["--runsc", "/nonexistent/runsc"]
    with Cluster(images, database=database(request, request.param), nodes=[
        dict(name="n1", extra=no_runsc), dict(name="n2", extra=no_runsc), dict(name="n3", labels=["gpu=h200"]),
    ]) as c:
        yield c


def create(c, **spec):
    spec.setdefault("image", BB)
    r = c.server.http.post("/v1/sandboxes", json=spec)
    assert r.status_code in (200, 201), r.text
    return r.json()


def drop(c, *ids):
    for sid in ids:
        c.server.http.delete(f"/v1/sandboxes/{sid}")


def test_nodes_join_and_report_capacity(cluster):
    nodes = cluster.server.nodes()
    assert set(nodes) == {"n1", "n2", "n3"}
    for n in nodes.values():
        assert n["state"] == "ready" and not n["cordoned"]
        assert n["allocatable"]["cpu_millis"] == 2000
        assert n["allocatable"]["memory"] == 2 << 30
    assert nodes["n3"]["labels"] == {"gpu": "h200"}
    out = cluster.server.cli("node", "ls").stdout.decode()
    assert "n1" in out and "gpu=h200" in out, out
    # The Python SDK reads the same, typed.
    import warren

    with warren.Client(cluster.server.url, token=cluster.server.token) as client:
        by_name = {n.name: n for n in client.nodes()}
    assert by_name["n3"].labels == {"gpu": "h200"} and by_name["n1"].state == "ready"
    assert by_name["n2"].load.disk_pressure is False
    # A node that joined said nothing alarming on its way, and its
    # terminal output (a file here) has no colour codes.
    for name in ("n1", "n2", "n3"):
        said = (cluster.base / f"node-{name}.log").read_bytes()
        assert b"\x1b[" not in said and b"WARN" not in said, said.decode(errors="replace")


def test_a_sandbox_mounting_a_volume_goes_to_the_volumes_node(cluster):
    c = cluster
    name = f"vol-{secrets.token_hex(3)}"
    r = c.server.http.post("/v1/volumes", json={"name": name, "size": "16M", "node_selector": {"gpu": "h200"}})
    assert r.status_code == 201 and r.json()["node"] == "n3", r.text
    try:
        # Any node could take it by its size; the volume decides.
        s = create(c, cpu=0.1, memory="32M", volumes=[{"name": name, "path": "/v"}])
        try:
            assert s["node"] == "n3"
            listed = {v["name"]: v for v in c.server.http.get("/v1/volumes").json()}
            assert listed[name]["node"] == "n3" and listed[name]["mounted_by"] == [s["id"]]
        finally:
            drop(c, s["id"])
        # A name is the cluster's.
        r = c.server.http.post("/v1/volumes", json={"name": name, "size": "16M"})
        assert r.status_code == 409 and "n3" in r.json()["error"]["message"], r.text
        # A node that stops with a sandbox still mounting a volume leaves
        # the volume mounted, so after its restart every sandbox shares one
        # file system (a second mount would be a second loop device).
        home = c.nodes["n3"].home
        mounts = lambda: [l for l in Path("/proc/self/mountinfo").read_text().splitlines()
                          if f"{home}/volumes/{name}/fs" in l]
        reader = create(c, cpu=0.1, memory="32M", volumes=[{"name": name, "path": "/v", "read_only": True}])
        assert len(mounts()) == 1
        log = home / "warren-node.log"
        joins = lambda: log.read_text(errors="replace").count(" joined")
        before = joins()
        c.nodes["n3"].stop()
        c.nodes["n3"].start()
        # The control plane's view says ready at once; the agent takes
        # calls once it has joined again.
        wait_until("n3 to join again", lambda: joins() > before)
        other = create(c, cpu=0.1, memory="32M", volumes=[{"name": name, "path": "/v", "read_only": True}])
        assert len(mounts()) == 1, mounts()
        exit_ev, out, _, _ = c.server.exec(other["id"], ["ls", "/v"])
        assert exit_ev["code"] == 0
        drop(c, reader["id"], other["id"])
    finally:
        assert c.server.http.delete(f"/v1/volumes/{name}").status_code == 200


def test_placement_takes_the_node_with_the_most_left(cluster):
    c = cluster
    # n1 gets 1.5 of its 2 cores used; the others stay empty.
    big = create(c, cpu=1.5, memory="64M", node_selector={})
    first = big["node"]
    ids = [big["id"]]
    try:
        # The next ones avoid the busy node while the others have more left.
        for _ in range(2):
            s = create(c, cpu=1, memory="64M")
            ids.append(s["id"])
            assert s["node"] != first, (first, s["node"])
        placed = [c.where(i) for i in ids[1:]]
        assert len(set(placed)) == 2, placed
        # Pack chooses the fullest node that still fits.
        packed = create(c, cpu=0.5, memory="64M", placement="pack")
        ids.append(packed["id"])
        assert packed["node"] == first, packed["node"]
    finally:
        drop(c, *ids)


def test_node_selector_places_on_matching_nodes_only(cluster):
    c = cluster
    s = create(c, cpu=0.1, memory="32M", node_selector={"gpu": "h200"})
    try:
        assert s["node"] == "n3"
    finally:
        drop(c, s["id"])
    r = c.server.http.post("/v1/sandboxes", json={"image": BB, "node_selector": {"gpu": "a100"}})
    assert r.status_code == 503, r.text
    assert "gpu=a100" in r.json()["error"]["message"]
    # Through the CLI.
    p = c.server.cli("create", "--image", BB, "--cpu", "0.1", "--memory", "32M", "--node-selector", "gpu=h200")
    sid = p.stdout.decode().strip()
    try:
        assert c.where(sid) == "n3"
    finally:
        drop(c, sid)


def test_a_sandbox_runs_only_on_a_node_that_offers_its_class(cluster):
    c = cluster
    offered = {name: n.get("isolation", []) for name, n in c.server.nodes().items()}
    assert "gvisor" in offered["n3"] and "gvisor" not in offered["n1"] + offered["n2"], offered
    s = create(c, cpu=0.1, memory="32M", isolation="gvisor")
    try:
        assert s["node"] == "n3" and s["spec"]["isolation"] == "gvisor"
        # Served through the server like any other sandbox: gVisor's kernel.
        assert sh_ok(c.server, s["id"], "uname -r") == "4.4.0\n"
    finally:
        drop(c, s["id"])


def test_the_cluster_queue_is_fifo_and_starts_where_room_frees(cluster):
    c = cluster
    # 3 nodes × 2 cores: six sandboxes of one core fill the cluster.
    running = [create(c, cpu=1, memory="32M")["id"] for _ in range(6)]
    queued = []
    try:
        for _ in range(2):
            r = c.server.http.post("/v1/sandboxes", params={"wait": "false"}, json={"image": BB, "cpu": 1, "memory": "32M"})
            assert r.status_code in (201, 202), r.text
            queued.append(r.json())
        assert [q["state"] for q in queued] == ["queued", "queued"]
        assert [q["queue_position"] for q in queued] == [1, 2]
        freed = c.where(running[0])
        drop(c, running[0])
        first = wait_until("the head of the queue to start", lambda: (
            lambda s: s if s["state"] == "running" else None)(c.server.http.get(f"/v1/sandboxes/{queued[0]['id']}").json()))
        assert first["node"] == freed
        second = c.server.http.get(f"/v1/sandboxes/{queued[1]['id']}").json()
        assert second["state"] == "queued" and second["queue_position"] == 1, second
    finally:
        drop(c, *running[1:], *[q["id"] for q in queued])


def test_exec_files_logs_and_ports_reach_every_node_through_the_server(cluster):
    c = cluster
    ids = []
    try:
        # One sandbox on each node: the others are cordoned meanwhile.
        for node in ("n1", "n2", "n3"):
            others = [n for n in ("n1", "n2", "n3") if n != node]
            for o in others:
                c.server.cli("node", "cordon", o)
            try:
                s = create(c, cpu=0.1, memory="32M", cmd=["sh", "-c", f"echo hello-from-{node}; httpd -f -p 8080 -h /etc"])
            finally:
                for o in others:
                    c.server.cli("node", "uncordon", o)
            assert s["node"] == node
            ids.append(s["id"])
        for sid, node in zip(ids, ("n1", "n2", "n3")):
            exit_ev, out, _, _ = c.server.exec(sid, ["sh", "-c", "cat /etc/hostname >/dev/null; echo $((6*7))"])
            assert exit_ev and exit_ev["code"] == 0 and out == b"42\n", (node, exit_ev, out)
            r = c.server.http.put(f"/v1/sandboxes/{sid}/files", params={"path": "/tmp/x"}, content=node.encode() * 1000)
            assert r.status_code in (200, 204), r.text
            r = c.server.http.get(f"/v1/sandboxes/{sid}/files", params={"path": "/tmp/x"})
            assert r.content == node.encode() * 1000
            logs = wait_until("the main process's output in the log", lambda: (
                lambda t: t if f"hello-from-{node}" in t else None)(c.server.http.get(f"/v1/sandboxes/{sid}/logs").text))
            assert logs
            # A port on the sandbox's loopback, through the server and the node.
            body = wait_until("the port to answer", lambda: (
                lambda r: r if r.status_code == 200 else None)(c.server.http.get(f"/v1/sandboxes/{sid}/ports/8080/passwd")))
            assert b"root:" in body.content
    finally:
        drop(c, *ids)


def test_the_node_api_refuses_users_and_wrong_credentials(cluster):
    n = cluster.nodes["n1"]
    for auth in (None, f"Bearer {cluster.server.token}", "Bearer not-the-credential"):
        headers = {"Authorization": auth} if auth else {}
        r = httpx.post(f"{n.url}/node/v2/inventory", headers=headers, timeout=5, verify=False)
        assert r.status_code == 401, (auth, r.status_code, r.text)
    # A heartbeat for a node with a wrong credential is refused too.
    r = httpx.post(f"{cluster.server.url}/v1/nodes/n1/heartbeat", headers={"Authorization": f"Bearer {cluster.server.token}"},
                   json={"name": "n1", "allocatable": {"cpu_millis": 1, "memory": 1, "slots": 1}, "max_pids": 1,
                         "load": {"cpu_busy": 0, "disk_pressure": False, "sandboxes": 0}}, timeout=5)
    assert r.status_code == 401, r.text
    # And a join with a wrong token.
    r = httpx.post(f"{cluster.server.url}/v1/nodes/join", headers={"Authorization": "Bearer nope"},
                   json={"url": "http://127.0.0.1:1", "info": {"name": "evil", "allocatable": {"cpu_millis": 1, "memory": 1, "slots": 1},
                                                              "max_pids": 1, "load": {"cpu_busy": 0, "disk_pressure": False, "sandboxes": 0}}}, timeout=5)
    assert r.status_code == 401, r.text
    assert "evil" not in cluster.server.nodes()
    # A stranger's malformed body is refused for who sent it, before its
    # schema is read: the answer says nothing of the fields expected.
    for path in ("/v1/nodes/join", "/v1/nodes/n1/heartbeat"):
        r = httpx.post(f"{cluster.server.url}{path}", headers={"Authorization": "Bearer nope"},
                       json={"nonsense": 1}, timeout=5)
        assert r.status_code == 401 and "missing field" not in r.text and "invalid" not in r.text, r.text


def test_a_join_token_holder_cannot_take_over_a_joined_nodes_name(cluster):
    """Issue 38 (9): a name stays bound to the key it joined with. With the
    join token but not n1's key: another key is refused (409), n1's pin
    without a proof of its key is refused (401), a copied proof for
    another URL too; n1 stays ready on its own credential."""
    import base64

    c = cluster
    token = (c.server.home / "join-token").read_text().strip()
    info = {"name": "n1", "allocatable": {"cpu_millis": 1, "memory": 1, "slots": 1}, "max_pids": 1,
            "load": {"cpu_busy": 0, "disk_pressure": False, "sandboxes": 0}}
    real = c.nodes["n1"].fingerprint()

    def join(**extra):
        return httpx.post(f"{c.server.url}/v1/nodes/join", headers={"Authorization": f"Bearer {token}"},
                          json={"url": "https://127.0.0.1:1", "info": info, **extra}, timeout=5)

    r = join(tls_fingerprint="ab" * 32)
    assert r.status_code == 401 and "tls_proof" in r.text, r.text
    # A proof made with some other key, for a pin of that key: not n1's.
    other = Path(tempfile.mkdtemp()) / "other"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-keyout", other.with_suffix(".key"), "-out", other.with_suffix(".pem"), "-subj", "/CN=x",
                    "-days", "1", "-outform", "DER"], check=True, capture_output=True)
    der = other.with_suffix(".pem").read_bytes()
    fp = hashlib.sha256(der).hexdigest()
    now = int(time.time())
    statement = f"warren node join\nn1\nhttps://127.0.0.1:1\n{fp}\n{now}".encode()
    sig = subprocess.run(["openssl", "dgst", "-sha256", "-sign", other.with_suffix(".key")], input=statement,
                         check=True, capture_output=True).stdout
    proof = {"certificate": base64.b64encode(der).decode(), "signed_at": now,
             "signature": base64.b64encode(sig).decode(), "scheme": "ECDSA_NISTP256_SHA256"}
    r = join(tls_fingerprint=fp, tls_proof=proof)
    assert r.status_code == 409 and "warren node rm n1" in r.text, r.text
    # n1's pin with that proof: the certificate is not the pinned one.
    r = join(tls_fingerprint=real, tls_proof=proof)
    assert r.status_code == 401, r.text
    time.sleep(2)
    assert c.server.nodes()["n1"]["state"] == "ready"
    assert c.server.nodes()["n1"]["url"].startswith("https://127.0.0.1:") and not \
        c.server.nodes()["n1"]["url"].endswith(":1")


def test_the_node_api_is_tls_with_the_certificate_the_server_pinned(cluster):
    n = cluster.nodes["n1"]
    pin = n.fingerprint()
    assert n.presented() == pin
    assert cluster.server.nodes()["n1"]["url"] == n.url
    if cluster.server.database is None:
        import sqlite3
        db = sqlite3.connect(f"file:{cluster.server.home / 'warren.db'}?mode=ro", uri=True)
        (stored,) = db.execute("SELECT tls_fingerprint FROM nodes WHERE name = 'n1'").fetchone()
        db.close()
        assert stored == pin
    # Plain HTTP to the node API gets no answer from it.
    with pytest.raises(httpx.HTTPError):
        httpx.post(n.url.replace("https://", "http://") + "/node/v2/info", timeout=5)


def test_a_killed_node_loses_its_sandboxes_and_is_reconciled_when_back(images):
    with Cluster(images, nodes=[dict(name="a"), dict(name="b")]) as c:
        c.server.cli("node", "cordon", "b")
        on_a = [create(c, cpu=0.1, memory="32M")["id"] for _ in range(2)]
        # A batch that asks for its lost members to be made again.
        r = c.server.http.post("/v1/batches", json={
            "count": 2, "retry_on_lost": True, "labels": {"task": "lost-retry"},
            "spec": {"image": BB, "cpu": 0.1, "memory": "32M"}})
        assert r.status_code == 202, r.text
        batch = r.json()["id"]
        members = wait_until("the batch to run", lambda: (
            lambda m: m if len(m) == 2 and all(s["state"] == "running" for s in m) else None)(
            c.server.http.get("/v1/sandboxes", params={"label": f"warren.dev/batch={batch}"}).json()))
        c.server.cli("node", "uncordon", "b")
        assert {c.where(i) for i in on_a} | {m["node"] for m in members} == {"a"}
        node = c.nodes["a"]
        assert len(node.leftovers()) == 4
        killed = time.time()
        node.proc.kill()
        node.proc.wait()
        gone = on_a + [m["id"] for m in members]
        lost = wait_until("the sandboxes of the killed node to be lost", lambda: all(
            c.server.http.get(f"/v1/sandboxes/{i}").json()["state"] == "lost" for i in gone), timeout=20)
        took = time.time() - killed
        print(f"node loss: {took:.2f} s from kill -9 to all its sandboxes lost")
        assert lost and took <= 13, took
        assert c.server.nodes()["a"]["state"] == "lost"
        events = c.server.http.get("/v1/events", params={"type": "node"}).json()
        assert any(e["reason"] == "node_lost" for e in events), events
        # The batch's members are made again on the node that is left.
        retried = wait_until("the lost batch members to be retried", lambda: (
            lambda m: m if len(m) == 2 and all(s["state"] == "running" for s in m) else None)([
                s for s in c.server.http.get("/v1/sandboxes", params={"label": f"warren.dev/batch={batch}"}).json()
                if s["id"] not in gone]))
        assert {s["node"] for s in retried} == {"b"}
        # Capacity is free again, and new sandboxes go to the other node.
        s = create(c, cpu=0.1, memory="32M")
        assert s["node"] == "b"
        # Back: the node takes its sandboxes over from its journal; the
        # control plane gave them up, so reconciliation destroys them.
        node.start()
        wait_until("the lost sandboxes to be removed from the node", lambda: node.leftovers() == [], timeout=20)
        assert c.server.nodes()["a"]["state"] == "ready"
        drop(c, s["id"])
        c.server.http.delete(f"/v1/batches/{batch}")


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_a_killed_server_touches_no_sandbox_and_picks_up_where_it_was(images, request, store):
    with Cluster(images, database=database(request, store), nodes=[dict(name="a"), dict(name="b")]) as c:
        ids = [create(c, cpu=0.5, memory="32M")["id"] for _ in range(2)]
        assert {c.where(i) for i in ids} == {"a", "b"}
        c.server.proc.kill()
        c.server.proc.wait()
        time.sleep(2)
        assert sum(len(n.leftovers()) for n in c.nodes.values()) == 2
        c.server.start()
        for sid in ids:
            assert c.server.http.get(f"/v1/sandboxes/{sid}").json()["state"] == "running"
            exit_ev, out, _, _ = c.server.exec(sid, ["echo", "still-here"])
            assert exit_ev and out == b"still-here\n", (exit_ev, out)
        wait_until("both nodes ready again", lambda: all(n["state"] == "ready" for n in c.server.nodes().values()))
        drop(c, *ids)
        wait_until("the nodes to be empty", lambda: all(n.leftovers() == [] for n in c.nodes.values()))


def test_a_node_cut_off_from_its_control_plane_ends_expired_sandboxes_alone(images):
    """Issue 38 (13): the control plane gone (killed: the node cannot tell
    that from a partition), the node still ends sandboxes at their TTL and
    lease, as their reclaim says (`keep`: frozen and held), and the control
    plane, back, records why each ended instead of calling them lost."""
    from helpers import CGROUP_V2, cgroup_read

    with Cluster(images, nodes=[dict(name="a")]) as c:
        t0 = time.time()
        ttl = create(c, cpu=0.1, memory="32M", ttl="4s")["id"]
        lease = create(c, cpu=0.1, memory="32M", lease="4s")["id"]
        kept = create(c, cpu=0.1, memory="32M", ttl="4s", reclaim="keep", keep_for="1h")["id"]
        live = create(c, cpu=0.1, memory="32M")["id"]
        c.server.proc.kill()
        c.server.proc.wait()
        assert time.time() - t0 < 4, "the control plane must be gone before the first expiry"
        node = c.nodes["a"]
        wait_until("the node to end the expired sandboxes alone",
                   lambda: node.leftovers() == sorted([kept, live]), timeout=20)
        took = time.time() - t0
        print(f"partitioned node: expired sandboxes ended {took:.1f} s after create (TTL 4 s)")
        assert took < 4 + 5 + 3, took
        frozen = lambda: (cgroup_read(kept, "freezer", "cgroup.freeze").strip() == "1" if CGROUP_V2
                          else cgroup_read(kept, "freezer", "freezer.state").strip() == "FROZEN")
        wait_until("the `keep` sandbox to be held frozen", frozen, timeout=5)
        c.server.start()
        get = lambda sid: c.server.http.get(f"/v1/sandboxes/{sid}").json()
        wait_until("the records to follow what the node did", lambda: (
            (get(ttl)["state"], get(ttl)["reason"]) == ("destroyed", "ttl_expired")
            and (get(lease)["state"], get(lease)["reason"]) == ("destroyed", "lease_expired")
            and get(kept)["state"] == "kept"), timeout=20)
        assert get(live)["state"] == "running"
        drop(c, kept, live)
        wait_until("the node to be empty", lambda: node.leftovers() == [])


def test_a_waiting_create_says_where_it_is_in_the_queue(cluster):
    import subprocess

    from conftest import WARREN

    c = cluster
    full = [create(c, cpu=1, memory="32M")["id"] for _ in range(6)]
    p = subprocess.Popen(
        [str(WARREN), "create", "--image", BB, "--cpu", "1", "--memory", "32M"],
        env=c.server.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        line = p.stderr.readline().decode()
        assert "queued at position 1" in line, line
        assert p.poll() is None
        drop(c, full[0])
        out, err = p.communicate(timeout=30)
        assert p.returncode == 0, err
        sid = out.decode().strip()
        assert c.server.http.get(f"/v1/sandboxes/{sid}").json()["state"] == "running"
        full.append(sid)
    finally:
        if p.poll() is None:
            p.kill()
        drop(c, *full[1:])


def test_drain_lets_sandboxes_end_then_destroys_the_rest(images):
    with Cluster(images, nodes=[dict(name="a"), dict(name="b")]) as c:
        c.server.cli("node", "cordon", "b")
        short = create(c, cpu=0.1, memory="32M", cmd=["sleep", "2"])["id"]
        stays = create(c, cpu=0.1, memory="32M")["id"]
        c.server.cli("node", "uncordon", "b")
        started = time.time()
        p = c.server.cli("node", "drain", "a", "--deadline", "6s", timeout=60)
        assert "drained" in p.stdout.decode()
        took = time.time() - started
        assert 5 <= took <= 20, took
        ended = c.server.http.get(f"/v1/sandboxes/{short}").json()
        assert (ended["state"], ended["reason"]) == ("destroyed", "main_exited"), ended
        drained = c.server.http.get(f"/v1/sandboxes/{stays}").json()
        assert (drained["state"], drained["reason"]) == ("destroyed", "node_drained"), drained
        # It stays cordoned: new sandboxes go elsewhere.
        assert c.server.nodes()["a"]["cordoned"]
        s = create(c, cpu=0.1, memory="32M")
        assert s["node"] == "b"
        drop(c, s["id"])


def test_prewarm_and_batches_pull_once_per_node_and_keep_their_digest(images, tmp_path):
    import os

    from helpers import ImageBuilder, uniq
    from test_registry import Registry

    reg = Registry()
    try:
        repo = uniq("warm")
        b = ImageBuilder(images["oci"], tmp_path / "img").layer(
            lambda r: (r / "payload").write_bytes(os.urandom(256 * 1024)))
        digest = reg.push(b.layout, b.tag, f"{repo}:v1")
        last = reg.manifest(digest, repo)["layers"][-1]["digest"]
        ref = f"{reg.host}/{repo}:v1"
        with Cluster(images, nodes=[dict(name="a"), dict(name="b", labels=["gpu=h200"]), dict(name="c")]) as c:
            out = c.server.cli("image", "prewarm", ref, "--node-selector", "gpu=h200").stdout.decode().split()
            assert out == ["b", ref, digest], out
            assert reg.blob_gets(repo, last) == 1
            # The three nodes are empty and alike, so placement ties: the one
            # that holds the image already wins (after its next heartbeat).
            time.sleep(1.5)
            near = create(c, image=ref, cpu=0.1, memory="32M")
            assert near["node"] == "b", near["node"]
            drop(c, near["id"])
            # A batch resolves the tag once and prewarms every node it may
            # use: one download on each node that lacked the image.
            r = c.server.http.post("/v1/batches", json={"count": 3, "spec": {"image": ref, "cpu": 1, "memory": "32M"}})
            assert r.status_code == 202, r.text
            batch = r.json()
            assert batch["spec"]["image"] == f"{reg.host}/{repo}@{digest}", batch["spec"]
            # The tag moves on while the batch runs: its members keep the digest.
            b2 = ImageBuilder(images["oci"], tmp_path / "img2").layer(lambda r: (r / "other").write_text("x"))
            moved = reg.push(b2.layout, b2.tag, f"{repo}:v1")
            assert moved != digest
            members = wait_until("the batch to run", lambda: (
                lambda m: m if len(m) == 3 and all(s["state"] == "running" for s in m) else None)(
                c.server.http.get("/v1/sandboxes", params={"label": f"warren.dev/batch={batch['id']}"}).json()))
            assert {m["node"] for m in members} == {"a", "b", "c"}
            assert {m["image_digest"] for m in members} == {digest}
            assert reg.blob_gets(repo, last) == 3
            c.server.http.delete(f"/v1/batches/{batch['id']}")
    finally:
        reg.stop()


def test_four_nodes_pull_an_image_through_the_cache_and_upstream_serves_it_once(images, tmp_path):
    import os

    from helpers import ImageBuilder, uniq
    from test_registry import Registry, RegistryCache

    upstream = Registry()
    cache = None
    try:
        cache = RegistryCache(upstream)
        repo = uniq("once")
        b = ImageBuilder(images["oci"], tmp_path / "img").layer(
            lambda r: (r / "payload").write_bytes(os.urandom(16 << 20)))
        digest = upstream.push(b.layout, b.tag, f"{repo}:v1")
        layers = [l["digest"] for l in upstream.manifest(digest, repo)["layers"]]
        ref = f"{upstream.host}/{repo}:v1"
        c = Cluster(images)
        # The server's registries.toml names the cache; every node takes it
        # at join (their own files name no registry).
        (c.base / "server" / "registries.toml").write_text(
            f'[registry."{upstream.host}"]\ninsecure = true\nmirrors = ["{cache.host}"]\n'
            f'[registry."{cache.host}"]\ninsecure = true\n')
        with c:
            for name in "abcd":
                c.add_node(name)
                assert "[registry" not in (c.base / name / "registries.toml").read_text()
            out = c.server.cli("image", "prewarm", ref).stdout.decode().split("\n")
            assert sorted(l.split()[0] for l in out if l) == ["a", "b", "c", "d"], out
            assert all(l.split()[2] == digest for l in out if l), out
            # All four at once: the upstream served each layer once, the
            # cache served it to every node.
            for layer in layers:
                assert upstream.blob_gets(repo, layer) == 1, layer
                assert cache.served(repo, layer) == 4, layer
            s = create(c, image=ref, cpu=0.1, memory="32M")
            exit_ev, out, _, _ = c.server.exec(s["id"], ["sh", "-c", "wc -c < /payload"])
            assert exit_ev["code"] == 0 and out.strip() == str(16 << 20).encode(), out
            drop(c, s["id"])
    finally:
        if cache:
            cache.stop()
        upstream.stop()


def test_images_built_committed_or_imported_on_one_node_run_on_every_node(images, tmp_path):
    from test_registry import Registry

    reg = Registry()
    try:
        nodes = [dict(name="a", labels=["n=a"]), dict(name="b", labels=["n=b"])]
        with Cluster(images, nodes=nodes, server_args=["--cluster-registry", f"{reg.host}/warren"]) as c:
            def run_on(node, image, cmd):
                s = create(c, image=image, cpu=0.1, memory="32M", node_selector={"n": node})
                try:
                    assert s["node"] == node
                    exit_ev, out, err, _ = c.server.exec(s["id"], ["sh", "-c", cmd])
                    assert exit_ev["code"] == 0, err
                    return s["image_digest"], out.decode()
                finally:
                    drop(c, s["id"])

            ctx = tmp_path / "ctx"
            ctx.mkdir()
            (ctx / "Dockerfile").write_text("FROM busybox:latest\nCOPY v /v\n")
            for version in ("one", "two"):
                (ctx / "v").write_text(version)
                built = c.server.cli("build", "-t", "app:1", str(ctx))
                assert f"published as {reg.host}/warren/app:1" in built.stderr.decode(), built.stderr
                digest = built.stdout.decode().split()[-1]
                # The build ran on one node; both run it, and the node that
                # pulled the first build runs the second, not its old copy.
                for node in "ab":
                    assert run_on(node, "app:1", "cat /v") == (digest, version)
            # A commit on one node runs on the other.
            s = create(c, image="app:1", cpu=0.1, memory="32M", node_selector={"n": "a"})
            c.server.exec(s["id"], ["sh", "-c", "echo committed > /c"])
            name, digest = c.server.cli("commit", s["id"], "snap:1").stdout.decode().split()
            drop(c, s["id"])
            assert run_on("b", "snap:1", "cat /c") == (digest, "committed\n")
            # The busybox the cluster imported at start is there too, for
            # nodes that join later.
            catalog = httpx.get(f"http://{reg.host}/v2/_catalog").json()["repositories"]
            assert {"warren/app", "warren/snap", "warren/busybox"} <= set(catalog), catalog
            # A local name never published is still each node's own.
            r = c.server.http.post("/v1/sandboxes", json={"image": "nowhere:1", "cpu": 0.1, "memory": "32M"})
            assert r.status_code == 404, r.text
    finally:
        reg.stop()


def test_replicas_share_one_database_and_a_killed_leader_is_replaced(images, postgres):
    import uuid
    from concurrent.futures import ThreadPoolExecutor

    from conftest import free_port

    url = postgres.create_database()
    port = free_port()
    with Cluster(images, database=url, nodes=[dict(name="a"), dict(name="b")],
                 also=[f"http://127.0.0.1:{port}"]) as c:
        leader = c.server
        follower = c.add_replica(port)
        try:
            # The follower forwards: creates, exec streams and ports work
            # through it.
            s = follower.http.post("/v1/sandboxes", json={"image": BB, "cpu": 0.1, "memory": "32M"}).json()
            exit_ev, out, _, _ = follower.exec(s["id"], ["echo", "through-the-follower"])
            assert exit_ev and out == b"through-the-follower\n", (exit_ev, out)
            follower.http.delete(f"/v1/sandboxes/{s['id']}")
            # A tenant made through the leader is known to the follower, and
            # survives the failover below with its sandbox.
            assert leader.http.post("/v1/tenants", json={"name": "team-f"}).status_code == 201
            token = follower.http.post("/v1/tokens", json={"tenant": "team-f"}).json()["token"]
            as_tenant = httpx.Client(base_url=follower.url, headers={"Authorization": f"Bearer {token}"}, timeout=60)
            mine = as_tenant.post("/v1/sandboxes", json={"image": BB, "cpu": 0.01, "memory": "16M"}).json()["id"]

            def create_until_answered(rid):
                # A create is idempotent by request id: retried across the
                # failover until a replica answers it.
                deadline = time.time() + 60
                while time.time() < deadline:
                    try:
                        r = follower.http.post("/v1/sandboxes", json={
                            "image": BB, "cpu": 0.01, "memory": "16M", "request_id": rid}, timeout=30)
                        if r.status_code in (200, 201):
                            return r.json()
                        if r.status_code not in (502, 503, 500):
                            return r.json()
                    except Exception:
                        pass
                    time.sleep(0.2)
                raise AssertionError(f"create {rid} never answered")

            rids = [f"failover-{uuid.uuid4().hex[:8]}-{i}" for i in range(60)]
            with ThreadPoolExecutor(8) as pool:
                futures = [pool.submit(create_until_answered, rid) for rid in rids]
                wait_until("some creates to land", lambda: sum(f.done() for f in futures) >= 15, timeout=60)
                killed = time.time()
                leader.proc.kill()
                leader.proc.wait()
                # While no replica leads, a create with its body unread is
                # refused on a connection the follower closes: it says so,
                # or the client's next request on it fails.
                r = follower.http.post("/v1/sandboxes", json={"image": BB, "cpu": 0.01, "memory": "16M"})
                if r.status_code == 503:
                    assert r.headers.get("connection") == "close", r.headers
                    assert r.headers.get("retry-after"), r.headers
                elif r.status_code in (200, 201):
                    follower.http.delete(f"/v1/sandboxes/{r.json()['id']}")
                # The follower takes over within the lease (about 4.5 s)
                # and answers once it has reconciled the nodes.
                def follower_leads():
                    assert follower.proc.poll() is None, f"the follower exited with {follower.proc.returncode}"
                    return follower.http.get("/healthz", timeout=5).text.strip() == "ok"

                wait_until("the follower to lead", follower_leads, timeout=20, every=0.05)
                took = time.time() - killed
                answers = [f.result() for f in futures]
            print(f"leader failover: {took:.2f} s from kill -9 to the follower answering")
            assert took <= 8, took
            records = follower.http.get("/v1/sandboxes", params={"all": "true"}).json()
            by_rid = {}
            for r in records:
                rid = r["spec"].get("request_id")
                if rid in rids:
                    by_rid.setdefault(rid, []).append(r)
            # One record per create, and no sandbox placed twice: what the
            # nodes hold is exactly the running records.
            assert all(len(v) == 1 for v in by_rid.values()), by_rid
            assert [x["id"] for x in as_tenant.get("/v1/sandboxes").json()] == [mine]
            assert next(r for r in records if r["id"] == mine)["tenant"] == "team-f"
            running = {r["id"] for r in records if r["state"] == "running"} - {mine}
            assert len(running) >= 40, (len(running), [a.get("state") or a.get("error") for a in answers])
            wait_until("the nodes to hold exactly the running sandboxes", lambda: set(
                c.nodes["a"].leftovers() + c.nodes["b"].leftovers()) == running | {mine}, timeout=30)
            assert as_tenant.delete(f"/v1/sandboxes/{mine}").status_code == 200
            for sid in running:
                follower.http.delete(f"/v1/sandboxes/{sid}")
            c.server = follower
        finally:
            if follower.proc.poll() is None and c.server is not follower:
                follower.stop()


def test_a_stalled_leader_is_fenced_off_by_its_nodes(images, postgres):
    """A leader frozen past its lease (SIGSTOP) is replaced; the nodes learn
    the new leader's epoch, refuse the old one's calls, and the old leader
    stops once it runs again, without having touched a sandbox."""
    from conftest import free_port

    url = postgres.create_database()
    port = free_port()
    with Cluster(images, database=url, nodes=[dict(name="a")], also=[f"http://127.0.0.1:{port}"]) as c:
        leader = c.server
        follower = c.add_replica(port)
        epoch_file = c.nodes["a"].home / "leader-epoch"
        try:
            s = create(c, cpu=0.1, memory="32M")
            assert epoch_file.read_text().strip() == "1"
            leader.proc.send_signal(signal.SIGSTOP)
            try:
                def follower_leads():
                    # Until it leads, the follower forwards to the frozen
                    # leader, which does not answer.
                    try:
                        return follower.http.get("/healthz", timeout=1).text.strip() == "ok"
                    except httpx.TimeoutException:
                        return False

                wait_until("the follower to lead", follower_leads, timeout=30, every=0.1)
                wait_until("node a to follow epoch 2", lambda: epoch_file.read_text().strip() == "2", timeout=20)
                # The frozen leader's heartbeat deadlines have all passed:
                # awake, it would take node a for lost and its sandbox
                # with it, were the node to obey it.
            finally:
                leader.proc.send_signal(signal.SIGCONT)
            assert leader.proc.wait(timeout=20) == 75, "the replaced leader did not stop"
            said = (c.base / f"server-{leader.port}.log").read_text(errors="replace")
            assert "went to another replica" in said or "lease went to" in said, said[-2000:]
            # Deterministically, too: a call with the old epoch, sent by hand
            # with the node's credential, is refused.
            cred = postgres.psql("SELECT credential FROM nodes WHERE name = 'a'", url=url).strip()
            r = httpx.post(f"{c.nodes['a'].url}/node/v2/info", verify=False, headers={
                "Authorization": f"Bearer {cred}", "x-warren-leader-epoch": "1"})
            assert r.status_code == 412 and r.json()["kind"] == "fenced", r.text
            r = httpx.post(f"{c.nodes['a'].url}/node/v2/info", verify=False, headers={
                "Authorization": f"Bearer {cred}", "x-warren-leader-epoch": "2"})
            assert r.status_code == 200, r.text
            # Nothing was touched: the sandbox runs on, and answers.
            assert follower.http.get(f"/v1/sandboxes/{s['id']}").json()["state"] == "running"
            exit_ev, out, _, _ = follower.exec(s["id"], ["echo", "still-here"])
            assert out == b"still-here\n", (exit_ev, out)
            assert s["id"] in c.nodes["a"].leftovers()
            refused = (c.nodes["a"].home / "warren-node.log").read_text(errors="replace").count(
                "refused a call of a replaced control plane")
            print(f"node a refused {refused} calls of the replaced leader")
            c.server = follower
        finally:
            if leader.proc.poll() is None:
                leader.proc.send_signal(signal.SIGCONT)
                leader.stop()
            if c.server is not follower:
                follower.stop()


def test_the_e2b_and_sandbox_fusion_front_doors_serve_through_the_server(images, tmp_path):
    """`warren server --e2b-api --e2b-sandbox --sandbox-fusion`: the real E2B
    SDK and SandboxFusion's protocol reach sandboxes on the nodes."""
    from conftest import free_port
    from debian import debian_archive
    from test_e2b import CLIENT, run_script, venv

    api, sbx, fusion = free_port(), free_port(), free_port()
    image = "deb-front:1"
    args = ["--e2b-api", f"127.0.0.1:{api}", "--e2b-sandbox", f"127.0.0.1:{sbx}",
            "--sandbox-fusion", f"127.0.0.1:{fusion}", "--sandbox-fusion-image", image]
    with Cluster(images, nodes=[dict(name="a"), dict(name="b")], server_args=args) as c:
        # Templates are read at start: written into the home before it.
        c.server.cli("image", "import", str(debian_archive(tmp_path)), "--name", image, timeout=300)
        (c.server.home / "e2b-templates.toml").write_text(f'[templates]\nbase = "{image}"\n')
        c.server.stop()
        c.server.start()
        c.server.e2b_env = {
            "E2B_API_URL": f"http://127.0.0.1:{api}",
            "E2B_SANDBOX_URL": f"http://127.0.0.1:{sbx}",
            "E2B_API_KEY": "e2b_" + c.server.token,
        }
        out = run_script(c.server, venv("2.63.0"), [CLIENT, "sync", "base"], "e2b 2.63.0 through warren server")
        assert "step: create" in out, out
        r = httpx.post(f"http://127.0.0.1:{fusion}/run_code", json={"code": "import socket; print(socket.gethostname())"},
                       timeout=120)
        assert r.status_code == 200 and r.json()["status"] == "Success", r.text
        r = httpx.post(f"http://127.0.0.1:{fusion}/run_jupyter", json={"cells": ["x = 6 * 7", "x"]}, timeout=120)
        assert r.status_code == 200 and r.json()["status"] == "Success", r.text
        assert r.json()["cells"][1]["display"] == [{"text/plain": "42"}], r.text
        # Every sandbox they made ran on a node, and none is left.
        made = c.server.http.get("/v1/sandboxes", params={"all": "true"}).json()
        assert made and {s["node"] for s in made} <= {"a", "b"}, [(s["id"], s["node"]) for s in made]
        wait_until("the front doors' sandboxes to be gone", lambda: not [
            s for s in c.server.http.get("/v1/sandboxes").json() if s["state"] not in ("destroyed", "failed")])


@pytest.mark.serial  # host network namespaces and addresses on lo; a partition timed in seconds
def test_nodes_in_network_namespaces_of_their_own_as_if_on_other_hosts(images):
    """Each node agent in a network namespace with its own address, the
    server on an address of this machine that both reach through their
    default route: placement, exec, files and a port through the server to
    either node; a partition (the link of one taken down) makes that node
    lost and its sandboxes with it; the link back, it is reconciled."""
    import random
    import uuid

    from cluster import NetHost, ServerAddress

    tag, subnet = uuid.uuid4().hex[:4], random.randint(64, 250)
    made = []
    try:
        server_at = ServerAddress(tag, subnet)
        made.append(server_at)
        hosts = {name: NetHost(tag, i, subnet) for i, name in ((1, "a"), (2, "b"))}
        made += hosts.values()
        with Cluster(images, server_host=server_at.address) as c:
            for name, host in hosts.items():
                c.add_node(name, host=host)
            c.server.cli("image", "import", str(images["oci"]), "--name", BB)
            nodes = c.server.nodes()
            for name, host in hosts.items():
                assert nodes[name]["url"] == f"https://{host.address}:{c.nodes[name].port}", nodes[name]
            # Most room left: the second lands on the other node.
            cmd = ["sh", "-c", "httpd -f -p 8080 -h /etc"]
            first = create(c, cpu=0.5, memory="64M", cmd=cmd)
            second = create(c, cpu=0.5, memory="64M", cmd=cmd)
            assert {first["node"], second["node"]} == {"a", "b"}, (first["node"], second["node"])
            for s in (first, second):
                exit_ev, out, _, _ = c.server.exec(s["id"], ["sh", "-c", "echo $((6*7))"])
                assert exit_ev and exit_ev["code"] == 0 and out == b"42\n", (s["node"], exit_ev, out)
                r = c.server.http.put(f"/v1/sandboxes/{s['id']}/files", params={"path": "/tmp/x"}, content=b"x" * 5000)
                assert r.status_code in (200, 204), r.text
                assert c.server.http.get(f"/v1/sandboxes/{s['id']}/files", params={"path": "/tmp/x"}).content == b"x" * 5000
                body = wait_until("the port to answer", lambda s=s: (
                    lambda r: r if r.status_code == 200 else None)(
                        c.server.http.get(f"/v1/sandboxes/{s['id']}/ports/8080/passwd")))
                assert b"root:" in body.content
            on_a = first if first["node"] == "a" else second
            # A partition: node a's link goes down. It runs on, unreachable.
            cut = time.time()
            hosts["a"].cut()
            wait_until("node a's sandbox to be lost", lambda: c.server.http.get(
                f"/v1/sandboxes/{on_a['id']}").json()["state"] == "lost", timeout=25)
            assert c.server.nodes()["a"]["state"] == "lost"
            took = time.time() - cut
            print(f"partition: {took:.2f} s from the link going down to the node's sandbox lost")
            assert took <= 15, took
            assert c.nodes["a"].proc.poll() is None, "the partitioned node keeps running"
            # Healed: the node heartbeats again and gives up what the
            # control plane declared lost.
            hosts["a"].cut(down=False)
            wait_until("node a to be ready again", lambda: c.server.nodes()["a"]["state"] == "ready", timeout=30)
            wait_until("node a to remove its lost sandbox", lambda: c.nodes["a"].leftovers() == [], timeout=30)
            drop(c, first["id"] if first is not on_a else second["id"])
    finally:
        for m in made:
            m.remove()


def test_the_one_host_cluster_demo_runs_as_written():
    """scripts/cluster-demo.sh, as docs/cluster.md gives it: PostgreSQL, a
    server and two nodes on this host, sandboxes spread over both; Ctrl-C
    leaves nothing behind."""
    import os
    import re
    import threading

    from conftest import ROOT, WARREN

    proc = subprocess.Popen(["bash", str(ROOT / "scripts" / "cluster-demo.sh")], cwd=ROOT,
                            env={**os.environ, "WARREN_BIN": str(WARREN)}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(l.decode(errors="replace") for l in proc.stdout), daemon=True)
    reader.start()
    try:
        wait_until("the demo's cluster", lambda: any("Press Ctrl-C" in l for l in lines) or proc.poll() is not None,
                   timeout=120)
        out = "".join(lines)
        assert "Press Ctrl-C" in out, out
        table = out[out.index("ID  "):]
        nodes = {row.split()[3] for row in table.splitlines()[1:5]}
        assert nodes == {"a", "b"}, table
        home = re.search(r"WARREN_HOME=(\S+)/server", out).group(1)
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=60) == 130
        reader.join(timeout=10)
        assert f"stopped; {home} removed" in "".join(lines), "".join(lines)
        assert not Path(home).exists()
        pattern = f"cluster-demo-{proc.pid}-*"
        left = [*Path("/sys/fs/cgroup").glob(f"*/warren/{pattern}"), *Path("/sys/fs/cgroup/warren").glob(pattern)]
        assert left == [], left
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)

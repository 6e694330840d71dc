"""A crash (abort, as kill -9 or a power cut would) injected at each step of
create and destroy leaves, after a restart, either a complete sandbox or
nothing at all on the host."""

import contextlib
import time
from pathlib import Path

import httpx
import pytest

from conftest import own_daemon
from helpers import host_traces, state_root

CREATE_POINTS = ["create:claimed", "create:prepared", "create:spawned", "create:recorded"]
DESTROY_POINTS = ["destroy:stopping", "destroy:killed", "destroy:cgroups", "destroy:trashed"]


@pytest.fixture
def crashing(images):
    with contextlib.ExitStack() as stack:
        yield lambda point: stack.enter_context(own_daemon(images, env={"WARREN_CRASH_AT": point}))


def restart_clean(w):
    assert w.proc.wait(timeout=10) != 0, "the daemon should have aborted"
    w.extra_env = {}
    w.start()


def host_sandbox_ids(w):
    ids = {p.name for p in (w.home / "sandboxes").iterdir()}
    ids |= {p.name for p in state_root(w.home).iterdir()}
    # Below this daemon's own cgroup parent: other daemons' sandboxes come
    # and go beside it.
    for ctrl in [Path("/sys/fs/cgroup"), *Path("/sys/fs/cgroup").iterdir()]:
        d = ctrl / w.cgroup_parent
        if d.is_dir():
            ids |= {p.name for p in d.iterdir() if p.is_dir() and p.name.startswith("sbx-")}
    return ids


@pytest.mark.parametrize("point", CREATE_POINTS)
def test_crash_during_create_leaves_all_or_nothing(crashing, point):
    w = crashing(point)
    before = host_sandbox_ids(w)
    with pytest.raises(httpx.HTTPError):
        w.http.post("/v1/sandboxes", json={"image": "busybox:latest", "cpu": 0.1, "memory": "32M"})
    restart_clean(w)
    # The restart answers before an interrupted create's remains are gone
    # (removing them runs beside the API and can take seconds on a busy
    # host); its record is `creating` until then.
    deadline = time.time() + 10
    while True:
        rows = w.http.get("/v1/sandboxes", params={"all": "true"}).json()
        if all(r["state"] != "creating" for r in rows):
            break
        assert time.time() < deadline, rows
        time.sleep(0.05)
    for row in rows:
        if row["state"] == "running":
            ex, _, _, _ = w.exec(row["id"], ["true"])
            assert ex["code"] == 0
            w.destroy(row["id"])
        else:
            assert row["state"] in ("failed", "lost"), row
        assert host_traces(w, row["id"]) == []
    # Nothing without a record either: the sweep removed it.
    assert host_sandbox_ids(w) - before == set()
    # No uid range is claimed for a sandbox directory of this home that is gone.
    for claim in Path("/run/warren/uids").iterdir():
        owner = Path(claim.read_text())
        if owner.parent == w.home / "sandboxes":
            assert owner.exists(), f"{claim} still claims the range of {owner}"
    # The node is usable and its capacity was given back.
    sid = w.create(cpu=0.1, memory="32M")["id"]
    w.destroy(sid)
    assert w.http.get("/v1/nodes").json()[0]["allocated"]["slots"] == 0


@pytest.mark.parametrize("point", DESTROY_POINTS)
def test_crash_during_destroy_finishes_on_restart(crashing, point):
    w = crashing(point)
    sid = w.create(cpu=0.1, memory="32M")["id"]
    w.exec(sid, ["sh", "-c", "sleep 1000 &"])
    with pytest.raises(httpx.HTTPError):
        w.destroy(sid)
    restart_clean(w)
    deadline = time.time() + 10
    while (s := w.http.get(f"/v1/sandboxes/{sid}").json())["state"] not in ("destroyed", "lost"):
        assert time.time() < deadline, s
        time.sleep(0.05)
    assert s["state"] == "destroyed" and s["reason"] == "user_deleted", s
    assert host_traces(w, sid) == []
    # The directory a destroy moved into the trash is deleted behind it,
    # by the crashed daemon's successor when the crash came first.
    deadline = time.time() + 10
    while left := list((w.home / "trash").iterdir()):
        assert time.time() < deadline, left
        time.sleep(0.05)

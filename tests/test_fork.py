"""Forks: N sandboxes from one sandbox's filesystem as it is now. Children
see the source's files (deleted image files, opaque directories, owners
and modes included), each writes alone (unseen by the source and its
siblings), later source writes do not reach them, they outlive their
source, and the fork layer leaves the disk with its last child. Bad input
changes nothing."""

import asyncio
import json
import signal
from pathlib import Path

import pytest

import warren as sdk
from conftest import own_daemon
from helpers import error_body, sh, sh_ok, uniq, wait_until

# Runs again with the node over HTTP: fork_layer, release_fork_layer (docs/testing.md).
pytestmark = pytest.mark.contract

# What the source does to its filesystem before it is forked: new files
# (one owned by uid 1000, one setuid, a hard link, a symlink, a sparse
# file), a deleted image file (a whiteout), a directory of the image
# replaced by a new one (opaque), a file of the image changed.
SOURCE_CHANGES = """
set -e
mkdir -p /work/sub
echo source-a > /work/a
echo owned > /work/owned && chown 1000:1000 /work/owned && chmod 640 /work/owned
echo suid > /work/suid && chmod 4755 /work/suid
ln /work/a /work/hard
ln -s a /work/link
truncate -s 100M /work/sparse
echo tail >> /work/sparse
rm /etc/hostname
rm -rf /usr && mkdir -p /usr/new && echo fresh > /usr/new/f
echo 'extra:x:1001:1001::/:/bin/sh' >> /etc/passwd
"""

CHILD_VIEW = (
    "cat /work/a; stat -c '%u:%g %a' /work/owned /work/suid; "
    "stat -c %h /work/a; readlink /work/link; stat -c %s /work/sparse; "
    "test -e /etc/hostname && echo hostname-there || echo hostname-gone; "
    "ls /usr; cat /usr/new/f; tail -n1 /etc/passwd; cat /home/user/.keep 2>/dev/null; "
    "stat -c '%u:%g' /home/user"
)
EXPECTED_VIEW = (
    "source-a\n1000:1000 640\n0:0 4755\n2\na\n104857605\nhostname-gone\nnew\nfresh\n"
    "extra:x:1001:1001::/:/bin/sh\n1000:1000\n"
)


def fork(w, sid, **body):
    body.setdefault("count", 1)
    return w.http.post(f"/v1/sandboxes/{sid}/fork", json=body)


def layers_on_disk(w):
    forks = w.home / "forks"
    return sorted(p.name for p in forks.iterdir()) if forks.exists() else []


@pytest.mark.smoke  # fork
def test_children_start_from_the_source_and_write_alone(warren):
    w = warren
    task = uniq("fork")
    src = w.create(labels={"task": task, "keep": "yes"}, memory="64M", ttl="20m")["id"]
    sh_ok(w, src, SOURCE_CHANGES)
    assert sh_ok(w, src, CHILD_VIEW) == EXPECTED_VIEW
    r = fork(w, src, count=3, labels={"branch": "b", "keep": "over"}, ttl="10m")
    assert r.status_code == 201, r.text
    children = r.json()
    assert len(children) == 3 and len({c["id"] for c in children}) == 3
    ids = [c["id"] for c in children]
    layer = children[0]["spec"]["fork"]["layers"][0]
    assert layer in layers_on_disk(w)
    for c in children:
        assert c["state"] == "running"
        assert c["spec"]["fork"] == {"source": src, "layers": [layer]}
        labels = c["spec"]["labels"]
        assert labels == {"task": task, "keep": "over", "branch": "b", "warren.dev/fork-of": src}, labels
        assert c["spec"]["memory"] == 64 << 20 and c["spec"]["ttl"] == "10m"
        assert "request_id" not in c["spec"]
        # The source's files, with their owners, modes, links and holes; a
        # deleted image file stays deleted, a replaced directory replaced.
        assert sh_ok(w, c["id"], CHILD_VIEW) == EXPECTED_VIEW
        # Each child its own writer.
        sh_ok(w, c["id"], f"echo {c['id']} > /work/mine; echo changed-in-{c['id']} > /work/a; rm /work/owned")
    for c in ids:
        mine = sh_ok(w, c, "cat /work/mine /work/a; test -e /work/owned || echo no-owned")
        assert mine == f"{c}\nchanged-in-{c}\nno-owned\n", mine
    # The source saw none of it; what it writes now, no child sees.
    assert sh_ok(w, src, "cat /work/a; test -e /work/mine || echo no-mine; stat -c %u /work/owned") == (
        "source-a\nno-mine\n1000\n"
    )
    sh_ok(w, src, "echo later > /work/later; echo source-b > /work/a")
    for c in ids:
        out = sh_ok(w, c, "test -e /work/later && echo later-leaked || echo no-later; cat /work/a")
        assert out == f"no-later\nchanged-in-{c}\n", out
    # Events: the children were forked, the source says into which.
    first = w.http.get(f"/v1/sandboxes/{ids[0]}").json()["events"][0]
    assert (first["state"], first["reason"]) == ("creating", "forked"), first
    noted = [e for e in w.http.get(f"/v1/sandboxes/{src}").json()["events"] if e["reason"] == "forked"]
    assert len(noted) == 1 and all(c in noted[0]["message"] for c in ids), noted
    listed = w.http.get("/v1/sandboxes", params={"label": f"warren.dev/fork-of={src}"}).json()
    assert sorted(s["id"] for s in listed) == sorted(ids)
    # Children outlive their source; the layer goes with the last child.
    assert w.destroy(src).status_code == 200
    for c in ids:
        assert sh_ok(w, c, "cat /work/mine") == f"{c}\n"
    for c in ids[:2]:
        assert w.destroy(c).status_code == 200
    assert layer in layers_on_disk(w)
    assert sh_ok(w, ids[2], "cat /usr/new/f") == "fresh\n"
    assert w.destroy(ids[2]).status_code == 200
    assert layer not in layers_on_disk(w)


def test_forks_of_forks_paused_sources_and_child_sizes(warren):
    w = warren
    src = w.create(labels={"task": uniq("fork")})["id"]
    sh_ok(w, src, "echo gen0 > /gen0")
    assert w.http.post(f"/v1/sandboxes/{src}/pause").status_code == 200
    r = fork(w, src, count=1, disk="64M", memory="32M")
    assert r.status_code == 201, r.text
    child = r.json()[0]
    # A paused source stays paused; the child has its own disk and memory.
    assert w.http.get(f"/v1/sandboxes/{src}").json()["state"] == "paused"
    assert child["resources"]["disk"] == 64 << 20 and child["resources"]["memory"] == 32 << 20
    sh_ok(w, child["id"], "echo gen1 > /gen1; rm /gen0; echo gen1-b > /gen0b")
    # A child with a disk of its own cannot be forked yet (its changes are
    # on its own file system): refused, clearly, and nothing is made.
    r = fork(w, child["id"])
    assert r.status_code == 400 and "disk limit" in error_body(r)["message"], r.text
    # A fork of a fork: built on both layers.
    plain = fork(w, src).json()[0]
    sh_ok(w, plain["id"], "echo gen1 > /gen1; rm /gen0")
    r = fork(w, plain["id"], count=2)
    assert r.status_code == 201, r.text
    grand = r.json()
    layers = grand[0]["spec"]["fork"]["layers"]
    assert layers[1:] == plain["spec"]["fork"]["layers"] and len(layers) == 2
    for g in grand:
        out = sh_ok(w, g["id"], "cat /gen1; test -e /gen0 && echo gen0-there || echo gen0-gone")
        assert out == "gen1\ngen0-gone\n", out
    # Its parent and grandparent go; the grandchildren keep both layers.
    for s in (plain["id"], src, child["id"]):
        assert w.destroy(s).status_code == 200
    assert set(layers) <= set(layers_on_disk(w))
    assert sh_ok(w, grand[0]["id"], "cat /gen1") == "gen1\n"
    for g in grand:
        assert w.destroy(g["id"]).status_code == 200
    assert not set(layers) & set(layers_on_disk(w))


def test_bad_input_changes_nothing(warren):
    w = warren
    src = w.create(labels={"task": uniq("fork")})["id"]
    before = (layers_on_disk(w), w.http.get("/v1/sandboxes", params={"label": f"warren.dev/fork-of={src}"}).json())
    cases = [
        ({"count": 0}, 400, "between 1 and 256"),
        ({"count": 257}, 400, "between 1 and 256"),
        ({"count": 1, "memory": "1K"}, 400, "memory"),
        ({"count": 1, "image": "busybox:latest"}, 400, "unknown field"),
        ({"count": 1, "labels": {"bad key!": "x"}}, 400, "label"),
    ]
    for body, status, words in cases:
        r = w.http.post(f"/v1/sandboxes/{src}/fork", json=body)
        assert r.status_code == status, (body, r.text)
        assert words in error_body(r)["message"], (body, r.text)
    r = fork(w, "sbx-000000000000")
    assert r.status_code == 404, r.text
    # A create cannot claim to be a fork's child.
    r = w.http.post("/v1/sandboxes", json={"image": "busybox:latest", "fork": {"source": src, "layers": ["fk-000000000000"]}})
    assert r.status_code == 400 and "fork" in error_body(r)["message"], r.text
    after = (layers_on_disk(w), w.http.get("/v1/sandboxes", params={"label": f"warren.dev/fork-of={src}"}).json())
    assert after == before
    w.destroy(src)
    r = fork(w, src)
    assert r.status_code == 409 and "running or paused" in error_body(r)["message"], r.text


def test_cli_and_sdk(warren):
    w = warren
    src = w.create(labels={"task": uniq("fork")}, lease="30s")["id"]
    sh_ok(w, src, "echo cli > /from-source")
    p = w.cli("fork", src, "--count", "2", "--label", "via=cli", "--lease", "20s")
    ids = p.stdout.decode().split()
    assert len(ids) == 2 and all(i.startswith("sbx-") for i in ids), p.stdout
    for i in ids:
        info = w.http.get(f"/v1/sandboxes/{i}").json()
        assert info["spec"]["labels"]["via"] == "cli" and info["spec"]["lease"] == "20s"
        assert sh_ok(w, i, "cat /from-source") == "cli\n"
        w.destroy(i)
    bad = w.cli("fork", src, "--count", "0", check=False)
    assert bad.returncode != 0 and b"between 1 and 256" in bad.stderr, bad.stderr

    with sdk.Client(w.url, token=w.token) as client:
        source = client.sandboxes.get(src)
        kids = source.fork(2, labels={"via": "sdk"}, ttl=600)
        assert [k.state for k in kids] == ["running", "running"]
        assert all(k.info.spec.fork.source == src and k.labels["via"] == "sdk" for k in kids)
        assert all(k.exec("cat /from-source").stdout == b"cli\n" for k in kids)
        with pytest.raises(sdk.BadRequest):
            source.fork(0)
        with pytest.raises(TypeError):
            source.fork(1, image="busybox:latest")
        for k in kids:
            k.destroy()

    async def main():
        async with sdk.AsyncClient(w.url, token=w.token) as client:
            source = await client.sandboxes.get(src)
            kids = await source.fork(1, labels={"via": "async"})
            assert kids[0].info.spec.labels["warren.dev/fork-of"] == src
            assert (await kids[0].exec("cat /from-source")).stdout == b"cli\n"
            await kids[0].destroy()

    asyncio.run(main())
    w.destroy(src)


def test_children_and_their_layer_survive_a_restart(images):
    with own_daemon(images) as w:
        src = w.create()["id"]
        sh_ok(w, src, "echo before-crash > /kept")
        ids = [c["id"] for c in fork(w, src, count=2).json()]
        layer = w.http.get(f"/v1/sandboxes/{ids[0]}").json()["spec"]["fork"]["layers"][0]
        # A leftover no sandbox claims (a daemon that died mid-fork).
        stray = w.home / "forks" / "fk-strayleftove"
        stray.mkdir()
        (w.home / "forks" / "new-fk-halfmade").mkdir()
        w.stop(signal.SIGKILL)
        w.start()
        assert layers_on_disk(w) == [layer]
        for i in ids:
            assert sh_ok(w, i, "cat /kept") == "before-crash\n"
        w.destroy(src)
        w.destroy(ids[0])
        assert layers_on_disk(w) == [layer]
        w.destroy(ids[1])
        assert layers_on_disk(w) == []

"""Volumes: named storage of a fixed size on a node, kept across sandboxes
(`warren volume`, `/v1/volumes`, `create -v NAME:/PATH[:ro]`)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import WARREN, own_daemon
from helpers import error_body, sh, sh_ok


def mounts_under(path):
    """Mount points of this (the host's) namespace below `path`."""
    return [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
            if line.split()[4].startswith(str(path))]


def volumes(w):
    return {v["name"]: v for v in json.loads(w.cli("volume", "ls", "--json").stdout)}


def test_a_volume_keeps_files_across_sandboxes_one_writer_or_many_readers(images):
    with own_daemon(images) as w:
        out = w.cli("volume", "create", "ds", "--size", "64M").stdout.decode()
        assert out.startswith("ds 64.0 MiB on "), out
        writer = w.create(volumes=[{"name": "ds", "path": "/data"}])
        # The volume's root is the sandbox root's, and only the volume's
        # (no lost+found); what is written there is bounded by its size.
        assert sh_ok(w, writer["id"], "stat -c %u /data; ls -A /data").split() == ["0"]
        sh_ok(w, writer["id"], "echo kept > /data/f && mkdir /data/d && echo deep > /data/d/g")
        ev, _, err = sh(w, writer["id"], "dd if=/dev/zero of=/data/big bs=1M count=100")
        assert ev["code"] != 0 and "No space left" in err, err
        sh_ok(w, writer["id"], "rm /data/big")
        assert volumes(w)["ds"]["mounted_by"] == [writer["id"]]
        # One read-write mount is the only one.
        for ro in (False, True):
            r = w.http.post("/v1/sandboxes", json={"image": "busybox:latest",
                                                    "volumes": [{"name": "ds", "path": "/x", "read_only": ro}]})
            assert r.status_code == 409 and writer["id"] in error_body(r)["message"], r.text
        r = w.http.delete("/v1/volumes/ds")
        assert r.status_code == 409, r.text
        w.destroy(writer["id"])

        # Readers share it, and cannot write.
        readers = [w.create(volumes=[{"name": "ds", "path": "/mnt/ds", "read_only": True}]) for _ in range(2)]
        for s in readers:
            assert sh_ok(w, s["id"], "cat /mnt/ds/f /mnt/ds/d/g").split() == ["kept", "deep"]
            ev, _, err = sh(w, s["id"], "touch /mnt/ds/new")
            assert ev["code"] != 0 and "Read-only" in err, err
        assert sorted(volumes(w)["ds"]["mounted_by"]) == sorted(s["id"] for s in readers)
        r = w.http.post("/v1/sandboxes", json={"image": "busybox:latest", "volumes": [{"name": "ds", "path": "/x"}]})
        assert r.status_code == 409, r.text
        # The CLI's -v, as docker's.
        sid = w.cli("create", "--image", "busybox:latest", "-v", "ds:/in:ro").stdout.decode().strip()
        assert sh_ok(w, sid, "cat /in/f") == "kept\n"
        for s in [*readers, {"id": sid}]:
            w.destroy(s["id"])

        # Kept across a restart of the daemon, which unmounts what it
        # mounted when it stops.
        w.stop()
        assert mounts_under(w.home) == []
        w.start()
        s = w.create(volumes=[{"name": "ds", "path": "/data"}])
        assert sh_ok(w, s["id"], "cat /data/d/g") == "deep\n"
        w.destroy(s["id"])
        assert volumes(w)["ds"]["used"] > 0
        # Removed, nothing is left on the host.
        assert w.cli("volume", "rm", "ds").stdout.decode() == "ds removed\n"
        assert mounts_under(w.home / "volumes") == []
        assert list((w.home / "volumes").iterdir()) == []


def test_bad_volume_requests_are_refused_and_change_nothing(images):
    with own_daemon(images) as w:
        w.cli("volume", "create", "v1", "--size", "16M")
        for body in ({"name": "Bad Name", "size": "1G"}, {"name": "ok", "size": "1M"},
                     {"name": "ok", "size": "1G", "extra": 1}):
            r = w.http.post("/v1/volumes", json=body)
            assert r.status_code == 400, (body, r.text)
        r = w.http.post("/v1/volumes", json={"name": "v1", "size": "16M"})
        assert r.status_code == 409 and "already exists" in error_body(r)["message"], r.text
        before = w.http.get("/v1/sandboxes").json()
        for mounts, status in (([{"name": "v1", "path": "relative"}], 400),
                               ([{"name": "v1", "path": "/proc/x"}], 400),
                               ([{"name": "v1", "path": "/a/../b"}], 400),
                               ([{"name": "v1", "path": "/a"}, {"name": "v1", "path": "/b"}], 400),
                               ([{"name": "none", "path": "/a"}], 404)):
            r = w.http.post("/v1/sandboxes", json={"image": "busybox:latest", "volumes": mounts})
            assert r.status_code == status, (mounts, r.text)
        assert w.http.get("/v1/sandboxes").json() == before
        p = w.cli("create", "--image", "busybox:latest", "-v", "v1", check=False)
        assert p.returncode != 0 and b"NAME:/PATH" in p.stderr, p.stderr
        assert list(volumes(w)) == ["v1"]
        assert w.http.delete("/v1/volumes/none").status_code == 404


def test_a_symlink_in_the_image_cannot_send_a_mount_out_of_the_sandbox(images):
    with own_daemon(images) as w:
        w.cli("volume", "create", "v", "--size", "16M")
        src = w.create()
        # An image whose /evil points at the host's idea of /etc.
        sh_ok(w, src["id"], "ln -s /etc /evil")
        w.cli("commit", src["id"], "evil:1")
        w.destroy(src["id"])
        s = w.create(image="evil:1", volumes=[{"name": "v", "path": "/evil/warren-volume-test"}])
        sh_ok(w, s["id"], "touch /etc/warren-volume-test/inside")
        assert not Path("/etc/warren-volume-test").exists()
        w.destroy(s["id"])
        s = w.create(volumes=[{"name": "v", "path": "/v"}])
        assert sh_ok(w, s["id"], "ls /v") == "inside\n"
        w.destroy(s["id"])


def test_the_sdk_makes_mounts_and_removes_volumes(images):
    import warren as sdk

    with own_daemon(images) as w, sdk.Client(w.url, token=w.token) as c:
        v = c.volumes.create("cache", "32M")
        assert (v.name, v.size) == ("cache", 32 << 20)
        with c.sandbox(image="busybox:latest", volumes=["cache:/cache"]) as sb:
            sb.exec(["sh", "-c", "echo hi > /cache/x"], check=True)
            assert sb.info.spec.volumes == [sdk.VolumeMount("cache", "/cache")]
            assert [x.mounted_by for x in c.volumes.list()] == [[sb.id]]
            try:
                c.volumes.remove("cache")
                raise AssertionError("a mounted volume was removed")
            except sdk.Conflict:
                pass
        with c.sandbox(image="busybox:latest", volumes=[sdk.VolumeMount("cache", "/c", read_only=True)]) as sb:
            assert sb.exec(["cat", "/c/x"]).stdout_text == "hi\n"
        assert c.volumes.remove("cache").name == "cache"
        assert c.volumes.list() == []


def test_the_docs_examples_run_as_written(images):
    text = (Path(__file__).parent.parent / "docs" / "volumes.md").read_text()
    shell = re.search(r"^```sh\n(.*?)^```", text, re.M | re.S).group(1)
    python = re.search(r"^```python\n(.*?)^```", text, re.M | re.S).group(1)
    with own_daemon(images) as w:
        env = {**w.env(), "PATH": f"{WARREN.parent}:{os.environ['PATH']}"}
        p = subprocess.run(["sh", "-ec", shell], env=env, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        assert "rows\n" in p.stdout and "datasets removed" in p.stdout, p.stdout
        p = subprocess.run([sys.executable, "-c", python], env=env, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0 and p.stdout.split() == ["warm"], (p.stdout, p.stderr)
        assert volumes(w) == {}

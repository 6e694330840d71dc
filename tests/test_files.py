"""PUT/GET /v1/sandboxes/{id}/files and `warren cp`: round trips and containment."""

import hashlib
import os
import re
import secrets
from pathlib import Path


import pytest

from helpers import error_body, make_tar, read_tar, sh, sh_ok, uniq

# Runs again with the node over HTTP: write_file, read_file, path_op, watch (docs/testing.md).
pytestmark = pytest.mark.contract

TAR = {"content-type": "application/x-tar"}


def put(warren, sid, path, data, mode=None, headers=None):
    params = {"path": path}
    if mode:
        params["mode"] = mode
    # A fresh connection per upload: a rejected upload can leave a keep-alive
    # connection dead (see test_rejected_upload_keeps_connection_usable), and
    # that must not break the shared client the other checks use.
    with warren.client() as c:
        return c.put(f"/v1/sandboxes/{sid}/files", params=params, content=data, headers=headers)


def get(warren, sid, path):
    return warren.http.get(f"/v1/sandboxes/{sid}/files", params={"path": path})


def stat_mode(warren, sid, path):
    return sh_ok(warren, sid, f"stat -c %a {path}").strip()


def host_snapshot(paths):
    """Content hash (or absence) of host files, to prove they did not change."""
    out = {}
    for p in paths:
        p = Path(p)
        out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None
    return out


@pytest.mark.smoke  # files
def test_file_round_trip(warren, sandbox):
    sid = sandbox()["id"]
    data = secrets.token_bytes(1 << 20) + bytes(range(256))
    r = put(warren, sid, "/opt/deep/dir/blob.bin", data, mode="0755")
    assert r.status_code in (200, 201, 204), r.text
    r = get(warren, sid, "/opt/deep/dir/blob.bin")
    assert r.status_code == 200
    assert r.content == data
    assert stat_mode(warren, sid, "/opt/deep/dir/blob.bin") == "755"
    # The sandbox sees the same bytes.
    out = sh_ok(warren, sid, "sha256sum /opt/deep/dir/blob.bin")
    assert out.split()[0] == hashlib.sha256(data).hexdigest()

    r = put(warren, sid, "/tmp/secret", b"s3cret", mode="0600")
    assert r.status_code in (200, 201, 204)
    assert stat_mode(warren, sid, "/tmp/secret") == "600"
    assert get(warren, sid, "/tmp/secret").content == b"s3cret"
    # Empty file.
    assert put(warren, sid, "/tmp/empty", b"").status_code in (200, 201, 204)
    r = get(warren, sid, "/tmp/empty")
    assert r.status_code == 200 and r.content == b""


def test_file_read_of_image_and_sandbox_written_files(warren, sandbox):
    sid = sandbox()["id"]
    sh_ok(warren, sid, "printf 'made inside\\n' > /root/inside.txt")
    assert get(warren, sid, "/root/inside.txt").content == b"made inside\n"
    assert get(warren, sid, "/etc/hostname").content == b"warren-busybox\n"


def test_file_mode_is_exactly_as_requested(warren, sandbox):
    sid = sandbox()["id"]
    for mode in ("0666", "0777", "0640"):
        r = put(warren, sid, f"/tmp/m{mode}", b"x", mode=mode)
        assert r.status_code in (200, 201, 204)
        assert stat_mode(warren, sid, f"/tmp/m{mode}") == mode.lstrip("0"), mode


def test_file_overwrite_applies_new_mode(warren, sandbox):
    sid = sandbox()["id"]
    assert put(warren, sid, "/tmp/script.sh", b"#!/bin/sh\necho v1\n", mode="0600").status_code == 204
    assert put(warren, sid, "/tmp/script.sh", b"#!/bin/sh\necho v2\n", mode="0755").status_code == 204
    assert get(warren, sid, "/tmp/script.sh").content == b"#!/bin/sh\necho v2\n"
    assert stat_mode(warren, sid, "/tmp/script.sh") == "755"


def test_directory_upload_and_download_as_tar(warren, sandbox):
    sid = sandbox()["id"]
    entries = [
        ("proj", "dir", None, 0o755),
        ("proj/a.txt", "file", b"alpha\n", 0o644),
        ("proj/bin", "dir", None, 0o750),
        ("proj/bin/run.sh", "file", b"#!/bin/sh\necho run\n", 0o755),
        ("proj/bin/data.bin", "file", bytes(range(256)) * 10, 0o600),
        ("proj/link", "symlink", "a.txt", 0o777),
        ("proj/empty", "dir", None, 0o700),
    ]
    r = put(warren, sid, "/work/up", make_tar(entries), headers=TAR)
    assert r.status_code in (200, 201, 204), r.text
    out = sh_ok(
        warren,
        sid,
        "cd /work/up/proj && cat a.txt && sh bin/run.sh && readlink link && cat link && "
        "stat -c '%n %a' a.txt bin bin/run.sh bin/data.bin empty",
    )
    assert out.splitlines() == [
        "alpha",
        "run",
        "a.txt",
        "alpha",
        "a.txt 644",
        "bin 750",
        "bin/run.sh 755",
        "bin/data.bin 600",
        "empty 700",
    ]

    r = get(warren, sid, "/work/up")
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/x-tar"
    got = read_tar(r.content)
    want = {
        "proj": ("dir", None, 0o755),
        "proj/a.txt": ("file", b"alpha\n", 0o644),
        "proj/bin": ("dir", None, 0o750),
        "proj/bin/run.sh": ("file", b"#!/bin/sh\necho run\n", 0o755),
        "proj/bin/data.bin": ("file", bytes(range(256)) * 10, 0o600),
        "proj/link": ("symlink", "a.txt", None),
        "proj/empty": ("dir", None, 0o700),
    }
    assert got == want


def test_warren_cp_both_ways(warren, sandbox, tmp_path):
    sid = sandbox()["id"]
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_bytes(b"a\n")
    (src / "sub" / "b.bin").write_bytes(bytes(range(256)))
    (src / "tool").write_bytes(b"#!/bin/sh\necho tool\n")
    os.chmod(src / "tool", 0o755)
    os.symlink("a.txt", src / "ln")

    # File, both ways.
    warren.cli("cp", str(src / "tool"), f"{sid}:/usr/local/bin/tool")
    assert sh_ok(warren, sid, "tool") == "tool\n"
    back = tmp_path / "tool.back"
    warren.cli("cp", f"{sid}:/usr/local/bin/tool", str(back))
    assert back.read_bytes() == (src / "tool").read_bytes()
    # Copying into an existing local directory keeps the file name.
    d = tmp_path / "into"
    d.mkdir()
    warren.cli("cp", f"{sid}:/usr/local/bin/tool", str(d))
    assert (d / "tool").read_bytes() == (src / "tool").read_bytes()

    # A destination ending in / is a directory: the file keeps its name,
    # and missing local parents are made.
    warren.cli("cp", str(src / "a.txt"), f"{sid}:/tmp/")
    assert sh_ok(warren, sid, "cat /tmp/a.txt") == "a\n"
    warren.cli("cp", f"{sid}:/tmp/a.txt", str(tmp_path / "new" / "deeper") + "/")
    assert (tmp_path / "new" / "deeper" / "a.txt").read_bytes() == b"a\n"
    warren.cli("cp", f"{sid}:/tmp/a.txt", str(tmp_path / "made" / "b.txt"))
    assert (tmp_path / "made" / "b.txt").read_bytes() == b"a\n"
    # A directory named without the slash is a mistake the user can fix.
    p = warren.cli("cp", str(src / "a.txt"), f"{sid}:/tmp", check=False)
    err = p.stderr.decode()
    assert p.returncode != 0 and "is a directory" in err and not re.search(r"\b500\b", err), err

    # Directory, both ways.
    warren.cli("cp", str(src), f"{sid}:/data/dst")
    out = sh_ok(warren, sid, "cd /data/dst && cat a.txt && md5sum sub/b.bin && readlink ln && ./tool")
    assert out.splitlines()[0] == "a"
    assert out.splitlines()[1].split()[0] == hashlib.md5(bytes(range(256))).hexdigest()
    assert out.splitlines()[2:] == ["a.txt", "tool"]
    sh_ok(warren, sid, "echo new > /data/dst/sub/new.txt")
    dst = tmp_path / "back"
    warren.cli("cp", f"{sid}:/data/dst", str(dst))
    assert (dst / "a.txt").read_bytes() == b"a\n"
    assert (dst / "sub" / "b.bin").read_bytes() == bytes(range(256))
    assert (dst / "sub" / "new.txt").read_bytes() == b"new\n"
    assert os.readlink(dst / "ln") == "a.txt"
    assert os.stat(dst / "tool").st_mode & 0o777 == 0o755

    # A missing remote file is an error.
    p = warren.cli("cp", f"{sid}:/no/such/file", str(tmp_path / "x"), check=False)
    assert p.returncode != 0 and not (tmp_path / "x").exists()
    err = p.stderr.decode()
    assert err.count("/no/such/file") == 1 and "no such file" in err.lower(), err


def test_missing_file_is_404(warren, sandbox):
    sid = sandbox()["id"]
    r = get(warren, sid, "/no/such/file")
    assert r.status_code == 404
    error_body(r)
    r = warren.http.get("/v1/sandboxes/sbx-000000000000/files", params={"path": "/etc/passwd"})
    assert r.status_code == 404


def test_dotdot_path_stays_inside(warren, sandbox):
    sid = sandbox()["id"]
    host_passwd = Path("/etc/passwd").read_bytes()
    inside = get(warren, sid, "/etc/passwd").content
    assert b"user:x:1000:1000" in inside and inside != host_passwd
    for path in ("/../../etc/passwd", "/etc/../../../../etc/passwd", "/tmp/../../etc/passwd"):
        r = get(warren, sid, path)
        if r.status_code == 200:
            assert r.content == inside, path
        else:
            assert r.status_code == 400, (path, r.text)

    # Writing with '..' never reaches the host.
    name = uniq("warren-dotdot")
    before = host_snapshot([f"/tmp/{name}", "/etc/hostname"])
    for path in (f"/../../tmp/{name}", f"/tmp/../../../tmp/{name}"):
        r = put(warren, sid, path, b"pwned\n")
        assert r.status_code in (204, 400), (path, r.text)
    assert host_snapshot([f"/tmp/{name}", "/etc/hostname"]) == before
    assert not Path(f"/tmp/{name}").exists()


def test_relative_path_resolved_inside(warren, sandbox):
    sid = sandbox()["id"]
    r = get(warren, sid, "etc/passwd")
    if r.status_code == 200:
        assert r.content == get(warren, sid, "/etc/passwd").content
    else:
        assert r.status_code == 400, r.text
    name = uniq("warren-rel")
    cwd_target = Path.cwd() / "tmp" / name
    before = host_snapshot([f"/tmp/{name}", cwd_target, f"/tmp/{name}-2"])
    r = put(warren, sid, f"tmp/{name}", b"rel\n")
    assert r.status_code in (204, 400), r.text
    if r.status_code == 204:
        assert sh_ok(warren, sid, f"cat /tmp/{name}") == "rel\n"
    r = put(warren, sid, f"../tmp/{name}-2", b"rel\n")
    assert r.status_code in (204, 400), r.text
    assert host_snapshot([f"/tmp/{name}", cwd_target, f"/tmp/{name}-2"]) == before


def test_symlinks_planted_inside_stay_inside(warren, sandbox):
    sid = sandbox()["id"]
    name = uniq("warren-link")
    host_file = Path("/tmp") / f"{name}-hostfile"
    host_file.write_text("host original\n")
    watched = [
        f"/tmp/{name}-a",
        f"/tmp/{name}-b",
        f"/tmp/{name}-dir/c",
        f"/tmp/{name}-up/x",
        str(host_file),
        "/etc/hostname",
        "/etc/passwd",
    ]
    before = host_snapshot(watched)
    try:
        sh_ok(
            warren,
            sid,
            f"ln -s / /tmp/rootlink; ln -s /etc/.. /tmp/rootlink2; ln -s ../../../../.. /tmp/uplink; "
            f"ln -s /etc/hostname /tmp/final; ln -s {host_file} /tmp/final-host; ln -s /tmp /tmp/tmplink",
        )
        # Intermediate symlinks are followed, but inside the sandbox.
        assert put(warren, sid, f"/tmp/rootlink/tmp/{name}-a", b"A\n").status_code == 204
        assert put(warren, sid, f"/tmp/rootlink2/tmp/{name}-b", b"B\n").status_code == 204
        assert put(warren, sid, f"/tmp/uplink/tmp/{name}-dir/c", b"C\n").status_code == 204
        assert sh_ok(warren, sid, f"cat /tmp/{name}-a /tmp/{name}-b /tmp/{name}-dir/c") == "A\nB\nC\n"
        # Reading through them reads the sandbox's files.
        assert get(warren, sid, "/tmp/rootlink/etc/hostname").content == b"warren-busybox\n"
        assert get(warren, sid, "/tmp/uplink/etc/hostname").content == b"warren-busybox\n"

        # Writing through a final-component symlink is refused, target untouched.
        for link in ("/tmp/final", "/tmp/final-host"):
            r = put(warren, sid, link, b"pwned\n")
            assert r.status_code == 400, (link, r.text)
            error_body(r)
        assert sh_ok(warren, sid, "cat /etc/hostname") == "warren-busybox\n"
        # A symlink to a host path only ever resolves inside (where it dangles).
        r = get(warren, sid, "/tmp/final-host")
        assert r.status_code in (400, 404), r.text
        assert b"host original" not in r.content

        # Tar upload into a symlinked directory stays inside too.
        tar = make_tar([("x", "file", b"X\n", 0o644)])
        r = put(warren, sid, f"/tmp/uplink/tmp/{name}-up", tar, headers=TAR)
        assert r.status_code == 204, r.text
        assert sh_ok(warren, sid, f"cat /tmp/{name}-up/x") == "X\n"
        # A tar whose symlink entry points outside, followed by a file through it.
        tar = make_tar([("esc", "symlink", "/tmp", 0o777), ("esc/" + f"{name}-a", "file", b"E\n", 0o644)])
        r = put(warren, sid, "/tmp/tarlink", tar, headers=TAR)
        assert r.status_code in (204, 400), r.text

        assert host_snapshot(watched) == before
        assert host_file.read_text() == "host original\n"
    finally:
        host_file.unlink(missing_ok=True)


def test_read_through_final_symlink_follows_it_inside(warren, sandbox):
    sid = sandbox()["id"]
    sh_ok(warren, sid, "ln -s /etc/hostname /tmp/hn; ln -s /etc /tmp/etcdir")
    r = get(warren, sid, "/tmp/hn")
    assert r.status_code == 200, r.text
    assert r.content == b"warren-busybox\n"
    r = get(warren, sid, "/bin/sh")
    assert r.status_code == 200, r.text
    assert r.content == get(warren, sid, "/bin/busybox").content
    r = get(warren, sid, "/tmp/etcdir")
    assert r.status_code == 200, r.text
    assert "hostname" in read_tar(r.content)


def test_tar_entries_escaping_are_refused(warren, sandbox):
    sid = sandbox()["id"]
    name = uniq("warren-tar")
    before = host_snapshot([f"/tmp/{name}", f"/{name}"])
    for entry in (f"../../../../tmp/{name}", f"a/../../{name}", f"/tmp/{name}"):
        tar = make_tar([(entry, "file", b"evil\n", 0o644)])
        r = put(warren, sid, "/tmp/untar", tar, headers=TAR)
        assert r.status_code == 400, (entry, r.text)
        assert error_body(r)["code"]
    assert host_snapshot([f"/tmp/{name}", f"/{name}"]) == before
    ev, out, _ = sh(warren, sid, f"find / -xdev -name '{name}*'")
    assert out == "", out
    # A refused upload takes back the directories it made (here /tmp/untar
    # and the entries' parents), and the files it had written before the
    # refused entry.
    tar = make_tar([("d/e/f", "file", b"ok\n", 0o644), ("../../escape", "file", b"evil\n", 0o644)])
    r = put(warren, sid, "/tmp/untar/deeper", tar, headers=TAR)
    assert r.status_code == 400, r.text
    assert sh_ok(warren, sid, "ls -d /tmp/untar 2>/dev/null; echo end") == "end\n"


def test_files_of_destroyed_sandbox_are_409(warren):
    sid = warren.create()["id"]
    warren.destroy(sid)
    r = get(warren, sid, "/etc/passwd")
    assert r.status_code == 409, r.text
    r = put(warren, sid, "/tmp/x", b"x")
    assert r.status_code == 409, r.text


def test_rejected_upload_keeps_connection_usable(warren, sandbox):
    """After a rejected upload whose body was fully sent, the server either answers the
    next request on the same connection or says `Connection: close` on the rejection."""
    import socket

    sid = sandbox()["id"]
    body = b"x" * 100_000
    head = (
        f"PUT /v1/sandboxes/{sid}/files?path=../bad/x HTTP/1.1\r\nHost: warren\r\n"
        f"Authorization: Bearer {warren.token}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    follow = b"GET /healthz HTTP/1.1\r\nHost: warren\r\n\r\n"
    bad = []
    for i in range(200):
        with socket.create_connection(("127.0.0.1", warren.port), timeout=10) as s:
            s.sendall(head + body + follow)
            data = b""
            while not (data.count(b"HTTP/1.1 ") >= 2 and data.endswith(b"ok\n")):
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        first = data.split(b"\r\n\r\n", 1)[0].lower()
        assert first.startswith(b"http/1.1 400"), data[:200]
        answered = data.count(b"HTTP/1.1 ") >= 2
        if not answered and b"connection: close" not in first:
            bad.append(i)
    assert bad == [], f"{len(bad)}/200 connections were closed after the 400 without 'Connection: close'"


# ---------------------------------------------------------------- POST /v1/sandboxes/{id}/paths


def paths(warren, sid, **op):
    return warren.http.post(f"/v1/sandboxes/{sid}/paths", json=op)


def entries(warren, sid, **op):
    r = paths(warren, sid, **op)
    assert r.status_code == 200, (op, r.status_code, r.text)
    return r.json()


def test_paths_stat_list_mkdir_rename_remove(warren, sandbox):
    sid = sandbox()["id"]
    sh_ok(warren, sid, "mkdir -p /w/a/b && printf hello > /w/a/f && chmod 640 /w/a/f && ln -s f /w/a/ln")

    [f] = entries(warren, sid, op="stat", path="/w/a/f")
    mtime = int(sh_ok(warren, sid, "stat -c %Y /w/a/f"))
    assert {k: f[k] for k in ("path", "kind", "size", "mode", "uid", "gid")} == {
        "path": "/w/a/f", "kind": "file", "size": 5, "mode": 0o640, "uid": 0, "gid": 0,
    }, f
    assert f["modified_ms"] // 1000 == mtime and "symlink_target" not in f, f
    [ln] = entries(warren, sid, op="stat", path="/w/a/ln")
    assert ln["kind"] == "symlink" and ln["symlink_target"] == "f", ln
    [root] = entries(warren, sid, op="stat", path="/")
    assert root["path"] == "/" and root["kind"] == "dir", root

    # depth 1 (the default) is the directory's own entries; more descends.
    assert [e["path"] for e in entries(warren, sid, op="list", path="/w")] == ["/w/a"]
    deep = {e["path"]: e["kind"] for e in entries(warren, sid, op="list", path="/w/", depth=3)}
    assert deep == {"/w/a": "dir", "/w/a/b": "dir", "/w/a/f": "file", "/w/a/ln": "symlink"}, deep

    [d] = entries(warren, sid, op="make_dir", path="/w/new/deeper")
    assert d["path"] == "/w/new/deeper" and d["kind"] == "dir", d
    assert sh_ok(warren, sid, "test -d /w/new/deeper && echo yes") == "yes\n"
    for existing in ("/w/new/deeper", "/w/a/f"):
        r = paths(warren, sid, op="make_dir", path=existing)
        assert r.status_code == 409 and error_body(r)["code"] == "conflict", r.text

    # A rename makes the destination's parents and moves the whole tree.
    [moved] = entries(warren, sid, op="rename", **{"from": "/w/a", "to": "/x/y/z"})
    assert moved["path"] == "/x/y/z" and moved["kind"] == "dir", moved
    assert sh_ok(warren, sid, "cat /x/y/z/f; readlink /x/y/z/ln; test -e /w/a || echo gone") == "hellof\ngone\n"

    # Removing a link removes the link, not its target; a directory goes
    # with everything in it.
    assert entries(warren, sid, op="remove", path="/x/y/z/ln") == []
    assert sh_ok(warren, sid, "cat /x/y/z/f") == "hello"
    assert entries(warren, sid, op="remove", path="/x") == []
    assert sh_ok(warren, sid, "test -e /x || echo gone; ls /w") == "gone\nnew\n"


def test_paths_make_dir_as_and_set_attrs_give_owners_as_the_sandbox_sees_them(warren, sandbox):
    sid = sandbox()["id"]
    [d] = entries(warren, sid, op="make_dir_as", path="/o/p", owner={"uid": 1000, "gid": 1001},
                  mode=0o750, parents=True)
    assert (d["uid"], d["gid"], d["mode"]) == (1000, 1001, 0o750), d
    assert sh_ok(warren, sid, "stat -c '%u %g %a' /o /o/p") == "1000 1001 750\n1000 1001 750\n"
    r = paths(warren, sid, op="make_dir_as", path="/o/p", owner={"uid": 0, "gid": 0}, mode=0o755)
    assert r.status_code == 409, r.text
    [same] = entries(warren, sid, op="make_dir_as", path="/o/p", owner={"uid": 0, "gid": 0}, mode=0o755,
                     exist_ok=True)
    assert same["uid"] == 1000, same
    r = paths(warren, sid, op="make_dir_as", path="/q/r", owner={"uid": 0, "gid": 0}, mode=0o755)
    assert r.status_code == 404, r.text
    sh_ok(warren, sid, "echo x > /o/f && ln -s /etc/passwd /o/ln")
    [f] = entries(warren, sid, op="set_attrs", path="/o/f", uid=7, mode=0o600)
    assert (f["uid"], f["gid"], f["mode"]) == (7, 0, 0o600), f
    assert sh_ok(warren, sid, "stat -c '%u %a' /o/f") == "7 600\n"
    # A link's own owner; its target (the sandbox's /etc/passwd) is untouched.
    [ln] = entries(warren, sid, op="set_attrs", path="/o/ln", uid=5, gid=5)
    assert ln["kind"] == "symlink" and ln["uid"] == 5, ln
    assert sh_ok(warren, sid, "stat -c '%u' /etc/passwd") == "0\n"
    for op in ({"op": "set_attrs", "path": "/o/ln", "mode": 0o777},
               {"op": "set_attrs", "path": "/o/f", "uid": 65536}):
        r = paths(warren, sid, **op)
        assert r.status_code == 400, (op, r.text)


def test_paths_errors(warren, sandbox):
    sid = sandbox()["id"]
    sh_ok(warren, sid, "echo x > /tmp/file")
    for op in (
        {"op": "stat", "path": "/nope"},
        {"op": "list", "path": "/nope/deeper"},
        {"op": "remove", "path": "/nope"},
        {"op": "rename", "from": "/nope", "to": "/tmp/new"},
    ):
        r = paths(warren, sid, **op)
        assert r.status_code == 404, (op, r.text)
        assert "/nope" in error_body(r)["message"], r.text
    r = paths(warren, "sbx-000000000000", op="stat", path="/")
    assert r.status_code == 404 and error_body(r)["code"] == "not_found", r.text

    # Bodies that are not a PathOp, and paths that cannot be one.
    for body in (b"{", b'{"op": "chmod", "path": "/tmp"}', b'{"op": "stat"}', b'{"op": "list", "path": "/", "depth": -1}'):
        r = warren.http.post(f"/v1/sandboxes/{sid}/paths", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400, (body, r.text)
        assert error_body(r)["code"] == "bad_request", r.text
    for op in (
        {"op": "list", "path": "/tmp/file"},
        {"op": "remove", "path": "/"},
        {"op": "stat", "path": "/tmp/file/x"},
        {"op": "make_dir", "path": "/tmp/file/x"},
        {"op": "rename", "from": "/tmp/file", "to": "/tmp/file/x"},
        {"op": "rename", "from": "/tmp", "to": "/tmp/inside/tmp"},
    ):
        r = paths(warren, sid, **op)
        assert r.status_code == 400, (op, r.text)
        error_body(r)

    # Something in the way of a rename: a file of a directory's, a
    # directory of a file's.
    sh_ok(warren, sid, "mkdir -p /d/full/x /e")
    for src, dst in (("/e", "/tmp/file"), ("/tmp/file", "/d")):
        r = paths(warren, sid, op="rename", **{"from": src, "to": dst})
        assert r.status_code == 409 and error_body(r)["code"] == "conflict", (src, dst, r.text)
    assert sh_ok(warren, sid, "cat /tmp/file; ls /d /e") == "x\n/d:\nfull\n\n/e:\n"

    warren.destroy(sid)
    r = paths(warren, sid, op="stat", path="/")
    assert r.status_code == 409, r.text


def test_paths_symlinks_never_lead_out(warren, sandbox, tmp_path):
    """Links the sandbox plants (to /etc, to the host's paths, up and out)
    are described, not followed out: listing through them lists the
    sandbox's own files; removing a tree removes links, not their targets."""
    sid = sandbox()["id"]
    host_dir = tmp_path / "host-dir"
    host_dir.mkdir()
    (host_dir / "keep").write_text("host\n")
    sh_ok(
        warren,
        sid,
        f"ln -s /etc /thelink && ln -s ../../../../.. /tmp/up && ln -s {host_dir} /tmp/hostdir && "
        f"mkdir -p /tree/sub && ln -s {host_dir} /tree/sub/out && ln -s /etc /tree/etc && touch /tree/sub/f",
    )
    sandbox_etc = set(sh_ok(warren, sid, "ls -A /etc").split())
    host_etc = set(os.listdir("/etc"))
    assert sandbox_etc != host_etc  # else the check below could not tell them apart

    [link] = entries(warren, sid, op="stat", path="/thelink")
    assert link["kind"] == "symlink" and link["symlink_target"] == "/etc", link
    # A listing of the whole root shows the link and does not enter it.
    top = entries(warren, sid, op="list", path="/", depth=2)
    assert {e["kind"] for e in top if e["path"] == "/thelink"} == {"symlink"}
    assert not [e for e in top if e["path"].startswith("/thelink/")]
    # Listing through it resolves it inside the sandbox: its own /etc.
    listed = entries(warren, sid, op="list", path="/thelink", depth=3)
    names = {e["path"].removeprefix("/thelink/") for e in listed if e["path"].count("/") == 2}
    assert names == sandbox_etc, (names ^ sandbox_etc)
    assert any(e["path"] == "/thelink/hostname" for e in listed)
    assert names != host_etc
    # `..` past the root stays at the sandbox's root.
    up = {e["path"].removeprefix("/tmp/up/") for e in entries(warren, sid, op="list", path="/tmp/up")}
    assert up == set(sh_ok(warren, sid, "ls -A /").split()), up
    # A link to a host directory dangles inside.
    r = paths(warren, sid, op="list", path="/tmp/hostdir")
    assert r.status_code == 404, r.text
    assert "keep" not in r.text

    # Renaming onto a link's place or removing a tree never reaches the targets.
    assert entries(warren, sid, op="remove", path="/tree") == []
    assert entries(warren, sid, op="remove", path="/thelink") == []
    assert (host_dir / "keep").read_text() == "host\n"
    assert set(sh_ok(warren, sid, "ls -A /etc").split()) == sandbox_etc
    assert sh_ok(warren, sid, "test -e /tree || echo gone; cat /etc/hostname") == "gone\nwarren-busybox\n"

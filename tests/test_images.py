"""Image import (OCI layout and docker-archive tars), whiteouts, corruption, removal."""

import json
import os
import secrets
import shutil
import subprocess


import pytest

from helpers import ImageBuilder, error_body, flip_bytes, image_names, run, sh_ok, uniq

# Runs again with the node over HTTP: image_import, image_list, image_remove (docs/testing.md).
pytestmark = pytest.mark.contract


def cli_run(warren, image, *cmd):
    return warren.cli("run", "--image", image, "--rm", "--", *cmd, check=False)


def import_http(warren, tar, name):
    with open(tar, "rb") as f:
        return warren.http.post("/v1/images/import", params={"name": name}, content=f.read())


def unique_image(images, tmp_path, marker):
    """An image with a layer no other test has imported (random content)."""
    b = ImageBuilder(images["oci"], tmp_path / "build")

    def add(root):
        (root / "etc" / "marker").write_text(marker + "\n")
        (root / "etc" / "random.bin").write_bytes(secrets.token_bytes(200_000))

    b.layer(add)
    return b


@pytest.mark.smoke  # image import
def test_import_oci_and_docker_archives(warren, images):
    names = {"oci": uniq("imp-oci") + ":1", "docker": uniq("imp-docker") + ":1"}
    for kind, name in names.items():
        p = warren.cli("image", "import", str(images[kind]), "--name", name)
        assert p.stdout.decode().split()[0] == name
        assert p.stdout.decode().split()[1].startswith("sha256:")
    listed = {i["name"]: i for i in json.loads(warren.cli("image", "ls", "--json").stdout)}
    for name in names.values():
        assert name in listed, listed.keys()
        assert listed[name]["digest"].startswith("sha256:")
    table = warren.cli("image", "ls").stdout.decode()
    assert all(n in table for n in names.values())
    for name in names.values():
        p = cli_run(warren, name, "echo", "ok")
        assert p.returncode == 0, p.stderr
        assert p.stdout == b"ok\n"
    # The docker archive's layer unpacks to the same filesystem.
    p = cli_run(warren, names["docker"], "sh", "-c", "cat /etc/hostname; id -u user; ls -ld /tmp | cut -c1-10")
    assert p.stdout == b"warren-busybox\n1000\ndrwxrwxrwt\n", p.stderr
    p = warren.cli("image", "rm", names["docker"])
    assert p.stdout.decode().strip() == names["docker"]
    assert names["docker"] not in dict(image_names(warren))


def test_importing_a_directory_says_to_make_an_archive(warren, tmp_path):
    p = warren.cli("image", "import", str(tmp_path), "--name", uniq("dir") + ":1", check=False)
    err = p.stderr.decode()
    assert p.returncode != 0 and "is a directory" in err and "tar -C" in err, err
    assert "cannot reach" not in err, err


def test_layer_with_whiteouts(warren, images, tmp_path):
    b = ImageBuilder(images["oci"], tmp_path / "build")

    def first(root):
        (root / "etc" / "keep.txt").write_text("keep\n")
        (root / "etc" / "gone.txt").write_text("gone\n")
        for d in ("data", "opaque"):
            (root / d / "sub").mkdir(parents=True)
            (root / d / "a").write_text("a\n")
            (root / d / "sub" / "b").write_text("b\n")
        os.remove(root / "bin" / "vi")  # an applet link from the base layer

    def second(root):
        os.remove(root / "etc" / "gone.txt")
        for entry in (root / "data").iterdir():
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
        (root / "data" / "new").write_text("new\n")
        shutil.rmtree(root / "opaque")
        (root / "opaque").mkdir()
        (root / "opaque" / "fresh").write_text("fresh\n")
        os.remove(root / "bin" / "wget")  # delete a base-layer file in the top layer

    b.layer(first).layer(second)
    # The top layer really carries whiteouts.
    top = subprocess.run(["tar", "-tzf", str(b.layer_blobs()[-1])], capture_output=True, text=True, check=True).stdout
    assert "etc/.wh.gone.txt" in top and "data/.wh.a" in top, top
    tar = b.tar(tmp_path / "wh.tar")
    name = uniq("whiteout") + ":" + b.tag
    warren.cli("image", "import", str(tar), "--name", name)
    info = warren.create(image=name)
    sid = info["id"]
    try:
        out = sh_ok(
            warren,
            sid,
            "for f in /etc/keep.txt /etc/gone.txt /data/a /data/sub /data/sub/b /data/new "
            "/opaque/a /opaque/sub /opaque/fresh /bin/vi /bin/wget /bin/ls; do "
            "if [ -e $f ] || [ -L $f ]; then echo present $f; else echo absent $f; fi; done; ls -a /data /opaque",
        )
        lines = out.splitlines()
        for f in ("/etc/keep.txt", "/data/new", "/opaque/fresh", "/bin/ls"):
            assert f"present {f}" in lines, out
        for f in ("/etc/gone.txt", "/data/a", "/data/sub", "/data/sub/b", "/opaque/a", "/opaque/sub", "/bin/vi", "/bin/wget"):
            assert f"absent {f}" in lines, out
        # No whiteout markers leak into the sandbox.
        assert ".wh." not in out
        assert sh_ok(warren, sid, "find / -xdev -name '.wh.*' | head -5") == ""
    finally:
        warren.destroy(sid)
    warren.cli("image", "rm", name)


def test_corrupted_blob_is_refused(warren, images, tmp_path):
    b = unique_image(images, tmp_path, "corrupt-test")
    good = b.tar(tmp_path / "good.tar")
    # Corrupt the new (top) layer blob in a copy of the layout.
    bad_layout = tmp_path / "bad"
    shutil.copytree(b.layout, bad_layout)
    top = b.layer_blobs()[-1]
    flip_bytes(bad_layout / top.relative_to(b.layout))
    bad = tmp_path / "bad.tar"
    run("tar", "-C", bad_layout, "-cf", bad, ".")

    before = image_names(warren)
    name = uniq("corrupt") + ":" + b.tag
    r = import_http(warren, bad, name)
    assert r.status_code == 400, r.text
    err = error_body(r)
    assert "sha256" in err["message"] or "digest" in err["message"], err
    p = warren.cli("image", "import", str(bad), "--name", name, check=False)
    assert p.returncode != 0
    assert image_names(warren) == before
    r = warren.http.post("/v1/sandboxes", json={"image": name})
    assert r.status_code == 404, r.text

    # Garbage and truncated archives are refused the same way.
    r = warren.http.post("/v1/images/import", params={"name": name}, content=b"this is not a tar")
    assert r.status_code == 400, r.text
    data = good.read_bytes()
    r = warren.http.post("/v1/images/import", params={"name": name}, content=data[: len(data) // 2])
    assert r.status_code == 400, r.text
    assert image_names(warren) == before

    # Control: the uncorrupted archive imports and runs.
    warren.cli("image", "import", str(good), "--name", name)
    p = cli_run(warren, name, "cat", "/etc/marker")
    assert p.returncode == 0 and p.stdout == b"corrupt-test\n", p.stderr
    warren.cli("image", "rm", name)


def test_corrupted_copy_of_known_layer_is_refused(warren, images, tmp_path):
    layout = tmp_path / "oci"
    layout.mkdir()
    run("tar", "-C", layout, "-xf", images["oci"])
    blobs = sorted((layout / "blobs" / "sha256").iterdir(), key=lambda p: p.stat().st_size)
    flip_bytes(blobs[-1])  # the largest blob is busybox's layer, already imported
    bad = tmp_path / "bad.tar"
    run("tar", "-C", layout, "-cf", bad, ".")
    before = image_names(warren)
    name = uniq("corrupt-known") + ":latest"
    r = import_http(warren, bad, name)
    if r.status_code < 300:
        warren.http.delete(f"/v1/images/{name}")
    assert r.status_code == 400, r.text
    assert image_names(warren) == before


def test_image_rm_in_use_is_409(warren, images, tmp_path):
    b = unique_image(images, tmp_path, "inuse-test")
    tar = b.tar(tmp_path / "inuse.tar")
    name = uniq("inuse") + ":" + b.tag  # the tag picks the manifest in the layout
    warren.cli("image", "import", str(tar), "--name", name)
    sid = warren.create(image=name)["id"]
    try:
        r = warren.http.delete(f"/v1/images/{name}")
        assert r.status_code == 409, r.text
        error_body(r)
        p = warren.cli("image", "rm", name, check=False)
        assert p.returncode != 0
        assert name in dict(image_names(warren))
        assert sh_ok(warren, sid, "cat /etc/marker") == "inuse-test\n"
    finally:
        warren.destroy(sid)
    p = warren.cli("image", "rm", name)
    assert p.returncode == 0
    assert name not in dict(image_names(warren))
    r = warren.http.post("/v1/sandboxes", json={"image": name})
    assert r.status_code == 404, r.text
    r = warren.http.delete(f"/v1/images/{name}")
    assert r.status_code == 404, r.text

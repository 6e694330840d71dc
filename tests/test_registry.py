"""Pulls from a real OCI registry: Debian's docker-registry (CNCF
distribution) on loopback, images built with umoci and pushed with skopeo."""

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pytest

from conftest import NO_SEARCH, ROOT, free_port
from debian import debian_python_layout
from helpers import ImageBuilder, flip_bytes, image_names, run, uniq, wait_until

REGISTRY_BIN = "/usr/bin/docker-registry"

pytestmark = pytest.mark.skipif(
    not Path(REGISTRY_BIN).exists(), reason="docker-registry is not installed (scripts/install-deps.sh --test)"
)


def answered(url, proc, log_path, what):
    """Waits (15 s at most) until `url` answers 200 or 401, failing with
    the log's tail if `proc` exits first or never answers."""
    deadline = time.time() + 15
    while time.time() < deadline:
        try:
            if httpx.get(url, timeout=1, verify=False).status_code in (200, 401):
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not start: {Path(log_path).read_text()[-2000:]}")


def stopped(proc, log, directory):
    """Stops a server process, then removes its directory."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()
    shutil.rmtree(directory, ignore_errors=True)


class Registry:
    """One docker-registry process on 127.0.0.1 with filesystem storage in a
    temp dir; `users` turns on htpasswd basic auth."""

    def __init__(self, users=None, tls=False):
        self.dir = Path(tempfile.mkdtemp(prefix="warren-registry-"))
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.storage = self.dir / "data"
        self.log_path = self.dir / "registry.log"
        auth = ""
        if users:
            # The registry only accepts bcrypt entries (htpasswd -B).
            lines = [
                subprocess.run(["htpasswd", "-Bbn", u, p], check=True, capture_output=True, text=True).stdout.strip()
                for u, p in users.items()
            ]
            (self.dir / "htpasswd").write_text("\n".join(lines) + "\n")
            auth = f"auth:\n  htpasswd:\n    realm: warren-test\n    path: {self.dir / 'htpasswd'}\n"
        tls_conf = ""
        self.ca = None
        if tls:
            # A private CA and a server certificate for 127.0.0.1 signed by it.
            d = self.dir
            run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=warren-test-ca",
                "-keyout", d / "ca.key", "-out", d / "ca.pem")
            run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
                "-keyout", d / "server.key", "-out", d / "server.csr")
            (d / "ext").write_text("subjectAltName=IP:127.0.0.1\n")
            run("openssl", "x509", "-req", "-in", d / "server.csr", "-CA", d / "ca.pem", "-CAkey", d / "ca.key",
                "-CAcreateserial", "-days", "1", "-extfile", d / "ext", "-out", d / "server.pem")
            self.ca = d / "ca.pem"
            tls_conf = f"  tls:\n    certificate: {d / 'server.pem'}\n    key: {d / 'server.key'}\n"
        (self.dir / "config.yml").write_text(
            "version: 0.1\nlog:\n  level: info\n"
            f"storage:\n  filesystem:\n    rootdirectory: {self.storage}\n  delete:\n    enabled: true\n"
            f"http:\n  addr: {self.host}\n" + tls_conf + auth
        )
        scheme = "https" if tls else "http"
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [REGISTRY_BIN, "serve", str(self.dir / "config.yml")], stdout=self.log, stderr=self.log
        )
        answered(f"{scheme}://{self.host}/v2/", self.proc, self.log_path, "docker-registry")

    def stop(self):
        stopped(self.proc, self.log, self.dir)

    def push(self, layout, tag, ref, creds=None, zstd=False):
        """Copies layout:tag to this registry as ref (repo:tag); returns the
        manifest digest the registry stored."""
        args = ["skopeo", "copy", "-q", "--dest-tls-verify=false"]
        if creds:
            args += ["--dest-creds", creds]
        if zstd:
            args += ["--dest-compress-format", "zstd"]
        digest_file = self.dir / f"digest-{uniq()}"
        args += ["--digestfile", str(digest_file), f"oci:{layout}:{tag}", f"docker://{self.host}/{ref}"]
        run(*args)
        return digest_file.read_text().strip()

    def manifest(self, ref_digest, repo):
        r = httpx.get(
            f"{'https' if self.ca else 'http'}://{self.host}/v2/{repo}/manifests/{ref_digest}",
            verify=False,
            headers={"Accept": "application/vnd.oci.image.manifest.v1+json"},
        )
        r.raise_for_status()
        return r.json()

    def blob_data(self, digest):
        hexd = digest.split(":", 1)[1]
        return self.storage / "docker/registry/v2/blobs/sha256" / hexd[:2] / hexd / "data"

    def blob_gets(self, repo, digest):
        """How many times the blob was fetched (access log lines)."""
        text = self.log_path.read_text(errors="replace")
        needle = f'"GET /v2/{repo}/blobs/{digest} '
        return text.count(needle)


class RegistryCache:
    """deploy/registry-cache/nginx.conf, as shipped, in front of `upstream`
    (the addresses and paths written in): the cluster's pull-through
    cache."""

    def __init__(self, upstream):
        self.dir = Path(tempfile.mkdtemp(prefix="warren-registry-cache-"))
        # nginx's workers (not root) write the cache below it.
        self.dir.chmod(0o755)
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        text = (ROOT / "deploy" / "registry-cache" / "nginx.conf").read_text()
        for old, new in [
            ("https://UPSTREAM", f"http://{upstream.host}"),
            ("Host UPSTREAM", f"Host {upstream.host}"),
            ("listen 5000", f"listen {self.host}"),
            ("/var/cache/warren-registry-cache", str(self.dir / "cache")),
            ("/var/log/warren-registry-cache.log", str(self.dir / "access.log")),
            ("/run/warren-registry-cache.pid", str(self.dir / "nginx.pid")),
        ]:
            assert old in text, old
            text = text.replace(old, new)
        (self.dir / "nginx.conf").write_text("daemon off;\n" + text)
        self.log = open(self.dir / "nginx.log", "ab")
        self.proc = subprocess.Popen(["nginx", "-c", str(self.dir / "nginx.conf"), "-p", str(self.dir)],
                                     stdout=self.log, stderr=self.log)
        answered(f"http://{self.host}/v2/", self.proc, self.dir / "nginx.log", "nginx")

    def served(self, repo, digest):
        """How many times the cache answered a GET of the blob."""
        return (self.dir / "access.log").read_text().count(f'"GET /v2/{repo}/blobs/{digest} ')

    def stop(self):
        stopped(self.proc, self.log, self.dir)


@pytest.fixture
def registry():
    started = []

    def make(users=None, tls=False):
        r = Registry(users, tls)
        started.append(r)
        return r

    yield make
    for r in started:
        r.stop()


def configure(warren, text):
    """Writes the daemon's registries.toml (read at every pull). Short names
    are looked up on no registry unless the text says where."""
    if "unqualified-search-registries" not in text:
        text = NO_SEARCH + text
    (warren.home / "registries.toml").write_text(text)


def insecure(*regs):
    return "".join(f'[registry."{r.host}"]\ninsecure = true\n' for r in regs)


@pytest.fixture
def builder(images, tmp_path):
    return lambda: ImageBuilder(images["oci"], tmp_path / uniq("img"))


def multi_layer(builder, marker):
    """busybox + a layer adding files + a layer deleting one (whiteout) and
    replacing a directory's contents (opaque)."""

    def add(root):
        (root / "app").mkdir()
        (root / "app" / "marker").write_text(marker)
        (root / "app" / "gone").write_text("to be deleted")
        (root / "data").mkdir()
        (root / "data" / "old").write_text("old")
        (root / "app" / "blob").write_bytes(os.urandom(256 * 1024))

    def change(root):
        (root / "app" / "gone").unlink()
        shutil.rmtree(root / "data")
        (root / "data").mkdir()
        (root / "data" / "new").write_text("new")

    return builder().layer(add).layer(change)


def store_state(warren):
    """What the image store holds: blobs, snapshots, records, scratch."""
    root = warren.home / "images"
    listing = lambda d: sorted(p.name for p in (root / d).iterdir())
    return {d: listing(d) for d in ("content/sha256", "snapshots", "images", "tmp")}


def assert_nothing_added(before, after):
    """A failed pull may collect older garbage, but adds nothing and leaves
    the image records as they were."""
    for k in before:
        assert set(after[k]) <= set(before[k]), (k, set(after[k]) - set(before[k]))
    assert after["images"] == before["images"]
    assert after["tmp"] == []


def node_events(warren, reason):
    """Every event with this reason (the log is paged from its start)."""
    out, after = [], 0
    while True:
        page = warren.http.get("/v1/events", params={"after": after, "limit": 10000}).json()
        if not page:
            return out
        out += [e for e in page if e["reason"] == reason]
        after = page[-1]["seq"]


def pull(warren, ref, check=True):
    return warren.cli("image", "pull", ref, check=check, timeout=120)


def sh(warren, sid, script):
    ev, out, err, _ = warren.exec(sid, ["sh", "-c", script])
    assert ev and ev["code"] == 0, (ev, err)
    return out.decode()


@pytest.mark.contract  # image_pull, image_for_create
def test_pull_by_tag_and_digest_runs_the_image(warren, registry, builder, sandbox):
    reg = registry()
    configure(warren, insecure(reg))
    marker = uniq("m")
    b = multi_layer(builder, marker)
    repo = uniq("app")
    digest = reg.push(b.layout, b.tag, f"{repo}:v1")

    p = pull(warren, f"{reg.host}/{repo}:v1")
    name, got = p.stdout.decode().split()
    assert (name, got) == (f"{reg.host}/{repo}:v1", digest)
    progress = p.stderr.decode()
    assert "3 layers" in progress and "downloaded" in progress, progress
    # The node reports the pull to the event log just after answering.
    mine = lambda: [
        e for e in node_events(warren, "image_pulled") if e["message"].startswith(f"{reg.host}/{repo}:v1 is {digest}")
    ]
    wait_until(lambda: mine(), what="the image_pulled event")
    assert len(mine()) == 1 and "downloaded 2 layers" in mine()[0]["message"], mine()

    info = sandbox(image=f"{reg.host}/{repo}:v1")
    assert info["image_digest"] == digest
    assert sh(warren, info["id"], "cat /app/marker") == marker
    # The whiteout and the opaque directory took effect.
    assert sh(warren, info["id"], "ls -a /app /data").split() == [
        "/app:", ".", "..", "blob", "marker", "/data:", ".", "..", "new"
    ]
    inspected = json.loads(warren.cli("inspect", info["id"]).stdout)
    assert inspected["image_digest"] == digest

    # By digest: no tag involved, same content, no new download.
    gets = reg.blob_gets(repo, reg.manifest(digest, repo)["layers"][-1]["digest"])
    p = pull(warren, f"{reg.host}/{repo}@{digest}")
    assert p.stdout.decode().split() == [f"{reg.host}/{repo}@{digest}", digest]
    assert "already in the store" in p.stderr.decode()
    assert reg.blob_gets(repo, reg.manifest(digest, repo)["layers"][-1]["digest"]) == gets
    info = sandbox(image=f"{reg.host}/{repo}@{digest}")
    assert info["image_digest"] == digest
    names = [i["name"] for i in warren.http.get("/v1/images").json()]
    assert f"{reg.host}/{repo}:v1" in names and f"{reg.host}/{repo}@{digest}" in names


def rewrite_manifest(layout, tag, edit):
    """Rewrites the tag's manifest in an OCI layout: edit(manifest, blob, put)
    changes it (blob(digest) is a blob's path, put(bytes) stores a blob and
    returns its digest and size); the manifest and index digests follow."""
    layout = Path(layout)
    blob = lambda d: layout / "blobs" / "sha256" / d.split(":", 1)[1]

    def put(data):
        d = "sha256:" + hashlib.sha256(data).hexdigest()
        blob(d).write_bytes(data)
        return d, len(data)

    idx = json.loads((layout / "index.json").read_text())
    entry = next(m for m in idx["manifests"] if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag)
    manifest = json.loads(blob(entry["digest"]).read_text())
    edit(manifest, blob, put)
    entry["digest"], entry["size"] = put(json.dumps(manifest).encode())
    (layout / "index.json").write_text(json.dumps(idx))


def recompress_zstd(layout, tag, index):
    """Rewrites layer `index` of the tag as zstd (same diffID), updating the
    manifest and index digests: an image with gzip and zstd layers mixed."""
    def edit(manifest, blob, put):
        layer = manifest["layers"][index]
        raw = subprocess.run(["gzip", "-dc", blob(layer["digest"])], check=True, capture_output=True).stdout
        packed = subprocess.run(["zstd", "-q", "-c", "-"], input=raw, check=True, capture_output=True).stdout
        layer["digest"], layer["size"] = put(packed)
        layer["mediaType"] = "application/vnd.oci.image.layer.v1.tar+zstd"

    rewrite_manifest(layout, tag, edit)


def test_mixed_gzip_and_zstd_layers(warren, registry, builder, sandbox):
    reg = registry()
    configure(warren, insecure(reg))
    marker = uniq("mixed")
    b = multi_layer(builder, marker)
    recompress_zstd(b.layout, b.tag, 1)
    repo = uniq("mix")
    digest = reg.push(b.layout, b.tag, f"{repo}:v1")
    types = [l["mediaType"] for l in reg.manifest(digest, repo)["layers"]]
    assert types[1].endswith("+zstd") and types[0].endswith("+gzip") and types[2].endswith("+gzip"), types
    pull(warren, f"{reg.host}/{repo}:v1")
    info = sandbox(image=f"{reg.host}/{repo}:v1")
    assert sh(warren, info["id"], "cat /app/marker; ls /data") == marker + "new\n"


def test_zstd_layers_are_pulled_and_unpacked(warren, registry, builder, sandbox):
    reg = registry()
    configure(warren, insecure(reg))
    marker = uniq("z")
    b = multi_layer(builder, marker)
    repo = uniq("zst")
    digest = reg.push(b.layout, b.tag, f"{repo}:v1", zstd=True)
    types = {l["mediaType"] for l in reg.manifest(digest, repo)["layers"]}
    assert types == {"application/vnd.oci.image.layer.v1.tar+zstd"}, types

    pull(warren, f"{reg.host}/{repo}:v1")
    info = sandbox(image=f"{reg.host}/{repo}:v1")
    assert info["image_digest"] == digest
    assert sh(warren, info["id"], "cat /app/marker; ls /data") == marker + "new\n"


def test_a_moved_tag_is_seen_by_the_next_create(warren, registry, builder, sandbox):
    reg = registry()
    configure(warren, insecure(reg))
    repo = uniq("moving")
    first = builder().layer(lambda r: (r / "version").write_text("one"))
    d1 = reg.push(first.layout, first.tag, f"{repo}:live")
    a = sandbox(image=f"{reg.host}/{repo}:live")
    assert a["image_digest"] == d1

    second = builder().layer(lambda r: (r / "version").write_text("two"))
    d2 = reg.push(second.layout, second.tag, f"{repo}:live")
    assert d2 != d1
    # No explicit pull: create resolves the tag at the registry itself.
    b = sandbox(image=f"{reg.host}/{repo}:live")
    assert b["image_digest"] == d2
    assert sh(warren, b["id"], "cat /version") == "two"
    # The older sandbox keeps its layers although its tag moved on.
    assert sh(warren, a["id"], "cat /version") == "one"
    record = next(i for i in warren.http.get("/v1/images").json() if i["name"] == f"{reg.host}/{repo}:live")
    assert record["digest"] == d2


def test_a_tampered_blob_is_refused_and_nothing_is_kept(warren, registry, builder):
    reg = registry()
    configure(warren, insecure(reg))
    repo = uniq("bad")
    b = builder().layer(lambda r: (r / "payload").write_bytes(os.urandom(512 * 1024)))
    digest = reg.push(b.layout, b.tag, f"{repo}:v1")
    layer = reg.manifest(digest, repo)["layers"][-1]["digest"]
    flip_bytes(reg.blob_data(layer))

    before = store_state(warren)
    p = pull(warren, f"{reg.host}/{repo}:v1", check=False)
    err = p.stderr.decode()
    assert p.returncode != 0
    assert layer in err and "tampered" in err, err
    assert_nothing_added(before, store_state(warren))
    wait_until(
        lambda: any(
            e["message"].startswith(f"{reg.host}/{repo}:v1: ") and layer in e["message"]
            for e in node_events(warren, "image_pull_failed")
        ),
        what="the image_pull_failed event",
    )

    r = warren.http.post("/v1/sandboxes", json={"image": f"{reg.host}/{repo}:v1"})
    assert r.status_code == 502, r.text
    assert "tampered" in r.json()["error"]["message"]
    assert_nothing_added(before, store_state(warren))
    assert not any(s["spec"]["image"] == f"{reg.host}/{repo}:v1" for s in warren.http.get("/v1/sandboxes").json())


def set_diff_id(layout, tag, index, diff_id):
    """Rewrites the tag's config so rootfs.diff_ids[index] is diff_id, with
    consistent digests (the manifest and config still verify)."""
    def edit(manifest, blob, put):
        config = json.loads(blob(manifest["config"]["digest"]).read_text())
        config["rootfs"]["diff_ids"][index] = diff_id
        manifest["config"]["digest"], manifest["config"]["size"] = put(json.dumps(config).encode())

    rewrite_manifest(layout, tag, edit)


def test_a_wrong_diff_id_is_refused_and_nothing_is_kept(warren, registry, builder):
    reg = registry()
    configure(warren, insecure(reg))
    repo = uniq("diffid")
    b = builder().layer(lambda r: (r / "payload").write_bytes(os.urandom(64 * 1024)))
    set_diff_id(b.layout, b.tag, -1, "sha256:" + "0" * 64)
    reg.push(b.layout, b.tag, f"{repo}:v1")

    before = store_state(warren)
    p = pull(warren, f"{reg.host}/{repo}:v1", check=False)
    err = p.stderr.decode()
    assert p.returncode != 0
    assert "diffID" in err and "sha256:" + "0" * 64 in err, err
    assert_nothing_added(before, store_state(warren))


def test_concurrent_creates_download_each_layer_once(warren, registry, builder):
    reg = registry()
    configure(warren, insecure(reg))
    repo = uniq("shared")
    b = builder().layer(lambda r: (r / "payload").write_bytes(os.urandom(2 << 20)))
    digest = reg.push(b.layout, b.tag, f"{repo}:v1")
    manifest = reg.manifest(digest, repo)
    ref = f"{reg.host}/{repo}:v1"

    results, ids = [], []
    barrier = threading.Barrier(8)

    def create():
        with warren.client() as c:
            barrier.wait()
            r = c.post("/v1/sandboxes", json={"image": ref})
            results.append(r)

    threads = [threading.Thread(target=create) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert all(r.status_code in (200, 201) for r in results), [r.text for r in results]
        ids = [r.json()["id"] for r in results]
        assert {r.json()["image_digest"] for r in results} == {digest}
        # The config and the new layer were fetched once for all eight; the
        # base layer was already in the store (busybox) and not at all.
        for blob in [manifest["config"], manifest["layers"][-1]]:
            assert reg.blob_gets(repo, blob["digest"]) == 1, blob
        assert reg.blob_gets(repo, manifest["layers"][0]["digest"]) == 0
    finally:
        for r in results:
            if r.status_code in (200, 201):
                warren.destroy(r.json()["id"])


def test_registry_credentials(warren, registry, builder):
    reg = registry(users={"ci": "right-horse"})
    repo = uniq("private")
    b = builder()
    reg.push(b.layout, b.tag, f"{repo}:v1", creds="ci:right-horse")
    ref = f"{reg.host}/{repo}:v1"

    configure(warren, insecure(reg))
    p = pull(warren, ref, check=False)
    assert p.returncode != 0
    err = p.stderr.decode()
    assert "requires authentication" in err and "registries.toml" in err, err

    configure(warren, insecure(reg) + 'username = "ci"\npassword = "wrong-battery"\n')
    p = pull(warren, ref, check=False)
    err = p.stderr.decode()
    assert p.returncode != 0
    assert "refused the credentials" in err, err
    assert "wrong-battery" not in err

    configure(warren, insecure(reg) + 'username = "ci"\npassword = "right-horse"\n')
    p = pull(warren, ref)
    assert p.stdout.decode().startswith(ref)
    log = warren.log_text()
    assert "right-horse" not in log and "wrong-battery" not in log


def test_plain_http_is_the_default_on_loopback_only(warren, registry, builder):
    """A registry on 127.0.0.1 works without an entry, as with Docker; one
    listed `insecure = false` is spoken to over HTTPS, and the failure says
    which entry to change. (Non-loopback hosts: the unit tests, since the
    tests contact only this machine.)"""
    reg = registry()
    repo = uniq("plain")
    b = builder()
    reg.push(b.layout, b.tag, f"{repo}:v1")
    configure(warren, f'[registry."{reg.host}"]\ninsecure = false\n')
    before = store_state(warren)
    p = pull(warren, f"{reg.host}/{repo}:v1", check=False)
    err = p.stderr.decode()
    assert p.returncode != 0
    assert "HTTPS" in err and f'[registry."{reg.host}"] insecure = true' in err, err
    assert_nothing_added(before, store_state(warren))
    configure(warren, "")
    assert pull(warren, f"{reg.host}/{repo}:v1").stdout.decode().startswith(f"{reg.host}/{repo}:v1")
    # Nothing listening says so rather than suggest plain HTTP.
    port = free_port()
    p = pull(warren, f"127.0.0.1:{port}/{repo}:v1", check=False)
    err = p.stderr.decode()
    assert p.returncode != 0 and "listens" in err and "insecure" not in err, err


def test_bad_references_and_missing_images_change_nothing(warren, registry):
    reg = registry()
    configure(warren, insecure(reg))
    before = store_state(warren)
    for ref, expect in [
        ("busybox-nonexistent", "lists no unqualified-search-registries"),
        (f"{reg.host}/Upper:v1", "invalid image reference"),
        (f"{reg.host}/app@sha256:abc", "digest reference"),
        (f"{reg.host}/{uniq('missing')}:v1", "has no manifest"),
    ]:
        p = pull(warren, ref, check=False)
        assert p.returncode != 0, ref
        assert expect in p.stderr.decode(), (ref, p.stderr.decode())
    r = warren.http.post("/v1/sandboxes", json={"image": f"{reg.host}/{uniq('missing')}:v1"})
    assert r.status_code == 404, r.text
    assert "check the repository and tag" in r.json()["error"]["message"]
    configure(warren, '[registry."x"]\nusername = "only"\n')
    p = pull(warren, f"{reg.host}/app:v1", check=False)
    assert "username and password go together" in p.stderr.decode()
    assert_nothing_added(before, store_state(warren))


def test_short_names_resolve_through_the_search_registries_and_their_mirrors(warren, registry, builder, sandbox):
    """Issue 39 (2): a short name is read as every container tool reads it,
    on docker.io (the default search registry) with `library/` for one
    component, and docker.io is reached through its mirror here (a
    registry on loopback): a dead mirror is skipped, the image is recorded
    under its full name and found there by the next create."""
    mirror = registry()
    marker = uniq("m")
    b = builder().layer(lambda root: (root / "marker").write_text(marker))
    repo = uniq("short")
    digest = mirror.push(b.layout, b.tag, f"library/{repo}:v1")
    team = mirror.push(b.layout, b.tag, f"team/{repo}:v1")
    dead = f"127.0.0.1:{free_port()}"
    configure(warren, f'unqualified-search-registries = ["docker.io"]\n[registry."docker.io"]\nmirrors = ["{dead}", "{mirror.host}"]\n')
    info = sandbox(image=f"{repo}:v1")
    assert info["image_digest"] == digest
    assert sh(warren, info["id"], "cat /marker") == marker
    assert (f"docker.io/library/{repo}:v1", digest) in image_names(warren)
    gets = lambda: mirror.log_path.read_text(errors="replace").count(f"GET /v2/library/{repo}/manifests/v1 ")
    before = gets()
    assert sandbox(image=f"{repo}:v1")["image_digest"] == digest
    assert gets() == before, "the second create used the copy it pulled"
    # Two components: no library/. The CLI pulls short names too.
    p = pull(warren, f"team/{repo}:v1")
    assert p.stdout.decode().split() == [f"docker.io/team/{repo}:v1", team]
    # Nowhere to be found (on registries of this machine only): each source
    # says why; 404 when every one answered that it has no such image.
    configure(warren, f'unqualified-search-registries = ["{mirror.host}"]\n[registry."{mirror.host}"]\nmirrors = ["{dead}"]\n')
    missing = uniq("none")
    r = warren.http.post("/v1/sandboxes", json={"image": f"{missing}:v1"})
    message = r.json()["error"]["message"]
    assert r.status_code == 502 and f"{mirror.host}: registry {mirror.host} has no manifest" in message, r.text
    assert f"{dead}: cannot connect" in message, message
    configure(warren, f'unqualified-search-registries = ["{mirror.host}"]\n')
    r = warren.http.post("/v1/sandboxes", json={"image": f"{missing}:v1"})
    assert r.status_code == 404 and f"{mirror.host}/{missing}:v1" in r.json()["error"]["message"], r.text
    # Bad entries are refused with the line to fix.
    configure(warren, '[registry."docker.io"]\nmirrors = ["http://x/y"]\n')
    p = pull(warren, f"{repo}:v2", check=False)
    assert p.returncode != 0 and "mirror" in p.stderr.decode(), p.stderr.decode()


@pytest.mark.contract  # image_pull ahead of creates
def test_prewarm_pulls_ahead_and_refuses_unknown_nodes(warren, registry, builder, sandbox):
    reg = registry()
    configure(warren, insecure(reg))
    repo = uniq("warm")
    b = builder().layer(lambda r: (r / "payload").write_bytes(os.urandom(256 * 1024)))
    digest = reg.push(b.layout, b.tag, f"{repo}:v1")
    manifest = reg.manifest(digest, repo)
    ref = f"{reg.host}/{repo}:v1"

    before = store_state(warren)
    r = warren.http.post("/v1/images/prewarm", json={"reference": ref, "nodes": ["no-such-node"]})
    assert r.status_code == 400 and "unknown node" in r.json()["error"]["message"], r.text
    assert store_state(warren) == before

    node = warren.http.get("/v1/nodes").json()[0]["name"]
    out = warren.cli("image", "prewarm", ref, "--nodes", node).stdout.decode().split()
    assert out == [node, ref, digest]
    assert reg.blob_gets(repo, manifest["layers"][-1]["digest"]) == 1
    # The create finds everything in place: no blob fetched again.
    info = sandbox(image=ref)
    assert info["image_digest"] == digest
    assert reg.blob_gets(repo, manifest["layers"][-1]["digest"]) == 1


@pytest.mark.contract  # commit
def test_commit_turns_changes_into_a_layer(warren, registry, builder, sandbox):
    reg = registry()
    configure(warren, insecure(reg))
    marker = uniq("c")
    b = multi_layer(builder, marker)
    repo = uniq("base")
    base_digest = reg.push(b.layout, b.tag, f"{repo}:v1")
    src = sandbox(image=f"{reg.host}/{repo}:v1")
    sh(
        warren,
        src["id"],
        "echo task > /app/task && rm /app/marker && rm -r /data && mkdir /data && echo fresh > /data/only"
        " && ln -s /app/task /app/link && mkdir -p /srv/deep/er && echo x > /srv/deep/er/f"
        " && chown 1000:1001 /srv/deep/er/f",
    )
    name = uniq("task") + ":v1"
    started = time.monotonic()
    p = warren.cli("commit", src["id"], name)
    elapsed = time.monotonic() - started
    out_name, digest = p.stdout.decode().split()
    assert out_name == name and digest != base_digest
    assert elapsed < 5, elapsed
    record = next(i for i in warren.http.get("/v1/images").json() if i["name"] == name)
    assert len(record["layers"]) == 4
    # The source keeps running after the freeze for the commit.
    assert sh(warren, src["id"], "cat /app/task") == "task\n"

    dst = sandbox(image=name)
    assert dst["image_digest"] == digest
    listing = sh(warren, dst["id"], "cat /app/task /app/link /data/only /srv/deep/er/f; ls -a /app /data")
    assert listing.split() == [
        "task", "task", "fresh", "x", "/app:", ".", "..", "blob", "link", "task", "/data:", ".", "..", "only"
    ], listing
    # Owners are the ids the source saw, not its host range (each sandbox
    # has its own, so a host id would be nobody in the next one).
    owners = sh(warren, dst["id"], "stat -c '%u:%g' / /app/task /srv/deep/er/f")
    assert owners.split() == ["0:0", "0:0", "1000:1001"], owners

    r = warren.http.post(f"/v1/sandboxes/{src['id']}/commit", json={"name": "Bad Name"})
    assert r.status_code == 400, r.text
    warren.destroy(src["id"])
    r = warren.http.post(f"/v1/sandboxes/{src['id']}/commit", json={"name": name})
    assert r.status_code == 409, r.text


@contextlib.contextmanager
def fresh_daemon():
    """A `warren up` with an empty image store."""
    from conftest import Warren

    base = Path(tempfile.mkdtemp(prefix="warren-fresh-"))
    w = Warren(base / "home", free_port())
    w.home.mkdir()
    w.start()
    try:
        yield w
    finally:
        w.stop_and_remove(base)


@pytest.mark.contract  # commit, image_push
def test_commit_push_pull_on_a_clean_store_gives_the_same_files(warren, registry, builder, sandbox):
    reg = registry()
    configure(warren, insecure(reg))
    repo = uniq("base")
    b = multi_layer(builder, uniq("m"))
    reg.push(b.layout, b.tag, f"{repo}:v1")
    src = sandbox(image=f"{reg.host}/{repo}:v1")
    sh(warren, src["id"], "echo pushed > /app/task && rm /app/marker && rm -r /data && mkdir /data && touch /data/x")
    # Same repository as the base, so the registry already has its layers.
    task = f"{reg.host}/{repo}:{uniq('task')}"
    name, digest = warren.cli("commit", src["id"], task).stdout.decode().split()
    assert name == task

    p = warren.cli("image", "push", task)
    assert p.stdout.decode().split() == [task, digest]
    assert "uploaded 2 blobs" in p.stderr.decode()  # the new layer and config; the base was there
    # Pushing again uploads nothing.
    assert "uploaded 0 blobs" in warren.cli("image", "push", task).stderr.decode()
    # --from pushes a stored image under another name; to another
    # repository of the same registry, every blob is mounted from the one
    # the image came from instead of uploaded.
    other = f"{reg.host}/{uniq('copy')}:v2"
    p = warren.cli("image", "push", other, "--from", task)
    assert p.stdout.decode().split() == [other, digest]
    assert "uploaded 0 blobs, mounted 5" in p.stderr.decode(), p.stderr.decode()

    r = warren.http.post("/v1/images/push", json={"reference": "no-registry:v1", "source": task})
    assert r.status_code == 400 and "names no registry" in r.json()["error"]["message"]
    r = warren.http.post("/v1/images/push", json={"reference": f"{reg.host}/x:v1", "source": "nonexistent:v9"})
    assert r.status_code == 404, r.text

    expected = sh(warren, src["id"], "cd / && find app data -exec ls -ld {} + | awk '{print $1, $NF}'; cat app/task")
    with fresh_daemon() as clean:
        configure(clean, insecure(reg))
        assert clean.http.get("/v1/images").json() == []
        out = pull(clean, task).stdout.decode().split()
        assert out == [task, digest]
        info = clean.create(image=task)
        try:
            got = sh(clean, info["id"], "cd / && find app data -exec ls -ld {} + | awk '{print $1, $NF}'; cat app/task")
            assert got == expected
            assert "pushed" in got and "marker" not in got and "old" not in got
        finally:
            clean.destroy(info["id"])


@pytest.mark.contract  # image_gc
def test_gc_meets_a_budget_without_touching_images_in_use(warren, registry, builder, sandbox):
    reg = registry()
    configure(warren, insecure(reg))
    refs, layers = [], []
    for i in range(2):
        repo = uniq(f"gc{i}")
        b = builder().layer(lambda r: (r / "payload").write_bytes(os.urandom(1 << 20)))
        digest = reg.push(b.layout, b.tag, f"{repo}:v1")
        refs.append(f"{reg.host}/{repo}:v1")
        layers.append(reg.manifest(digest, repo)["layers"][-1]["digest"])
        pull(warren, refs[-1])
    used = sandbox(image=refs[0])
    content = warren.home / "images" / "content" / "sha256"
    assert all((content / l.split(":")[1]).exists() for l in layers)

    r = warren.http.post("/v1/images/gc", json={"budget": "lots"})
    assert r.status_code == 400, r.text
    r = warren.http.post("/v1/images/gc", json={})
    assert r.status_code == 200 and r.json()["removed"] == [], r.text

    p = warren.cli("image", "gc", "--budget", "1")
    report = json.loads(p.stdout)
    names = {i["name"] for i in warren.http.get("/v1/images").json()}
    # The unused registry image went; the one a sandbox runs and the
    # imported busybox (nowhere to pull it back from) stayed.
    assert refs[1] in report["removed"] and refs[0] not in report["removed"], report
    assert refs[1] not in names and refs[0] in names and "busybox:latest" in names
    assert not (content / layers[1].split(":")[1]).exists()
    assert (content / layers[0].split(":")[1]).exists()
    assert report["used_after"] < report["used_before"]
    assert sh(warren, used["id"], "ls -la /payload | wc -l") == "1\n"
    # Gone from the store, not from the registry: a create pulls it back.
    again = sandbox(image=refs[1])
    assert sh(warren, again["id"], "test -f /payload && echo ok") == "ok\n"


def test_a_sandbox_on_a_moved_tag_survives_a_restart(images, registry, builder):
    from conftest import own_daemon

    reg = registry()
    repo = uniq("restart")
    with own_daemon(images) as w:
        configure(w, insecure(reg))
        first = builder().layer(lambda r: (r / "version").write_text("one"))
        d1 = reg.push(first.layout, first.tag, f"{repo}:live")
        a = w.create(image=f"{reg.host}/{repo}:live")["id"]
        second = builder().layer(lambda r: (r / "version").write_text("two"))
        d2 = reg.push(second.layout, second.tag, f"{repo}:live")
        pull(w, f"{reg.host}/{repo}:live")
        names = {i["name"]: i["digest"] for i in w.http.get("/v1/images").json()}
        # The tag names the new digest; the old image stays reachable by
        # digest while a sandbox runs it.
        assert names[f"{reg.host}/{repo}:live"] == d2
        assert names[f"{reg.host}/{repo}@{d1}"] == d1
        w.stop(signal.SIGKILL)
        w.start()
        assert w.http.get(f"/v1/sandboxes/{a}").json()["state"] == "running"
        assert sh(w, a, "cat /version") == "one"
        w.destroy(a)


def test_a_debian_userland_with_python_runs_from_the_registry(warren, registry, sandbox, tmp_path):
    layout = debian_python_layout(tmp_path)
    reg = registry()
    configure(warren, insecure(reg))
    repo = uniq("debian")
    digest = reg.push(layout, "deb", f"{repo}:bookworm")
    pull(warren, f"{reg.host}/{repo}:bookworm")
    info = sandbox(image=f"{reg.host}/{repo}:bookworm", memory="256M")
    assert info["image_digest"] == digest
    ev, out, err, _ = warren.exec(
        info["id"], ["/usr/bin/python3", "-c", "import json, sqlite3; print(json.dumps(sqlite3.sqlite_version))"]
    )
    assert ev and ev["code"] == 0, (ev, err)
    assert out.decode().startswith('"3.')


def test_https_registry_with_a_private_ca(warren, registry, builder, sandbox):
    reg = registry(tls=True)
    repo = uniq("tls")
    b = builder().layer(lambda r: (r / "over-tls").write_text("yes"))
    digest = reg.push(b.layout, b.tag, f"{repo}:v1")
    ref = f"{reg.host}/{repo}:v1"

    # A loopback registry is asked in plain HTTP unless listed otherwise.
    configure(warren, "")
    p = pull(warren, ref, check=False)
    err = p.stderr.decode()
    assert p.returncode != 0 and "insecure = false" in err and "ca_file" in err, err

    configure(warren, f'[registry."{reg.host}"]\ninsecure = false\n')
    p = pull(warren, ref, check=False)
    err = p.stderr.decode()
    assert p.returncode != 0
    assert "not trusted" in err and "ca_file" in err, err

    configure(warren, f'[registry."{reg.host}"]\nca_file = "{reg.dir / "missing.pem"}"\n')
    p = pull(warren, ref, check=False)
    assert p.returncode != 0 and "cannot read ca_file" in p.stderr.decode(), p.stderr.decode()

    configure(warren, f'[registry."{reg.host}"]\nca_file = "{reg.ca}"\n')
    assert pull(warren, ref).stdout.decode().split() == [ref, digest]
    info = sandbox(image=ref)
    assert sh(warren, info["id"], "cat /over-tls") == "yes"


def test_image_budget_prunes_after_pulls(images, registry, builder):
    from conftest import own_daemon

    reg = registry()
    with own_daemon(images, args=["--image-budget", "1"]) as w:
        configure(w, insecure(reg))
        refs = []
        for i in range(2):
            repo = uniq(f"budget{i}")
            b = builder().layer(lambda r: (r / "payload").write_bytes(os.urandom(1 << 20)))
            reg.push(b.layout, b.tag, f"{repo}:v1")
            refs.append(f"{reg.host}/{repo}:v1")
        pull(w, refs[0])
        busy = w.create(image=refs[0])["id"]
        pull(w, refs[1])
        names = lambda: {i["name"] for i in w.http.get("/v1/images").json()}
        # Over budget: nothing can go (one image in use, the other just
        # pulled, busybox imported).
        time.sleep(0.5)
        assert {refs[0], refs[1], "busybox:latest"} <= names()
        w.destroy(busy)
        repo = uniq("budget2")
        b = builder().layer(lambda r: (r / "payload").write_bytes(os.urandom(1 << 20)))
        reg.push(b.layout, b.tag, f"{repo}:v1")
        pull(w, f"{reg.host}/{repo}:v1")
        # The third pull pruned both older registry images, not itself and
        # not the imported busybox.
        wait_until(lambda: refs[0] not in names() and refs[1] not in names(), what="pruning")
        assert {f"{reg.host}/{repo}:v1", "busybox:latest"} <= names()
        pruned = wait_until(lambda: node_events(w, "images_pruned"), what="the images_pruned event")
        assert refs[0] in pruned[-1]["message"] and refs[1] in pruned[-1]["message"], pruned


@pytest.mark.contract  # the image_pull stream
def test_cli_create_shows_pull_progress_only_when_downloading(warren, registry, builder):
    reg = registry()
    configure(warren, insecure(reg))
    repo = uniq("cli")
    b = builder().layer(lambda r: (r / "payload").write_bytes(os.urandom(256 * 1024)))
    digest = reg.push(b.layout, b.tag, f"{repo}:v1")
    ref = f"{reg.host}/{repo}:v1"
    ids = []
    try:
        p = warren.cli("create", "--image", ref)
        ids.append(p.stdout.decode().strip())
        err = p.stderr.decode()
        assert "downloaded" in err and f"pulled {ref}" in err, err
        p = warren.cli("create", "--image", ref)
        ids.append(p.stdout.decode().strip())
        assert p.stderr.decode() == ""
        assert {warren.http.get(f"/v1/sandboxes/{i}").json()["image_digest"] for i in ids} == {digest}
        p = warren.cli("create", "--image", f"{reg.host}/{uniq('nope')}:v1", check=False)
        assert p.returncode != 0 and "has no manifest" in p.stderr.decode()
    finally:
        for i in ids:
            warren.destroy(i)


@contextlib.contextmanager
def bearer_gate(backend, token):
    """A loopback front for `backend` (host:port) that answers 401 with a
    Bearer challenge unless a request carries `Authorization: Bearer token`,
    as registries behind a token service do."""
    import http.client
    import http.server

    class Gate(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def relay(self):
            if self.path.startswith("/token"):
                self.send_response(401)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if self.headers.get("Authorization") != f"Bearer {token}":
                body = b'{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}'
                self.send_response(401)
                self.send_header("WWW-Authenticate", f'Bearer realm="http://{host}/token",service="gate"')
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)
                return
            length = int(self.headers.get("Content-Length") or 0)
            conn = http.client.HTTPConnection(backend)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "authorization")}
            conn.request(self.command, self.path, body=self.rfile.read(length) if length else None, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            self.send_response(resp.status)
            for k, v in resp.getheaders():
                if k.lower() not in ("transfer-encoding", "connection"):
                    self.send_header(k, v)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_HEAD = relay

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Gate)
    host = f"127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield host
    finally:
        server.shutdown()


def test_bearer_token_credentials(warren, registry, builder, sandbox):
    reg = registry()
    repo = uniq("bearer")
    b = builder().layer(lambda r: (r / "who").write_text("token holder"))
    digest = reg.push(b.layout, b.tag, f"{repo}:v1")
    with bearer_gate(reg.host, "s3cret-token") as gate:
        ref = f"{gate}/{repo}:v1"
        configure(warren, f'[registry."{gate}"]\ninsecure = true\n')
        p = pull(warren, ref, check=False)
        assert p.returncode != 0 and "requires authentication" in p.stderr.decode(), p.stderr.decode()
        configure(warren, f'[registry."{gate}"]\ninsecure = true\ntoken = "wrong-token"\n')
        p = pull(warren, ref, check=False)
        err = p.stderr.decode()
        assert p.returncode != 0 and "refused the credentials" in err and "wrong-token" not in err, err
        configure(warren, f'[registry."{gate}"]\ninsecure = true\ntoken = "s3cret-token"\n')
        assert pull(warren, ref).stdout.decode().split() == [ref, digest]
        info = sandbox(image=ref)
        assert sh(warren, info["id"], "cat /who") == "token holder"
    log = warren.log_text()
    assert "s3cret-token" not in log and "wrong-token" not in log

"""Secrets: kept sealed by the server, given to the sandboxes that name them
as environment variables or as files on a memory file system at
/run/secrets, and never shown by a read, a log or the store's files."""

import hashlib
import signal

import pytest

from conftest import own_daemon

VALUE = "hf_S3cr3t-value-1"
NEW_VALUE = "hf_S3cr3t-value-2"


def digest(text):
    """What `sha256sum` prints of it: a sandbox shows its secrets by digest,
    so that its log (which keeps exec output) does not hold them."""
    return hashlib.sha256(text.encode()).hexdigest()


def sh(w, sid, script):
    ex, out, err, _ = w.exec(sid, ["sh", "-c", script])
    return ex["code"], out.decode(), err.decode()


@pytest.fixture
def sw(images):
    with own_daemon(images) as w:
        yield w


def test_secrets_reach_only_their_sandboxes_and_no_read_shows_them(sw):
    w = sw
    made = w.cli("secret", "create", "HF", "--metadata", "owner=team-a", input=VALUE.encode()).stdout.decode()
    assert made.startswith("hf sec_") and made.rstrip().endswith("version 1"), made
    w.cli("secret", "create", "db-pass", input=b"pw\n")
    listed = w.cli("secret", "ls").stdout.decode()
    assert "hf" in listed and "owner=team-a" in listed and VALUE not in listed

    sid = w.cli("create", "--image", "busybox:latest", "--secret", "hf,env=HF_TOKEN",
                "--secret", "db-pass").stdout.decode().strip()
    code, out, _ = sh(w, sid, 'printf %s "$HF_TOKEN" | sha256sum; sha256sum < /run/secrets/db-pass; '
                              'grep " /run/secrets " /proc/mounts; ls -l /run/secrets')
    lines = out.splitlines()
    assert code == 0 and [l.split()[0] for l in lines[:2]] == [digest(VALUE), digest("pw\n")], out
    assert lines[2].split()[2] == "tmpfs" and "uid=" not in lines[2], out
    assert lines[4].startswith("-r--r--r--") and " root " in lines[4], out

    # Reads name secrets, never hold their values.
    seen = [w.http.get(p).text for p in ("/v1/secrets", "/v1/secrets/hf", f"/v1/sandboxes/{sid}",
                                         "/v1/events", f"/v1/sandboxes/{sid}/logs")]
    seen += [w.cli("inspect", sid).stdout.decode(), w.cli("logs", sid).stdout.decode()]
    assert all(VALUE not in s for s in seen)
    assert '"name": "hf"' in seen[5] and '"env": "HF_TOKEN"' in seen[5]
    # Nor do the server's files: the store holds the value sealed.
    stored = b"".join(p.read_bytes() for p in w.home.glob("warren.db*"))
    assert b"hf_S3cr3t" not in stored and b"sec_" in stored

    # A commit of the sandbox does not carry the file.
    r = w.http.post(f"/v1/sandboxes/{sid}/commit", json={"name": "committed:1"}, timeout=120)
    assert r.status_code in (200, 201), r.text
    other = w.create(image="committed:1")["id"]
    code, out, _ = sh(w, other, "ls /run/secrets 2>&1; echo ${HF_TOKEN:-unset}")
    assert "db-pass" not in out and out.rstrip().endswith("unset"), out

    # A new version reaches sandboxes made after it; running ones keep theirs.
    assert "version 2" in w.cli("secret", "set", "hf", input=NEW_VALUE.encode()).stdout.decode()
    newer = w.create(secrets=[{"name": "hf", "env": "HF_TOKEN"}])["id"]
    env_digest = 'printf %s "$HF_TOKEN" | sha256sum'
    assert sh(w, newer, env_digest)[1].split()[0] == digest(NEW_VALUE)
    assert sh(w, sid, env_digest)[1].split()[0] == digest(VALUE)

    # A restarted daemon takes the sandbox over with its secrets.
    w.stop(signal.SIGKILL)
    w.start()
    assert sh(w, sid, env_digest)[1].split()[0] == digest(VALUE)


def test_bad_secrets_are_refused_and_change_nothing(sw):
    w = sw
    w.cli("secret", "create", "k", input=b"v")
    before = len(w.http.get("/v1/sandboxes").json())
    for spec, says in [
        ({"secrets": [{"name": "nope"}]}, "secret nope does not exist"),
        ({"secrets": [{"name": "k", "env": "K"}], "env": {"K": "x"}}, "set both by env and by a secret"),
        ({"secrets": [{"name": "k", "target": "/etc/passwd"}]}, "under /run/secrets"),
        ({"secrets": [{"name": "k"}, {"name": "K", "target": "k"}]}, "two secrets are given as /run/secrets/k"),
    ]:
        r = w.http.post("/v1/sandboxes", json={"image": "busybox:latest", **spec})
        assert r.status_code == 400 and says in r.text, (spec, r.text)
    assert len(w.http.get("/v1/sandboxes").json()) == before
    for body, status, says in [
        ({"name": "sec_x", "value": "v"}, 400, "not starting with `sec_`"),
        ({"name": "a b", "value": "v"}, 400, "letters, digits"),
        ({"name": "k", "value": "v"}, 409, "already exists"),
        ({"name": "big", "value": "x" * (64 * 1024 + 1)}, 400, "at most 65536 bytes"),
        ({"name": "m", "value": "v", "metadata": {str(i): "" for i in range(33)}}, 400, "metadata"),
    ]:
        r = w.http.post("/v1/secrets", json=body)
        assert r.status_code == status and says in r.text, (body, r.text)
    assert [s["name"] for s in w.http.get("/v1/secrets").json()] == ["k"]
    assert w.http.get("/v1/secrets/nope").status_code == 404
    # Removed, it is given to no new sandbox.
    assert "k removed" in w.cli("secret", "rm", "k").stdout.decode()
    r = w.http.post("/v1/sandboxes", json={"image": "busybox:latest", "secrets": [{"name": "k"}]})
    assert r.status_code == 400 and "secret k does not exist" in r.text


def test_the_sdk_keeps_and_gives_secrets(sw):
    import warren as sdk

    with sdk.Client(sw.url, token=sw.token) as c:
        made = c.secrets.create("Tok", VALUE, metadata={"team": "a"})
        assert (made.name, made.version, made.metadata) == ("tok", 1, {"team": "a"})
        assert c.secrets.set("tok", NEW_VALUE).version == 2
        assert [s.name for s in c.secrets.list()] == ["tok"] and "value" not in c.secrets.get("tok").raw
        with c.sandbox(image="busybox:latest", secrets=["tok,env=TOK", sdk.SecretRef("tok", target="t")]) as sb:
            out = sb.exec("printf %s \"$TOK\" | sha256sum; sha256sum < /run/secrets/t").stdout.decode()
            assert [l.split()[0] for l in out.splitlines()] == [digest(NEW_VALUE)] * 2
            assert sb.info.spec.secrets == [sdk.SecretRef("tok", env="TOK"), sdk.SecretRef("tok", target="t")]
        with pytest.raises(sdk.NotFound):
            c.secrets.remove("tok") and c.secrets.get("tok")

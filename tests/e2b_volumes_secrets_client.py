"""E2B SDK user code for secrets and volumes, unchanged: run by
tests/test_e2b.py with the pinned `e2b` from PyPI and only E2B_API_URL,
E2B_SANDBOX_URL, E2B_API_KEY and E2B_VOLUME_API_URL pointing at Warren.
Every step asserts; a failure exits non-zero with its traceback. A secret's
value is never printed (only compared by digest inside the sandbox)."""

import hashlib
import secrets as random
import sys

from e2b import Sandbox, Secret, Volume
from e2b.exceptions import (
    NotFoundException,
    SecretException,
    SecretNotFoundException,
    VolumeException,
    VolumeNotFoundException,
    VolumePathNotFoundException,
)

TEMPLATE = sys.argv[1] if len(sys.argv) > 1 else "base"
RUN = random.token_hex(3)


def step(name):
    print(f"step: {name}", flush=True)


def raises(exc, f, *args, contains=None, **kwargs):
    try:
        f(*args, **kwargs)
    except exc as e:
        assert contains is None or contains in str(e), (contains, str(e))
        return e
    raise AssertionError(f"{f.__name__}{args} did not raise {exc.__name__}")


def secrets_api():
    step("secrets: create")
    names = [f"Tok-{RUN}-{i}" for i in range(3)]
    values = {n.lower(): random.token_urlsafe(24) for n in names}
    made = [Secret.create(n, values[n.lower()], metadata={"i": str(i)}) for i, n in enumerate(names)]
    for i, s in enumerate(made):
        assert s.secret_id.startswith("sec_"), s
        assert (s.name, s.version, s.metadata) == (names[i].lower(), 1, {"i": str(i)}), s
        assert not hasattr(s, "value")
        assert s.created_at.tzinfo is not None and s.updated_at >= s.created_at, s
    raises(SecretException, Secret.create, names[0], "x", contains="409")
    raises(SecretException, Secret.create, "sec_reserved", "x", contains="400")
    raises(SecretException, Secret.create, "has space", "x", contains="400")
    raises(SecretException, Secret.create, f"big-{RUN}", "x", metadata={f"k{i}": "v" for i in range(33)},
           contains="400")

    step("secrets: list, two to a page")
    everything = Secret.list().next_items()
    pager = Secret.list(limit=2)
    pages = []
    while pager.has_next:
        pages.append(pager.next_items())
    assert [len(p) for p in pages[:-1]] == [2] * (len(pages) - 1) and 1 <= len(pages[-1]) <= 2, pages
    listed = [s.secret_id for p in pages for s in p]
    assert listed == [s.secret_id for s in everything], (listed, everything)
    assert {s.secret_id for s in made} <= set(listed)
    assert len(pages) >= 2

    step("secrets: get_info by id and by name, update, exists")
    assert Secret.get_info(made[1].secret_id).name == names[1].lower()
    assert Secret.get_info(names[1]).secret_id == made[1].secret_id    # any case
    raises(SecretNotFoundException, Secret.get_info, f"nope-{RUN}")
    raises(SecretNotFoundException, Secret.update, f"nope-{RUN}", "v")
    values[names[1].lower()] = random.token_urlsafe(24)
    up = Secret.update(made[1].secret_id, values[names[1].lower()], metadata={"rotated": "yes"})
    assert (up.version, up.metadata) == (2, {"rotated": "yes"}), up
    up = Secret.update(names[1], values[names[1].lower()])
    assert (up.version, up.metadata) == (3, {"rotated": "yes"}), up
    assert Secret.exists(made[2].secret_id) and Secret.exists(names[2])
    assert not Secret.exists(f"nope-{RUN}")
    return names, values


def volume_api():
    step("volumes: create, list, get_info, connect")
    name = f"vol-{RUN}"
    vol = Volume.create(name)
    assert (vol.volume_id, vol.name) == (name, name) and vol.token, vol
    raises(VolumeException, Volume.create, name, contains="409")
    raises(VolumeException, Volume.create, f"Caps-{RUN}", contains="400")
    assert name in [v.volume_id for v in Volume.list()]
    info = Volume.get_info(vol.volume_id)
    assert (info.volume_id, info.name, info.token) == (name, name, vol.token), info
    raises(VolumeNotFoundException, Volume.get_info, f"nope-{RUN}")
    assert isinstance(raises(VolumeNotFoundException, Volume.get_info, "Not_A_Name"), NotFoundException)
    vol = Volume.connect(name)

    step("volumes: write, read, stat, the 409s and 404s")
    st = vol.write_file("/hello.txt", "hi there", mode=0o644)
    assert (st.name, st.path, st.size, st.mode, st.uid, st.gid) == ("hello.txt", "/hello.txt", 8, 0o644, 0, 0), st
    assert st.type.value == "file" and st.mtime.tzinfo is not None, st
    assert vol.read_file("hello.txt") == "hi there"              # relative: from the root
    assert vol.read_file("/hello.txt", format="bytes") == b"hi there"
    assert b"".join(vol.read_file("/hello.txt", format="stream")) == b"hi there"
    raises(VolumeException, vol.write_file, "/hello.txt", "again", contains="409")
    assert vol.read_file("/hello.txt") == "hi there"
    assert vol.write_file("/hello.txt", b"replaced", force=True).size == 8
    assert vol.read_file("/hello.txt") == "replaced"
    vol.write_file("/empty", b"")
    assert vol.read_file("/empty") == "" and vol.read_file("/empty", format="bytes") == b""
    raises(VolumePathNotFoundException, vol.write_file, "/no/such/dir.txt", "x")
    raises(VolumePathNotFoundException, vol.read_file, "/nope.txt")
    st = vol.write_file("/owned.txt", "mine", uid=1000, gid=1000, mode=0o600)
    assert (st.uid, st.gid, st.mode) == (1000, 1000, 0o600), st

    step("volumes: make_dir, list, exists, update_metadata, remove")
    d = vol.make_dir("/d")
    assert (d.type.value, d.path, d.mode & 0o777) == ("directory", "/d", 0o755), d
    raises(VolumeException, vol.make_dir, "/d", contains="409")
    assert vol.make_dir("/d", force=True).path == "/d"
    raises(VolumeException, vol.make_dir, "/hello.txt", force=True, contains="409")
    raises(VolumePathNotFoundException, vol.make_dir, "/a/b/c")
    c = vol.make_dir("/a/b/c", uid=1000, gid=1000, mode=0o750, force=True)
    assert (c.uid, c.gid, c.mode & 0o777) == (1000, 1000, 0o750), c
    assert (vol.get_info("/a").uid, vol.get_info("/a/b").mode & 0o777) == (1000, 0o750)
    vol.write_file("/a/b/c/deep.txt", "deep")
    raises(VolumeException, vol.write_file, "/d", "x", force=True, contains="409")
    top = sorted(e.name for e in vol.list("/"))
    assert top == ["a", "d", "empty", "hello.txt", "owned.txt"], top
    assert [e.path for e in vol.list("/a")] == ["/a/b"]
    assert "/a/b/c/deep.txt" in [e.path for e in vol.list("/a", depth=4)]
    raises(VolumePathNotFoundException, vol.list, "/nope")
    raises(VolumePathNotFoundException, vol.list, "/hello.txt")
    assert vol.exists("/hello.txt") and not vol.exists("/zz")
    assert vol.get_info("/hello.txt").size == 8
    raises(VolumePathNotFoundException, vol.get_info, "/zz")
    up = vol.update_metadata("/hello.txt", mode=0o640, uid=1000)
    assert (up.mode, up.uid, up.gid) == (0o640, 1000, 0), up
    raises(VolumePathNotFoundException, vol.update_metadata, "/zz", mode=0o644)
    vol.remove("/a")                                              # with all it holds
    assert not vol.exists("/a") and not vol.exists("/a/b/c/deep.txt")
    raises(VolumePathNotFoundException, vol.remove, "/a")

    step("volumes: another volume's token is refused")
    stranger = Volume(vol.volume_id, vol.name, token=vol.token[::-1])
    raises(VolumeException, stranger.read_file, "/hello.txt", contains="403")
    return vol


def sandbox_sees_both(secret_names, values, vol):
    step("sandbox: a secret as a variable, the volume mounted")
    secret = secret_names[1]
    sbx = Sandbox.create(TEMPLATE, timeout=120, envs={"API_TOKEN": Secret.fill(secret), "PLAIN": "p"},
                         volume_mounts={"/mnt/data": vol})
    try:
        digest = hashlib.sha256(values[secret.lower()].encode()).hexdigest()
        r = sbx.commands.run('printf %s "$API_TOKEN" | sha256sum; echo "$PLAIN"')
        assert r.stdout.split()[0] == digest and r.stdout.split()[-1] == "p", "the secret's digest differs"
        info = Sandbox.get_info(sbx.sandbox_id)
        assert info.volume_mounts == [{"name": vol.name, "path": "/mnt/data"}], info.volume_mounts
        listed = [s for s in Sandbox.list().next_items() if s.sandbox_id == sbx.sandbox_id]
        assert listed and listed[0].volume_mounts == info.volume_mounts, listed

        step("sandbox: sees what the API wrote, the API sees what it wrote")
        assert sbx.commands.run("cat /mnt/data/hello.txt").stdout == "replaced"
        r = sbx.commands.run("stat -c '%u %g %a' /mnt/data/owned.txt /mnt/data/hello.txt")
        assert r.stdout.split("\n")[:2] == ["1000 1000 600", "1000 0 640"], r.stdout
        sbx.commands.run("mkdir -p /mnt/data/out && echo from the sandbox > /mnt/data/out/s.txt")
        assert vol.read_file("/out/s.txt") == "from the sandbox\n"
        st = vol.get_info("/out/s.txt")
        assert (st.uid, st.gid) == (0, 0), st            # the sandbox's root is the volume's 0
        vol.write_file("/out/live.txt", "while it runs")
        assert sbx.commands.run("cat /mnt/data/out/live.txt").stdout == "while it runs"

        step("volumes: a mounted volume is not destroyed")
        raises(VolumeException, Volume.destroy, vol.volume_id, contains="409")
    finally:
        sbx.kill()


def cleanup(secret_names, vol):
    step("destroy")
    for n in secret_names:
        assert Secret.destroy(n) is True
    assert not Secret.exists(secret_names[0])
    assert Secret.destroy(secret_names[0]) is False
    assert Volume.destroy(vol.volume_id) is True
    assert vol.volume_id not in [v.volume_id for v in Volume.list()]
    assert Volume.destroy(vol.volume_id) is False
    raises(VolumeNotFoundException, Volume.get_info, vol.volume_id)


names, values = secrets_api()
vol = volume_api()
sandbox_sees_both(names, values, vol)
cleanup(names, vol)
print("volumes and secrets ok")

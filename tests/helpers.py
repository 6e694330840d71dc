"""Shared helpers for the integration tests (host-side checks, image building,
tar building). Imported by the test modules; pytest puts tests/ on sys.path."""

import contextlib
import glob
import hashlib
import io
import os
import re
import secrets
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_V2 = not (CGROUP_ROOT / "memory").is_dir()


def sigint_as_at_a_terminal():
    """preexec_fn for a process a test later stops with Ctrl-C's SIGINT.

    A shell started in the background without job control (as CI runners
    and `cmd &` in scripts start things) ignores SIGINT, every process it
    starts inherits that, and a shell that found SIGINT ignored on entry
    can neither trap it nor be stopped by it: a test's Ctrl-C would go
    unheard. A person's terminal never hands that down, so the test
    restores what they have."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def uniq(prefix="t"):
    return f"{prefix}-{secrets.token_hex(4)}"


def sh(warren, sid, script, **kw):
    """Runs `sh -c script` in a sandbox; returns (exit_event, stdout str, stderr str)."""
    ev, out, err, _ = warren.exec(sid, ["sh", "-c", script], **kw)
    assert isinstance(ev, dict), f"exec did not stream an exit event: {describe(ev)}"
    return ev, out.decode(errors="replace"), err.decode(errors="replace")


def sh_ok(warren, sid, script, **kw):
    ev, out, err = sh(warren, sid, script, **kw)
    assert ev["code"] == 0, f"{script!r} exited {ev}: stdout={out!r} stderr={err!r}"
    return out


def describe(ev):
    if ev is None:
        return "stream ended without an exit event"
    if hasattr(ev, "status_code"):
        return f"HTTP {ev.status_code}: {ev.text}"
    return repr(ev)


def wait_until(pred, timeout=10.0, interval=0.05, what="condition"):
    deadline = time.time() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def error_body(resp):
    """Checks the error shape {"error": {"code", "message"}} and returns the inner object."""
    body = resp.json()
    assert set(body) == {"error"}, body
    assert isinstance(body["error"].get("code"), str) and body["error"]["code"], body
    assert isinstance(body["error"].get("message"), str) and body["error"]["message"], body
    return body["error"]


# ---------------------------------------------------------------- cgroups


def cgroup_dirs(sid):
    """Every cgroup directory of a sandbox (v1: one per controller; v2: one),
    below any daemon's cgroup parent (`warren`, or a test daemon's
    `warren/<its directory>`)."""
    found = []
    for parent in ("warren", "warren/*"):
        found += glob.glob(f"{CGROUP_ROOT}/*/{parent}/{sid}") + glob.glob(f"{CGROUP_ROOT}/{parent}/{sid}")
    return sorted(set(found))


def cgroup_dir(sid, controller):
    """The sandbox's cgroup directory in one v1 controller's hierarchy (the
    unified one on v2)."""
    root = CGROUP_ROOT if CGROUP_V2 else CGROUP_ROOT / controller
    dirs = glob.glob(f"{root}/warren/{sid}") + glob.glob(f"{root}/warren/*/{sid}")
    if len(dirs) != 1:
        raise FileNotFoundError(f"no single cgroup of {sid} in {root}: {dirs}")
    return Path(dirs[0])


def cgroup_read(sid, controller, name):
    """Reads a cgroup file of the sandbox: <controller>/<parent>/<id>/<name>
    on v1, <parent>/<id>/<name> on v2."""
    return (cgroup_dir(sid, controller) / name).read_text()


def cgroup_stat(sid, controller, name):
    out = {}
    for line in cgroup_read(sid, controller, name).splitlines():
        parts = line.split()
        if len(parts) == 2:
            out[parts[0]] = int(parts[1])
    return out


def cpu_usage_ns(sid):
    if CGROUP_V2:
        return cgroup_stat(sid, "cpu", "cpu.stat")["usage_usec"] * 1000
    return int(cgroup_read(sid, "cpuacct", "cpuacct.usage"))


# ---------------------------------------------------------------- host processes


def sandbox_host_pids(sid):
    """Host pids of processes whose cgroup path names the sandbox."""
    pat = re.compile(rf"/warren/(.+/)?{re.escape(sid)}(/|$)", re.M)
    pids = []
    for d in glob.glob("/proc/[0-9]*"):
        try:
            text = Path(d, "cgroup").read_text()
        except OSError:
            continue
        if pat.search(text):
            pids.append(int(d.rsplit("/", 1)[1]))
    return sorted(pids)


def proc_state(pid):
    """The state letter of /proc/<pid>/stat (R, S, Z, ...), or None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def proc_ppid(pid):
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def sandbox_init_host_pid(sid):
    """Host pid of the sandbox's PID 1: the process of the sandbox whose pid
    in its own namespace (the last NSpid field) is 1. (Parentage is not
    reliable: a process that is exiting may be momentarily reparented.)"""
    pids = sandbox_host_pids(sid)
    roots = []
    for p in pids:
        try:
            status = Path(f"/proc/{p}/status").read_text()
        except OSError:
            continue
        nspid = next((l.split()[1:] for l in status.splitlines() if l.startswith("NSpid:")), [])
        if nspid and nspid[-1] == "1":
            roots.append(p)
    assert len(roots) == 1, f"expected one PID 1 for {sid}, got {roots} of {pids}"
    return roots[0]


def crash(warren):
    """kill -9 of the daemon, as a crash would."""
    warren.proc.send_signal(signal.SIGKILL)
    warren.proc.wait()


def restart(warren):
    """Starts the daemon again; returns the seconds until it answered `ok`."""
    t = time.time()
    warren.start()
    return time.time() - t


def daemon_family(warren):
    """The daemon's pid and its direct children (spawners)."""
    pid = warren.proc.pid
    fam = [pid]
    for d in glob.glob("/proc/[0-9]*"):
        p = int(d.rsplit("/", 1)[1])
        if proc_ppid(p) == pid:
            fam.append(p)
    return fam



def state_root(home):
    """libcontainer's state of a home's sandboxes: /run/warren/state/ and the
    first 16 hex digits of the SHA-256 of the home's absolute path."""
    key = hashlib.sha256(str(Path(home).resolve()).encode()).hexdigest()[:16]
    return Path("/run/warren/state") / key

def host_traces(warren, sid):
    """Everything a sandbox leaves on the host, as a list of descriptions:
    mounts (in this and the daemon's mount namespaces), its directories under
    <home>, cgroup directories, its claim on a host uid range and processes."""
    left = []
    seen_ns = set()
    for pid in ["self", *daemon_family(warren)]:
        try:
            ns = os.readlink(f"/proc/{pid}/ns/mnt")
            if ns in seen_ns:
                continue
            seen_ns.add(ns)
            mounts = Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
        except OSError:
            continue
        left += [f"mount ({ns}): {line}" for line in mounts if sid in line]
    for d in (warren.home / "sandboxes" / sid, state_root(warren.home) / sid, warren.home / "run" / sid):
        if os.path.lexists(d):
            left.append(f"path: {d}")
    left += [f"cgroup: {d}" for d in cgroup_dirs(sid)]
    owner = str(warren.home / "sandboxes" / sid)
    for claim in glob.glob("/run/warren/uids/[0-9]*"):
        with contextlib.suppress(OSError):
            if Path(claim).read_text() == owner:
                left.append(f"uids: {claim}")
    left += [
        f"process: {p} {Path(f'/proc/{p}/cmdline').read_bytes()!r}"
        for p in sandbox_host_pids(sid)
        if os.path.exists(f"/proc/{p}")
    ]
    return left


# ---------------------------------------------------------------- tar and images


def make_tar(entries):
    """entries: list of (name, kind, data_or_target, mode); kind in file/dir/symlink."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as t:
        for name, kind, data, mode in entries:
            ti = tarfile.TarInfo(name)
            ti.mode = mode
            ti.mtime = int(time.time())
            if kind == "file":
                ti.size = len(data)
                t.addfile(ti, io.BytesIO(data))
            elif kind == "dir":
                ti.type = tarfile.DIRTYPE
                t.addfile(ti)
            elif kind == "symlink":
                ti.type = tarfile.SYMTYPE
                ti.linkname = data
                t.addfile(ti)
    return buf.getvalue()


def read_tar(data):
    """{normalised name: (kind, bytes or link target, mode)} of a tar archive."""
    out = {}
    with tarfile.open(fileobj=io.BytesIO(data)) as t:
        for m in t.getmembers():
            name = m.name
            while name.startswith("./"):
                name = name[2:]
            name = name.rstrip("/")
            if name in ("", "."):
                continue
            if m.isfile():
                out[name] = ("file", t.extractfile(m).read(), m.mode & 0o7777)
            elif m.isdir():
                out[name] = ("dir", None, m.mode & 0o7777)
            elif m.issym():
                out[name] = ("symlink", m.linkname, None)
    return out


def run(*cmd, **kw):
    return subprocess.run([str(c) for c in cmd], check=True, capture_output=True, **kw)


@contextlib.contextmanager
def loop_ext4(img, size, features=()):
    """An ext4 of `size` (e.g. "64M") in the file `img`, loop-mounted at a
    short new directory under /tmp (a home there holds sandbox sockets,
    whose paths must stay short); unmounted and removed afterwards."""
    mnt = Path(tempfile.mkdtemp(prefix="wf-", dir="/tmp"))
    run("truncate", "-s", size, img)
    run("mkfs.ext4", "-q", "-F", *features, img)
    run("mount", "-o", "loop", img, mnt)
    try:
        yield mnt
    finally:
        run("umount", "-l", mnt)
        mnt.rmdir()


class ImageBuilder:
    """Builds OCI image-layout tars from the busybox OCI tar with umoci:
    each `layer(fn)` unpacks the current tag, calls fn(rootfs Path), and
    repacks it as a new tag (one more layer, with whiteouts for deletions)."""

    def __init__(self, base_tar, workdir):
        self.dir = Path(workdir)
        self.layout = self.dir / "oci"
        self.layout.mkdir(parents=True)
        run("tar", "-C", self.layout, "-xf", base_tar)
        self.tag = "latest"
        self.n = 0

    def layer(self, fn):
        self.n += 1
        bundle = self.dir / f"bundle{self.n}"
        new_tag = f"l{self.n}"
        run("umoci", "unpack", "--image", f"{self.layout}:{self.tag}", bundle)
        fn(bundle / "rootfs")
        # repack writes the new layer into the current tag; tag it and move on.
        run("umoci", "repack", "--image", f"{self.layout}:{new_tag}", bundle)
        shutil.rmtree(bundle)
        self.tag = new_tag
        return self

    def config(self, *args):
        """Runs `umoci config` on the current tag (e.g. "--config.env", "K=V");
        the result replaces the tag."""
        run("umoci", "config", "--image", f"{self.layout}:{self.tag}", *args)
        return self

    def layer_blobs(self):
        """Paths of the layer blobs of the current tag, bottom first."""
        import json

        index = json.loads((self.layout / "index.json").read_text())
        desc = next(
            m
            for m in index["manifests"]
            if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == self.tag
        )
        blob = lambda d: self.layout / "blobs" / d.split(":", 1)[0] / d.split(":", 1)[1]
        manifest = json.loads(blob(desc["digest"]).read_text())
        return [blob(l["digest"]) for l in manifest["layers"]]

    def tar(self, out):
        run("umoci", "gc", "--layout", self.layout)
        run("tar", "-C", self.layout, "-cf", out, ".")
        return Path(out)


def flip_bytes(path, count=4):
    """Corrupts a blob in place (keeps its size)."""
    data = bytearray(Path(path).read_bytes())
    mid = len(data) // 2
    for i in range(count):
        data[mid + i] ^= 0xFF
    os.chmod(path, 0o644)
    Path(path).write_bytes(bytes(data))


def image_names(warren):
    r = warren.http.get("/v1/images")
    assert r.status_code == 200, r.text
    return sorted((i["name"], i["digest"]) for i in r.json())


# ---------------------------------------------------------------- WebSocket


class WebSocket:
    """A minimal WebSocket client (RFC 6455) on a plain socket, for the exec
    WebSocket: the handshake, masked frames out, whole messages in. No
    package needed (neither `websockets` nor `httpx-ws` is installed)."""

    def __init__(self, url, path, token=None, timeout=10, headers=()):
        import base64 as _b64
        import socket as _socket
        from urllib.parse import urlparse

        u = urlparse(url)
        self.sock = _socket.create_connection((u.hostname, u.port), timeout=timeout)
        self.sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
        key = _b64.b64encode(secrets.token_bytes(16)).decode()
        head = [f"GET {path} HTTP/1.1", f"Host: {u.hostname}:{u.port}", "Upgrade: websocket",
                "Connection: Upgrade", f"Sec-WebSocket-Key: {key}", "Sec-WebSocket-Version: 13"]
        if token is not None:
            head.append(f"Authorization: Bearer {token}")
        # More header lines ("Name: value"): a cookie, an Origin.
        head.extend(headers)
        self.sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            chunk = self.sock.recv(4096)
            if not chunk:
                break
            self.buf += chunk
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        lines = head.decode(errors="replace").split("\r\n")
        self.status = int(lines[0].split()[1])
        self.headers = {k.strip().lower(): v.strip() for k, _, v in (l.partition(":") for l in lines[1:])}
        self.body = b""
        if self.status != 101:
            # An HTTP answer instead of the upgrade: read its body.
            want = int(self.headers.get("content-length", "0"))
            while len(self.buf) < want:
                chunk = self.sock.recv(4096)
                if not chunk:
                    break
                self.buf += chunk
            self.body = self.buf[:want]

    def send(self, payload, opcode=None):
        """A text message for str, binary for bytes (or `opcode` as given)."""
        import struct

        if opcode is None:
            opcode = 1 if isinstance(payload, str) else 2
        data = payload.encode() if isinstance(payload, str) else bytes(payload)
        mask = secrets.token_bytes(4)
        n = len(data)
        if n < 126:
            head = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
        elif n < 1 << 16:
            head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
        else:
            head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
        self.sock.sendall(head + mask + masked)

    def send_json(self, obj):
        import json as _json

        self.send(_json.dumps(obj))

    def close(self, code=1000):
        import struct

        try:
            self.send(struct.pack("!H", code), opcode=8)
        except OSError:
            pass
        self.sock.close()

    def _read(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError("the WebSocket's connection closed")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def recv(self):
        """The next message as (kind, payload): ("text", str), ("binary",
        bytes), ("close", (code, reason)); pings are answered and skipped."""
        import struct

        message, kind = b"", None
        while True:
            b0, b1 = self._read(2)
            opcode, n = b0 & 0x0F, b1 & 0x7F
            if n == 126:
                (n,) = struct.unpack("!H", self._read(2))
            elif n == 127:
                (n,) = struct.unpack("!Q", self._read(8))
            mask = self._read(4) if b1 & 0x80 else None
            data = self._read(n)
            if mask:
                data = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
            if opcode == 9:
                self.send(data, opcode=10)
                continue
            if opcode == 10:
                continue
            if opcode == 8:
                code = struct.unpack("!H", data[:2])[0] if len(data) >= 2 else None
                return "close", (code, data[2:].decode(errors="replace"))
            if opcode in (1, 2):
                kind = "text" if opcode == 1 else "binary"
            message += data
            if b0 & 0x80:
                return kind, (message.decode() if kind == "text" else message)


# Shell blocks of the docs, as the README and docs tests read them.


def bare(cmd):
    """The command without its trailing comment (` # …`)."""
    return re.sub(r"\s+#\s.*$", "", cmd)


def commands(code):
    """Command lines of a block: continuations joined, comment lines and
    blank lines left out."""
    out, pending = [], ""
    for line in code.splitlines():
        if pending:
            line = pending + "\n" + line
            pending = ""
        if line.rstrip().endswith("\\"):
            pending = line
            continue
        if line.strip() and not line.lstrip().startswith("#"):
            out.append(line)
    assert not pending, f"a continuation line ends the block: {pending!r}"
    return out

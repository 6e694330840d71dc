#!/usr/bin/env python3
"""Chaos suite for `warren up`: crash the daemon under load, inject faults,
restart it, and check that nothing acknowledged was lost and nothing that
ended was left behind.

    python3 scripts/chaos.py --rounds N [--seed S] [--warren BIN]
                             [--sigstop-every K] [--json REPORT] [--skip KIND]

Run as root. The script starts its own daemon, `warren up --home HOME
--listen 127.0.0.1:PORT --cpu-overcommit 64`, with HOME on a 3 GB ext4 file
system of its own (a sparse file, loop-mounted for the whole run, so a full
disk can be injected), imports busybox:latest and runs N rounds:

1. Workload, from several threads for 0.5-3 s: creates (each with a
   `request_id`; every 2xx answer is an acknowledged create), creates with a
   2-4 s `ttl`, creates whose main process prints "n 0".."n 299", creates
   that run out of memory (`keep_on_failure`), creates with `reclaim: delay`,
   execs (exit code and stdout checked when the stream completes), uploads
   (acknowledged ones recorded with their sha256), downloads of acknowledged
   uploads, pauses and resumes, destroys.
2. `kill -9` of the daemon at a random moment of the workload.
3. Injections, in rounds the seeded RNG chooses (each kind at least once in
   any run of 4 rounds or more), before the crash:
     spawner   kill -9 of a spawner process while creates run;
     init      kill -9 of a sandbox's init while an exec streams from it
               (the stream must end, the sandbox must not stay running);
     readonly  `chattr +i` of warren.db and its WAL for ~2 s (the daemon
               must stay alive and serve, and create, again afterwards);
     diskfull  the home's file system filled to ~50 MB free while images
               are imported (100 MB: the upload itself cannot fit; 35 MB:
               the copy into the store cannot; a small gzip layer that
               unpacks to 300 MB: the unpack cannot): each import must be
               refused with a clear 4xx/5xx error and leave nothing in the
               image store;
     sigstop   (every `--sigstop-every` rounds; default once, in the middle
               round) SIGSTOP of the daemon for 30 s just after a sandbox
               with a 5 s ttl was created: after SIGCONT it must be
               destroyed (ttl_expired) within 5 s.
4. Restart on the same home: more than 2 s until `GET /healthz` answers
   `ok` is a violation.
5. Checks: listed running/paused/kept sandboxes have their init alive in
   their cgroup (and running ones run `exec true`); nothing of this home is
   on the host (processes, cgroups, mounts in the daemon's and its
   children's mount namespaces, directories, uid-range claims) unless its
   sandbox is listed open; every acknowledged create exists and a replay of
   its request_id answers the same id; acknowledged uploads into running
   sandboxes read back byte-identical; the main output of every finished
   ticker is complete but for at most one contiguous gap per crash it lived
   through (the chunk the daemon had read when it was killed); sandboxes past their ttl (+3 s) do
   not run; no sandbox is `lost` unless its init was killed; the daemon's
   descriptor count stays bounded. Then a random half of the sandboxes
   (tickers spared: they end by themselves) is destroyed; every 5th round
   and the last, once the tickers have finished, all of them.

At the end the daemon is stopped with SIGINT (it must exit within 30 s and
leave no sandbox process behind), everything the run made is removed (also
on Ctrl-C or an error) and a summary is printed (`--json FILE` writes it as
JSON). The exit status is 0 only when there was no violation (1: violations,
2: an error in this script, 130: interrupted). The seed fixes the plan (which
round gets which injection, durations, crash moments) and each thread's
choices; timing on a real machine does the rest. `--skip KIND` leaves an
injection out, to triage a failure without changing the rest of the plan.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import glob
import gzip
import hashlib
import io
import json
import os
import platform
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
SBX = r"sbx-[a-z0-9]{12}"
ID_RE = re.compile(SBX)
CGROUP_LINE_RE = re.compile(rf"/warren/({SBX})(?:/|$)", re.M)
CGROUP_ROOT = Path("/sys/fs/cgroup")

OPEN_STATES = ("queued", "creating", "running", "paused", "stopping", "kept")
FINAL_STATES = ("destroyed", "failed", "lost")
WITH_INIT = ("running", "paused", "kept")
INJECTIONS = ("spawner", "init", "readonly", "diskfull")

THREADS = 4
HTTP_TIMEOUT = httpx.Timeout(30.0, connect=5.0)
RESTART_LIMIT_S = 2.0
TTL_SLACK_S = 3.0
FD_SLACK = 48  # descriptors over the baseline tolerated with no sandbox alive
FD_PER_SANDBOX = 12  # ... and per live sandbox

TICKER_LINES = 300
TICKER_CMD = ["sh", "-c", 'i=0; while [ $i -lt 300 ]; do echo "n $i"; i=$((i+1)); sleep 0.01; done']
TICKER_TEXT = "".join(f"n {i}\n" for i in range(TICKER_LINES))
OOM_CMD = ["sh", "-c", 'x=$(head -c 200000000 /dev/zero | tr "\\0" a)']

_T0 = time.monotonic()
_print_lock = threading.Lock()


def log(msg: str) -> None:
    with _print_lock:
        print(f"[{time.monotonic() - _T0:7.2f}s] {msg}", flush=True)


def run(*cmd, check=True, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], check=check, capture_output=True, timeout=timeout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Fatal(Exception):
    """The run cannot go on (the daemon does not come back)."""


# ---------------------------------------------------------------- violations


class Violations:
    """Every failed check, with the round it was found in."""

    def __init__(self):
        self.items: list[str] = []
        self.lock = threading.Lock()
        self.where = "setup"

    def add(self, what: str) -> None:
        with self.lock:
            self.items.append(f"[{self.where}] {what}")
        log(f"VIOLATION: {what}")

    def __len__(self):
        return len(self.items)


# ---------------------------------------------------------------- loop file system


class LoopFs:
    """A 3 GB ext4 file system in a sparse file, loop-mounted: the home lives
    on it so that a full disk can be made without touching the host's."""

    SIZE = "3G"

    def __init__(self, base: Path):
        self.image = base / "fs.img"
        self.mnt = base / "mnt"
        self.ballast = self.mnt / "ballast"
        self.mounted = False

    def create(self) -> None:
        run("truncate", "-s", self.SIZE, self.image)
        # -m 0: no blocks reserved for root, so "free" is the same for the
        # daemon (root) and for statvfs's f_bavail.
        run("mkfs.ext4", "-q", "-F", "-m", "0", self.image)
        self.mnt.mkdir()
        run("mount", "-o", "loop", self.image, self.mnt)
        self.mounted = True

    def free(self) -> int:
        st = os.statvfs(self.mnt)
        return st.f_bavail * st.f_frsize

    def fill(self, leave: int) -> None:
        size = self.free() - leave
        if size > 0:
            run("fallocate", "-l", size, self.ballast)

    def unfill(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.ballast.unlink()

    def destroy(self) -> None:
        if self.mounted:
            self.unfill()
            for _ in range(10):
                if run("umount", self.mnt, check=False).returncode == 0:
                    break
                time.sleep(0.5)
            else:
                log(f"umount {self.mnt} failed; detaching lazily")
                run("umount", "-l", self.mnt, check=False)
            self.mounted = False


# ---------------------------------------------------------------- images


def _tar_add(t: tarfile.TarFile, name: str, data: bytes | None = None, size=None, fileobj=None) -> None:
    ti = tarfile.TarInfo(name)
    ti.mtime = 1700000000
    if data is None and fileobj is None:
        ti.type = tarfile.DIRTYPE
        ti.mode = 0o755
        t.addfile(ti)
        return
    ti.mode = 0o644
    ti.size = len(data) if data is not None else size
    t.addfile(ti, io.BytesIO(data) if data is not None else fileobj)


class _Pattern(io.RawIOBase):
    """`n` bytes of a repeated line of text."""

    LINE = b"warren chaos: a layer that compresses well and is not sparse\n" * 64

    def __init__(self, n):
        self.left = n

    def readable(self):
        return True

    def readinto(self, b):
        n = min(len(b), self.left)
        chunk = self.LINE * (n // len(self.LINE) + 1)
        b[:n] = chunk[:n]
        self.left -= n
        return n


class _HashingWriter(io.RawIOBase):
    """Hashes what is written through it (the diffID of a compressed layer)."""

    def __init__(self, sink):
        self.sink, self.h = sink, hashlib.sha256()

    def writable(self):
        return True

    def write(self, b):
        self.h.update(b)
        self.sink.write(b)
        return len(b)


def random_layer(rng: random.Random, size: int) -> tuple[bytes, str, str]:
    """An uncompressed layer holding `size` random bytes: (blob, media type, diffID)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as t:
        _tar_add(t, "chaos")
        _tar_add(t, "chaos/random.bin", rng.randbytes(size))
    blob = buf.getvalue()
    return blob, "application/vnd.oci.image.layer.v1.tar", "sha256:" + sha256(blob)


def bomb_layer(size: int) -> tuple[bytes, str, str]:
    """A gzip layer of a few hundred KB that unpacks to `size` bytes of text
    (not zeros: those could be written sparse and take no room)."""
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", compresslevel=9, mtime=0) as gz:
        hw = _HashingWriter(gz)
        with tarfile.open(fileobj=hw, mode="w|", format=tarfile.GNU_FORMAT) as t:
            _tar_add(t, "chaos")
            _tar_add(t, "chaos/bomb.txt", size=size, fileobj=_Pattern(size))
    return out.getvalue(), "application/vnd.oci.image.layer.v1.tar+gzip", "sha256:" + hw.h.hexdigest()


def write_oci_layout(out: Path, layer: tuple[bytes, str, str]) -> str:
    """An OCI image-layout tar with one layer; returns the layer blob's digest."""
    blob, media_type, diff_id = layer
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    config = json.dumps(
        {
            "architecture": arch,
            "os": "linux",
            "config": {"Cmd": ["/bin/sh"]},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        }
    ).encode()
    desc = lambda mt, b: {"mediaType": mt, "digest": "sha256:" + sha256(b), "size": len(b)}
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": desc("application/vnd.oci.image.config.v1+json", config),
            "layers": [desc(media_type, blob)],
        }
    ).encode()
    mdesc = desc("application/vnd.oci.image.manifest.v1+json", manifest)
    mdesc["annotations"] = {"org.opencontainers.image.ref.name": "latest"}
    index = json.dumps({"schemaVersion": 2, "manifests": [mdesc]}).encode()
    with tarfile.open(out, "w", format=tarfile.GNU_FORMAT) as t:
        _tar_add(t, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        _tar_add(t, "index.json", index)
        _tar_add(t, "blobs")
        _tar_add(t, "blobs/sha256")
        for b in (config, manifest, blob):
            _tar_add(t, f"blobs/sha256/{sha256(b)}", b)
    return "sha256:" + sha256(blob)


# ---------------------------------------------------------------- the daemon


class Daemon:
    """One `warren up` on a fixed home and port, restarted at will."""

    def __init__(self, binary: Path, home: Path, port: int, log_path: Path):
        self.binary, self.home, self.port, self.log_path = binary, home, port, log_path
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None
        self.token = ""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 60.0) -> float:
        """Starts the daemon; returns the seconds until /healthz answered `ok`."""
        with open(self.log_path, "ab") as logf:
            logf.write(f"\n==== chaos: warren up at {time.ctime()} ====\n".encode())
            logf.flush()
            t0 = time.monotonic()
            self.proc = subprocess.Popen(
                [str(self.binary), "up", "--home", str(self.home), "--listen", f"127.0.0.1:{self.port}",
                 "--cpu-overcommit", "64",
                 # scripts/test.sh's second pass: the node driven over HTTP.
                 *os.environ.get("WARREN_TEST_UP_ARGS", "").split()],
                stdout=logf,
                stderr=logf,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C in the terminal is ours to handle
            )
        deadline = t0 + timeout
        while time.monotonic() < deadline:
            try:
                r = httpx.get(self.url + "/healthz", timeout=1.0)
                if r.status_code == 200 and r.text.rstrip("\n") == "ok":
                    took = time.monotonic() - t0
                    self.token = (self.home / "token").read_text().strip()
                    return took
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                raise Fatal(f"warren up exited with {self.proc.returncode} at start; log tail:\n{self.log_tail()}")
            time.sleep(0.01)
        raise Fatal(f"warren up did not answer /healthz `ok` within {timeout:.0f}s; log tail:\n{self.log_tail()}")

    def kill9(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()

    def stop(self, timeout: float = 30.0) -> bool:
        """SIGINT; True when it exited within `timeout` (else it is killed)."""
        if not self.alive():
            return True
        self.proc.send_signal(signal.SIGCONT)
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            self.kill9()
            return False

    def client(self, timeout=HTTP_TIMEOUT) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=timeout)

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def family(self) -> list[int]:
        """The daemon and its direct children (spawners, adopted inits)."""
        return [self.pid, *children_of(self.pid)]

    def spawners(self) -> list[int]:
        out = []
        for p in children_of(self.pid):
            with contextlib.suppress(OSError):
                argv = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")
                if len(argv) > 1 and argv[1] == b"spawner":
                    out.append(p)
        return sorted(out)

    def log_tail(self, n=4000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_bytes()[-n:].decode(errors="replace")
        return ""


def proc_ppid(pid) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def children_of(pid: int) -> list[int]:
    out = []
    for d in glob.glob("/proc/[0-9]*"):
        p = int(d.rsplit("/", 1)[1])
        if proc_ppid(p) == pid:
            out.append(p)
    return out


def innermost_nspid(pid: int) -> str | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            return line.split()[-1]
    return None


# ---------------------------------------------------------------- host view


class HostView:
    """One scan of everything of this home's sandboxes on the host, in the
    sense of tests/helpers.host_traces: processes in `warren/<id>` cgroups,
    cgroup directories, mounts in this process's and the daemon family's
    mount namespaces, `sandboxes/<id>` and `run/<id>` directories, and claims
    on host uid ranges in /run/warren/uids."""

    def __init__(self, home: Path, family: list[int]):
        self.home = home
        self.procs: dict[str, set[int]] = {}
        for d in glob.glob("/proc/[0-9]*"):
            try:
                text = Path(d, "cgroup").read_text()
            except OSError:
                continue
            for sid in set(CGROUP_LINE_RE.findall(text)):
                self.procs.setdefault(sid, set()).add(int(d.rsplit("/", 1)[1]))
        self.cgroups: dict[str, list[str]] = {}
        for d in glob.glob(f"{CGROUP_ROOT}/*/warren/sbx-*") + glob.glob(f"{CGROUP_ROOT}/warren/sbx-*"):
            self.cgroups.setdefault(os.path.basename(d), []).append(d)
        self.dirs: dict[str, list[str]] = {}
        for sub in ("sandboxes", "run"):
            for d in glob.glob(str(home / sub / "sbx-*")):
                self.dirs.setdefault(os.path.basename(d), []).append(d)
        self.claims: dict[str, list[str]] = {}
        prefix = str(home / "sandboxes") + "/"
        for claim in glob.glob("/run/warren/uids/[0-9]*"):
            with contextlib.suppress(OSError):
                owner = Path(claim).read_text()
                if owner.startswith(prefix):
                    self.claims.setdefault(owner[len(prefix):], []).append(claim)
        self.mounts: dict[str, list[str]] = {}
        seen_ns = set()
        for pid in ["self", *family]:
            try:
                ns = os.readlink(f"/proc/{pid}/ns/mnt")
                if ns in seen_ns:
                    continue
                seen_ns.add(ns)
                lines = Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
            except OSError:
                continue
            for line in lines:
                for sid in set(ID_RE.findall(line)):
                    self.mounts.setdefault(sid, []).append(f"mount ({ns}): {line}")
        self.logs = {p.stem for p in (home / "logs").glob("sbx-*.jsonl")}

    def home_ids(self, known: set[str]) -> set[str]:
        """Ids of this home: known to its API, or with a trace that names the
        home (a directory, a claim, a log, a process whose mounts are in it)."""
        ids = set(known) | set(self.dirs) | set(self.claims) | self.logs
        home = str(self.home)
        for sid, pids in self.procs.items():
            if sid in ids:
                continue
            for p in pids:
                with contextlib.suppress(OSError):
                    if home in Path(f"/proc/{p}/mountinfo").read_text():
                        ids.add(sid)
                        break
        return ids

    def traces(self, sid: str) -> list[str]:
        out = list(self.mounts.get(sid, []))
        out += [f"path: {d}" for d in self.dirs.get(sid, [])]
        out += [f"cgroup: {d}" for d in self.cgroups.get(sid, [])]
        out += [f"uids: {c}" for c in self.claims.get(sid, [])]
        for p in sorted(self.procs.get(sid, ())):
            with contextlib.suppress(OSError):
                out.append(f"process: {p} {Path(f'/proc/{p}/cmdline').read_bytes()!r}")
        return out

    def init_pid(self, sid: str) -> list[int]:
        """Host pids of the sandbox's processes that are PID 1 in their namespace."""
        return sorted(p for p in self.procs.get(sid, ()) if innermost_nspid(p) == "1")


def proc_in_cgroup(pid: int, sid: str) -> bool:
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return False
    return any(line.endswith(f"/warren/{sid}") for line in lines)


# ---------------------------------------------------------------- what was acknowledged


@dataclass
class Created:
    sid: str
    kind: str  # plain, ttl, ticker, oom, delay
    spec: dict
    acked_at: float  # monotonic
    round: int
    into_round: float = 0.0  # seconds after the round's workload began
    ttl_s: float | None = None
    replayed: bool = False
    log_checked: bool = False
    lost_reported: bool = False
    missing_reported: bool = False


@dataclass
class Upload:
    sid: str
    path: str
    digest: str
    size: int


class Ledger:
    """Acknowledged creates and uploads, and the sandboxes the workload uses."""

    def __init__(self):
        self.lock = threading.Lock()
        self.creates: dict[str, Created] = {}
        self.uploads: list[Upload] = []
        self.targets: dict[str, str] = {}  # sid -> kind: what the workload may act on
        self.destroy_requested: set[str] = set()
        self.init_killed: set[str] = set()
        self.stats = Counter()
        self.counter = 0

    def next_n(self) -> int:
        with self.lock:
            self.counter += 1
            return self.counter

    def bump(self, key: str, n: int = 1) -> None:
        with self.lock:
            self.stats[key] += n

    def add_create(self, c: Created, target=True) -> None:
        with self.lock:
            self.creates[c.sid] = c
            self.stats["creates_acknowledged"] += 1
            if target:
                self.targets[c.sid] = c.kind

    def add_upload(self, u: Upload) -> None:
        with self.lock:
            self.uploads.append(u)
            self.stats["uploads_acknowledged"] += 1

    def pick(self, rng: random.Random, kinds=None) -> str | None:
        with self.lock:
            ids = sorted(s for s, k in self.targets.items() if kinds is None or k in kinds)
        return rng.choice(ids) if ids else None

    def pick_upload(self, rng: random.Random) -> Upload | None:
        with self.lock:
            ups = [u for u in self.uploads if u.sid in self.targets]
        return rng.choice(ups) if ups else None

    def mark_destroy(self, sid: str) -> None:
        with self.lock:
            self.destroy_requested.add(sid)
            self.targets.pop(sid, None)

    def set_targets(self, targets: dict[str, str]) -> None:
        with self.lock:
            self.targets = dict(targets)


# ---------------------------------------------------------------- HTTP helpers


def exec_stream(http: httpx.Client, sid: str, cmd: list[str], limit_s: float = 60.0, on_event=None, **kw):
    """POST exec. Returns (status, exit event or None, stdout, stderr); the
    stream is abandoned after `limit_s` (keepalives would keep it open)."""
    out, err, exit_ev = bytearray(), bytearray(), None
    deadline = time.monotonic() + limit_s
    with http.stream("POST", f"/v1/sandboxes/{sid}/exec", json={"cmd": cmd, **kw}) as r:
        if r.status_code != 200:
            r.read()
            return r.status_code, None, b"", b""
        for line in r.iter_lines():
            if line:
                ev = json.loads(line)
                if ev.get("type") == "stdout":
                    out += base64.b64decode(ev["data"])
                elif ev.get("type") == "stderr":
                    err += base64.b64decode(ev["data"])
                elif ev.get("type") == "exit":
                    exit_ev = ev
                if on_event:
                    on_event(ev, bytes(out))
            if time.monotonic() > deadline:
                break
    return 200, exit_ev, bytes(out), bytes(err)


def main_stdout(http: httpx.Client, sid: str) -> tuple[str | None, list[str]]:
    """The main process's stdout from the sandbox's log, and the log lines
    that are not JSON."""
    r = http.get(f"/v1/sandboxes/{sid}/logs")
    if r.status_code != 200:
        return None, []
    parts, bad = [], []
    for line in r.text.splitlines():
        if not line.strip():
            continue
        try:
            ev = json.loads(line)
        except ValueError:
            bad.append(line)
            continue
        if ev.get("kind") == "stdout" and ev.get("exec_id") == "main":
            parts.append(ev["text"] if "text" in ev else base64.b64decode(ev["data"]).decode("latin-1"))
    return "".join(parts), bad


def gaps(actual: str, expected: str) -> tuple[bool, int, int]:
    """Whether `actual` is `expected` with whole lines cut out (in order, no
    line twice); how many contiguous pieces were cut, and how many
    characters are missing."""
    want = expected.splitlines(keepends=True)
    have = actual.splitlines(keepends=True)
    i, pieces, in_gap = 0, 0, False
    for line in have:
        while i < len(want) and want[i] != line:
            i += 1
            if not in_gap:
                pieces, in_gap = pieces + 1, True
        if i == len(want):
            return False, pieces, len(expected) - len(actual)
        i, in_gap = i + 1, False
    if i < len(want):
        pieces += 1
    return True, pieces, len(expected) - len(actual)


def describe_ticker(text: str) -> str:
    """A short account of what is wrong with a ticker's output."""
    nums, odd = [], []
    for line in text.split("\n"):
        m = re.fullmatch(r"n (\d+)", line)
        if m:
            nums.append(int(m.group(1)))
        elif line:
            odd.append(line)
    dups = sorted({n for n in nums if nums.count(n) > 1})
    back = [(a, b) for a, b in zip(nums, nums[1:]) if b <= a]
    gaps = [(a, b) for a, b in zip(nums, nums[1:]) if b > a + 1]
    if nums and nums[0] != 0:
        gaps.insert(0, (-1, nums[0]))
    if nums and nums[-1] != TICKER_LINES - 1:
        gaps.append((nums[-1], TICKER_LINES))
    return (f"{len(nums)} lines, gaps (after, before) {gaps[:6]}, duplicates {dups[:6]}, "
            f"out of order {back[:6]}, garbled {odd[:4]!r}")


# ---------------------------------------------------------------- round plans


@dataclass
class RoundPlan:
    index: int
    duration: float  # seconds of workload
    crash_at: float  # seconds into the workload
    injection: str | None
    inject_at: float
    sigstop: bool
    destroy_all: bool


def plan_rounds(rng: random.Random, rounds: int, sigstop_every: int | None, skip=()) -> list[RoundPlan]:
    kinds: list[str | None] = [None] * rounds
    # Each kind at least once when there are rounds enough; otherwise as
    # many different kinds as there are rounds. (The draws are the same
    # whatever is skipped, so a seed's other rounds do not change.)
    guaranteed = rng.sample(INJECTIONS, min(len(INJECTIONS), rounds))
    for kind, slot in zip(guaranteed, rng.sample(range(rounds), len(guaranteed))):
        kinds[slot] = kind
    for r in range(rounds):
        if kinds[r] is None and rng.random() < 0.35:
            kinds[r] = rng.choice(INJECTIONS)
    kinds = [None if k in skip else k for k in kinds]
    if sigstop_every is None:
        stops = {rounds // 2}
    elif sigstop_every <= 0:
        stops = set()
    else:
        stops = {r for r in range(rounds) if (r + 1) % sigstop_every == 0}
    plans = []
    for r in range(rounds):
        duration = rng.uniform(0.5, 3.0)
        crash_at = rng.uniform(0.25, 1.0) * duration
        plans.append(
            RoundPlan(
                index=r,
                duration=duration,
                crash_at=crash_at,
                injection=kinds[r],
                inject_at=rng.uniform(0.0, 0.5) * crash_at,
                sigstop=r in stops,
                destroy_all=(r % 5 == 4) or r == rounds - 1,
            )
        )
    return plans


# ---------------------------------------------------------------- the workload


class Worker:
    """One workload thread: random operations until told to stop."""

    OPS = [
        ("create:plain", 10),
        ("create:ttl", 6),
        ("create:ticker", 6),
        ("create:oom", 2),
        ("create:delay", 3),
        ("exec", 14),
        ("upload", 8),
        ("download", 6),
        ("pause_resume", 4),
        ("destroy", 6),
    ]
    USABLE = ("plain", "ttl", "ticker")  # kinds that exec, files and pause act on

    def __init__(self, suite: "Chaos", index: int, stop: threading.Event):
        self.s, self.stop = suite, stop
        self.rng = random.Random(f"{suite.seed}/{suite.round}/{index}")
        self.tag = f"{suite.seed}-r{suite.round}-w{index}"
        self.http = suite.daemon.client()

    def run(self) -> None:
        names = [n for n, _ in self.OPS]
        weights = [w for _, w in self.OPS]
        try:
            while not self.stop.is_set():
                op = self.rng.choices(names, weights)[0]
                try:
                    if op.startswith("create:"):
                        self.create(op.split(":")[1])
                    else:
                        getattr(self, op)()
                except (httpx.HTTPError, ValueError, KeyError):
                    # The daemon is down, or answered mid-crash: expected.
                    self.s.ledger.bump("api_errors")
                    time.sleep(0.05)
                except Exception:
                    self.s.script_error(f"worker {self.tag} {op}:\n{traceback.format_exc()}")
                    time.sleep(0.05)
        finally:
            self.http.close()

    def create(self, kind: str):
        self.s.create(self.http, self.s.spec(self.rng, kind, self.tag))

    def exec(self):
        sid = self.s.ledger.pick(self.rng, self.USABLE)
        if sid is None:
            return time.sleep(0.02)
        n = self.s.ledger.next_n()
        code = self.rng.randint(0, 3)
        token = f"out-{n}"
        self.s.ledger.bump("execs_started")
        status, ev, out, _ = exec_stream(
            self.http, sid, ["sh", "-c", f"echo {token}; echo err-{n} >&2; exit {code}"], timeout="20s"
        )
        if ev is None:
            return
        if ev.get("code") == code and out == f"{token}\n".encode():
            self.s.ledger.bump("execs_verified")
            return
        # Killed under the exec (ttl, a destroy, its main process ended)?
        if self.s.still_running(self.http, sid):
            self.s.v.add(f"exec in {sid} answered exit {ev} stdout {out!r}; expected code {code} and {token!r}")

    def upload(self):
        sid = self.s.ledger.pick(self.rng, self.USABLE)
        if sid is None:
            return time.sleep(0.02)
        n = self.s.ledger.next_n()
        size = self.rng.choice([0, 1, 100, 4096, 65536, self.rng.randint(1, 300_000)])
        data = self.rng.randbytes(size)
        path = f"/tmp/f-{n}"
        self.s.ledger.bump("uploads_started")
        r = self.http.put(f"/v1/sandboxes/{sid}/files", params={"path": path}, content=data)
        if 200 <= r.status_code < 300:
            self.s.ledger.add_upload(Upload(sid, path, sha256(data), size))

    def download(self):
        u = self.s.ledger.pick_upload(self.rng)
        if u is None:
            return time.sleep(0.02)
        r = self.http.get(f"/v1/sandboxes/{u.sid}/files", params={"path": u.path})
        if r.status_code == 200:
            if sha256(r.content) != u.digest:
                self.s.v.add(
                    f"download of {u.sid}:{u.path} answered {len(r.content)} bytes sha256 "
                    f"{sha256(r.content)[:16]}, but {u.size} bytes sha256 {u.digest[:16]} were uploaded"
                )
            else:
                self.s.ledger.bump("downloads_verified")

    def pause_resume(self):
        sid = self.s.ledger.pick(self.rng, self.USABLE)
        if sid is None:
            return time.sleep(0.02)
        r = self.http.post(f"/v1/sandboxes/{sid}/pause")
        if r.status_code == 200:
            self.s.ledger.bump("pauses")
            time.sleep(self.rng.uniform(0.05, 0.3))
            self.http.post(f"/v1/sandboxes/{sid}/resume")

    def destroy(self):
        sid = self.s.ledger.pick(self.rng)
        if sid is None:
            return time.sleep(0.02)
        self.s.ledger.mark_destroy(sid)
        r = self.http.delete(f"/v1/sandboxes/{sid}")
        if 200 <= r.status_code < 300:
            self.s.ledger.bump("destroys")


# ---------------------------------------------------------------- the suite


class Chaos:
    def __init__(self, args):
        self.args = args
        self.seed = args.seed
        self.rng = random.Random(self.seed)
        self.binary = Path(args.warren)
        if not self.binary.is_absolute():
            self.binary = ROOT / self.binary
        self.base = Path(tempfile.mkdtemp(prefix="warren-chaos-"))
        self.fs = LoopFs(self.base)
        self.home = self.fs.mnt / "home"
        self.daemon = Daemon(self.binary, self.home, free_port(), self.base / "warren.log")
        self.ledger = Ledger()
        self.v = Violations()
        self.round = -1
        self.rounds_done = 0
        self.http: httpx.Client | None = None
        self.crashes = 0
        self.injections = Counter()
        self.restart_s: list[float] = []
        self.fd_rounds: list[dict] = []
        self.fd_baseline = 0
        self.script_errors: list[str] = []
        self.images: dict[str, Path] = {}
        self.fault_layer_digests: list[str] = []
        self.stopped_cleanly = False
        self.last_create_failure = ""
        self.round_t0 = time.monotonic()

    # --- small helpers

    def script_error(self, text: str) -> None:
        self.script_errors.append(text)
        log(f"SCRIPT ERROR: {text}")

    def spec(self, rng: random.Random, kind: str, tag: str) -> dict:
        n = self.ledger.next_n()
        spec = {
            "image": "busybox:latest",
            "cpu": rng.choice([0.1, 0.15, 0.2, 0.25]),
            "memory": rng.choice(["32M", "48M", "64M"]),
            "request_id": f"chaos-{tag}-{n}",
            "labels": {"chaos": kind},
        }
        if kind == "ttl":
            spec["ttl"] = f"{rng.randint(2, 4)}s"
        elif kind == "ticker":
            spec["cmd"] = TICKER_CMD
        elif kind == "oom":
            spec.update(memory="32M", reclaim="keep_on_failure", cmd=OOM_CMD)
        elif kind == "delay":
            spec.update(reclaim="delay", keep_for="3s", cmd=rng.choice([["true"], ["sh", "-c", "sleep 1"]]))
        return spec

    def create(self, http: httpx.Client, spec: dict, target=True) -> Created | None:
        kind = spec["labels"]["chaos"]
        self.ledger.bump("creates_started")
        r = http.post("/v1/sandboxes", json=spec)
        if not 200 <= r.status_code < 300:
            self.last_create_failure = f"{r.status_code} {r.text[:300]}"
            return None
        c = Created(
            sid=r.json()["id"],
            kind=kind,
            spec=spec,
            acked_at=time.monotonic(),
            round=self.round,
            into_round=time.monotonic() - self.round_t0,
            ttl_s=float(spec["ttl"].rstrip("s")) if "ttl" in spec else None,
        )
        self.ledger.add_create(c, target=target)
        return c

    def state(self, http: httpx.Client, sid: str) -> dict | None:
        try:
            r = http.get(f"/v1/sandboxes/{sid}")
            return r.json() if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    def still_running(self, http: httpx.Client, sid: str) -> bool:
        """Whether a sandbox still runs and nobody asked to destroy it (so an
        operation on it had no excuse to fail)."""
        if sid in self.ledger.destroy_requested or sid in self.ledger.init_killed:
            return False
        s = self.state(http, sid)
        return s is not None and s["state"] == "running"

    def list_sandboxes(self, all_states: bool) -> dict[str, dict]:
        r = self.http.get("/v1/sandboxes", params={"all": "true"} if all_states else None)
        r.raise_for_status()
        return {s["id"]: s for s in r.json()}

    def import_image(self, tar: Path, name: str, http: httpx.Client | None = None):
        """POST an image tar; (status or None on a transport error, body text)."""
        http = http or self.http
        try:
            r = http.post("/v1/images/import", params={"name": name}, content=tar.read_bytes(),
                          timeout=httpx.Timeout(120.0, connect=5.0))
            return r.status_code, r.text
        except httpx.HTTPError as e:
            return None, f"{type(e).__name__}: {e}"

    def expect_serving(self, after: str) -> None:
        """The daemon is alive and answers /healthz and a list, and three
        creates in a row succeed (the store takes writes again)."""
        if not self.daemon.alive():
            self.v.add(f"the daemon exited ({self.daemon.proc.returncode}) after {after}; log tail:\n"
                       f"{self.daemon.log_tail(1500)}")
            return
        last, streak = "", 0
        deadline = time.monotonic() + 15
        with self.daemon.client() as http:
            while time.monotonic() < deadline:
                try:
                    h = http.get("/healthz")
                    if h.status_code != 200 or h.text.rstrip("\n") != "ok":
                        last, streak = f"/healthz {h.status_code} {h.text!r}", 0
                    elif (l := http.get("/v1/sandboxes")).status_code != 200:
                        last, streak = f"list {l.status_code} {l.text[:300]}", 0
                    else:
                        spec = self.spec(self.rng, "plain", f"{self.seed}-r{self.round}-serve")
                        if self.create(http, spec) is not None:
                            streak += 1
                            if streak == 3:
                                return
                            continue
                        last, streak = f"create answered {self.last_create_failure}", 0
                except httpx.HTTPError as e:
                    last, streak = f"{type(e).__name__}: {e}", 0
                time.sleep(0.3)
        self.v.add(f"the daemon did not serve (health, list, 3 creates in a row) within 15 s after {after}: {last}")

    # --- setup

    def setup(self) -> None:
        log(f"seed {self.seed}; base {self.base}; warren {self.binary}")
        if not self.binary.exists():
            raise Fatal(f"no warren binary at {self.binary} (build it, or pass --warren)")
        self.fs.create()
        self.home.mkdir()
        self.build_images()
        self.daemon.start()
        self.http = self.daemon.client()
        status, text = self.import_image(self.images["busybox"], "busybox:latest")
        if status not in (200, 201):
            raise Fatal(f"importing busybox failed: {status} {text[:500]}")
        # The descriptor baseline: a daemon that has made and destroyed one
        # sandbox and has none now.
        c = self.create(self.http, self.spec(self.rng, "plain", f"{self.seed}-setup"), target=False)
        if c is None:
            raise Fatal("the first create failed; see the daemon's log:\n" + self.daemon.log_tail())
        exec_stream(self.http, c.sid, ["true"])
        self.http.delete(f"/v1/sandboxes/{c.sid}")
        self.fd_baseline = self.daemon.fds()
        log(f"daemon pid {self.daemon.pid} on {self.daemon.url}, home {self.home} "
            f"({self.fs.free() >> 20} MiB free), {self.fd_baseline} descriptors with no sandbox")

    def build_images(self) -> None:
        busybox = self.base / "busybox.tar"
        run(ROOT / "scripts" / "make-busybox-image.sh", busybox)
        self.images["busybox"] = busybox
        rng = random.Random(f"{self.seed}/images")
        for name, layer in (("big", random_layer(rng, 100 << 20)), ("mid", random_layer(rng, 35 << 20)),
                            ("bomb", bomb_layer(300 << 20))):
            path = self.base / f"{name}.tar"
            digest = write_oci_layout(path, layer)
            self.images[name] = path
            self.fault_layer_digests.append(digest)
        log("images: " + ", ".join(f"{k} {p.stat().st_size >> 10} KiB" for k, p in self.images.items()))

    # --- a round

    def run_round(self, plan: RoundPlan) -> None:
        self.round = plan.index
        self.v.where = f"round {plan.index}"
        before = dict(self.ledger.stats)
        log(f"=== round {plan.index}: workload {plan.duration:.2f}s, crash at {plan.crash_at:.2f}s, "
            f"injection {plan.injection or '-'}{', sigstop' if plan.sigstop else ''}")
        if plan.sigstop:
            self.inject_sigstop()
        self.workload_and_crash(plan)
        took = self.restart()
        try:
            self.check_round(plan)
            self.cleanup_round(plan)
        except httpx.HTTPError as e:
            # The restarted daemon failed an API call the checks needed.
            self.v.add(f"the API failed during the checks after the restart: {type(e).__name__}: {e}")
        delta = {k: self.ledger.stats[k] - before.get(k, 0) for k in ("creates_acknowledged", "execs_verified",
                                                                     "uploads_acknowledged", "api_errors")}
        self.rounds_done += 1
        log(f"round {plan.index} done: restart {took:.2f}s, {delta}, violations so far {len(self.v)}")

    def workload_and_crash(self, plan: RoundPlan) -> None:
        stop = threading.Event()
        workers = [threading.Thread(target=Worker(self, i, stop).run, daemon=True) for i in range(THREADS)]
        t0 = self.round_t0 = time.monotonic()
        for w in workers:
            w.start()
        try:
            if plan.injection:
                time.sleep(max(0.0, t0 + plan.inject_at - time.monotonic()))
                self.injections[plan.injection] += 1
                log(f"injecting {plan.injection}")
                getattr(self, f"inject_{plan.injection}")()
            time.sleep(max(0.0, t0 + plan.crash_at - time.monotonic()))
            if not self.daemon.alive():
                self.v.add(f"the daemon died on its own (exit {self.daemon.proc.returncode}); log tail:\n"
                           f"{self.daemon.log_tail(1500)}")
            self.daemon.kill9()
            self.crashes += 1
            log(f"kill -9 at {time.monotonic() - t0:.2f}s")
            time.sleep(max(0.2, t0 + plan.duration - time.monotonic()))
        finally:
            stop.set()
            for w in workers:
                w.join(timeout=90)
                if w.is_alive():
                    self.v.add("a workload thread still hangs 90 s after the crash (an API call without an end)")

    def restart(self) -> float:
        self.daemon.kill9()
        if self.http:
            self.http.close()
        took = self.daemon.start()
        self.http = self.daemon.client()
        self.restart_s.append(took)
        if took > RESTART_LIMIT_S:
            self.v.add(f"the restarted daemon answered /healthz `ok` after {took:.2f}s (limit {RESTART_LIMIT_S}s)")
        return took

    # --- injections

    def inject_spawner(self) -> None:
        """kill -9 of a spawner while creates run."""
        http = self.daemon.client()
        tag = f"{self.seed}-r{self.round}-spawner"
        creates = [
            threading.Thread(target=self._quiet_create, args=(self.spec(self.rng, "plain", tag),), daemon=True)
            for _ in range(3)
        ]
        for t in creates:
            t.start()
        time.sleep(self.rng.uniform(0.01, 0.06))
        spawners = self.daemon.spawners()
        if not spawners:
            self.script_error("no spawner process found under the daemon")
        else:
            victim = self.rng.choice(spawners)
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
            log(f"killed spawner {victim} (of {spawners})")
        for t in creates:
            t.join(timeout=60)
            if t.is_alive():
                self.v.add("a create still hangs 60 s after a spawner was killed")
        # The node still creates: a dead spawner is replaced on its next use.
        for _ in range(3):
            try:
                if self.create(http, self.spec(self.rng, "plain", tag)) is not None:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        else:
            self.v.add("no create succeeded (3 tries) after a spawner was killed")
        http.close()

    def _quiet_create(self, spec: dict) -> None:
        with contextlib.suppress(httpx.HTTPError, ValueError), self.daemon.client() as http:
            self.create(http, spec)

    def inject_init(self) -> None:
        """kill -9 of a sandbox's init while an exec streams from it."""
        http = self.daemon.client()
        try:
            c = self.create(http, self.spec(self.rng, "plain", f"{self.seed}-r{self.round}-init"), target=False)
        except httpx.HTTPError as e:
            c = None
            log(f"init injection: create failed ({e})")
        if c is None:
            self.script_error("init injection: could not create its sandbox")
            return http.close()
        started, result = threading.Event(), {}

        def stream():
            try:
                result["r"] = exec_stream(
                    http, c.sid, ["sh", "-c", "echo start; sleep 30; echo end"], limit_s=120,
                    on_event=lambda ev, out: b"start" in out and started.set(),
                )
            except Exception as e:  # noqa: BLE001 - a broken stream is a fine ending
                result["error"] = f"{type(e).__name__}: {e}"

        t = threading.Thread(target=stream, daemon=True)
        t.start()
        if not started.wait(10):
            self.script_error(f"init injection: the exec in {c.sid} did not start: {result}")
        pids = HostView(self.home, self.daemon.family()).init_pid(c.sid)
        if len(pids) != 1:
            self.v.add(f"sandbox {c.sid} (running) has {len(pids)} PID-1 processes on the host: {pids}")
            return http.close()
        self.ledger.init_killed.add(c.sid)
        os.kill(pids[0], signal.SIGKILL)
        log(f"killed init {pids[0]} of {c.sid} mid-exec")
        t.join(timeout=20)
        if t.is_alive():
            self.v.add(f"the exec stream of {c.sid} did not end within 20 s after its init was killed")
        elif "r" in result:
            status, ev, out, _ = result["r"]
            if ev is not None and ev.get("code") == 0 and b"end" in out:
                self.v.add(f"the exec in {c.sid} finished normally although its init was killed: {ev}")
        deadline = time.monotonic() + 10
        while (s := self.state(http, c.sid)) and s["state"] in ("running", "paused"):
            if time.monotonic() > deadline:
                self.v.add(f"sandbox {c.sid} is still {s['state']} 10 s after its init was killed")
                break
            time.sleep(0.1)
        if s:
            log(f"after its init was killed {c.sid} is {s['state']} ({s.get('reason')})")
        http.close()

    def inject_readonly(self) -> None:
        """The store read-only (immutable) for ~2 s under the workload."""
        files = [p for p in (self.home / "warren.db", self.home / "warren.db-wal") if p.exists()]
        run("chattr", "+i", *files)
        try:
            time.sleep(self.rng.uniform(1.5, 2.5))
        finally:
            run("chattr", "-i", *files)
        self.expect_serving("the store was read-only")

    def store_listing(self) -> set[str]:
        out = set()
        for sub in ("content", "snapshots", "images"):
            root = self.home / "images" / sub
            for dirpath, dirnames, filenames in os.walk(root):
                rel = os.path.relpath(dirpath, self.home / "images")
                if sub == "snapshots" and rel.count("/") >= 2:
                    dirnames[:] = []  # an unpacked layer's own files do not matter
                out |= {os.path.join(rel, n) for n in dirnames + filenames}
        return out

    def inject_diskfull(self) -> None:
        """Imports onto a home with ~50 MB free; each must fail cleanly."""
        before = self.store_listing()
        names = {k: f"chaos-full-{k}:r{self.round}" for k in ("big", "mid", "bomb")}
        self.fs.fill(leave=50 << 20)
        log(f"disk filled: {self.fs.free() >> 20} MiB free")
        try:
            with self.daemon.client() as http:
                for kind, name in names.items():
                    status, text = self.import_image(self.images[kind], name, http)
                    log(f"import {kind} ({self.images[kind].stat().st_size >> 20} MiB) on a full disk: "
                        f"{status} {text[:500]!r}")
                    if status is None:
                        # An upload bigger than the disk: the daemon may close
                        # the connection while the body is still coming.
                        if kind != "big":
                            self.v.add(f"import of {kind} on a full disk ended without an answer: {text}")
                    elif status < 400:
                        self.v.add(f"import of {kind} ({name}) on a full disk answered {status}: {text[:300]}")
                    else:
                        try:
                            err = json.loads(text)["error"]
                            assert err["code"] and err["message"]
                        except (ValueError, KeyError, TypeError, AssertionError):
                            self.v.add(f"import of {kind} on a full disk answered {status} without an error "
                                       f"body: {text[:300]!r}")
        finally:
            self.fs.unfill()
        self.expect_serving("the disk was full")
        self.check_no_partial_images(before, names)

    def check_no_partial_images(self, before: set[str], names: dict[str, str]) -> None:
        for tmp in (self.home / "images" / "tmp", self.home / "tmp"):
            left = sorted(os.listdir(tmp)) if tmp.is_dir() else []
            if left:
                self.v.add(f"a failed import left {tmp} non-empty: {left[:10]}")
        new = sorted(self.store_listing() - before)
        if new:
            self.v.add(f"failed imports left content in the image store: {new[:10]}")
        with contextlib.suppress(httpx.HTTPError, ValueError), self.daemon.client() as http:
            listed = {i["name"] for i in http.get("/v1/images").json()}
            if stale := set(names.values()) & listed:
                self.v.add(f"failed imports are listed as images: {sorted(stale)}")
        for rec in (self.home / "images" / "images").glob("*"):
            with contextlib.suppress(OSError):
                text = rec.read_text(errors="replace")
                if any(f'"{n}"' in text for n in names.values()):
                    self.v.add(f"image record {rec} names a failed import")
        for d in self.fault_layer_digests:
            blob = self.home / "images" / "content" / "sha256" / d.split(":")[1]
            if blob.exists():
                self.v.add(f"the blob of a failed import was kept: {blob}")

    def inject_sigstop(self) -> None:
        """SIGSTOP for 30 s with a 5 s-ttl sandbox; gone within 5 s of SIGCONT."""
        self.injections["sigstop"] += 1
        spec = self.spec(self.rng, "plain", f"{self.seed}-r{self.round}-sigstop")
        spec["ttl"] = "5s"
        c = self.create(self.http, spec, target=False)
        if c is None:
            self.script_error("sigstop: the 5 s-ttl sandbox could not be created")
            return
        log(f"SIGSTOP of the daemon for 30 s ({c.sid} has a 5 s ttl)")
        os.kill(self.daemon.pid, signal.SIGSTOP)
        try:
            time.sleep(30)
        finally:
            os.kill(self.daemon.pid, signal.SIGCONT)
        t = time.monotonic()
        s = None
        while time.monotonic() - t < 5:
            s = self.state(self.http, c.sid)
            if s and s["state"] == "destroyed":
                break
            time.sleep(0.05)
        took = time.monotonic() - t
        if not s or s["state"] != "destroyed" or s.get("reason") != "ttl_expired":
            self.v.add(f"{c.sid} (ttl 5 s, daemon stopped for 30 s) is "
                       f"{s and (s['state'], s.get('reason'))} 5 s after SIGCONT; expected destroyed/ttl_expired")
        else:
            log(f"{c.sid} destroyed (ttl_expired) {took:.2f}s after SIGCONT")

    # --- checks after a restart

    def check_round(self, plan: RoundPlan) -> None:
        rows = self.timed(self.list_sandboxes, True)
        self.timed(self.check_ttls, rows)
        self.timed(self.check_acknowledged, rows)
        self.timed(self.check_lost, rows)
        listed = self.list_sandboxes(all_states=False)
        self.timed(self.resume_paused, listed)
        self.timed(self.check_inits, listed)
        self.timed(self.check_uploads)
        self.timed(self.check_host)
        if plan.destroy_all:
            self.wait_for_tickers()
        self.timed(self.check_tickers)

    def timed(self, fn, *args):
        t = time.monotonic()
        try:
            return fn(*args)
        finally:
            if (took := time.monotonic() - t) > 2.0:
                log(f"{fn.__name__} took {took:.1f}s")

    def check_ttls(self, rows: dict[str, dict]) -> None:
        now = time.monotonic()
        for c in list(self.ledger.creates.values()):
            row = rows.get(c.sid)
            if c.ttl_s is None or row is None:
                continue
            over = now - (c.acked_at + c.ttl_s)
            if over > TTL_SLACK_S and row["state"] in ("running", "paused"):
                self.v.add(f"{c.sid} (ttl {c.ttl_s:.0f}s) is still {row['state']} {over:.1f}s after its ttl")

    def check_acknowledged(self, rows: dict[str, dict]) -> None:
        """Every acknowledged create exists, and its request_id replays to it."""
        creates = list(self.ledger.creates.values())
        missing = []
        for c in creates:
            if c.sid not in rows and not c.missing_reported:
                r = self.http.get(f"/v1/sandboxes/{c.sid}")
                if r.status_code != 200:
                    c.missing_reported = c.replayed = True
                    missing.append(f"{c.sid} (request_id {c.spec['request_id']}, answered {c.into_round:.2f}s "
                                   f"into round {c.round}: GET {r.status_code})")
        if missing:
            self.v.add(f"{len(missing)} acknowledged create(s) unknown after the restart: " + "; ".join(missing[:6])
                       + (" ..." if len(missing) > 6 else ""))
        older = [c for c in creates if c.replayed and not c.missing_reported]
        replay = [c for c in creates if not c.replayed]
        replay += self.rng.sample(older, min(5, len(older)))
        wrong = []
        for c in replay:
            r = self.http.post("/v1/sandboxes", json=c.spec)
            got = r.json().get("id") if r.headers.get("content-type", "").startswith("application/json") else None
            if not 200 <= r.status_code < 300 or got != c.sid:
                wrong.append(f"{c.spec['request_id']} answered {r.status_code} {got or r.text[:100]}, "
                             f"not {c.sid}")
            c.replayed = True
            self.ledger.bump("replays")
        if wrong:
            self.v.add(f"{len(wrong)} replayed request_id(s) did not answer the acknowledged sandbox: "
                       + "; ".join(wrong[:6]) + (" ..." if len(wrong) > 6 else ""))

    def check_lost(self, rows: dict[str, dict]) -> None:
        """Nothing becomes `lost` unless its init was killed."""
        lost = []
        for c in list(self.ledger.creates.values()):
            row = rows.get(c.sid)
            if row and row["state"] == "lost" and c.sid not in self.ledger.init_killed and not c.lost_reported:
                c.lost_reported = True
                events = (self.state(self.http, c.sid) or {}).get("events") or [{}]
                lost.append(f"{c.sid} ({c.kind} from round {c.round}"
                            f"{', destroy requested' if c.sid in self.ledger.destroy_requested else ''}: "
                            f"{events[-1].get('message', '')!r})")
        if lost:
            self.v.add(f"{len(lost)} sandbox(es) became lost though no init was killed: " + "; ".join(lost[:6])
                       + (" ..." if len(lost) > 6 else ""))

    def resume_paused(self, listed: dict[str, dict]) -> None:
        for sid, row in sorted(listed.items()):
            if row["state"] == "paused":
                r = self.http.post(f"/v1/sandboxes/{sid}/resume")
                if r.status_code == 200:
                    listed[sid] = r.json()

    def check_inits(self, listed: dict[str, dict]) -> None:
        view = HostView(self.home, self.daemon.family())
        for sid, row in sorted(listed.items()):
            if row["state"] not in WITH_INIT:
                continue
            pids = view.init_pid(sid)
            ok = len(pids) == 1 and proc_in_cgroup(pids[0], sid)
            if ok and row["state"] == "running":
                status, ev, _, err = exec_stream(self.http, sid, ["true"], limit_s=30, timeout="20s")
                if ev is not None and ev.get("code") == 0:
                    continue
                problem = f"`exec true` answered {status} {ev} {err[:200]!r}"
            elif ok:
                continue
            else:
                problem = f"its init is not alive in its cgroup (PID-1 processes {pids}, " \
                          f"all {sorted(view.procs.get(sid, ()))})"
            now = self.state(self.http, sid)
            if (now and now["state"] == "running" and status == 503
                    and row.get("spec", {}).get("labels", {}).get("chaos") == "oom"):
                # An OOM sandbox thrashes at its memory limit on a fraction
                # of a core, which its init shares: an exec may not start
                # within init's 10 s deadline (503, retry) until the OOM
                # killer ends it. That is allowed; a wedged init is not, so
                # the sandbox must reach its end soon.
                deadline = time.monotonic() + 30
                while now and now["state"] == "running" and time.monotonic() < deadline:
                    time.sleep(0.5)
                    now = self.state(self.http, sid)
                if not now or now["state"] != "running":
                    log(f"{sid} (OOM) answered exec with 503 while it thrashed, then became "
                        f"{now['state'] if now else 'gone'}")
                    continue
            if now and now["state"] == row["state"]:
                self.v.add(f"{sid} is listed {row['state']} but {problem}")

    def check_uploads(self) -> None:
        rows = self.list_sandboxes(all_states=False)
        for u in list(self.ledger.uploads):
            if rows.get(u.sid, {}).get("state") != "running":
                continue
            r = self.http.get(f"/v1/sandboxes/{u.sid}/files", params={"path": u.path})
            if r.status_code == 200 and sha256(r.content) == u.digest:
                self.ledger.bump("uploads_verified")
                continue
            if r.status_code != 200 and not self.still_running(self.http, u.sid):
                continue
            self.v.add(f"acknowledged upload {u.sid}:{u.path} ({u.size} bytes) reads back as "
                       f"{r.status_code} {len(r.content)} bytes sha256 {sha256(r.content)[:16]}")

    def check_host(self) -> None:
        """Nothing of this home on the host unless its sandbox is listed open."""
        for attempt in range(6):
            listed = self.list_sandboxes(all_states=False)
            rows = self.list_sandboxes(all_states=True)
            view = HostView(self.home, self.daemon.family())
            leftovers = {}
            for sid in sorted(view.home_ids(set(rows))):
                if sid in listed:
                    continue
                if traces := view.traces(sid):
                    leftovers[sid] = traces
            if not leftovers:
                return
            time.sleep(1.0)  # a destroy may be finishing; look again
        for sid, traces in leftovers.items():
            row = rows.get(sid)
            what = f"{row['state']} ({row.get('reason')})" if row else "unknown to the API"
            self.v.add(f"{sid}, {what}, is not listed open but is on the host:\n    " + "\n    ".join(traces[:8]))

    def wait_for_tickers(self, limit=25.0) -> None:
        """Lets running tickers finish before everything is destroyed."""
        t0 = time.monotonic()
        tickers = [c.sid for c in self.ledger.creates.values() if c.kind == "ticker"]
        while time.monotonic() - t0 < limit:
            rows = self.list_sandboxes(all_states=False)
            busy = [s for s in tickers if rows.get(s, {}).get("state") in ("running", "paused", "stopping")]
            if not busy:
                break
            time.sleep(0.3)
        log(f"waited {time.monotonic() - t0:.1f}s for tickers to finish" + (f"; still busy: {busy}" if busy else ""))

    def check_tickers(self) -> None:
        rows = self.list_sandboxes(all_states=True)
        for c in list(self.ledger.creates.values()):
            if c.kind != "ticker" or c.log_checked:
                continue
            row = rows.get(c.sid)
            if not row or row["state"] not in FINAL_STATES:
                continue
            c.log_checked = True
            if row["state"] != "destroyed" or row.get("reason") != "main_exited":
                continue
            text, bad = main_stdout(self.http, c.sid)
            if text is None:
                self.v.add(f"the log of finished ticker {c.sid} cannot be read")
                continue
            if bad:
                self.v.add(f"the log of {c.sid} has {len(bad)} line(s) that are not JSON: {bad[0][:200]!r}")
            ok, pieces, missing = gaps(text, TICKER_TEXT)
            # One chunk in flight may be lost per crash the ticker lived
            # through (it may have been paused across several rounds).
            lived = self.round - c.round + 1
            self.ledger.bump("tickers_checked")
            if not ok or pieces > lived:
                self.v.add(f"main output of ticker {c.sid} is not the 300 lines with at most one gap "
                           f"per crash it lived through ({lived}): {describe_ticker(text)}")
            elif missing:
                self.ledger.bump("ticker_gaps")
                log(f"ticker {c.sid}: {pieces} gap(s), {missing} bytes (a chunk read at a crash)")

    # --- end of a round

    def cleanup_round(self, plan: RoundPlan) -> None:
        listed = self.list_sandboxes(all_states=False)
        ids = sorted(listed)
        if plan.destroy_all:
            doomed = ids
        else:
            # Tickers end by themselves (and their logs are checked then).
            pool = [s for s in ids if self.ledger.creates.get(s, None) is None
                    or self.ledger.creates[s].kind != "ticker"]
            doomed = sorted(self.rng.sample(pool, len(pool) // 2))
        for sid in doomed:
            self.ledger.mark_destroy(sid)
            r = self.http.delete(f"/v1/sandboxes/{sid}")
            if not 200 <= r.status_code < 300:
                self.v.add(f"destroying {sid} answered {r.status_code}: {r.text[:200]}")
        left = self.list_sandboxes(all_states=False)
        self.ledger.set_targets({
            sid: self.ledger.creates[sid].kind
            for sid, row in left.items()
            if sid in self.ledger.creates and row["state"] in ("running", "paused")
            and sid not in self.ledger.init_killed
        })
        fds = self.daemon.fds()
        self.fd_rounds.append({"round": plan.index, "fds": fds, "live": len(left)})
        log(f"round {plan.index}: destroyed {len(doomed)}, {len(left)} live, daemon has {fds} descriptors "
            f"(baseline {self.fd_baseline})")
        bound = self.fd_baseline + FD_SLACK + FD_PER_SANDBOX * len(left)
        if fds > bound:
            self.v.add(f"the daemon holds {fds} descriptors with {len(left)} sandboxes live "
                       f"(baseline {self.fd_baseline}, bound {bound}): a leak?")

    # --- the end

    def final_stop(self) -> None:
        self.v.where = "final stop"
        ids = self.home_ids_now()
        ok = self.daemon.stop(timeout=30)
        self.stopped_cleanly = True
        if not ok:
            self.v.add("warren up did not exit within 30 s of SIGINT")
        elif self.daemon.proc.returncode != 0:
            self.v.add(f"warren up exited with {self.daemon.proc.returncode} after SIGINT")
        time.sleep(0.2)
        view = HostView(self.home, [])
        for sid in sorted(ids | view.home_ids(set())):
            if pids := sorted(view.procs.get(sid, ())):
                self.v.add(f"after the clean stop, sandbox {sid} still has processes {pids}")
            elif traces := view.traces(sid):
                self.v.add(f"after the clean stop, sandbox {sid} left: {traces[:5]}")

    def home_ids_now(self) -> set[str]:
        with contextlib.suppress(Exception):
            return set(self.list_sandboxes(all_states=True))
        return set()

    def teardown(self) -> None:
        """Leaves nothing behind, whatever happened."""
        with contextlib.suppress(Exception):
            if self.http:
                self.http.close()
        for f in (self.home / "warren.db", self.home / "warren.db-wal"):
            run("chattr", "-i", f, check=False)
        self.fs.unfill()
        if not self.stopped_cleanly and self.daemon.proc is not None:
            with contextlib.suppress(Exception):
                if not self.daemon.alive():
                    self.daemon.start()  # let the daemon destroy what is left
            with contextlib.suppress(Exception):
                self.daemon.stop(timeout=30)
        self.kill_leftovers()
        self.fs.destroy()
        if self.v.items or self.script_errors:
            kept = Path(tempfile.gettempdir()) / f"warren-chaos-{self.seed}-{os.getpid()}.log"
            with contextlib.suppress(OSError):
                shutil.copyfile(self.daemon.log_path, kept)
                log(f"the daemon's log is kept at {kept}")
        shutil.rmtree(self.base, ignore_errors=True)

    def kill_leftovers(self) -> None:
        if not self.home.exists():
            return
        view = HostView(self.home, [])
        ids = {s for s in view.home_ids(set()) if view.traces(s)}
        for sid in ids:
            for d in view.cgroups.get(sid, []):
                if d.startswith(f"{CGROUP_ROOT}/freezer/"):
                    with contextlib.suppress(OSError):
                        Path(d, "freezer.state").write_text("THAWED")
            for p in view.procs.get(sid, ()):
                with contextlib.suppress(OSError):
                    os.kill(p, signal.SIGKILL)
        time.sleep(0.3 if ids else 0)
        for sid in ids:
            for d in view.cgroups.get(sid, []):
                with contextlib.suppress(OSError):
                    os.rmdir(d)
            for c in view.claims.get(sid, []):
                with contextlib.suppress(OSError):
                    os.unlink(c)
        if ids:
            log(f"teardown: removed leftovers of {len(ids)} sandboxes")

    # --- report

    def summary(self) -> dict:
        st = self.ledger.stats
        rs = self.restart_s
        return {
            "seed": self.seed,
            "rounds": self.rounds_done,
            "creates_acknowledged": st["creates_acknowledged"],
            "creates_attempted": st["creates_started"],
            "execs": st["execs_verified"],
            "execs_attempted": st["execs_started"],
            "uploads": st["uploads_acknowledged"],
            "uploads_verified_after_restart": st["uploads_verified"],
            "downloads_verified": st["downloads_verified"],
            "pauses": st["pauses"],
            "destroys": st["destroys"],
            "replays": st["replays"],
            "tickers_checked": st["tickers_checked"],
            "ticker_gaps_tolerated": st["ticker_gaps"],
            "api_errors": st["api_errors"],
            "crashes": self.crashes,
            "injections": dict(sorted(self.injections.items())),
            "restart_to_ok_s": {
                "p50": round(statistics.median(rs), 3) if rs else None,
                "max": round(max(rs), 3) if rs else None,
                "all": [round(x, 3) for x in rs],
            },
            "fds": {"baseline": self.fd_baseline, "per_round": self.fd_rounds},
            "violations": list(self.v.items),
            "script_errors": self.script_errors,
        }


def print_summary(s: dict) -> None:
    print("\n==== chaos summary ====")
    print(f"seed {s['seed']}, rounds {s['rounds']}, crashes {s['crashes']}")
    print(f"creates acknowledged {s['creates_acknowledged']} (of {s['creates_attempted']}), "
          f"replays {s['replays']}")
    print(f"execs {s['execs']} verified (of {s['execs_attempted']}), uploads {s['uploads']} acknowledged, "
          f"{s['uploads_verified_after_restart']} read back after restarts, downloads {s['downloads_verified']}")
    print(f"pauses {s['pauses']}, destroys {s['destroys']}, tickers checked {s['tickers_checked']} "
          f"({s['ticker_gaps_tolerated']} lost a chunk in flight), API errors {s['api_errors']}")
    print(f"injections: {s['injections'] or 'none'}")
    r = s["restart_to_ok_s"]
    print(f"restart to `ok`: p50 {r['p50']}s, max {r['max']}s")
    print("descriptors: baseline {}, per round {}".format(
        s["fds"]["baseline"], ", ".join(f"{x['fds']}/{x['live']}" for x in s["fds"]["per_round"])))
    if s["script_errors"]:
        print(f"script errors: {len(s['script_errors'])}")
    print(f"violations: {len(s['violations'])}")
    for v in s["violations"]:
        print(f"  - {v}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, required=True)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--warren", default="target/debug/warren", help="warren binary (relative: to the repo root)")
    ap.add_argument("--sigstop-every", type=int, default=None,
                    help="SIGSTOP the daemon every K rounds (default: once, in the middle round; 0: never)")
    ap.add_argument("--json", type=Path, default=None, help="write the summary to this file as JSON")
    ap.add_argument("--skip", action="append", default=[], choices=INJECTIONS,
                    help="leave this injection out (to triage; repeatable)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("chaos.py must run as root", file=sys.stderr)
        return 2
    # Ctrl-C and SIGTERM end the run through the clean-up below, even when
    # SIGINT was ignored by whoever started us (a background job).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1, 2**31)
    print(f"chaos: seed {args.seed} (rerun with --seed {args.seed})", flush=True)

    suite = Chaos(args)
    plans = plan_rounds(suite.rng, args.rounds, args.sigstop_every, set(args.skip))
    log("plan: " + "; ".join(
        f"r{p.index}:{p.injection or '-'}{'+sigstop' if p.sigstop else ''}{'+all' if p.destroy_all else ''}"
        for p in plans))
    status = 0
    interrupted = False
    try:
        suite.setup()
        for plan in plans:
            suite.run_round(plan)
        suite.final_stop()
    except KeyboardInterrupt:
        interrupted = True
        log("interrupted; cleaning up")
    except Fatal as e:
        suite.v.add(f"fatal: {e}")
    except Exception:
        suite.script_error(traceback.format_exc())
    finally:
        try:
            suite.teardown()
        except Exception:
            suite.script_error("teardown: " + traceback.format_exc())
    s = suite.summary()
    print_summary(s)
    if args.json:
        args.json.write_text(json.dumps(s, indent=2) + "\n")
    if interrupted:
        status = 130
    elif s["violations"]:
        status = 1
    elif s["script_errors"]:
        status = 2
    return status


if __name__ == "__main__":
    sys.exit(main())

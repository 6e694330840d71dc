"""The README, run as written: its install step, its demo and its tour,
taken from its code blocks, against a fresh home and port, with only the
line that needs internet access skipped. Each command's exit status and
the output its comment promises are checked, and every command of the
tour must have a check here, so a README edit that the test does not know
fails it until the promise is written down.

What differs from a person's first ten minutes, and why: the home, the API
port and the port-forward port are fresh ones (the text's `/var/lib/warren`,
`127.0.0.1:7070` and `8080` are replaced), so that the test runs beside any
other Warren; `scripts/install.sh` installs the binary under test
(`WARREN_BIN`) into a temporary prefix instead of building a release one;
and after a line that starts something in the background the script waits
until it answers, as a person would before typing the next command."""

import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pytest

from conftest import ROOT, UP_ARGS, WARREN, free_port
from helpers import bare, commands, sigint_as_at_a_terminal

# The README starts `warren up` without flags: the suite's second pass
# (another node transport) would only run the same thing again.
pytestmark = pytest.mark.skipif(bool(UP_ARGS), reason="the README's daemon takes no flags; run once")

README = ROOT / "README.md"
NEEDS_INTERNET = "needs internet access"


def block(section):
    """The first ```sh block under the `## section` heading."""
    text = README.read_text()
    m = re.search(rf"^## {re.escape(section)}\n(.*?)^```sh\n(.*?)^```", text, re.M | re.S)
    assert m, f"README has no sh block under '## {section}'"
    return m.group(2)


class Setting:
    """A fresh home and ports, a checkout-like working directory (the
    README's commands run from a checkout), and the environment."""

    def __init__(self, base):
        self.base = base
        self.work = base / "work"
        self.work.mkdir()
        for d in ("scripts", "deploy"):
            (self.work / d).symlink_to(ROOT / d)
        self.home = base / "home"
        self.port = free_port()
        self.fwd = free_port()
        self.prefix = base / "prefix"
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "WARREN_HOME": str(self.home),
            "WARREN_URL": self.url,
            "WARREN_LISTEN": f"127.0.0.1:{self.port}",
            "WARREN_BIN": str(WARREN),
            "PREFIX": str(self.prefix),
            "SYSTEMD_DIR": str(self.prefix / "units"),
            "PATH": f"{self.prefix}/bin:{os.environ.get('PATH', '/usr/bin:/bin')}",
        }
        self.env.pop("WARREN_TOKEN", None)

    def localize(self, cmd):
        return (
            cmd.replace("/var/lib/warren", str(self.home))
            .replace("127.0.0.1:7070", f"127.0.0.1:{self.port}")
            .replace("8080", str(self.fwd))
        )

    def wait_for(self, cmd):
        """Shell that waits for what a background line started."""
        if re.search(r"\bwarren up\b", cmd):
            return f"for _ in $(seq 300); do curl -sf {self.url}/healthz >/dev/null && break; sleep 0.1; done"
        m = re.search(r"port-forward \S+ (\d+):", cmd)
        if m:
            return f"for _ in $(seq 300); do (exec 3<>/dev/tcp/127.0.0.1/{m.group(1)}) 2>/dev/null && break; sleep 0.1; done"
        raise AssertionError(f"the test does not know how to wait for {cmd!r}")


def run_script(setting, cmds, timeout):
    """Runs the commands in one bash, as typed in one shell; returns
    [(command, exit status, output)]. The shell runs in a session of its
    own, so whatever it leaves running is stopped afterwards."""
    lines = []
    for i, cmd in enumerate(cmds):
        background = bare(cmd).rstrip().endswith("&")
        if background:
            # Its own file: what it goes on printing (a daemon's warning)
            # would otherwise land in the later commands' output.
            log = setting.base / f"background-{i}.txt"
            cmd = f"{bare(cmd).rstrip().removesuffix('&').rstrip()} > {log} 2>&1 &"
        lines += [f"echo '@@cmd {i}'", cmd, f"echo \"@@rc {i} $?\""]
        if background:
            lines.append(setting.wait_for(bare(cmd)))
    script = setting.base / "readme.sh"
    script.write_text("\n".join(lines) + "\n")
    proc = subprocess.Popen(
        ["bash", str(script)],
        cwd=setting.work,
        env=setting.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"the README's commands took over {timeout}s:\n{out.decode(errors='replace')[-4000:]}")
    text = out.decode(errors="replace")
    results = []
    for i, cmd in enumerate(cmds):
        m = re.search(rf"^@@cmd {i}\n(.*?)^@@rc {i} (\d+)$", text, re.M | re.S)
        assert m, f"no result for {cmd!r}; output:\n{text[-4000:]}"
        results.append((cmd, int(m.group(2)), m.group(1)))
    return results, proc.pid


def stop_session(pgid):
    """Whatever the README's shell left running (its daemon, a port
    forward): SIGINT first, the clean stop, then SIGKILL."""
    for sig, wait in ((signal.SIGINT, 30), (signal.SIGKILL, 5)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.time() + wait
        while time.time() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


def stop_daemon_of(home):
    """The demo's daemon runs in a session of its own: found by its home."""
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            argv = (p / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"up" in argv and str(home).encode() in argv:
            os.kill(int(p.name), signal.SIGKILL)


def api_down(url):
    try:
        httpx.get(url + "/healthz", timeout=1)
        return False
    except httpx.HTTPError:
        return True


@pytest.fixture
def setting():
    base = Path(tempfile.mkdtemp(prefix="warren-readme-"))
    s = Setting(base)
    yield s
    shutil.rmtree(base, ignore_errors=True)


# What each tour command promises: (a fragment of the command, its exit
# status, a pattern its output must contain or None). The sandbox id is
# written {id}; every command must match exactly one entry.
TOUR = [
    ("scripts/install.sh", 0, r"installed .*/bin/warren"),
    ("warren doctor", 0, r"Warren can run sandboxes here"),
    ("warren up &", 0, None),
    ("make-busybox-image.sh", 0, None),
    ("warren image import", 0, r"(?m)^busybox:latest sha256:[0-9a-f]{64}$"),
    ("warren image ls", 0, r"busybox:latest"),
    ("id=$(warren create", 0, None),
    ("hostname; echo $OMP_NUM_THREADS", 0, r"\A{id}\n1\n\Z"),
    ("--timeout 2s", 0, r"(?m)^137$"),
    ("> train.py", 0, None),
    ("warren cp train.py", 0, None),
    ("warren cp $id:/work ./out", 0, None),
    ("warren fork $id", 0, None),
    ("warren pool set small", 0, r"^small size 2 ready \d"),
    ("warren pool ls", 0, r"(?m)^small +busybox +2 "),
    ("for k in $kids", 0, r"\Atrain.py\ntrain.py\n\Z"),
    ("warren run --image busybox --rm", 0, r"\Ahello\n3\n\Z"),
    ("> Dockerfile", 0, None),
    ("warren build -t demo:1", 0, r"(?m)^sha256:[0-9a-f]{64}$"),
    ("warren run --image demo:1", 0, r"\A1 train.py\n\Z"),
    ("warren batch create", 0, None),
    ("warren batch inspect", 0, r'"count": 50'),
    ("--ttl 5s", 0, None),
    ("--lease 3s", 0, None),
    ("warren heartbeat", 0, None),
    ("sleep 6", 0, None),
    ("--type ttl_expired", 0, r'"reason":"ttl_expired".*"state":"destroyed"'),
    ("--type lease_expired", 0, r'"reason":"lease_expired".*"state":"destroyed"'),
    ("warren profile ls", 0, r"\bswe\b"),
    ("warren profile export", 0, None),
    ("/metrics | head", 0, r"(?m)^# (HELP|TYPE) warren_"),
    ("net=$(warren create", 0, None),
    ("http://example.com/", 1, r"403 Forbidden"),
    ("warren network $net", 0, None),
    ("grep ' net '", 0, r' net +\{.*"decision":"deny".*"host":"example.com"'),
    ("httpd -p 8000", 0, None),
    ("warren port-forward", 0, None),
    ("/train.py", 0, r'\Aprint\("training"\)\n\Z'),
    ("/exec", 0, r'"type":"exit".*"code":2'),
    ("warren ps --label task=demo", 0, r"{id}"),
    ("warren inspect $id", 0, r'"id": "{id}"'),
    ("warren logs $id", 0, r"(?m)^\d{4}-\d\d-\d\dT[\d:.]+Z (stdout|stderr|event) "),
    ("warren rm --label task=demo", 0, r"{id} destroyed"),
    ("kill $(jobs -p)", 0, None),
]


def test_install_and_tour_as_written(setting):
    cmds = commands(block("Install")) + commands(block("A five-minute tour"))
    skipped = [c for c in cmds if NEEDS_INTERNET in c]
    assert len(skipped) == 1, f"lines marked '{NEEDS_INTERNET}': {skipped}"
    cmds = [setting.localize(c) for c in cmds if NEEDS_INTERNET not in c]
    matched = {}
    for c in cmds:
        hits = [e for e in TOUR if e[0] in bare(c)]
        assert len(hits) == 1, f"README command {c!r} matches {len(hits)} checks of this test: {hits}"
        matched[c] = hits[0]
    unused = [e[0] for e in TOUR if e not in matched.values()]
    assert not unused, f"checks for commands the README no longer has: {unused}"

    results, pgid = [], None
    try:
        results, pgid = run_script(setting, cmds, timeout=300)
        sid = next(out.split()[0] for c, _, out in results if "hostname" in c)
        assert re.fullmatch(r"sbx-\w+", sid), sid
        for cmd, rc, out in results:
            _, want_rc, pattern = matched[cmd]
            assert rc == want_rc, f"{cmd!r} exited {rc}, the README says {want_rc}:\n{out}"
            if pattern:
                pattern = pattern.replace("{id}", re.escape(sid))
                assert re.search(pattern, out, re.S), f"{cmd!r} printed:\n{out}\nwanted /{pattern}/"
        # What the commands left behind is what the comments say.
        assert (setting.work / "out" / "train.py").read_text() == 'print("training")\n'
        assert "[" in (setting.work / "profiles.toml").read_text()
        assert (setting.prefix / "units" / "warren-up.service").is_file()
        # `kill $(jobs -p)` stopped the daemon, which destroyed what was left.
        deadline = time.time() + 60
        while not api_down(setting.url) and time.time() < deadline:
            time.sleep(0.2)
        assert api_down(setting.url), "warren up still answers after the tour's last line"
        assert not list((setting.home / "sandboxes").iterdir()), "sandbox directories left behind"
        assert (setting.home / "warren-up.log").is_file()
    finally:
        if pgid:
            stop_session(pgid)


def test_demo_as_written(setting):
    (cmd,) = commands(block("The demo"))
    cmd = setting.localize(cmd).split("#")[0].strip()
    assert cmd == "scripts/demo.sh", cmd
    proc = subprocess.Popen(
        ["bash", "-c", cmd],
        cwd=setting.work,
        env=setting.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=sigint_as_at_a_terminal,
    )
    lines = []

    def read():
        for raw in proc.stdout:
            lines.append(raw.decode(errors="replace"))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.time() + 180
        while time.time() < deadline and proc.poll() is None:
            if any("Press Ctrl-C" in l for l in lines):
                break
            time.sleep(0.2)
        out = "".join(lines)
        assert "Press Ctrl-C" in out, f"the demo stopped before its end:\n{out}"
        assert re.search(r"16 sandboxes ready in \d+ ms", out), out
        assert re.search(r"destroyed: +16\b", out), out
        assert "sandbox directories left on the host: 0" in out, out
        assert re.search(r"(?m)^ID +STATE", out), f"no ps table:\n{out}"
        assert not api_down(setting.url), "warren up is not running at the demo's end"
        # Its closing hint works as printed, with this demo's port and home.
        hint = next(l for l in lines if "echo hello from a sandbox" in l).strip()
        assert hint.startswith(f"WARREN_URL={setting.url} WARREN_HOME={setting.home} "), hint
        said = subprocess.run(["bash", "-c", hint], capture_output=True, text=True, timeout=60,
                              env={k: v for k, v in setting.env.items() if not k.startswith("WARREN_")})
        assert said.stdout == "hello from a sandbox\n", said
        # Ctrl-C: the whole foreground process group gets SIGINT.
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            # Say what the daemon was doing.
            log = setting.home / "warren-up.log"
            tail = log.read_text(errors="replace")[-4000:] if log.exists() else "(no log)"
            raise AssertionError(f"the demo did not stop within 60 s of Ctrl-C:\n{''.join(lines)}\nwarren-up.log:\n{tail}")
        reader.join(timeout=10)
        out = "".join(lines)
        assert api_down(setting.url), f"warren up still answers after Ctrl-C:\n{out}"
        assert "warren up: stopped" in out and "stopped at once" not in out, out
    finally:
        stop_session(proc.pid)
        if not api_down(setting.url):
            stop_daemon_of(setting.home)


def test_the_demo_stops_with_a_clear_message_when_its_port_is_taken(setting):
    import socket

    taken = socket.socket()
    taken.bind(("127.0.0.1", setting.port))
    taken.listen()
    try:
        p = subprocess.run(["bash", "-c", "scripts/demo.sh"], cwd=setting.work, env=setting.env,
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 1, p
        assert "did not start" in p.stderr and "WARREN_URL=" in p.stderr, p.stderr
        assert api_down(setting.url)
    finally:
        taken.close()
        stop_daemon_of(setting.home)

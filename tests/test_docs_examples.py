"""The examples of docs/python.md, docs/e2b.md and docs/sandbox-fusion.md,
run as written (tests/test_readme.py does the README's): every code block
of each doc, in the doc's order, its shell commands in one bash and its
Python blocks in one Python session, with each command's exit status and
the output its comment promises checked.

Every block of these docs must be known here, like the README's tour: a
block that runs has a check for each command (or for the block, in
Python), and one that does not is classified with its reason (a file's
content or an answer's shape, another project's test suite, Docker Hub).
A doc edit that adds or drops an example, or changes what one prints,
fails this test until the check is written down.

What differs from a reader's session, and why: each doc gets a fresh home
and fresh ports (the text's `/var/lib/warren`, `127.0.0.1:7070`, `3000`,
`3001`, `8080` and `/tmp/...tar` are replaced) so that it runs beside any
other Warren; `warren` is the binary under test (`WARREN_BIN`);
`scripts/make-base-image.sh` lines take the archive that tests/debian.py
built with the same script and packages (cached: mmdebstrap takes
minutes); the SDK's `pip install` resolves from a wheelhouse of its
dependencies, filled once from PyPI and cached, so that a run needs no
network; E2B's SDK is the pinned one of tests/test_e2b.py, in its cached
venv; docs/python.md, which expects a running `warren up` with
`busybox:latest`, gets one (conftest's `own_daemon`); and after a line
that starts something in the background the script waits until it
answers, as a person would before typing the next command."""

import hashlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import httpx
import pytest

from conftest import ROOT, WARREN, free_port, hermetic, own_daemon
from debian import CACHE, cache_lock, debian_archive
from helpers import bare, commands, wait_until
from test_e2b import VERSIONS as E2B_VERSIONS
from test_e2b import venv as e2b_venv

DOCS = ROOT / "docs"


# ------------------------------------------------------------ what each doc promises


class Shell:
    """A shell block: for each command, (a fragment of it as the doc writes
    it, its exit status, a pattern its output must contain or None). The
    output of a command that runs in the background (`… &`) goes to a file
    of its own, where it is looked for, since it goes on printing after its
    line: among the later commands' output it would be theirs (a daemon's
    warning in the middle of an example's answer)."""

    def __init__(self, *checks):
        self.checks = checks


class Python:
    """A Python block, run in the doc's one Python session: its output must
    match `pattern` (or it need only run without raising)."""

    def __init__(self, pattern=None):
        self.pattern = pattern


class NotRun:
    """A block that is not an example to run, and why."""

    def __init__(self, why):
        self.why = why


REFERENCE = "reference: a file's content, an answer's shape or a message, nothing to run"
ANOTHER_SUITE = ("another project's test suite, from a checkout of it (minutes, and a registry for "
                 "its dependencies); run outside CI, its results are the doc's tables")
DOCKER_HUB = "needs Docker, Docker Hub (FROM debian:bookworm-slim) and Debian's mirror for its apt-get"

# Each doc: its blocks in order, as (language, a fragment of the block,
# what to do with it). Every block must match exactly one entry.
PYTHON_MD = [
    ("sh", "pip install ./sdk/python", Shell(
        ("python3 -m venv ~/.venvs/warren", 0, None),
        ("pip install ./sdk/python", 0, r"Successfully installed .*\bwarren-sdk-"),
    )),
    ("python", "client = warren.Client()", Python()),
    ("python", "print(sb.id, sb.state, sb.info.resources)",
     Python(r"\Asbx-\w+ running ResolvedResources\(cpu_millis=1000, memory=2147483648\b.*\)\n\Z")),
    ("python", "env.fork(8", Python(r"\Aset-up\nbranch-3\n\n\Z")),
    ("python", "sb = client.sandbox(", Python(r"\A0 b'/tmp\\n3\\n' b''\n\Z")),
    ("python", "client.run(", Python(r"\A1\.0\n\Z")),
    ("python", "for ev in stream:", Python(r"\Atest 1 passed\ntest 2 passed\ntest 3 passed\n0\n\Z")),
    ("python", "sb.spawn(", Python(r"\A137\n\Z")),
    ("python", "tty=True", Python(r"\A[^\n]*\\r\\n42\\r\\n[^\n]*\n\Z")),
    ("python", "sb.files.list(", Python(r"\A0o644 9 /work/main\.py \n\Z")),
    ("python", "sb.port(8000)", Python(r"\A\{'status': 'ok'\}\n\Z")),
    ("python", "client.batch(", Python(r"\A(\d+ \{[^\n]*\}\n)+\{'destroyed': 64\} \[\]\n64 [0-9.e-]+ [0-9.e-]+\n\Z")),
    ("python", "client.events(", Python(r"\A\d+ sbx-\w+ \w+ oom_killed\b[^\n]*\n\Z")),
    ("python", "except warren.CommandFailed", Python(r"\A127 b'sh: make: not found\\n'\n\Z")),
    ("sh", "examples/rollout.py", Shell(
        ("rollout.py --episodes 64", 0, r"\A64 episodes in [\d.]+s: .*; mean reward 0\.875; errors 0\n\Z"),
    )),
]

E2B_MD = [
    ("sh", "warren up --e2b-api", Shell(
        ("scripts/make-base-image.sh /tmp/e2b-base.tar --e2b-user", 0, None),
        ("mkdir -p /var/lib/warren", 0, None),
        ("> /var/lib/warren/e2b-templates.toml", 0, None),
        ("warren up --e2b-api", 0, r"E2B API on http://127.0.0.1:3000 .*E2B sandbox traffic on http://127.0.0.1:3001"),
        ("warren image import", 0, r"(?m)^e2b-base:1 sha256:[0-9a-f]{64}$"),
        ("export E2B_API_URL=", 0, None),
        ("export E2B_SANDBOX_URL=", 0, None),
        ("export E2B_API_KEY=", 0, None),
    )),
    ("python", "Sandbox.create(timeout=300", Python(r"\A42\n\nhello\n7 user /home/user\n\n\Z")),
    ("toml", 'code-interpreter-v1 = "', NotRun(REFERENCE)),
    ("toml", "[templates.code-interpreter-v1]", NotRun(REFERENCE)),
    ("toml", "[templates.untrusted]", NotRun(REFERENCE)),
    ("python", "Template.build(", Python(
        r"\[2/5\] COPY .*\n\[[^\n]*\] warm pool e2b-my-app: 1 started sandboxes\n.*"
        r"\nbuilt by root\nprod\n\n<h1>my app</h1>\n\n\n\Z")),
    ("toml", "[build]", NotRun(REFERENCE)),
    ("sh", "scripts/e2b-js-suite.sh", NotRun(ANOTHER_SUITE)),
    ("python", 'Secret.create("openai-key"', Python(r"\Ahas key\n\n\Z")),
    ("sh", "export E2B_VOLUME_API_URL=$E2B_API_URL", Shell(("export E2B_VOLUME_API_URL", 0, None))),
    ("python", 'Volume.create("datasets")', Python(r"\Aa,b\n1,2\n\ndone\n 1000\n\Z")),
]

FUSION_MD = [
    ("sh", "--sandbox-fusion-image debian:bookworm &", Shell(
        ("scripts/make-base-image.sh /tmp/debian.tar --include python3", 0, None),
        ("warren up --sandbox-fusion", 0,
         r"warren up: SandboxFusion /run_code on http://127.0.0.1:8080 \(image debian:bookworm\)"),
        ("warren image import", 0, r"(?m)^debian:bookworm sha256:[0-9a-f]{64}$"),
        ("/run_code", 0, r'\A\{"status":"Success","message":"","compile_result":null,'
                         r'"run_result":\{"status":"Finished",.*"stdout":"2\\n",.*\}\Z'),
    )),
    ("json", '"compile_result": null | CommandRunResult', NotRun(REFERENCE)),
    ("json", '"cells": [', NotRun(REFERENCE)),
    ("", "cannot run g++", NotRun(REFERENCE)),
    ("sh", "docker build", NotRun(DOCKER_HUB)),
    ("sh", "scripts/fusion-suite.sh", NotRun(ANOTHER_SUITE)),
    ("sh", "warren pool set fusion-py", Shell(
        ("warren pool set fusion-py", 0, r"\Afusion-py size 16 ready \d+\n\Z"),
    )),
]

TENANTS_MD = [
    ("sh", "warren tenant create team-a", Shell(
        ("warren tenant create team-a", 0, None),
        ("warren tenant create team-b", 0, None),
        ("warren run --rm", 0, r"(?m)^hello from team-a$"),
        ("--name a-web", 0, r"(?m)^sbx-\w+$"),
        ("warren inspect a-web", 1, r"no sandbox is named a-web"),
        ("warren token create --tenant team-a --role viewer", 0, r"(?m)^wrt_[\w-]{43}$"),
        ("warren tenant ls", 0, r"(?m)^team-a +2 +0 +[\d.]+/8 +\S+/32G +0/- +1/100 +0$"),
    )),
]

ISOLATION_MD = [
    ("sh", "--isolation gvisor --name untrusted", Shell(
        ("--isolation gvisor --name untrusted", 0, r"(?m)^sbx-\w+$"),
        ("warren exec untrusted -- uname -r", 0, r"\A4\.4\.0\n\Z"),
        ("warren inspect untrusted | grep isolation", 0, r'"isolation": "gvisor"'),
        ("warren rm untrusted", 0, r"destroyed"),
    )),
    ("text", "[ok  ] runsc", NotRun(REFERENCE)),
]

DOCS_TABLES = {"python.md": PYTHON_MD, "e2b.md": E2B_MD, "sandbox-fusion.md": FUSION_MD,
               "tenants.md": TENANTS_MD, "isolation.md": ISOLATION_MD}


# ------------------------------------------------------------ reading a doc

FENCE = re.compile(r"^```(\S*)\n(.*?)^```[ \t]*$", re.M | re.S)


def doc_blocks(name):
    """The fenced code blocks of docs/NAME: [(language, code)]."""
    return [(m.group(1), m.group(2)) for m in FENCE.finditer((DOCS / name).read_text())]


class Step:
    """One thing to run: a shell command or a Python block, with its check."""

    def __init__(self, lang, code, rc, pattern, where):
        self.lang, self.code, self.rc, self.pattern, self.where = lang, code, rc, pattern, where

    @property
    def background(self):
        return self.lang == "sh" and bare(self.code).endswith("&")


def plan(name):
    """The doc's steps, each matched to its check; fails on a block or a
    command the table does not know, and on a check that matches nothing."""
    table = DOCS_TABLES[name]
    used, steps = set(), []
    for n, (lang, code) in enumerate(doc_blocks(name), 1):
        hits = [i for i, (lng, frag, _) in enumerate(table) if lng == lang and frag in code]
        assert len(hits) == 1, (
            f"docs/{name}, block {n} (```{lang}) matches {len(hits)} entries of this test's table "
            f"(a new or changed example needs its check, or its reason not to run, here):\n{code}")
        used.add(hits[0])
        _, frag, what = table[hits[0]]
        where = f"docs/{name} block {n} ({frag!r})"
        if isinstance(what, NotRun):
            continue
        if isinstance(what, Python):
            assert lang == "python", where
            steps.append(Step("python", code, 0, what.pattern, where))
            continue
        assert isinstance(what, Shell) and lang == "sh", where
        matched = set()
        for cmd in commands(code):
            cmd_hits = [c for c in what.checks if c[0] in bare(cmd)]
            assert len(cmd_hits) == 1, f"{where}: command {cmd!r} matches {len(cmd_hits)} checks: {cmd_hits}"
            matched.add(cmd_hits[0])
            steps.append(Step("sh", cmd, cmd_hits[0][1], cmd_hits[0][2], f"{where}: {cmd!r}"))
        unused = [c[0] for c in what.checks if c not in matched]
        assert not unused, f"{where}: checks for commands the block no longer has: {unused}"
    unused = [table[i][1] for i in range(len(table)) if i not in used]
    assert not unused, f"docs/{name}: entries for blocks the doc no longer has: {unused}"
    return steps


def test_every_block_of_the_docs_has_a_check_or_a_reason():
    for name in DOCS_TABLES:
        steps = plan(name)
        assert steps, name


# ------------------------------------------------------------ running a doc

# Runs Python blocks one after another in one namespace, as one session
# (later blocks use the names of earlier ones); stops at the first that
# raises. argv: STEP:FILE...
DRIVER = r'''
import sys, traceback
sys.stdout.reconfigure(line_buffering=True)
sys.stderr.reconfigure(line_buffering=True)
ns = {"__name__": "__main__"}
for arg in sys.argv[1:]:
    step, path = arg.split(":", 1)
    print(f"@@cmd {step}", flush=True)
    try:
        exec(compile(open(path).read(), path, "exec"), ns)
    except BaseException:
        traceback.print_exc(file=sys.stdout)
        print(f"@@rc {step} 1", flush=True)
        sys.exit(1)
    print(f"@@rc {step} 0", flush=True)
'''


class Session:
    """A doc's run: a fresh directory with a checkout-like working
    directory, a home, the environment, and the replacements that point the
    doc's addresses and paths at them."""

    def __init__(self, base, name, home, url, replace):
        self.base, self.name, self.home, self.url = base, name, home, url
        self.work = base / "work"
        self.work.mkdir()
        (self.work / "scripts").symlink_to(ROOT / "scripts")
        bin_dir = base / "bin"
        bin_dir.mkdir()
        (bin_dir / "warren").symlink_to(WARREN)
        self.replace = replace
        # What the script starts in the background, for a stop after a failure.
        self.bg_pids = base / "background.pids"
        self.env = {
            **os.environ,
            "WARREN_HOME": str(home),
            "WARREN_URL": url,
            "WARREN_LISTEN": url.removeprefix("http://"),
            "PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        }
        for k in [k for k in self.env if k == "WARREN_TOKEN" or k.startswith("E2B_")]:
            del self.env[k]

    def localize(self, text):
        for old, new in self.replace.items():
            text = text.replace(old, new)
        return text

    def base_image(self, cmd):
        """`scripts/make-base-image.sh OUT [--include P,P] [--e2b-user]` as
        a link to the archive tests/debian.py made with the same script and
        packages."""
        argv = shlex.split(bare(cmd))
        assert argv[0] == "scripts/make-base-image.sh" and len(argv) >= 2, cmd
        out, rest = argv[1], argv[2:]
        packages, e2b_user = ("python3",), False
        while rest:
            if rest[0] == "--include":
                packages, rest = tuple(rest[1].split(",")), rest[2:]
            elif rest[0] == "--e2b-user":
                e2b_user, rest = True, rest[1:]
            else:
                raise AssertionError(f"this test does not know {rest[0]!r} of {cmd!r}")
        cached = debian_archive(self.base, packages, e2b_user=e2b_user)
        return f"ln -sf {shlex.quote(str(cached))} {shlex.quote(out)}"

    def background_output(self, i):
        """Where step `i`, run in the background, writes."""
        return self.base / f"background-{i}.txt"

    def wait_for(self, cmd):
        """Shell that waits for what a background line started."""
        if re.search(r"\bwarren up\b", cmd):
            return f"for _ in $(seq 300); do curl -sf {self.url}/healthz >/dev/null && break; sleep 0.1; done"
        raise AssertionError(f"the test does not know how to wait for {cmd!r}")

    def script(self, steps, python):
        """The session as one bash script: the doc's commands, each between
        markers; runs of Python blocks through DRIVER with `python`. At the
        end it says so, waits to be released, and stops what it started in
        the background, as `kill $(jobs -p)` does."""
        for old in self.replace:
            assert any(old in s.code for s in steps), f"docs/{self.name} no longer has {old!r}: drop its replacement"
        driver = self.base / "driver.py"
        driver.write_text(DRIVER)
        lines, group = [], []

        def flush():
            if group:
                lines.append(f"{python} {driver} {' '.join(group)}")
                group.clear()

        for i, s in enumerate(steps):
            code = self.localize(s.code)
            if s.lang == "python":
                # A file of its own in the working directory, as a reader's
                # script is (E2B's Template resolves `copy` paths from it).
                path = self.work / f"example-{i}.py"
                path.write_text(code)
                group.append(f"{i}:{path}")
                continue
            flush()
            if bare(code).startswith("scripts/make-base-image.sh"):
                code = self.base_image(code)
            if s.background:
                code = f"{bare(code).rstrip().removesuffix('&').rstrip()} > {self.background_output(i)} 2>&1 &"
            lines += [f"echo '@@cmd {i}'", code, f'echo "@@rc {i} $?"']
            if s.background:
                lines += [f"echo $! >> {self.bg_pids}", self.wait_for(bare(code))]
        flush()
        release = self.base / "release"
        os.mkfifo(release)
        # The FIFO opened read-write first, so that the test finds a reader
        # there as soon as the script says it is done.
        lines += [f"exec 9<> {release}", "echo '@@doc-done'", "read -r _ <&9",
                  'jobs=$(jobs -p); [ -z "$jobs" ] || kill $jobs; wait', "echo '@@stopped'"]
        path = self.base / "doc.sh"
        path.write_text("\n".join(lines) + "\n")
        return path, release


class Run:
    """The doc's script, running: its transcript goes to a file (what it
    starts in the background keeps writing there)."""

    def __init__(self, session, steps, python):
        self.session, self.steps = session, steps
        script, self.release = session.script(steps, python)
        self.transcript = session.base / "transcript.txt"
        with open(self.transcript, "wb") as out:
            self.proc = subprocess.Popen(["bash", str(script)], cwd=session.work, env=session.env,
                                         stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)

    def text(self):
        return self.transcript.read_bytes().decode(errors="replace")

    def wait_done(self, timeout):
        """Until the doc's last command has run; returns the transcript."""
        try:
            wait_until(lambda: "@@doc-done" in self.text() or self.proc.poll() is not None,
                       timeout=timeout, interval=0.2, what=f"docs/{self.session.name}'s commands")
        except AssertionError:
            raise AssertionError(f"docs/{self.session.name}'s commands took over {timeout}s:\n{self.text()[-4000:]}")
        text = self.text()
        assert "@@doc-done" in text, f"the script stopped early:\n{text[-4000:]}"
        return text

    def check(self, text):
        """Each step's exit status and output, as the table says."""
        for i, s in enumerate(self.steps):
            # (`@@rc` may follow output that does not end its line: curl's.)
            m = re.search(rf"^@@cmd {i}\n(.*?)@@rc {i} (\d+)$", text, re.M | re.S)
            assert m, f"no result for {s.where}; output:\n{text[-4000:]}"
            out, rc = m.group(1), int(m.group(2))
            assert rc == s.rc, f"{s.where} exited {rc}, the doc says {s.rc}:\n{out}"
            if s.pattern:
                pattern = self.session.localize(s.pattern)
                seen = self.session.background_output(i).read_text(errors="replace") if s.background else out
                assert re.search(pattern, seen, re.S), f"{s.where} printed:\n{out}\nwanted /{pattern}/"

    def stop(self, timeout=90):
        """Releases the script, which stops its background jobs and waits
        for them. A script that did not get there (a failure) is stopped:
        its background jobs by SIGTERM (a daemon then destroys its
        sandboxes), then whatever is left of it by SIGKILL."""
        if self.proc.poll() is None and "@@doc-done" in self.text():
            fd = os.open(self.release, os.O_WRONLY | os.O_NONBLOCK)
            os.write(fd, b"stop\n")
            os.close(fd)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        pids = self.session.bg_pids
        for pid in map(int, pids.read_text().split() if pids.exists() else ()):
            if running(pid):
                os.kill(pid, signal.SIGTERM)
                try:
                    wait_until(lambda: not running(pid), timeout=60, interval=0.2)
                except AssertionError:
                    pass  # killed below
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        return self.text()


def running(pid):
    """Whether the process runs (a zombie does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture
def base():
    d = Path(tempfile.mkdtemp(prefix="warren-docs-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def api_down(url):
    try:
        httpx.get(url + "/healthz", timeout=1)
        return False
    except httpx.HTTPError:
        return True


def check_stopped_clean(run, home, url):
    """The doc's daemon stopped with the script and left no sandbox behind."""
    text = run.stop()
    assert "@@stopped" in text, f"the doc's daemon did not stop:\n{text[-3000:]}"
    assert api_down(url), "warren up still answers after the script stopped it"
    left = list((home / "sandboxes").iterdir()) if (home / "sandboxes").exists() else []
    assert not left, f"sandbox directories left behind: {left}"


# ------------------------------------------------------------ docs/python.md


def sdk_wheelhouse():
    """The SDK's build and runtime requirements (sdk/python/pyproject.toml)
    as wheels, downloaded from PyPI once and cached: what the doc's
    `pip install ./sdk/python` resolves from (PIP_NO_INDEX)."""
    project = tomllib.loads((ROOT / "sdk" / "python" / "pyproject.toml").read_text())
    reqs = sorted(project["build-system"]["requires"] + project["project"]["dependencies"])
    key = hashlib.sha256(f"{sys.version_info[:2]} {reqs}".encode()).hexdigest()[:12]
    d = CACHE / "wheels" / f"warren-sdk-{key}"
    with cache_lock(f"wheels-{d.name}"):
        if not (d / "complete").exists():
            shutil.rmtree(d, ignore_errors=True)
            got = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
                                  "-d", d, *reqs], capture_output=True, text=True, timeout=600)
            assert got.returncode == 0, f"pip download {reqs}: {got.stderr[-2000:]}"
            (d / "complete").write_text("\n".join(reqs))
    return d


def test_python_md_as_written(images, base):
    steps = plan("python.md")
    wheels = sdk_wheelhouse()
    with own_daemon(images) as w:
        s = Session(base, "python.md", w.home, w.url, {
            "127.0.0.1:7070": f"127.0.0.1:{w.port}",
            "/var/lib/warren": str(w.home),
        })
        # `pip install ./sdk/python` builds in the tree: a copy of it, so
        # that the checkout is left as it is.
        shutil.copytree(ROOT / "sdk" / "python", s.work / "sdk" / "python",
                        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".mypy_cache"))
        home = base / "user"
        home.mkdir()
        s.env.update(HOME=str(home), PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheels))
        run = Run(s, steps, "python3")
        try:
            run.check(run.wait_done(timeout=300))
        finally:
            run.stop()


# ------------------------------------------------------------ docs/tenants.md


def test_tenants_md_as_written(images, base):
    steps = plan("tenants.md")
    with own_daemon(images) as w:
        s = Session(base, "tenants.md", w.home, w.url, {})
        run = Run(s, steps, "python3")
        try:
            run.check(run.wait_done(timeout=120))
        finally:
            run.stop()


# ------------------------------------------------------------ docs/isolation.md


def test_isolation_md_as_written(images, base):
    steps = plan("isolation.md")
    with own_daemon(images) as w:
        s = Session(base, "isolation.md", w.home, w.url, {})
        run = Run(s, steps, "python3")
        try:
            run.check(run.wait_done(timeout=120))
        finally:
            run.stop()


# ------------------------------------------------------------ docs/e2b.md


def test_e2b_md_as_written(base):
    steps = plan("e2b.md")
    python = e2b_venv(E2B_VERSIONS[0])
    home = base / "home"
    home.mkdir()
    hermetic(home)
    port, api, sbx = free_port(), free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    s = Session(base, "e2b.md", home, url, {
        "/var/lib/warren": str(home),
        "127.0.0.1:3000": f"127.0.0.1:{api}",
        "127.0.0.1:3001": f"127.0.0.1:{sbx}",
        "/tmp/e2b-base.tar": str(base / "e2b-base.tar"),
    })
    run = Run(s, steps, shlex.quote(str(python)))
    try:
        run.check(run.wait_done(timeout=300))
        # What the examples left: the killed sandboxes are gone; the
        # template's warm pool keeps its one sandbox.
        token = (home / "token").read_text().strip()
        http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
        live = http.get("/v1/sandboxes", params={"label": "warren.dev/front=e2b"}).json()
        assert live == [], [(x["id"], x["state"]) for x in live]
        pools = http.get("/v1/pools").json()
        assert [(p["name"], p["ready"]) for p in pools] == [("e2b-my-app", 1)], pools
    finally:
        check_stopped_clean(run, home, url)


# ------------------------------------------------------------ docs/sandbox-fusion.md


def test_sandbox_fusion_md_as_written(base):
    steps = plan("sandbox-fusion.md")
    home = base / "home"
    home.mkdir()
    hermetic(home)
    port, door = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    s = Session(base, "sandbox-fusion.md", home, url, {
        "127.0.0.1:8080": f"127.0.0.1:{door}",
        "/tmp/debian.tar": str(base / "debian.tar"),
    })
    run = Run(s, steps, "python3")
    try:
        run.check(run.wait_done(timeout=300))
        # The warm pool the doc makes serves the door's calls: once it has
        # a ready sandbox, a call takes it.
        token = (home / "token").read_text().strip()
        http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
        wait_until(lambda: http.get("/v1/pools/fusion-py").json()["ready"] >= 1, timeout=60,
                   what="a ready sandbox in the pool fusion-py")
        r = httpx.post(f"http://127.0.0.1:{door}/run_code", json={"code": "print(6 * 7)"}, timeout=60)
        assert r.status_code == 200 and r.json()["run_result"]["stdout"] == "42\n", r.text
        pool = http.get("/v1/pools/fusion-py").json()
        assert pool["claimed"] >= 1, pool
    finally:
        check_stopped_clean(run, home, url)

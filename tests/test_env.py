"""The environment inside a sandbox: image PATH, spec env, thread hygiene, hostname."""

import pytest

from helpers import ImageBuilder, sh_ok, uniq, wait_until

THREAD_VARS = ["OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS", "RAYON_NUM_THREADS", "GOMAXPROCS"]
# The PATH make-busybox-image.sh asks for (and Warren's default when an image sets none).
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def env_of(warren, sid, **kw):
    out = sh_ok(warren, sid, "env", **kw)
    return dict(l.split("=", 1) for l in out.splitlines() if "=" in l)


def test_env_from_image_spec_and_cpu(warren, sandbox):
    sid = sandbox(cpu=1.5, env={"FOO": "bar", "WITH_SPACE": "a b"})["id"]
    env = env_of(warren, sid)
    assert env["PATH"] == IMAGE_PATH
    assert env["FOO"] == "bar" and env["WITH_SPACE"] == "a b"
    for var in THREAD_VARS:
        assert env.get(var) == "2", (var, env)
    # Exec env adds to and overrides the sandbox env for that command only.
    env = env_of(warren, sid, env={"FOO": "exec", "EXTRA": "1"})
    assert env["FOO"] == "exec" and env["EXTRA"] == "1" and env["OMP_NUM_THREADS"] == "2"
    assert "EXTRA" not in env_of(warren, sid)


@pytest.mark.parametrize("cpu,want", [(0.2, "1"), ("500m", "1"), (1, "1"), (2.01, "3")])
def test_thread_count_rounds_up(warren, sandbox, cpu, want):
    sid = sandbox(cpu=cpu)["id"]
    env = env_of(warren, sid)
    assert [env.get(v) for v in THREAD_VARS] == [want] * len(THREAD_VARS), env


def test_spec_env_wins_over_derived(warren, sandbox):
    sid = sandbox(cpu=1.5, env={"OMP_NUM_THREADS": "7", "PATH": "/bin"})["id"]
    env = env_of(warren, sid)
    assert env["OMP_NUM_THREADS"] == "7"
    assert env["MKL_NUM_THREADS"] == "2"
    assert env["PATH"] == "/bin"


def test_hostname_is_sandbox_id(warren, sandbox):
    sid = sandbox()["id"]
    out = sh_ok(warren, sid, "hostname; cat /proc/sys/kernel/hostname; uname -n")
    assert out.split() == [sid, sid, sid]


def test_main_process_env_and_exit_code(warren):
    """cmd in the spec runs as the main process with the same environment."""
    info = warren.create(cmd=["sh", "-c", "echo $OMP_NUM_THREADS $FOO $(hostname); exit 6"], cpu=1.5, env={"FOO": "main"})
    sid = info["id"]
    final = wait_until(
        lambda: (lambda i: i if i["state"] in ("destroyed", "failed", "kept") else None)(
            warren.http.get(f"/v1/sandboxes/{sid}").json()
        ),
        timeout=15,
        what="main process to end",
    )
    assert final["exit_code"] == 6, final
    logs = warren.http.get(f"/v1/sandboxes/{sid}/logs").text
    assert f"2 main {sid}" in logs, logs


def test_image_config_env_and_workdir(warren, images, tmp_path):
    """The image's own ENV (PATH included) and WorkingDir reach execs; the spec env wins."""
    b = ImageBuilder(images["oci"], tmp_path / "build")
    b.layer(lambda root: (root / "opt" / "tools").mkdir(parents=True))
    b.config(
        "--config.env", "PATH=/opt/tools:/bin",
        "--config.env", "IMAGE_VAR=from-image",
        "--config.env", "OVERRIDDEN=image",
        "--config.workingdir", "/opt/tools",
    )
    name = uniq("envimg") + ":" + b.tag
    warren.cli("image", "import", str(b.tar(tmp_path / "env.tar")), "--name", name)
    sid = warren.create(image=name, env={"OVERRIDDEN": "spec"})["id"]
    try:
        env = env_of(warren, sid)
        assert env["PATH"] == "/opt/tools:/bin"
        assert env["IMAGE_VAR"] == "from-image"
        assert env["OVERRIDDEN"] == "spec"
        assert sh_ok(warren, sid, "pwd") == "/opt/tools\n"
    finally:
        warren.destroy(sid)
        warren.cli("image", "rm", name)


def test_an_image_without_etc_hosts_gets_one_with_localhost(warren, sandbox):
    """Issue 40 (10): as Docker does, a sandbox whose image has no
    /etc/hosts (the busybox test image) gets one, so `localhost` resolves;
    an image's own file is kept; Warren's file follows the sandbox's name
    into images committed from it."""
    sid = sandbox()["id"]
    hosts = sh_ok(warren, sid, "cat /etc/hosts")
    assert "127.0.0.1\tlocalhost\n" in hosts and f"127.0.1.1\t{sid}\n" in hosts, hosts
    got = sh_ok(warren, sid, "mkdir -p /www && echo hi > /www/i && (httpd -f -p 8000 -h /www &) "
                             "&& for i in 1 2 3 4 5 6 7 8 9 10; do wget -q -O - http://localhost:8000/i && break; sleep 0.2; done")
    assert got == "hi\n"
    # Committed with Warren's file: the next sandbox gets its own name in it.
    name = f"hosts-{uniq()}:v1"
    r = warren.http.post(f"/v1/sandboxes/{sid}/commit", json={"name": name})
    assert r.status_code in (200, 201), r.text
    child = sandbox(image=name)["id"]
    hosts = sh_ok(warren, child, "cat /etc/hosts")
    assert f"127.0.1.1\t{child}\n" in hosts and sid not in hosts, hosts
    # An image's own /etc/hosts is left as it is.
    sh_ok(warren, child, "printf '10.1.2.3\\tmine\\n' > /etc/hosts")
    own = f"hosts-own-{uniq()}:v1"
    assert warren.http.post(f"/v1/sandboxes/{child}/commit", json={"name": own}).status_code in (200, 201)
    kept = sandbox(image=own)["id"]
    assert sh_ok(warren, kept, "cat /etc/hosts") == "10.1.2.3\tmine\n"


def test_a_process_gets_its_users_login_environment_and_home(warren, sandbox):
    """Issue 40 (1): HOME, USER and LOGNAME come from the account a
    process runs as (as `su -` and E2B's envd set them); `cwd: "~"` is
    that account's home; the request's own env wins."""
    sid = sandbox()["id"]
    probe = ["sh", "-c", "echo $HOME $USER $LOGNAME; pwd"]
    run = lambda **kw: warren.exec(sid, probe, **kw)[1].decode().split()
    assert run() == ["/root", "root", "root", "/"]
    assert run(user="user", cwd="~") == ["/home/user", "user", "user", "/home/user"]
    assert run(user="1000", cwd="~/") == ["/home/user", "user", "user", "/home/user"]
    assert run(user="user", env={"HOME": "/tmp"}) == ["/tmp", "user", "user", "/"]
    r = warren.http.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": ["true"], "cwd": "relative"})
    assert r.status_code == 400 and "~" in r.text, r.text

"""Devices through CDI, with a test vendor (no GPU here): the test makes
device nodes (mknod copies of /dev/null, /dev/zero and /dev/fuse) under a
directory of its own, writes CDI specs naming them, and starts `warren up`
with `--cdi-dir` and `--gpu-kind test.example/gpu`. A sandbox gets exactly
the devices it asks for (nodes, mounts, environment), the device cgroup
lets it open only those, a device is held by one sandbox at a time (also
across a daemon crash), `--gpus N` counts devices of the GPU kind,
capacity shows them, and a malformed spec is reported and ignored."""

import json
import os
import shutil
import signal
import stat
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import own_daemon

KIND = "test.example/gpu"
GPU0, GPU1, ALL = f"{KIND}=0", f"{KIND}=1", f"{KIND}=all"


def mknod(path: Path, like: str):
    st = os.stat(like)
    os.mknod(path, 0o666 | stat.S_IFCHR, st.st_rdev)
    # A sandbox's root is an unprivileged host uid: it opens the node as
    # "other" (docs/gpu.md).
    os.chmod(path, 0o666)


@pytest.fixture(scope="module")
def vendor():
    """Device nodes, a driver file and CDI specs in a world-traversable
    directory (a sandbox's root must be able to walk to a bind source)."""
    d = Path(tempfile.mkdtemp(prefix="warren-cdi-"))
    if os.statvfs(d).f_flag & os.ST_NODEV:
        shutil.rmtree(d)
        pytest.skip(f"{tempfile.gettempdir()} is mounted nodev: the test's device nodes could not be opened")
    os.chmod(d, 0o755)
    nodes = d / "dev"
    nodes.mkdir(mode=0o755)
    mknod(nodes / "gpu0", "/dev/null")
    mknod(nodes / "gpu1", "/dev/zero")
    mknod(nodes / "ctl", "/dev/fuse")
    (d / "driver.txt").write_text("test driver 1.0\n")
    os.chmod(d / "driver.txt", 0o644)
    specs = d / "cdi"
    specs.mkdir(mode=0o755)
    (specs / "test-gpu.yaml").write_text(
        f"""cdiVersion: 0.6.0
kind: {KIND}
containerEdits:
  env:
  - TEST_GPU_DRIVER=1.0
  mounts:
  - hostPath: {d}/driver.txt
    containerPath: /opt/test-driver/version.txt
    options: [ro, nosuid, nodev, bind]
devices:
- name: "0"
  containerEdits:
    env: [TEST_GPU_INDEX=0]
    deviceNodes:
    - path: /dev/testgpu0
      hostPath: {nodes}/gpu0
- name: "1"
  containerEdits:
    env: [TEST_GPU_INDEX=1]
    deviceNodes:
    - path: /dev/testgpu1
      hostPath: {nodes}/gpu1
# As NVIDIA's `all`: every GPU's node. Not a GPU of its own for --gpus.
- name: all
  containerEdits:
    deviceNodes:
    - path: /dev/testgpu0
      hostPath: {nodes}/gpu0
    - path: /dev/testgpu1
      hostPath: {nodes}/gpu1
"""
    )
    # Another kind: a device whose node the device cgroup allows, one it
    # allows for reading only, and one that shows the same node as a plain
    # file mount (nodev, never a way in).
    (specs / "test-ctl.json").write_text(
        json.dumps(
            {
                "cdiVersion": "0.5.0",
                "kind": "test.example/ctl",
                "devices": [
                    {
                        "name": "node",
                        "containerEdits": {
                            "deviceNodes": [{"path": "/dev/testctl", "hostPath": f"{nodes}/ctl"}]
                        },
                    },
                    {
                        "name": "read-only",
                        "containerEdits": {
                            "deviceNodes": [{"path": "/dev/testctl", "hostPath": f"{nodes}/ctl", "permissions": "r"}]
                        },
                    },
                    {
                        "name": "file-only",
                        "containerEdits": {
                            "mounts": [
                                {
                                    "hostPath": f"{nodes}/ctl",
                                    "containerPath": "/dev/testctl",
                                    "options": ["bind", "rw"],
                                }
                            ]
                        },
                    },
                ],
            }
        )
    )
    (specs / "broken.yaml").write_text("cdiVersion: 0.6.0\nkind: not-a-kind\ndevices: [{name: x}]\n")
    (specs / "garbage.json").write_text("{ this is not json")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def gpu_warren(images, vendor):
    args = ["--cdi-dir", str(vendor / "cdi"), "--gpu-kind", KIND]
    with own_daemon(images, args) as w:
        yield w


def sh(w, sid, script):
    ex, out, err, _ = w.exec(sid, ["sh", "-c", script])
    assert ex is not None, ex
    return ex["code"], out.decode(), err.decode()


def create_cli(w, *flags, check=True):
    p = w.cli("create", "--image", "busybox:latest", *flags, check=check)
    return p.stdout.decode().strip(), p.stderr.decode()


def node_info(w):
    nodes = w.http.get("/v1/nodes").json()
    assert len(nodes) == 1, nodes
    return nodes[0]


def test_a_sandbox_gets_exactly_its_device_mount_and_env(gpu_warren):
    w = gpu_warren
    sid, _ = create_cli(w, "--device", GPU0)
    try:
        code, out, err = sh(w, sid, "ls -l /dev/testgpu0 && ls /dev/ | grep -c testgpu")
        assert code == 0, err
        assert out.startswith("crw-rw-rw-") and "1,   3" in out, out
        assert out.splitlines()[-1] == "1", "only its own device: " + out
        code, out, err = sh(w, sid, "echo data > /dev/testgpu0 && echo written")
        assert (code, out) == (0, "written\n"), err
        code, out, _ = sh(w, sid, "echo $TEST_GPU_DRIVER $TEST_GPU_INDEX; cat /opt/test-driver/version.txt")
        assert out == "1.0 0\ntest driver 1.0\n", out
        # The file mount is read-only.
        code, _, _ = sh(w, sid, "echo x > /opt/test-driver/version.txt")
        assert code != 0
        inspect = json.loads(w.cli("inspect", sid).stdout)
        assert inspect["spec"]["devices"] == [GPU0], inspect["spec"]
        # No NVML here: the GPU figures are there, and 0.
        assert inspect["usage"]["gpu_memory_bytes"] == 0, inspect["usage"]
        metrics = w.http.get("/metrics").text
        assert f'warren_sandbox_gpu_memory_bytes{{sandbox="{sid}"}} 0' in metrics, metrics[-2000:]
    finally:
        w.destroy(sid)


def test_a_sandbox_without_the_device_cannot_see_or_make_it(gpu_warren):
    w = gpu_warren
    holder, _ = create_cli(w, "--device", GPU0)
    plain, _ = create_cli(w)
    try:
        code, out, _ = sh(w, plain, "ls /dev; echo ${TEST_GPU_DRIVER:-unset}; ls /opt/test-driver")
        assert "testgpu" not in out and "unset" in out, out
        assert code != 0, "no driver mount either"
        # No CAP_MKNOD, and a user namespace: mknod fails whatever the
        # device cgroup would say.
        code, _, err = sh(w, plain, "mknod /tmp/gpu c 1 3")
        assert code != 0, err
    finally:
        w.destroy(holder)
        w.destroy(plain)


def test_a_device_mounted_as_a_file_cannot_be_opened(gpu_warren):
    w = gpu_warren
    # The same host node (a copy of /dev/fuse, 10:229) as a CDI mount, not
    # a device node: Warren mounts it nodev.
    sid, _ = create_cli(w, "--device", "test.example/ctl=file-only")
    try:
        code, out, err = sh(w, sid, "ls -l /dev/testctl; exec 3</dev/testctl && echo opened")
        assert out.startswith("crw-rw-rw-"), out
        assert code != 0 and "opened" not in out, (out, err)
        assert "ermission denied" in err, err
    finally:
        w.destroy(sid)


def test_the_device_cgroup_allows_each_node_as_the_spec_says(gpu_warren):
    w = gpu_warren
    # The same node (mode 0666, no nodev): the device cgroup alone decides.
    # (The two devices share it, so they are held one after the other.)
    rw, _ = create_cli(w, "--device", "test.example/ctl=node")
    try:
        code, out, err = sh(w, rw, "exec 3<>/dev/testctl && echo opened")
        assert (code, out) == (0, "opened\n"), err
    finally:
        w.destroy(rw)
    ro, _ = create_cli(w, "--device", "test.example/ctl=read-only")
    try:
        code, out, err = sh(w, ro, "exec 3</dev/testctl && echo read; exec 4<>/dev/testctl && echo written")
        assert out == "read\n" and code != 0, (out, err)
        assert "not permitted" in err, err
    finally:
        w.destroy(ro)


def test_a_device_is_held_by_one_sandbox_and_freed_when_it_goes(gpu_warren):
    w = gpu_warren
    first, _ = create_cli(w, "--device", GPU0)
    ids = lambda: sorted(s["id"] for s in w.http.get("/v1/sandboxes").json())  # noqa: E731
    before = ids()
    try:
        out, err = create_cli(w, "--device", GPU0, check=False)
        assert out == "", out
        assert f"device {GPU0} is in use by sandbox {first}" in err, err
        out, err = create_cli(w, "--device", ALL, check=False)
        assert out == "" and f"shares a device node with {GPU0}, in use by sandbox {first}" in err, err
        assert ids() == before, "the refused creates left nothing"
        unknown, err = create_cli(w, "--device", f"{KIND}=7", check=False)
        assert unknown == "" and f"unknown device \"{KIND}=7\"" in err, err
        bad, err = create_cli(w, "--device", "gpu0", check=False)
        assert bad == "" and "vendor/class=name" in err, err
    finally:
        w.destroy(first)
    again, _ = create_cli(w, "--device", GPU0)
    w.destroy(again)


def test_gpus_take_devices_of_the_gpu_kind_and_capacity_counts_them(gpu_warren):
    w = gpu_warren
    info = node_info(w)
    assert info["allocatable"]["gpus"] == 2, info
    assert info["allocated"]["gpus"] == 0, info
    kinds = {c["kind"]: c for c in info["devices"]}
    assert kinds[KIND]["devices"] == [GPU0, GPU1, ALL] and kinds[KIND]["gpu"], kinds
    assert kinds["test.example/ctl"]["devices"] == [f"test.example/ctl={n}" for n in ("file-only", "node", "read-only")]
    sid, _ = create_cli(w, "--gpus", "2")
    try:
        code, out, err = sh(w, sid, "ls /dev | grep testgpu; echo $TEST_GPU_DRIVER")
        assert out == "testgpu0\ntestgpu1\n1.0\n", (out, err)
        info = node_info(w)
        assert info["allocated"]["gpus"] == 2, info
        table = w.cli("node", "ls").stdout.decode().splitlines()
        assert table[0].split()[6] == "GPU" and table[1].split()[4] == "2/2", table
        # The node's own view of what is held comes with its next report.
        deadline = time.time() + 15
        while (used := sorted({c["kind"]: c for c in node_info(w)["devices"]}[KIND]["used"])) != [GPU0, GPU1, ALL]:
            assert time.time() < deadline, used
            time.sleep(0.2)
        out, err = create_cli(w, "--device", GPU1, check=False)
        assert out == "" and "in use" in err, err
    finally:
        w.destroy(sid)
    out, err = create_cli(w, "--gpus", "3", check=False)
    assert out == "" and "gpus" in err.lower(), err
    assert node_info(w)["allocated"]["gpus"] == 0


def test_doctor_reports_specs_devices_and_the_malformed_ones(gpu_warren, vendor):
    p = gpu_warren.cli("doctor", "--json", "--cdi-dir", str(vendor / "cdi"), check=False)
    checks = json.loads(p.stdout)
    by = {}
    for c in checks:
        by.setdefault(c["name"], []).append(c)
    assert "test-gpu.yaml" in by["cdi specs"][0]["found"], by["cdi specs"]
    devices = " ".join(c["found"] for c in by["cdi devices"])
    assert f"{KIND}: 3" in devices and "test.example/ctl: 3" in devices, devices
    skipped = " ".join(c["found"] for c in by["cdi spec skipped"])
    assert "broken.yaml" in skipped and "vendor/class" in skipped, skipped
    assert "garbage.json" in skipped, skipped
    assert "nvml" in by and "libnvidia-ml.so.1" in by["nvml"][0]["found"], by["nvml"]
    # The daemon started with the malformed files there and still runs.
    assert gpu_warren.proc.poll() is None


def test_holdings_survive_a_daemon_crash(images, vendor):
    args = ["--cdi-dir", str(vendor / "cdi"), "--gpu-kind", KIND]
    with own_daemon(images, args) as w:
        holder, _ = create_cli(w, "--device", GPU1)
        w.stop(signal.SIGKILL)
        w.start()
        out, err = create_cli(w, "--device", GPU1, check=False)
        assert out == "" and f"in use by sandbox {holder}" in err, err
        code, out, _ = sh(w, holder, "echo x > /dev/testgpu1 && echo ok")
        assert out == "ok\n"
        other, _ = create_cli(w, "--gpus", "1")
        code, out, _ = sh(w, other, "ls /dev | grep testgpu")
        assert out == "testgpu0\n", out
        w.destroy(holder)
        w.destroy(other)


def test_the_python_sdk_asks_for_devices(gpu_warren):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "sdk" / "python" / "src"))
    import warren as sdk

    with sdk.Client(gpu_warren.url, token=gpu_warren.token) as c:
        with c.sandbox(image="busybox:latest", devices=[GPU1]) as sb:
            assert sb.info.spec.devices == [GPU1]
            r = sb.exec(["sh", "-c", "ls /dev | grep testgpu; echo $TEST_GPU_INDEX"])
            assert (r.exit_code, r.stdout) == (0, b"testgpu1\n1\n"), r

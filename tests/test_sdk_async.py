"""The Python SDK's AsyncClient against a real daemon, and the SDK's
examples (the rollout loop at a reduced size, code-execution rewards)."""

import asyncio
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

import warren as sdk
from warren import models
from helpers import uniq

EXAMPLES = Path(__file__).resolve().parent.parent / "sdk" / "python" / "examples"


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


def aclient(w):
    return sdk.AsyncClient(w.url, token=w.token)


def test_async_exec_stream_spawn_files(warren, tmp_path):
    async def main():
        async with aclient(warren) as c:
            ran = await c.run("busybox:latest", "echo one-shot; exit 2", memory="32M")
            assert (ran.exit_code, ran.stdout) == (2, b"one-shot\n")
            async with c.sandbox(image="busybox:latest", memory="32M", labels={"a": uniq()}) as sb:
                r = await sb.exec("echo out; echo err >&2; exit 3", env={"X": "1"})
                assert (r.exit_code, r.stdout, r.stderr) == (3, b"out\n", b"err\n")
                with pytest.raises(sdk.ExecTimeout):
                    await sb.exec("sleep 30", timeout=0.3)
                events = []
                async with await sb.exec_stream("printf 'a\\377'; sleep 0.2; printf b >&2") as s:
                    async for ev in s:
                        events.append(ev)
                out = [(e.stream, e.data) for e in events if isinstance(e, models.ExecOutput)]
                assert out == [("stdout", b"a\xff"), ("stderr", b"b")]
                assert isinstance(events[-1], models.ExecExit)

                # A background process drains while we do other things.
                p = await sb.spawn("for i in 1 2 3; do echo $i; sleep 0.1; done")
                assert (await sb.exec("echo meanwhile")).stdout == b"meanwhile\n"
                assert (await p.wait()).stdout == b"1\n2\n3\n"
                p = await sb.spawn("sleep 99")
                await p.kill()
                assert (await p.wait()).exit_code == 137
                assert "sleep 99" not in (await sb.exec("ps")).stdout_text
                p = await sb.spawn("cat", stdin=True)
                await p.send_stdin("hi ")
                await p.send_stdin(b"there")
                await p.close_stdin()
                assert (await p.wait(check=True)).stdout == b"hi there"

                await sb.files.write("/tmp/f", b"\x00data")
                assert await sb.files.read("/tmp/f") == b"\x00data"
                assert [e.name for e in await sb.files.list("/tmp")] == ["f"]
                assert (await sb.files.stat("/tmp/f")).size == 5
                made = await sb.files.mkdir("/m/n")
                assert made.is_dir and made.path == "/m/n"
                with pytest.raises(sdk.Conflict):
                    await sb.files.mkdir("/m/n")
                assert (await sb.files.rename("/tmp/f", "/m/n/f")).path == "/m/n/f"
                assert [e.path for e in await sb.files.list("/m", depth=2)] == ["/m/n", "/m/n/f"]
                await sb.files.remove("/m")
                assert not await sb.files.exists("/m")
                with pytest.raises(sdk.NotFound):
                    await sb.files.stat("/m/n/f")
                await sb.files.write("/tmp/f", b"\x00data")
                src = tmp_path / "src"
                (src / "d").mkdir(parents=True)
                (src / "d" / "x").write_bytes(os.urandom(3000))
                await sb.files.upload_dir(src, "/w")
                await sb.files.download_dir("/w", tmp_path / "dst")
                assert (tmp_path / "dst" / "d" / "x").read_bytes() == (src / "d" / "x").read_bytes()
                await sb.files.remove("/w")
                assert not await sb.files.exists("/w")

                assert (await sb.pause()).state == "paused"
                with pytest.raises(sdk.Conflict):
                    await sb.exec("true")
                assert (await sb.resume()).state == "running"
                assert (await sb.set_ttl("5m")).ttl_remaining_ms <= 300_000
                assert (await sb.set_reclaim("delay", keep_for=5)).spec.reclaim == "delay"
                assert (await sb.heartbeat()).id == sb.id
                assert any(l.reason == "paused" for l in await sb.logs())
                assert (await sb.usage()).memory_bytes > 0
            assert (await c.sandboxes.get(sb.id)).state == "destroyed"
            with pytest.raises(sdk.NotFound):
                await c.sandboxes.get("sbx-nope")

    run(main())


def test_async_batch_events_and_lease_keeper(warren):
    tag = uniq()

    async def main():
        async with aclient(warren) as c:
            seen = []

            async def follow():
                async for ev in c.events(follow=True, labels={"ab": tag}):
                    seen.append(ev)
                    if ev.state == "destroyed" and len([e for e in seen if e.state == "destroyed"]) == 3:
                        return

            watcher = asyncio.create_task(follow())
            await asyncio.sleep(0.3)
            b = await c.batch(3, image="busybox:latest", memory="32M", cmd="exit 0", labels={"ab": tag})
            progress = []
            info = await b.wait(on_progress=progress.append, timeout=60, interval=0.05)
            assert info.states == {"destroyed": 3} and progress
            await asyncio.wait_for(watcher, 20)
            assert {e.sandbox_id for e in seen} == {m.id for m in await b.sandboxes(all=True)}

            kept = await c.sandbox(image="busybox:latest", memory="32M", lease="1500ms", labels={"ab": tag, "k": "1"})
            loose = await c.sandbox(image="busybox:latest", memory="32M", lease="1500ms", labels={"ab": tag}, keep_alive=False)
            await asyncio.sleep(4)
            states = {s.id: s.info for s in await c.sandboxes.list({"ab": tag}, all=True)}
            assert states[kept.id].state == "running"
            assert (states[loose.id].state, states[loose.id].reason) in {("destroyed", "lease_expired"), ("stopping", "lease_expired")}
            await kept.destroy()

    run(main())


@pytest.mark.serial  # 200 sandboxes at once: starves the tests beside it
def test_async_client_drives_many_sandboxes_from_one_loop(warren):
    """N concurrent create+exec+destroy cycles from one event loop (the
    daemon queues what does not fit at once). N is 200 in CI; run with
    WARREN_SDK_SANDBOXES=1000 for the issue's target (81 s on a shared
    2-core machine, bound by the daemon, not the client)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4096:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))
    tag = uniq()
    n = int(os.environ.get("WARREN_SDK_SANDBOXES", "200"))

    async def one(c, i):
        async with c.sandbox(image="busybox:latest", cpu=0.05, memory="16M", labels={"k1000": tag}) as sb:
            r = await sb.exec(["echo", str(i)])
            return r.stdout

    async def main():
        async with aclient(warren) as c:
            t = time.monotonic()
            outs = await asyncio.gather(*(one(c, i) for i in range(n)))
            elapsed = time.monotonic() - t
            assert outs == [f"{i}\n".encode() for i in range(n)]
            assert len(c._http._transport._pool.connections) <= 1024  # one pool, bounded
            assert await c.sandboxes.list({"k1000": tag}) == []
            return elapsed

    elapsed = asyncio.run(main())
    print(f"{n} sandboxes (create+exec+destroy) from one loop in {elapsed:.1f}s")


def example(name, *args, w):
    env = {**os.environ, "WARREN_URL": w.url, "WARREN_TOKEN": w.token}
    p = subprocess.run([sys.executable, str(EXAMPLES / name), *args], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_rollout_example_at_64_episodes(warren):
    stats = json.loads(example("rollout.py", "--episodes", "64", "--concurrency", "64", "--json", w=warren))
    print(stats)
    assert stats["episodes"] == 64 and stats["errors"] == []
    assert stats["mean_reward"] == 0.875  # one episode in eight has a broken policy
    assert stats["steps"] == 64 * 4 and stats["sandboxes_left"] == 0
    assert stats["episodes_per_s"] > 0 and stats["step_p99_ms"] >= stats["step_p50_ms"] > 0


def test_code_rewards_and_minimal_examples(warren):
    rewards = json.loads(example("code_rewards.py", "--json", w=warren))
    assert rewards == {"iterative": 1.0, "off_by_one": 0.2, "hardcoded": 0.6, "infinite_loop": 0.0, "vandal": 0.2}
    out = example("minimal.py", w=warren)
    assert out.startswith("0 hello from sbx-") and "streamed: 3" in out

"""An RL rollout loop on Warren: N concurrent episodes from one asyncio event
loop. Each episode creates a sandbox from the task image, lets a policy act
in it one command at a time (the policy here is scripted; a real one would
be the model being trained), scores the final state, and destroys the
sandbox. Every sandbox carries `task`, `code_version` and `dataset_version`
labels, so a run's sandboxes, logs, events and learned resource profile can
be found again (`warren ps --label code_version=…`).

    python3 rollout.py --episodes 256 --concurrency 256 [--image busybox:latest] [--json]

The task: /task/input.txt holds numbers; the agent must write their sum to
/work/answer. One episode in eight gets a policy that makes a mistake, so
the expected mean reward is 0.875.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from dataclasses import dataclass, field

import warren

LABELS = {"task": "sum-numbers", "code_version": "rollout-v1", "dataset_version": "2025-01"}


@dataclass
class Episode:
    index: int
    reward: float = 0.0
    steps: int = 0
    step_seconds: list[float] = field(default_factory=list)
    create_seconds: float = 0.0
    error: str | None = None


def policy(numbers: list[int], broken: bool) -> list[str]:
    """The agent's actions: shell commands, one per step."""
    field_sum = "s+=$i" if not broken else "s+=$i*2"
    return [
        "ls /task && wc -w /task/input.txt",
        "mkdir -p /work && head -c 64 /task/input.txt",
        "awk '{s=0; for(i=1;i<=NF;i++) " + field_sum + "; print s}' /task/input.txt > /work/answer",
        "cat /work/answer",
    ]


async def episode(client: warren.AsyncClient, index: int, image: str, run_id: str, seed: int) -> Episode:
    rng = random.Random(seed * 100_003 + index)
    numbers = [rng.randint(0, 1000) for _ in range(rng.randint(5, 50))]
    ep = Episode(index)
    t0 = time.perf_counter()
    try:
        async with client.sandbox(
            image=image,
            cpu=0.1,
            memory="32M",
            ttl="10m",
            lease="60s",
            labels={**LABELS, "run": run_id, "episode": str(index)},
        ) as sb:
            ep.create_seconds = time.perf_counter() - t0
            await sb.files.write("/task/input.txt", " ".join(map(str, numbers)) + "\n")
            for command in policy(numbers, broken=index % 8 == 7):
                t = time.perf_counter()
                result = await sb.exec(command, timeout=30)
                ep.step_seconds.append(time.perf_counter() - t)
                ep.steps += 1
                if result.exit_code != 0:
                    break
            answer = (await sb.files.read("/work/answer")).decode().strip()
            ep.reward = 1.0 if answer == str(sum(numbers)) else 0.0
    except warren.WarrenError as e:
        ep.error = repr(e)
    return ep


def pct(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


async def rollout(episodes: int, concurrency: int, image: str, seed: int) -> dict[str, object]:
    run_id = f"r{int(time.time() * 1000) % 10**9}"
    limit = asyncio.Semaphore(concurrency)
    async with warren.AsyncClient() as client:

        async def one(i: int) -> Episode:
            async with limit:
                return await episode(client, i, image, run_id, seed)

        t0 = time.perf_counter()
        done = await asyncio.gather(*(one(i) for i in range(episodes)))
        wall = time.perf_counter() - t0
        left = await client.sandboxes.list({"run": run_id})
    steps = [s for ep in done for s in ep.step_seconds]
    creates = [ep.create_seconds for ep in done if ep.error is None]
    return {
        "run": run_id,
        "episodes": len(done),
        "errors": [ep.error for ep in done if ep.error],
        "mean_reward": statistics.fmean(ep.reward for ep in done),
        "wall_s": round(wall, 3),
        "episodes_per_s": round(len(done) / wall, 2),
        "steps": len(steps),
        "steps_per_s": round(len(steps) / wall, 2),
        "step_p50_ms": round(pct(steps, 50) * 1000, 1),
        "step_p99_ms": round(pct(steps, 99) * 1000, 1),
        "create_p50_ms": round(pct(creates, 50) * 1000, 1),
        "create_p99_ms": round(pct(creates, 99) * 1000, 1),
        "sandboxes_left": len(left),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--image", default="busybox:latest")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = ap.parse_args()
    stats = asyncio.run(rollout(args.episodes, args.concurrency, args.image, args.seed))
    if args.json:
        print(json.dumps(stats))
        return
    print(
        f"{stats['episodes']} episodes in {stats['wall_s']}s: {stats['episodes_per_s']} episodes/s, "
        f"{stats['steps_per_s']} steps/s; step p50 {stats['step_p50_ms']} ms, p99 {stats['step_p99_ms']} ms; "
        f"create p50 {stats['create_p50_ms']} ms, p99 {stats['create_p99_ms']} ms; "
        f"mean reward {stats['mean_reward']:.3f}; errors {len(stats['errors'])}"  # type: ignore[arg-type]
    )


if __name__ == "__main__":
    main()

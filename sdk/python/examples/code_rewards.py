"""Code-execution rewards for a batch of model completions: each completion
(a program the model wrote) runs in a fresh sandbox against the task's test
cases, with a time limit; its reward is the share of tests it passes. A
completion that loops forever is killed by the exec timeout and scores 0;
one that damages its sandbox harms nothing else.

    python3 code_rewards.py [--image busybox:latest] [--json]

The completions here are shell functions for "print the n-th Fibonacci
number" (a real trainer would run Python in a Python image).
"""

from __future__ import annotations

import argparse
import asyncio
import json

import warren

TESTS = [(0, "0"), (1, "1"), (2, "1"), (10, "55"), (20, "6765")]

COMPLETIONS = {
    "iterative": 'a=0; b=1; i=0; while [ $i -lt "$1" ]; do t=$((a+b)); a=$b; b=$t; i=$((i+1)); done; echo $a',
    "off_by_one": 'a=0; b=1; i=0; while [ $i -le "$1" ]; do t=$((a+b)); a=$b; b=$t; i=$((i+1)); done; echo $a',
    "hardcoded": 'case "$1" in 0) echo 0;; 1|2) echo 1;; *) echo 42;; esac',
    "infinite_loop": "while :; do :; done",
    "vandal": "rm -rf / 2>/dev/null; echo 0",
}


async def score(client: warren.AsyncClient, name: str, program: str, image: str) -> tuple[str, float]:
    async with client.sandbox(image=image, cpu=0.25, memory="32M", ttl="5m", labels={"task": "fib-rewards", "completion": name}) as sb:
        await sb.files.write("/work/solution.sh", program)
        passed = 0
        for n, expected in TESTS:
            try:
                r = await sb.exec(["sh", "/work/solution.sh", str(n)], timeout=2)
            except warren.ExecTimeout:
                break  # no partial credit for a program that hangs
            passed += r.exit_code == 0 and r.stdout_text.strip() == expected
        return name, passed / len(TESTS)


async def rewards(image: str) -> dict[str, float]:
    async with warren.AsyncClient() as client:
        results = await asyncio.gather(*(score(client, n, p, image) for n, p in COMPLETIONS.items()))
    return dict(results)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--image", default="busybox:latest")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out = asyncio.run(rewards(args.image))
    if args.json:
        print(json.dumps(out))
    else:
        for name, reward in out.items():
            print(f"{name:14} {reward:.2f}")


if __name__ == "__main__":
    main()

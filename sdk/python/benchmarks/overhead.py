"""What the SDK costs: the create + exec(`true`) + destroy cycle through
`warren.AsyncClient` against the same cycle as raw httpx calls, in
alternating blocks of the same run, against a running Warren.

    WARREN_URL=http://127.0.0.1:7070 WARREN_TOKEN=... \\
        python3 overhead.py --cycles 100 --blocks 4 [--image busybox:latest]

Prints p50 per cycle for each and the SDK's overhead in percent.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path

import httpx

import warren

SPEC = {"cpu": 0.1, "memory": "32M"}


async def sdk_cycle(client: warren.AsyncClient, image: str) -> None:
    sb = await client.sandboxes.create(image, keep_alive=False, **SPEC)
    result = await sb.exec(["true"])
    assert result.exit_code == 0, result
    await sb.destroy()


async def raw_cycle(http: httpx.AsyncClient, image: str) -> None:
    r = await http.post("/v1/sandboxes", json={"image": image, **SPEC})
    r.raise_for_status()
    sid = r.json()["id"]
    code = None
    async with http.stream("POST", f"/v1/sandboxes/{sid}/exec", json={"cmd": ["true"]}) as s:
        s.raise_for_status()
        async for line in s.aiter_lines():
            if line:
                ev = json.loads(line)
                if ev["type"] == "exit":
                    code = ev["code"]
    assert code == 0, code
    (await http.delete(f"/v1/sandboxes/{sid}")).raise_for_status()


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cycles", type=int, default=100, help="cycles per block")
    ap.add_argument("--blocks", type=int, default=4, help="blocks per client, alternating")
    ap.add_argument("--image", default="busybox:latest")
    args = ap.parse_args()
    url = os.environ.get("WARREN_URL", "http://127.0.0.1:7070")
    token = os.environ.get("WARREN_TOKEN") or Path(os.environ.get("WARREN_HOME", "/var/lib/warren"), "token").read_text().strip()
    times: dict[str, list[float]] = {"sdk": [], "raw": []}
    async with warren.AsyncClient(url, token=token) as client, httpx.AsyncClient(
        base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60
    ) as http:
        for block in range(args.blocks * 2):
            which = "sdk" if block % 2 == 0 else "raw"
            for _ in range(args.cycles):
                t = time.perf_counter()
                if which == "sdk":
                    await sdk_cycle(client, args.image)
                else:
                    await raw_cycle(http, args.image)
                times[which].append(time.perf_counter() - t)
    sdk, raw = statistics.median(times["sdk"]) * 1000, statistics.median(times["raw"]) * 1000
    print(json.dumps({"cycles_each": len(times["sdk"]), "sdk_p50_ms": round(sdk, 2), "raw_p50_ms": round(raw, 2),
                      "overhead_pct": round((sdk / raw - 1) * 100, 1)}))


if __name__ == "__main__":
    asyncio.run(main())

#!/usr/bin/env python3
"""Runs the escape suite (tests/test_escape.py, as root and as uid 1000) and
prints its result as the Markdown table of docs/security.md. Run as root:
    python3 scripts/escape_table.py"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

with tempfile.TemporaryDirectory() as d:
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "tests/test_escape.py", "-k", "escape_suite"],
        cwd=ROOT, env={**os.environ, "WARREN_ESCAPE_REPORT": d}, check=True, stdout=sys.stderr,
    )
    runs = {}
    for user in ("0", "1000"):
        lines = [json.loads(l) for l in Path(d, f"{user}.jsonl").read_text().splitlines()]
        runs[user] = {l["check"]: l for l in lines if "check" in l}

cell = lambda l: ("pass" if l["pass"] else "FAIL") + ": " + l["observed"].replace("|", "\\|")
print("| check | expected | observed as root | observed as uid 1000 |")
print("|---|---|---|---|")
for check, root in runs["0"].items():
    other = runs["1000"].get(check)
    print(f"| {check} | {root['expect'].replace('|', chr(92) + '|')} | {cell(root)} | {cell(other) if other else '-'} |")

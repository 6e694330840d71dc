#!/usr/bin/env python3
"""Runs the escape suite (tests/test_escape.py's test_escape_suite_passes: each
isolation class, as root and as uid 1000) and prints its result as the
Markdown table of docs/security.md, a column per class and user. Run as root,
on a node that has runsc (the gvisor class):
    python3 scripts/escape_table.py"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLASSES = ("container", "gvisor")
USERS = ("0", "1000")

with tempfile.TemporaryDirectory() as d:
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "tests/test_escape.py::test_escape_suite_passes"],
        cwd=ROOT, env={**os.environ, "WARREN_ESCAPE_REPORT": d}, check=True, stdout=sys.stderr,
    )
    runs = {}
    for cls in CLASSES:
        for user in USERS:
            lines = [json.loads(l) for l in Path(d, f"{cls}-{user}.jsonl").read_text().splitlines()]
            runs[cls, user] = {l["check"]: l for l in lines if "check" in l}

esc = lambda text: text.replace("|", "\\|")


def cell(line):
    if line is None:
        return "-"
    if line["pass"] is None:
        return f"n/a: {esc(line['observed'])} ({esc(line['reason'])})"
    return ("pass" if line["pass"] else "FAIL") + ": " + esc(line["observed"])


def expected(check):
    """The expectation, once when every class has the same, else per class."""
    per = {cls: runs[cls, "0"][check]["expect"] for cls in CLASSES if check in runs[cls, "0"]}
    if len(set(per.values())) == 1:
        return esc(next(iter(per.values())))
    return "<br>".join(f"{cls}: {esc(e)}" for cls, e in per.items())


# Every check in the order the probe ran them (a check of one class only
# goes after the one it followed there); a class without it shows "-".
order = []
for cls in CLASSES:
    at = 0
    for check in runs[cls, "0"]:
        if check in order:
            at = order.index(check) + 1
        else:
            order.insert(at, check)
            at += 1
heads = [f"{cls}, {'root' if user == '0' else 'uid ' + user}" for cls in CLASSES for user in USERS]
print("| check | expected | " + " | ".join(heads) + " |")
print("|---|---|" + "---|" * len(heads))
for check in order:
    cells = [cell(runs[cls, user].get(check)) for cls in CLASSES for user in USERS]
    print(f"| {check} | {expected(check)} | " + " | ".join(cells) + " |")

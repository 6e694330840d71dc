#!/usr/bin/env python3
"""Sums the JUnit XML reports of scripts/test.sh's phases: one closing line
with the counts of every phase together, and optionally the slowest tests.

    scripts/test-report.py REPORT.xml...            # total: N passed, N failed, N skipped
    scripts/test-report.py --slowest 20 REPORT.xml...  # and a Markdown table of the 20 slowest

Exits 1 when a report is missing or unreadable (a phase that crashed before
writing one), so a broken run never reads as a clean count."""

import argparse
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def cases(path):
    """(phase, test id, seconds, outcome) of every test case in one report."""
    root = ET.parse(path).getroot()
    phase = Path(path).stem
    for case in root.iter("testcase"):
        if case.find("skipped") is not None:
            outcome = "skipped"
        elif case.find("failure") is not None or case.find("error") is not None:
            outcome = "failed"
        else:
            outcome = "passed"
        name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        yield phase, name, float(case.get("time") or 0), outcome


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slowest", type=int, default=0, help="also print the N slowest tests")
    ap.add_argument("reports", nargs="+")
    args = ap.parse_args()
    rows = []
    for r in args.reports:
        try:
            rows += list(cases(r))
        except (OSError, ET.ParseError) as e:
            print(f"test-report: {r}: {e}", file=sys.stderr)
            return 1
    counts = {k: sum(1 for row in rows if row[3] == k) for k in ("passed", "failed", "skipped")}
    if args.slowest:
        print(f"| seconds | phase | test |\n|---:|---|---|")
        for phase, name, secs, _ in sorted(rows, key=lambda r: -r[2])[: args.slowest]:
            print(f"| {secs:.1f} | {phase} | `{name}` |")
    print(f"total: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Collects the sanitizer reports of a test run (issue 12).

usage: sanitizer-reports.py DIR > LOG.json

`quickstart.sh test` runs the ASan build's suite with log_path=DIR/asan and DIR/ubsan, so every
sanitized process (a test, or a `tandem` node a test started) writes its findings to
DIR/{asan,ubsan}.<pid> instead of a stderr that may be discarded. Each report is printed
(stderr) and becomes one failed entry in LOG.json (meson testlog lines, for
tools/test-summary.py); no report at all is one passed entry. Exits 1 when there is a report."""
import json
import os
import sys

directory = sys.argv[1]
reports = sorted(
    name for name in os.listdir(directory)
    if (name.startswith("asan.") or name.startswith("ubsan."))
    and os.path.getsize(os.path.join(directory, name)) > 0)
for name in reports:
    with open(os.path.join(directory, name), encoding="utf-8", errors="replace") as f:
        text = f.read()
    print(f"SANITIZER REPORT {os.path.join(directory, name)}:\n{text}", file=sys.stderr)
    print(json.dumps({"name": f"sanitizer report {name}", "result": "FAIL", "stdout": text}))
if not reports:
    print(json.dumps({"name": "sanitizer reports (none)", "result": "OK", "stdout": ""}))
sys.exit(1 if reports else 0)

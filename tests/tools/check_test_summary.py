#!/usr/bin/env python3
"""tools/test-summary.py counts SKIP and EXPECTEDFAIL apart from passed, and sums several
testlog.json files (the g++, sanitizer and fuzz runs) into one closing line (issue 12):
fixtures of meson testlog.json lines, each with the closing line it must print and its exit
code."""
import json
import os
import subprocess
import sys
import tempfile

SCRIPT = os.path.join(os.environ.get("TANDEM_SOURCE_ROOT", "."), "tools", "test-summary.py")
DOCTEST = "[doctest] test cases: {} | {} passed | {} failed | {} skipped"

CASES = [
    ([{"name": "a", "result": "SKIP"}], "0 passed, 0 failed, 1 skipped", 0),
    ([{"name": "a", "result": "EXPECTEDFAIL"}], "0 passed, 0 failed, 0 skipped", 0),
    ([{"name": "a", "result": "OK", "stdout": DOCTEST.format(5, 3, 0, 2)}],
     "3 passed, 0 failed, 2 skipped", 0),
    ([{"name": "a", "result": "FAIL", "stdout": DOCTEST.format(4, 3, 1, 0)},
      {"name": "b", "result": "OK"}], "4 passed, 1 failed, 0 skipped", 1),
    ([{"name": "a", "result": "TIMEOUT"}], "0 passed, 1 failed, 0 skipped", 1),
]

# Several logs at once: each a list of entries, or None for a log that was never written.
MULTI = [
    ([[{"name": "a", "result": "OK", "stdout": DOCTEST.format(5, 3, 0, 2)}],
      [{"name": "a", "result": "OK", "stdout": DOCTEST.format(4, 4, 0, 0)},
       {"name": "fuzz_x", "result": "OK"}]], "8 passed, 0 failed, 2 skipped", 0),
    ([[{"name": "a", "result": "OK"}],
      [{"name": "a", "result": "FAIL", "stdout": DOCTEST.format(2, 1, 1, 0)}]],
     "2 passed, 1 failed, 0 skipped", 1),
    ([[{"name": "a", "result": "OK"}], None], "1 passed, 1 failed, 0 skipped", 1),
    ([[], [{"name": "b", "result": "SKIP"}]], "0 passed, 0 failed, 1 skipped", 0),
]


def run_summary(logs):
    paths = []
    for entries in logs:
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            for e in entries or []:
                f.write(json.dumps(e) + "\n")
        if entries is None:
            os.unlink(f.name)  # a log that is missing
        paths.append(f.name)
    run = subprocess.run([sys.executable, SCRIPT, *paths], capture_output=True, text=True)
    for path in paths:
        if os.path.exists(path):
            os.unlink(path)
    lines = run.stdout.strip().splitlines()
    return (lines[-1] if lines else ""), run.returncode


problems = 0
for logs, want_line, want_rc in [([entries], line, rc) for entries, line, rc in CASES] + MULTI:
    last, rc = run_summary(logs)
    if last != want_line or rc != want_rc:
        problems += 1
        print(f"FAIL {logs}: got '{last}' rc {rc}, want '{want_line}' rc {want_rc}")
total = len(CASES) + len(MULTI)
print(f"{total - problems} passed, {problems} failed")
sys.exit(1 if problems else 0)

#!/usr/bin/env python3
"""tools/test-summary.py counts SKIP and EXPECTEDFAIL apart from passed (issue 12): fixtures
of meson testlog.json lines, each with the closing line it must print and its exit code."""
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

problems = 0
for entries, want_line, want_rc in CASES:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        for e in entries:
            f.write(json.dumps(e) + "\n")
    run = subprocess.run([sys.executable, SCRIPT, f.name], capture_output=True, text=True)
    os.unlink(f.name)
    last = run.stdout.strip().splitlines()[-1]
    if last != want_line or run.returncode != want_rc:
        problems += 1
        print(f"FAIL {entries}: got '{last}' rc {run.returncode}, want '{want_line}' rc {want_rc}")
print(f"{len(CASES) - problems} passed, {problems} failed")
sys.exit(1 if problems else 0)

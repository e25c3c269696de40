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


# A failed test's reasons are printed before the closing line: its ERROR and values lines,
# the first line of each MESSAGE (an answer's body), and node-log lines at warning or worse;
# not its other output.
WHY_OUT = "\n".join([
    "TEST CASE:  x", "t.cpp:1: ERROR: CHECK( 503 == 200 ) is NOT correct!",
    "  values: CHECK( 503 == 200 )", "t.cpp:2: MESSAGE: POST /v1/x -> 503: the router said no",
    "2026-12-02 10:00:00.000 [n] info: nothing to see",
    "2026-12-02 10:00:00.001 [n] warning: gateway: router slow", DOCTEST.format(1, 0, 1, 0)])
WHY_WANT = ["ERROR: CHECK( 503 == 200 )", "values: CHECK", "MESSAGE: POST /v1/x -> 503",
            "warning: gateway: router slow"]


def check_reasons():
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        f.write(json.dumps({"name": "a", "result": "FAIL", "stdout": WHY_OUT}) + "\n")
    run = subprocess.run([sys.executable, SCRIPT, f.name], capture_output=True, text=True)
    os.unlink(f.name)
    missing = [w for w in WHY_WANT if w not in run.stdout]
    extra = "nothing to see" in run.stdout
    if missing or extra:
        print(f"FAIL reasons: missing {missing}, info line printed: {extra}:\n{run.stdout}")
        return 1
    return 0


problems = check_reasons()
for logs, want_line, want_rc in [([entries], line, rc) for entries, line, rc in CASES] + MULTI:
    last, rc = run_summary(logs)
    if last != want_line or rc != want_rc:
        problems += 1
        print(f"FAIL {logs}: got '{last}' rc {rc}, want '{want_line}' rc {want_rc}")
total = len(CASES) + len(MULTI) + 1
print(f"{total - problems} passed, {problems} failed")
sys.exit(1 if problems else 0)

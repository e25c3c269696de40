#!/usr/bin/env python3
"""tools/status-check (issue 39): passes on docs/STATUS.md as committed, and fails, naming the
line, on each kind of overclaim written into a copy: a test that does not exist, a test case
that is not in tests/, a document section that is not written, a status that is no kind of
evidence, a simulated figure called Validated without the word."""
import os
import subprocess
import sys
import tempfile

ROOT = os.environ.get("TANDEM_SOURCE_ROOT", ".")
BUILD = os.environ.get("TANDEM_BUILD_ROOT", os.path.join(ROOT, "build"))
SCRIPT = os.path.join(ROOT, "tools", "status-check")
HEAD = "| capability | status | shown by |\n| --- | --- | --- |\n"

# (row, the problem the check must print, or None for a row that must pass)
CASES = [
    ("| x | Validated | `manifest`, `fabric` |", None),
    ("| x | Validated | `manifest` (a metric `not_a_test_name` in parentheses) |", None),
    ("| x | Validated | `no_such_test` |", "`no_such_test` is not a test"),
    ("| x | Validated | `fabric` \"control frames use a reserve ...\" |", None),
    ("| x | Validated | `fabric` \"a case nobody wrote ...\" |", "is no TEST_CASE or SUBCASE"),
    ("| x | Validated | docs/benchmarks.md \"Authenticated fabric\" |", None),
    ("| x | Validated | docs/benchmarks.md \"A section nobody wrote\" |", "has no section"),
    ("| x | Met | `manifest` |", "says none of"),
    ("| x | Validated | `tandem sim`: p99 within 5% |", "without the word 'simulated'"),
    ("| x | Modelled (simulated) | `tandem sim`: p99 within 5% |", None),
]

problems = 0
for row, want in CASES:
    with tempfile.NamedTemporaryFile("w", suffix=".md", delete=False) as f:
        f.write("# Status\n\n" + HEAD + row + "\n")
        path = f.name
    run = subprocess.run([sys.executable, SCRIPT, BUILD, path], capture_output=True, text=True)
    os.unlink(path)
    ok = (run.returncode == 0) if want is None else (run.returncode == 1 and want in run.stdout
                                                     and ":5:" in run.stdout)
    if not ok:
        problems += 1
        print(f"FAIL {row!r}: rc {run.returncode}, want {want!r}, got:\n{run.stdout}{run.stderr}")
run = subprocess.run([sys.executable, SCRIPT, BUILD], capture_output=True, text=True)
if run.returncode != 0:
    problems += 1
    print(f"FAIL docs/STATUS.md as committed:\n{run.stdout}{run.stderr}")
print(f"{len(CASES) + 1 - problems} passed, {problems} failed")
sys.exit(1 if problems else 0)

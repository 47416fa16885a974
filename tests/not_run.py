#!/usr/bin/env python3
"""The suite's summary of what was not run, and why (tests/run-all.sh calls it at exit).

Reads the step logs run-all.sh keeps (one per test step) and lists:
- every test the fast loop ignored (`test NAME ... ignored, REASON`) that no later step ran,
  with its reason;
- every check an engine script reported as `SKIPPED ...` (a machine that cannot show it).
A test ignored because it `needs` a tool must be run by the step that installs the tool, and one
ignored as `slow` by the slow step: one that was not, although the suite reached its last step,
makes this exit 1.

    python3 tests/not_run.py target/run-all
"""
import pathlib
import re
import sys

RESULT = re.compile(r"^test (\S+) \.\.\. (ok|FAILED|ignored)(?:, (.*))?$")
LAST_STEP = "mooncake"  # the step whose log shows the suite ran to its end


def main(logs):
    logs = pathlib.Path(logs)
    ignored, ran, skipped = {}, set(), []
    steps = sorted(logs.glob("*.log"), key=lambda p: p.stat().st_mtime)
    for log in steps:
        for line in log.read_text(errors="replace").splitlines():
            m = RESULT.match(line.strip())
            if m:
                name, outcome, reason = m.groups()
                if outcome == "ignored":
                    ignored.setdefault(name, (log.stem, reason or "no reason given"))
                else:
                    ran.add(name)
            elif "SKIPPED " in line:
                skipped.append((log.stem, line.split("SKIPPED ", 1)[1].strip()))
    not_run = {n: v for n, v in ignored.items() if n not in ran}
    print(f"\n== not run: {len(not_run)} tests, {len(skipped)} engine checks "
          f"({len(ignored) - len(not_run)} ignored in one step were run by a later one)")
    for name, (step, reason) in sorted(not_run.items()):
        print(f"  {name} ({step}): {reason}")
    for step, what in skipped:
        print(f"  [{step}] {what}")
    finished = (logs / f"{LAST_STEP}.log").exists()
    missed = [n for n, (_, reason) in not_run.items() if reason.startswith(("needs", "slow"))]
    if finished and missed:
        print(f"error: {len(missed)} tests that need a tool the suite installs, or are slow, were "
              "never run: the step that has the tool (or the slow step) must run them (-- --ignored <filter>)", file=sys.stderr)
        return 1
    if not finished:
        print("  (the suite stopped before its last step: later steps did not run)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "target/run-all"))

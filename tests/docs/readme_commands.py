#!/usr/bin/env python3
"""Every command in README.md is one the test suite runs (issue 41).

Reads the README's shell code blocks (```sh, ```bash, ```shell, ```console or a bare ```), joins
continued lines, drops comments, and checks each command:

- `./examples/quickstart.sh` and `./tests/run-all.sh`: tests/run-all.sh runs the quickstart as a
  step of its own and is what .ci/run runs; both are checked here by reading those files.
- `jitship ...`: run for real with the jitship binary (JITSHIP_BIN, default target/debug/jitship)
  in a scratch directory that stands in for the machine: HOME, TMPDIR and the working directory are
  in it, and the README's local store (`local:/var/lib/jitship`) becomes one there. A command that
  would run until stopped (`watch`, `run`) is given `--help` after its own flags (before `--`), so
  clap parses every flag and value the README shows and then prints the help (exit 0); `run` then
  also runs for real with `true` as its server (install, watch, final publish, exit 0: the
  server's status). Any other command runs to its end: a usage error (exit 2) fails, and so does
  an exit code its help does not list (install: one of its outcomes; policy new: 0, with the crate
  written).
- anything else fails: a command no test runs does not belong in the README.

Also checks that the README stays the front door (at most 250 lines), and that the guide's table
of every command's exit codes (docs/guide/exit-codes.md) lists each code the command's `--help`
lists, so the two cannot drift apart.

    python3 tests/docs/readme_commands.py      # after a build of target/debug/jitship
"""
import os
import pathlib
import re
import shlex
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MAX_LINES = 250
SHELL_FENCES = {"", "sh", "bash", "shell", "console"}
RUN_ALL = "./tests/run-all.sh"
QUICKSTART = "./examples/quickstart.sh"
# Commands that run until they are stopped: parsed (`--help` after their flags), not run.
LONG_RUNNING = {"watch", "run"}
# Exit codes a real run may end with (beyond these, a usage error or a crash fails).
INSTALL_OUTCOMES = {0, 10, 11, 12, 13, 14, 15}


def commands(text):
    """(line number, command text) for every command in the README's shell code blocks."""
    out = []
    fence = None
    pending, start = "", 0
    for no, line in enumerate(text.splitlines(), 1):
        m = re.match(r"^ {0,3}(```|~~~)\s*([\w+-]*)", line)
        if m:
            if fence is None:
                fence = m.group(2).lower()
            else:
                fence = None
            continue
        if fence is None or fence not in SHELL_FENCES:
            continue
        if fence == "console":
            if not line.lstrip().startswith("$ "):
                continue  # output, not a command
            line = line.lstrip()[2:]
        if not pending:
            start = no
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        words = shlex.split(full, comments=True)
        if words:
            out.append((start, words))
    return out


def check_suite_commands(problems):
    run_all = (ROOT / "tests/run-all.sh").read_text()
    if not re.search(r"^[^#\n]*\./examples/quickstart\.sh\b", run_all, re.M):
        problems.append("tests/run-all.sh no longer runs ./examples/quickstart.sh")
    ci = (ROOT / ".ci/run").read_text()
    if not re.search(r"^exec \./tests/run-all\.sh\s*$", ci, re.M):
        problems.append(".ci/run no longer runs ./tests/run-all.sh, the README's test command")


def run_jitship(no, words, binary, problems):
    run_one(no, words, binary, problems, parse_only=True)
    if words[1:2] == ["run"] and "--" in words:
        real = words[: words.index("--") + 1] + ["true"]
        run_one(no, real, binary, problems, parse_only=False)


def run_one(no, words, binary, problems, parse_only):
    with tempfile.TemporaryDirectory(prefix="jitship-readme-") as scratch:
        scratch = pathlib.Path(scratch)
        for d in ("home", "tmp", "work"):
            (scratch / d).mkdir()
        store = f"local:{scratch / 'store'}"
        args = [re.sub(r"^local:/var/lib/jitship\b", store, w) for w in words[1:]]
        args = [w.replace("$HOME", str(scratch / "home")) for w in args]
        sub = args[0] if args else ""
        parse_only = parse_only and sub in LONG_RUNNING
        if parse_only:
            cut = args.index("--") if "--" in args else len(args)
            args = args[:cut] + ["--help"]
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(scratch / "home"),
            "TMPDIR": str(scratch / "tmp"),
            "USER": "readme",
            "LANG": "C.UTF-8",
        }
        try:
            p = subprocess.run(
                [binary, *args], cwd=scratch / "work", env=env, capture_output=True,
                text=True, timeout=300, stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            problems.append(f"README.md:{no}: `{shlex.join(words)}` ran past 300 s")
            return
        shown = shlex.join(words)
        tail = (p.stderr or p.stdout).strip().splitlines()[-5:]
        if parse_only:
            ok = p.returncode == 0 and "Usage:" in p.stdout
            how = "parsed (--help after its flags)"
        elif sub == "run":
            ok = p.returncode == 0
            how = "ran with `true` as the server"
        elif sub == "install":
            ok = p.returncode in INSTALL_OUTCOMES
            how = "ran"
        elif sub == "policy" and args[1:2] == ["new"]:
            crate = scratch / "work" / args[2]
            ok = p.returncode == 0 and (crate / "Cargo.toml").is_file()
            how = "ran"
        else:
            ok = p.returncode not in (2, 101) and p.returncode >= 0
            how = "ran"
        if ok:
            print(f"README.md:{no}: {how}, exit {p.returncode}: {shown}")
        else:
            problems.append(
                f"README.md:{no}: `{shown}` exited {p.returncode}:\n    " + "\n    ".join(tail)
            )


EXIT_PAGE = ROOT / "docs/guide/exit-codes.md"


def subcommands(binary, prefix=()):
    """Every command of `jitship --help` (and of its command groups), `help` left out."""
    out = subprocess.run([binary, *prefix, "--help"], capture_output=True, text=True).stdout
    block = out.split("\nCommands:\n", 1)[1].split("\n\n", 1)[0] if "\nCommands:\n" in out else ""
    found = []
    for name in re.findall(r"(?m)^  ([a-z][a-z-]*)\b", block):
        if name == "help":
            continue
        inner = subcommands(binary, (*prefix, name))
        found += inner or [" ".join((*prefix, name))]
    return found


def check_exit_codes(binary, problems):
    """Every exit code a command's --help lists is in its row of the guide's table."""
    rows = {}
    page = EXIT_PAGE.read_text(encoding="utf-8")
    for line in page.split("\n## Every command's exit codes\n")[1].splitlines():
        if not line.startswith("| "):
            continue
        cells = line.split(" | ")
        names = re.findall(r"`([a-z ]+)`", cells[0])
        for name in names:
            rows[name] = set(re.findall(r"\b\d+\b", cells[-1]))
    commands = subcommands(binary)
    if len(commands) < 15:
        problems.append(f"`jitship --help` lists only {commands}")
    for cmd in commands:
        p = subprocess.run([binary, *cmd.split(), "--help"], capture_output=True, text=True)
        listed = p.stdout.split("\nExit codes", 1)[-1] if "\nExit codes" in p.stdout else ""
        codes = set(re.findall(r"(?m)^  (\d+) ", listed))
        if not codes:
            problems.append(f"`jitship {cmd} --help` lists no exit codes")
            continue
        row = rows.get(cmd)
        if row is None:
            problems.append(f"{EXIT_PAGE.relative_to(ROOT)}: no row for `{cmd}`")
        elif not codes <= row:
            problems.append(
                f"{EXIT_PAGE.relative_to(ROOT)}: `{cmd}` exits {sorted(codes - row, key=int)} "
                "by its --help, which its row does not list"
            )
    return len(commands)


def main():
    text = README.read_text(encoding="utf-8")
    problems = []
    lines = text.count("\n")
    if lines > MAX_LINES:
        problems.append(f"README.md has {lines} lines; the front door holds at most {MAX_LINES}")
    binary = os.environ.get("JITSHIP_BIN", str(ROOT / "target/debug/jitship"))
    found = commands(text)
    if not found:
        problems.append("README.md shows no command at all (the quickstart and the test command?)")
    for no, words in found:
        if words[0] in (QUICKSTART, RUN_ALL) and len(words) == 1:
            print(f"README.md:{no}: run by tests/run-all.sh itself: {words[0]}")
        elif words[0] == "jitship":
            if not os.access(binary, os.X_OK):
                problems.append(f"README.md:{no}: no jitship binary at {binary} (build it first)")
                continue
            run_jitship(no, words, binary, problems)
        else:
            problems.append(
                f"README.md:{no}: `{shlex.join(words)}` is run by no test; show it in the guide "
                "instead, or teach tests/docs/readme_commands.py to run it"
            )
    check_suite_commands(problems)
    checked = 0
    if os.access(binary, os.X_OK):
        checked = check_exit_codes(binary, problems)
    if problems:
        print("\n".join(problems))
        print(f"readme commands: {len(problems)} problem(s)")
        return 1
    print(
        f"readme commands: all {len(found)} commands of README.md ({lines} lines) run or parsed; "
        f"docs/guide/exit-codes.md lists every exit code of {checked} commands' --help"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Guard of the test suite: every ctest entry runs something, every test case runs.

catch_discover_tests turns each Catch2 TEST_CASE into a ctest entry whose
command names the test case as a test spec. A name that the spec syntax or
CMake's list handling mangles (a ';' splits it in two, for one) gives entries
whose spec matches no test case: Catch2 runs nothing and, without `-w NoTests`,
exits 0, so ctest counts a pass for a test that never ran.

This script reads ctest's own list of entries (`ctest --show-only=json-v1`),
and for each entry whose command runs one of the Catch2 executables (listed one
per line in --executables) it lists what that command would run
(`--list-test-names-only` appended to the entry's own arguments). It fails,
naming the entry, when an entry lists no test case, and, naming the test case,
when a test case of an executable is listed by no entry. Exit 0 when all is well.
"""
import argparse
import concurrent.futures
import json
import os
import subprocess
import sys


def list_names(executable, args):
    """Test case names that `executable args` would run."""
    out = subprocess.run([executable, *args, "--list-test-names-only"],
                         capture_output=True, text=True, timeout=60)
    # Catch2 exits with the number of test cases listed (0 when none).
    names = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    # Catch2 quotes names that start with '#' when listing them.
    return {n[1:-1] if n.startswith('"') and n.endswith('"') else n for n in names}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build-dir", required=True)
    parser.add_argument("--executables", required=True,
                        help="file with one Catch2 executable path per line")
    parser.add_argument("--ctest", default="ctest")
    opts = parser.parse_args()

    with open(opts.executables) as f:
        executables = [line.strip() for line in f if line.strip()]
    shown = subprocess.run([opts.ctest, "--show-only=json-v1", "--test-dir", opts.build_dir],
                           capture_output=True, text=True, check=True)
    entries = json.loads(shown.stdout)["tests"]

    problems = []
    reached = {exe: set() for exe in executables}
    runs = []  # (entry name, executable, its arguments)
    for entry in entries:
        command = entry.get("command") or []
        at = next((i for i, word in enumerate(command) if word in reached), None)
        if at is None:
            continue  # not a Catch2 executable (a script, a benchmark, mpirun of a plain program)
        runs.append((entry["name"], command[at], command[at + 1:]))
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        listed = pool.map(lambda run: list_names(run[1], run[2]), runs)
        for (name, exe, args), names in zip(runs, listed):
            if not names:
                problems.append(f"ctest entry '{name}' runs no test case: "
                                f"`{exe} {' '.join(args)}` matches nothing "
                                "(a ';' or other special character in a TEST_CASE name?)")
            reached[exe] |= names
    checked = len(runs)

    for exe in executables:
        every = list_names(exe, ["*"])  # '*' includes hidden test cases
        if not every:
            problems.append(f"{exe} lists no test cases at all")
        for name in sorted(every - reached[exe]):
            problems.append(f"test case '{name}' of {exe} is run by no ctest entry")

    if problems:
        print(f"test entry guard: {len(problems)} problem(s) in {checked} Catch2 entries:")
        for p in problems:
            print("  " + p)
        return 1
    total = sum(len(r) for r in reached.values())
    print(f"test entry guard: {checked} ctest entries of {len(executables)} Catch2 executables "
          f"run all {total} of their test cases")
    return 0


if __name__ == "__main__":
    sys.exit(main())

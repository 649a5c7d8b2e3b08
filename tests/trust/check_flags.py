#!/usr/bin/env python3
"""Walks every numeric flag of a program with a value its rule forbids.

  check_flags.py PROGRAM [ARGS...]

Reads PROGRAM --help (CLI11's format: "--name TYPE:RULE  description"). Every
option taking a number (INT, UINT, FLOAT) must carry a range rule from
examples/common/flag_checks.hpp (">=N", ">0", "[A, B]"), except UINT options,
whose conversion already refuses a sign. For each, the program is run with
ARGS plus the flag set just outside its rule; it must exit non-zero at once,
saying the flag's name and the value. Exit 0 when every flag is refused so.
"""
import re
import subprocess
import sys

OPTION = re.compile(r"^\s+(?:-\w,)?(--[\w-]+)\s+(INT|UINT|FLOAT)(?::(\S+))?")


def bad_value(kind, rule):
    """A value just outside `rule` for an option of type `kind`."""
    if rule is None:
        return "-1" if kind == "UINT" else None
    if rule.startswith(">="):
        lo = float(rule[2:])
        return str(int(lo) - 1) if kind != "FLOAT" else repr(lo - 0.5)
    if rule == ">0":
        return "0"
    m = re.fullmatch(r"\[(-?[\d.e+-]+),(-?[\d.e+-]+)\]", rule)
    if m:
        hi = float(m.group(2))
        return str(int(hi) + 1) if kind != "FLOAT" else repr(hi + 0.5)
    return None


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    program, args = sys.argv[1], sys.argv[2:]
    help_text = subprocess.run([program, "--help"], capture_output=True, text=True,
                               timeout=30).stdout
    # "[A, B]" holds a space: join it so that the rule is one token.
    help_text = re.sub(r"\[(\S+), (\S+)\]", r"[\1,\2]", help_text)
    problems, checked = [], 0
    for line in help_text.splitlines():
        m = OPTION.match(line)
        if not m:
            continue
        flag, kind, rule = m.groups()
        value = bad_value(kind, rule)
        if value is None:
            problems.append(f"{flag} takes a number ({kind}) but has no range rule ({rule})")
            continue
        checked += 1
        try:
            run = subprocess.run([program, *args, flag, value], capture_output=True, text=True,
                                 timeout=10)
        except subprocess.TimeoutExpired:
            problems.append(f"{flag} {value} was accepted (still running after 10 s)")
            continue
        out = run.stdout + run.stderr
        if run.returncode == 0:
            problems.append(f"{flag} {value} was accepted (exit 0)")
        elif flag not in out or value not in out:
            problems.append(f"{flag} {value} was refused without naming the flag and the value:"
                            f" {out.strip()[:200]!r}")
        else:
            print(f"ok: {flag} {value}: {out.strip().splitlines()[0]}")
    for p in problems:
        print("FAIL: " + p)
    if checked == 0 and not problems:
        print(f"FAIL: no numeric flags found in `{program} --help`")
        return 1
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

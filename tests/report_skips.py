#!/usr/bin/env python3
"""Prints each test that ctest skipped with the reason the test gave.

ctest's summary names skipped tests but not why. Every skip in Loom's suite
prints its reason on a line starting with "SKIPPED:" (support/skip.hpp, the CUDA
tests' main, the Slurm test); this reads ctest's JUnit file (--output-junit) and
prints those reasons, grouping tests that share one. A skipped test that printed
no such line is listed with the last line of its output.

  report_skips.py build/Testing/junit.xml
"""
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict


def reason_of(output):
    lines = [line.strip() for line in (output or "").splitlines() if line.strip()]
    given = [line[len("SKIPPED:"):].strip() for line in lines if line.startswith("SKIPPED:")]
    if given:
        return "; ".join(dict.fromkeys(given))  # once each, in order
    return lines[-1] if lines else "(the test printed nothing)"


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    by_reason = defaultdict(list)
    for case in ET.parse(sys.argv[1]).getroot().iter("testcase"):
        if case.find("skipped") is None:
            continue
        out = case.find("system-out")
        by_reason[reason_of(out.text if out is not None else "")].append(case.get("name"))
    if not by_reason:
        print("skipped tests: none")
        return 0
    total = sum(len(names) for names in by_reason.values())
    print(f"skipped tests ({total}), with the reason each gave:")
    for reason, names in by_reason.items():
        if len(names) == 1:
            print(f"  {names[0]}: {reason}")
        else:
            print(f"  {len(names)} tests: {reason}")
            for name in names:
                print(f"    {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

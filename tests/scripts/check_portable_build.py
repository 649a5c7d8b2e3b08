#!/usr/bin/env python3
"""Compiles the library's CPU-feature-guarded sources as a portable build would.

  check_portable_build.py SOURCE_DIR BUILD_DIR

The default build uses -march=native, so on an AVX-512 machine the branches
that other CPUs take (`#else` of `#if defined(__AVX512F__)` and the like) are
never compiled, and a stub there whose signature drifted from its header
still builds: the library links (a shared library may leave symbols
undefined) and only a program built with LOOM_NATIVE_ARCH=OFF fails to link
(found on 2026-11-30, building for a GPU machine). This check takes every
host kernel source (src/kernels/cpu/, whose headers hold such branches too)
and any other library source that tests an x86 feature macro, as
compile_commands.json compiles it, and compiles it again for x86-64-v3
(AVX2, no AVX-512) with -fsyntax-only -Werror -Wmissing-declarations: a
definition that matches no declaration, or a helper only the other branch
uses, is an error naming the file. Exit 0: all compile; 77 (skipped): not
an x86-64 GCC/Clang build or no compile_commands.json.
"""
import concurrent.futures
import json
import os
import platform
import re
import shlex
import subprocess
import sys

FEATURE = re.compile(r"__AVX512|__AVX2__|__AVX__")
DROP_WITH_VALUE = {"-o", "-MT", "-MF", "-MQ"}
DROP = {"-c", "-MD", "-MMD"}


def portable_command(entry):
    args = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
    # A compiler launcher (ccache) comes first when the build uses one.
    while args and os.path.basename(args[0]) in ("ccache", "sccache"):
        args = args[1:]
    out, skip = [args[0]], False
    for a in args[1:]:
        if skip:
            skip = False
        elif a in DROP_WITH_VALUE:
            skip = True
        elif a in DROP or a.startswith("-march=") or a.startswith("-mtune="):
            pass
        else:
            out.append(a)
    return out + ["-march=x86-64-v3", "-fsyntax-only", "-Werror", "-Wmissing-declarations"]


def main():
    source_dir, build_dir = sys.argv[1:3]
    database = os.path.join(build_dir, "compile_commands.json")
    if platform.machine() not in ("x86_64", "AMD64") or not os.path.exists(database):
        print(f"SKIP: needs an x86-64 build with {database}")
        return 77
    src = os.path.join(os.path.realpath(source_dir), "src") + os.sep
    kernels = os.path.join(src, "kernels", "cpu") + os.sep
    entries = []
    for e in json.load(open(database)):
        path = os.path.realpath(os.path.join(e["directory"], e["file"]))
        if path.startswith(src) and path.endswith(".cpp"):
            with open(path, errors="replace") as f:
                if path.startswith(kernels) or FEATURE.search(f.read()):
                    entries.append((path, e))
    if not entries:
        print("SKIP: no feature-guarded sources in the build")
        return 77
    compiler = os.path.basename(portable_command(entries[0][1])[0])
    if not re.search(r"(g\+\+|c\+\+|clang\+\+)", compiler):
        print(f"SKIP: compiler {compiler} is not GCC or Clang")
        return 77

    def compile_one(item):
        path, e = item
        r = subprocess.run(portable_command(e), cwd=e["directory"], capture_output=True, text=True)
        return path, r.returncode, r.stderr

    failures = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        for path, code, stderr in pool.map(compile_one, entries):
            if code != 0:
                failures += 1
                print(f"FAIL: {os.path.relpath(path, source_dir)} does not compile for "
                      f"x86-64-v3:\n{stderr[:3000]}")
    if failures:
        return 1
    print(f"PASS: {len(entries)} host kernel and feature-guarded sources compile for x86-64-v3 "
          "(-Werror -Wmissing-declarations)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

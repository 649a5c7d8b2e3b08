#!/usr/bin/env python3
"""loom-ckpt against a real checkpoint.

  check_ckpt_tool.py LOOM_CKPT CHECKPOINT_DIR WORK_DIR

CHECKPOINT_DIR holds the tp 2 x dp 2 ZeRO-2 checkpoint of the test GPT
(vocabulary 61, padded to 62 over tp 2; d_model 32) that the hidden test case
"[.ckpt_tool]" writes (ctest's fixture checkpoint.ckpt_tool_fixture). Then:
inspect lists the parameters with their global shapes; verify says ok;
consolidate writes one safetensors file of whole tensors (the token table
without its padding row), and with --gpt2 the blocks' linear weights as
[in, out]; verify fails naming the file after a byte of it is flipped.
"""
import json
import os
import struct
import subprocess
import sys


def run(command, expect_ok=True):
    print("$ " + " ".join(command), flush=True)
    out = subprocess.run(command, capture_output=True, text=True, timeout=120)
    text = out.stdout + out.stderr
    print(text)
    if (out.returncode == 0) != expect_ok:
        raise SystemExit(f"FAIL: exit status {out.returncode}")
    return text


def header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


def main():
    tool, ckpt, work = sys.argv[1:4]
    problems = []
    text = run([tool, "inspect", ckpt])
    for want in ["step 2, saved by 4 rank(s)", "wte.weight", "[61, 32]", "h.1.attn.c_attn.weight",
                 "value, exp_avg, exp_avg_sq"]:
        if want not in text:
            problems.append(f"inspect lacks {want!r}")
    if "ok: " not in run([tool, "verify", ckpt]):
        problems.append("verify did not say ok")
    for gpt2, attn in [(False, [96, 32]), (True, [32, 96])]:
        path = os.path.join(work, "whole.safetensors")
        run([tool, "consolidate", ckpt, path] + (["--gpt2"] if gpt2 else []))
        h = header(path)
        if h["wte.weight"]["shape"] != [61, 32]:
            problems.append(f"consolidated wte.weight is {h['wte.weight']['shape']}, not [61, 32]")
        if h["h.0.attn.c_attn.weight"]["shape"] != attn:
            problems.append(f"consolidated c_attn (gpt2={gpt2}) is "
                            f"{h['h.0.attn.c_attn.weight']['shape']}, not {attn}")
    step = os.path.join(ckpt, "step-00000002")
    victim = os.path.join(step, "rank-00003.safetensors")
    with open(victim, "r+b") as f:
        f.seek(-3, os.SEEK_END)
        b = f.read(1)
        f.seek(-3, os.SEEK_END)
        f.write(bytes([b[0] ^ 0x40]))
    text = run([tool, "verify", ckpt], expect_ok=False)
    if "rank-00003.safetensors" not in text:
        problems.append("verify of a flipped byte did not name the file")
    with open(victim, "r+b") as f:  # as it was, for checkpoint.gpt2_reference
        f.seek(-3, os.SEEK_END)
        f.write(b)
    for p in problems:
        print("FAIL: " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

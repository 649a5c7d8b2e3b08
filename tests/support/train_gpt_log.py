"""Running train_gpt from a test script and reading what it logs.

run(command) runs it (240 s at most), fails the script unless its exit status
is as expected, and returns its output, {step: (loss, norm)} as printed (the
text, so that runs can be compared to the printed digit), and the last
validation loss (text, or None). with_batch(args, factor) multiplies --batch
(one rank running what dp ranks ran together). step_mismatches(name, got,
want, exact) compares two runs' common steps.
"""
import re
import subprocess

STEP = re.compile(r"^step\s+(\d+)\s+loss ([\d.]+)\s+lr \S+\s+norm ([\d.]+)", re.M)
VALIDATION = re.compile(r"validation loss ([\d.]+) nats")


def run(command, expect_ok=True):
    print("$ " + " ".join(command), flush=True)
    out = subprocess.run(command, capture_output=True, text=True, timeout=240)
    text = out.stdout + out.stderr
    if (out.returncode == 0) != expect_ok:
        print(text)
        raise SystemExit(f"FAIL: exit status {out.returncode}")
    steps = {int(m[1]): (m[2], m[3]) for m in STEP.finditer(text)}
    validation = VALIDATION.findall(text)
    return text, steps, validation[-1] if validation else None


def with_batch(args, factor):
    out = list(args)
    i = out.index("--batch") + 1
    out[i] = str(int(out[i]) * factor)
    return out


def step_mismatches(name, got, want, exact):
    """Each step both runs logged: (loss, norm) equal as printed when `exact`,
    else within the printed digit (loss 1e-4 + 1e-4 relative, norm 1e-3 +
    1e-4 relative). Prints every pair; returns the mismatches as text."""
    out = []
    for s in sorted(set(got) & set(want)):
        (gl, gn), (wl, wn) = got[s], want[s]
        print(f"{name}, step {s}: loss {gl} norm {gn} (reference {wl} {wn})")
        ok = (gl, gn) == (wl, wn) if exact else (
            abs(float(gl) - float(wl)) <= 1e-4 + 1e-4 * float(wl)
            and abs(float(gn) - float(wn)) <= 1e-3 + 1e-4 * float(wn))
        if not ok:
            out.append(f"{name}, step {s}: loss {gl} norm {gn}, reference {wl} {wn}")
    return out

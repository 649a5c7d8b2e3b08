"""The test scripts' Python packages (tests/requirements.txt: numpy, safetensors,
tokenizers).

scripts/setup.sh installs them into a virtual environment (LOOM_TEST_VENV,
default <repo>/.test-venv). A script whose interpreter lacks them calls
reexec_with_test_venv(why): it re-runs itself with that environment's
interpreter, or skips (exit 77, ctest's SKIP_RETURN_CODE, with the reason)
when there is none.
"""
import os
import sys

SKIP = 77


def reexec_with_test_venv(why):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    venv = os.environ.get("LOOM_TEST_VENV") or os.path.join(root, ".test-venv")
    python = os.path.join(venv, "bin", "python")
    # (A venv's python is a link to the base interpreter: compare by a marker, not by path.)
    if os.path.exists(python) and not os.environ.get("LOOM_INTEROP_IN_VENV"):
        os.environ["LOOM_INTEROP_IN_VENV"] = "1"
        os.execv(python, [python, *sys.argv])
    print(f"SKIPPED: {why}; run `bash scripts/setup.sh` (it installs tests/requirements.txt "
          f"into {venv})")
    sys.exit(SKIP)

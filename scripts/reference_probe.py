"""The harness the reference probes share (scripts/probe_*_reference.py): each probe runs its
cases in a child process on the interpreter that has the reference (env MOCKER_DYNAMO_PYTHON,
else this one), prints the child's JSON lines, and with --fixture writes them, with a header
naming the reference and the probe, to a fixture file for parity tests."""
import argparse
import json
import os
import subprocess
import sys

REFERENCE = "ai-dynamo-runtime==1.6.1 (dynamo._core; engine core aisimulate-core 0.13.0)"


def main(script, description, run_child, notes, compact=False, timeout=600):
    """Command line of a probe: `script` is its file, `run_child(only)` prints its cases."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--fixture", help="also write the cases and figures to this JSON file")
    ap.add_argument("--only", default="", help="run only the cases whose name starts so")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        run_child(a.only)
        return
    py = os.environ.get("MOCKER_DYNAMO_PYTHON") or sys.executable
    env = dict(os.environ, RUST_LOG=os.environ.get("RUST_LOG", "error"))
    proc = subprocess.run([py, os.path.abspath(script), "--child", "--only", a.only],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                          timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    for ln in lines:
        print(ln)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        sys.exit(f"reference probe failed (exit {proc.returncode}); is ai-dynamo-runtime==1.6.1 "
                 f"installed in {py}?")
    if a.fixture:
        doc = {
            "reference": REFERENCE,
            "generated_by": "scripts/" + os.path.basename(script),
            "notes": notes,
            "cases": [json.loads(ln) for ln in lines],
        }
        with open(a.fixture, "w") as f:
            if compact:
                json.dump(doc, f, separators=(",", ":"))
            else:
                json.dump(doc, f, indent=1)
            f.write("\n")

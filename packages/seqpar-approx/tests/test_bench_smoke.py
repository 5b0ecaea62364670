"""The torchrun benchmark script runs end to end (tiny shapes, CPU, gloo)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_spava.py"


@pytest.mark.slow
def test_bench_script_smoke(tmp_path):
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    out = tmp_path / "b.json"
    cmd = [
        torchrun,
        "--nproc-per-node",
        "2",
        str(BENCH),
        "--smoke",
        "--seq-lens",
        "700",
        "--reps",
        "1",
        "--frames",
        "4",
        "--frame-patches",
        "4",
        "--out",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rep = json.loads(out.read_text())
    assert all(c["max_abs_err"] < 1e-4 for c in rep["checks"]), rep["checks"]
    methods = {(r["mode"], r["method"]) for r in rep["results"]}
    assert ("model", "spava-no-fused") in methods and ("vision", "frame-parallel") in methods

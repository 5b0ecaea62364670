"""Prints one line per benchmark of a pytest-benchmark JSON: name, median ms and extra fields."""

import json
import sys
from pathlib import Path

for path in sys.argv[1:]:
    for b in json.loads(Path(path).read_text())["benchmarks"]:
        x = b["extra_info"]
        keep = {
            k: x[k]
            for k in (
                "useful_tflops",
                "config",
                "estimation_ms",
                "estimation_quartiles_ms",
                "estimation_launched_ms",
                "plan_ms",
                "run_fraction",
                "segments",
                "estimation_over_kernel",
                "attended_fraction",
            )
            if x.get(k) is not None
        }
        print(f"{b['name']:70s} {b['stats']['median'] * 1e3:10.3f} ms {keep}")

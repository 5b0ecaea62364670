"""A rank that raises or stalls ends the job on every rank, with a message naming it, in bounded time."""

import os
import tempfile
import time
from pathlib import Path

import pytest
from seqpar_approx.faults import Watchdog
from seqpar_approx.testing import SpawnError, fault_worker, spawn


@pytest.mark.parametrize("mode", ["raise", "sleep"])
def test_failing_rank_ends_job_on_every_rank(mode):
    with tempfile.TemporaryDirectory() as d:
        t0 = time.monotonic()
        with pytest.raises(SpawnError) as ei:
            spawn(
                fault_worker,
                2,
                mode=mode,
                fail_rank=1,
                stall_s=3.0,
                report_dir=d,
                timeout_s=60,
                pg_timeout_s=30,
            )
        elapsed = time.monotonic() - t0
        aborts = {f: Path(d, f).read_text() for f in os.listdir(d)}
    assert elapsed < 40, f"job took {elapsed:.1f} s to end"
    assert "still running" not in str(ei.value)
    rank0 = aborts.get("abort0.txt", "")
    if mode == "raise":
        assert "ValueError: injected failure" in str(ei.value)
        assert "rank 1 failed in 'step 2': ValueError: injected failure" in rank0
    else:
        # whichever rank's watchdog fires first ends; the other then loses the store (or fires too)
        texts = [rank0, aborts["abort1.txt"]]
        assert all("no progress for" in t or "lost the rendezvous store" in t for t in texts)
        stalls = [t for t in texts if "no progress for" in t]
        assert stalls
        assert "rank 0: 'step 2' (4 beats), rank 1: 'step 2' (4 beats)" in stalls[0]


def test_watchdog_rejects_bad_timeout():
    with pytest.raises(ValueError, match="timeout_s: expected > 0"):
        Watchdog(timeout_s=0)

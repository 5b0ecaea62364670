"""A rank that raises or stalls ends the job on every rank, with a message naming it, in bounded time."""

import os
import tempfile
import time
from pathlib import Path

import pytest
from seqpar_approx.faults import Watchdog, init_distributed
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
        # whichever rank's watchdog fires first ends; the other then loses the store, fires too,
        # or (on a loaded machine) sees its all-gather raise as gloo loses the ended peer
        texts = [rank0, aborts["abort1.txt"]]
        ends = ("no progress for", "lost the rendezvous store", "failed in 'step 2': RuntimeError")
        assert all(any(e in t for e in ends) for t in texts), texts
        stalls = [t for t in texts if "no progress for" in t]
        assert stalls
        # rank 1 sleeps in the worker's step 3; rank 0 waits for it in the all-gather
        for t in stalls:
            assert "stalled: rank 1 after 'step 2' (4 beats), running testing.py:" in t, t
            assert "in fault_worker; waiting on it: rank 0 after 'step 2' (4 beats), " in t, t
            assert "waiting in collective all_gather" in t, t


def test_watchdog_rejects_bad_timeout():
    with pytest.raises(ValueError, match="timeout_s: expected > 0"):
        Watchdog(timeout_s=0)


@pytest.mark.parametrize(
    "env, asked",
    [
        pytest.param(
            {"OMPI_COMM_WORLD_SIZE": "2"},
            "asked for 2 processes (OMPI_COMM_WORLD_SIZE=2)",
            id="mpirun",
        ),
        pytest.param({"PMI_SIZE": "4"}, "asked for 4 processes (PMI_SIZE=4)", id="pmi"),
        pytest.param(
            # what accelerate's single-process launcher exports for --cpu --num_processes 2
            {
                "ACCELERATE_MIXED_PRECISION": "no",
                "ACCELERATE_USE_CPU": "True",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": "29500",
            },
            "asked for more than 1 processes (accelerate launch set MASTER_ADDR)",
            id="accelerate-cpu",
        ),
    ],
)
def test_launcher_that_started_fewer_processes_is_refused(monkeypatch, env, asked):
    for name in ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ValueError) as ei:
        init_distributed()
    msg = str(ei.value)
    assert asked in msg and "runs alone (world size 1" in msg, msg

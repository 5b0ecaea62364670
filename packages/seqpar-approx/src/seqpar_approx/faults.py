"""Ending a multi-rank job cleanly when one rank fails or stalls.

Two mechanisms, both bounded in time:

* the process group's own timeout (``init_distributed(timeout_s=...)``): a collective that waits
  longer raises on the waiting ranks;
* :class:`Watchdog`: a heartbeat thread per rank. The main thread calls ``beat(phase)`` as it makes
  progress (e.g. once per layer). The thread publishes the beat count and phase in the process
  group's key-value store, and aborts the process (``os._exit``) with a message naming the
  culprit when (a) its own main thread made no progress for ``timeout_s`` (it stalled, or waits on
  a peer that stalled: the message lists every rank's last phase), or (b) a peer posted a
  failure (a rank whose ``with Watchdog(...)`` block raised posts ``rank r failed: <error>``
  before re-raising). ``os._exit`` is used because a thread cannot interrupt a collective that
  is blocked inside the backend; torchrun / accelerate then tear the job down.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from datetime import timedelta

import torch.distributed as dist

EXIT_PEER_FAILED = 70
EXIT_STALLED = 71


def init_distributed(*, backend: str | None = None, timeout_s: float = 300.0) -> tuple[int, int]:
    """Initialise the default process group from the launcher's environment (torchrun / accelerate:
    ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``); return ``(rank, world_size)``.

    Without those variables it runs as a single process (rank 0 of 1) and initialises nothing.
    ``backend=None``: NCCL when CUDA is available, gloo otherwise.
    """
    import torch

    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return 0, 1
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", os.environ["RANK"])))
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    return dist.get_rank(), dist.get_world_size()


def _default_store():
    # The default group's store (rendezvous) is shared by every rank; no public accessor exists.
    from torch.distributed import distributed_c10d

    return dist.PrefixStore("spava_watchdog/", distributed_c10d._get_default_store())


class Watchdog:
    """Heartbeat + failure propagation for one rank (see the module docstring).

    Use as ``with Watchdog(timeout_s=60) as wd: ... wd.beat("layer 3") ...``. Without an
    initialised process group only the local stall check runs.
    """

    def __init__(
        self,
        *,
        timeout_s: float,
        interval_s: float | None = None,
        on_abort=None,
        store=None,
    ):
        if not timeout_s > 0:
            raise ValueError(f"timeout_s: expected > 0, got {timeout_s}")
        self.timeout_s = float(timeout_s)
        self.interval_s = interval_s if interval_s is not None else min(1.0, timeout_s / 5)
        self._on_abort = on_abort
        self._dist = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self._dist else 0
        self.world = dist.get_world_size() if self._dist else 1
        self._store = store if store is not None else (_default_store() if self._dist else None)
        self._beats = 0
        self._phase = "start"
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spava-watchdog", daemon=True)

    def beat(self, phase: str = "") -> None:
        self._beats += 1
        self._phase = phase or self._phase
        self._last = time.monotonic()

    def report_failure(self, exc: BaseException) -> None:
        if self._store is not None:
            msg = f"rank {self.rank} failed in '{self._phase}': {type(exc).__name__}: {exc}"
            with contextlib.suppress(Exception):  # the store may be gone already
                self._store.set(f"fail/{self.rank}", msg)

    def _abort(self, msg: str, code: int) -> None:
        text = f"[spava watchdog] rank {self.rank}: {msg}"
        print(text, file=sys.stderr, flush=True)
        if self._on_abort is not None:
            self._on_abort(text)
        os._exit(code)

    def _peers(self) -> tuple[list[str], list[tuple[int, int, str]]]:
        failures, beats = [], []
        for r in range(self.world):
            if r == self.rank:
                continue
            if self._store.check([f"fail/{r}"]):
                failures.append(self._store.get(f"fail/{r}").decode())
            if self._store.check([f"hb/{r}"]):
                n, _, phase = self._store.get(f"hb/{r}").decode().partition("|")
                beats.append((int(n), r, phase))
        return failures, beats

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            failures, beats = [], []
            if self._store is not None:
                try:
                    self._store.set(f"hb/{self.rank}", f"{self._beats}|{self._phase}")
                    failures, beats = self._peers()
                except Exception as e:  # noqa: BLE001 - store unreachable: the master is gone
                    self._abort(
                        f"lost the rendezvous store ({e}); a peer or the launcher died",
                        EXIT_PEER_FAILED,
                    )
            if failures:
                self._abort("ending because " + "; ".join(failures), EXIT_PEER_FAILED)
            idle = time.monotonic() - self._last
            if idle > self.timeout_s:
                ranks = sorted(
                    [(self.rank, self._beats, self._phase), *((r, n, p) for n, r, p in beats)]
                )
                table = ", ".join(f"rank {r}: '{p}' ({n} beats)" for r, n, p in ranks)
                self._abort(
                    f"no progress for {idle:.1f} s (timeout {self.timeout_s:.1f} s) after "
                    f"'{self._phase}': this rank or a peer it waits on is stuck; last progress "
                    f"per rank: {table}",
                    EXIT_STALLED,
                )

    def __enter__(self) -> Watchdog:
        self.beat("start")
        self._thread.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval_s * 2)
        if exc is not None:
            self.report_failure(exc)
            # give peers' watchdogs time to read the failure before this process (which may
            # host the store) exits; this rank then re-raises its own error
            time.sleep(self.interval_s * 3)

"""Ending a multi-rank job cleanly when one rank fails or stalls.

Two mechanisms, both bounded in time:

* the process group's own timeout (``init_distributed(timeout_s=...)``): a collective that waits
  longer raises on the waiting ranks;
* :class:`Watchdog`: a heartbeat thread per rank. The main thread calls ``beat(phase)`` as it makes
  progress (e.g. once per layer). The thread publishes the beat count, the phase and where the
  main thread is (waiting in a collective, or running a named line) in the process group's
  key-value store, and aborts the process (``os._exit``) with a message naming the culprit when
  (a) its own main thread made no progress for ``timeout_s``: the message names the stalled
  ranks (those not waiting in a collective), their last step and line, and the ranks waiting on
  them; or (b) a peer posted a failure (a rank whose ``with Watchdog(...)`` block raised posts
  ``rank r failed in '<step>': <error>`` before re-raising). ``os._exit`` is used because a
  thread cannot interrupt a collective that is blocked inside the backend; torchrun /
  accelerate then tear the job down. With NCCL a rank blocked on the GPU (a synchronising read
  after an asynchronous collective) shows as running the line that synchronises.

:func:`init_distributed` also refuses a launch that started fewer processes than asked for
(e.g. ``accelerate launch --cpu --num_processes 2``, whose single-process launcher starts one).
"""

from __future__ import annotations

import contextlib
import json
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
        asked = requested_processes()
        if asked is not None:
            count, source = asked
            raise ValueError(
                f"the launcher was asked for {count} processes ({source}) but this process runs "
                f"alone (world size 1: no RANK/WORLD_SIZE in its environment); launch with "
                f"`torchrun --nproc-per-node N` (gloo on CPU) or `accelerate launch --multi_gpu "
                f"--num_processes N` on GPUs"
            )
        return 0, 1
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    device = None
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", os.environ["RANK"])))
        torch.cuda.set_device(device)
    # With device_id, NCCL builds its communicator here (eager init) instead of inside the first
    # collective, which would otherwise fall into the first request's time to first token.
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s), device_id=device)
    return dist.get_rank(), dist.get_world_size()


# Process counts that MPI launchers (mpirun, mpiexec, srun with PMI) give each process they start
# and that torch.distributed does not read. Allocation-wide counts (SLURM_NTASKS) are left out:
# a batch script that runs one process on purpose has them too.
_COUNT_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE")


def requested_processes() -> tuple[int | str, str] | None:
    """How many processes the launcher was asked for, and what says so, when that is more than
    one and the environment lacks the ``RANK``/``WORLD_SIZE`` of a torch.distributed launch;
    ``None`` when nothing asks for more than one.

    ``accelerate launch`` sets ``ACCELERATE_MIXED_PRECISION`` in every launcher and
    ``MASTER_ADDR`` only when more than one process was asked for; its single-process launcher
    (used for ``--cpu``) then starts one process without ``RANK``. The count itself is read from
    the ``accelerate launch`` command line of the parent process where Linux shows it.
    """
    env = os.environ
    for name in _COUNT_VARIABLES:
        value = env.get(name, "")
        if value.isdigit() and int(value) > 1:
            return int(value), f"{name}={value}"
    if "ACCELERATE_MIXED_PRECISION" in env and "MASTER_ADDR" in env:
        count = _accelerate_num_processes()
        if count is not None:
            return count, f"accelerate launch --num_processes {count}"
        return "more than 1", "accelerate launch set MASTER_ADDR"
    return None


def _accelerate_num_processes() -> int | None:
    try:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            argv = f.read().decode(errors="replace").split("\0")
    except OSError:
        return None
    if not any(a.endswith("accelerate") or a == "launch" for a in argv):
        return None
    for i, a in enumerate(argv):
        for flag in ("--num_processes", "--num-processes"):
            if a == flag and i + 1 < len(argv) and argv[i + 1].isdigit():
                return int(argv[i + 1])
            if a.startswith(flag + "=") and a[len(flag) + 1 :].isdigit():
                return int(a[len(flag) + 1 :])
    return None


# Where a main thread that waits on its peers sits: inside torch.distributed, or in the wait of
# this package's collectives.
_COLLECTIVE_FILES = (
    os.path.join("torch", "distributed") + os.sep,
    os.path.join("seqpar_approx", "_comm.py"),
)


def _where(frame) -> tuple[bool, str]:
    """``(waiting, place)`` of a thread's innermost Python frame: ``waiting`` when any frame of
    the stack is a collective's; ``place`` names the collective or ``file:line in function``."""
    if frame is None:
        return False, "unknown"
    inner = frame
    waiting, collective = False, None
    while frame is not None:
        path = frame.f_code.co_filename
        if any(m in path for m in _COLLECTIVE_FILES):
            waiting = True
            # the outermost public function of c10d or of _comm names the collective (the
            # frames around it are logging decorators)
            if path.endswith(("distributed_c10d.py", "_comm.py")):
                collective = frame.f_code.co_name
        frame = frame.f_back
    if waiting:
        return True, f"waiting in collective {collective or 'torch.distributed'}"
    name = os.path.basename(inner.f_code.co_filename)
    return False, f"running {name}:{inner.f_lineno} in {inner.f_code.co_name}"


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
        self._main = threading.get_ident()
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

    def _state(self) -> tuple[int, str, bool, str]:
        waiting, place = _where(sys._current_frames().get(self._main))
        return self._beats, self._phase, waiting, place

    def _peers(self) -> tuple[list[str], dict[int, tuple[int, str, bool, str] | None]]:
        failures, states = [], {}
        for r in range(self.world):
            if r == self.rank:
                continue
            if self._store.check([f"fail/{r}"]):
                failures.append(self._store.get(f"fail/{r}").decode())
            states[r] = None
            if self._store.check([f"hb/{r}"]):
                states[r] = tuple(json.loads(self._store.get(f"hb/{r}").decode()))
        return failures, states

    def _stall_message(self, idle: float, states: dict) -> str:
        """Which ranks stalled (not waiting in a collective; or, when every rank waits, those
        with the fewest beats), their last step and place, and the ranks waiting on them."""
        known = {r: s for r, s in states.items() if s is not None}
        silent = sorted(r for r, s in states.items() if s is None)
        running = sorted(r for r, s in known.items() if not s[2])
        if running or silent:
            stalled, note = running, ""
        else:
            fewest = min(s[0] for s in known.values())
            stalled = sorted(r for r, s in known.items() if s[0] == fewest)
            note = " (every rank waits in a collective: the fewest beats are named)"

        def describe(r: int) -> str:
            n, phase, _, place = known[r]
            return f"rank {r} after '{phase}' ({n} beats), {place}"

        parts = [describe(r) for r in stalled] + [
            f"rank {r} (no heartbeat: stuck before its watchdog started, or gone)" for r in silent
        ]
        waiting = [describe(r) for r in sorted(known) if r not in stalled]
        text = (
            f"no progress for {idle:.1f} s (timeout {self.timeout_s:.1f} s); stalled: "
            f"{'; '.join(parts)}{note}"
        )
        if waiting:
            text += f"; waiting on it: {'; '.join(waiting)}"
        return text

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            failures, states = [], {}
            mine = self._state()
            if self._store is not None:
                try:
                    self._store.set(f"hb/{self.rank}", json.dumps(mine))
                    failures, states = self._peers()
                except Exception as e:  # noqa: BLE001 - store unreachable: the master is gone
                    self._abort(
                        f"lost the rendezvous store ({e}); a peer or the launcher died",
                        EXIT_PEER_FAILED,
                    )
            if failures:
                self._abort("ending because " + "; ".join(failures), EXIT_PEER_FAILED)
            idle = time.monotonic() - self._last
            if idle > self.timeout_s:
                states[self.rank] = mine
                self._abort(self._stall_message(idle, states), EXIT_STALLED)

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

"""The tuning run: time each op's candidate launch configs on this GPU and write a table.

``python -m sparse_kernels tune`` and ``vlm-accel tune`` call :func:`tune`; the shipped tables
(``sparse_kernels/tuning/tables/<family>.json``) are written by it with ``out=``.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from .cases import CASES, OPS, Prepared, TuneCase, TuneShape
from .configs import LaunchConfig
from .lookup import CHOOSER, family_of
from .table import ConfigTable, TableEntry, length_bucket, user_table_path

# A config already chosen for a neighbouring length bucket is kept when it is at most this much
# slower than the best: one compiled variant fewer is worth a little speed.
NEIGHBOUR_SLACK = 1.03


@dataclass(frozen=True)
class Failure:
    """A candidate that could not run (compile error, out of shared memory or registers)."""

    key: tuple
    config: LaunchConfig
    error: str


@dataclass(frozen=True)
class TuneResult:
    """What a run did: the table as written to ``path``, the entries it tuned, the keys it
    skipped (already in the table) and the candidates that failed."""

    path: Path
    table: ConfigTable
    tuned: tuple[TableEntry, ...]
    skipped: tuple[tuple, ...]
    failures: tuple[Failure, ...]


def _default_timer(call: Callable[[], object]) -> float:
    from .._triton.config import bench_config

    return float(bench_config(call))


def _failures_to_skip() -> tuple[type[BaseException], ...]:
    """Errors a candidate may raise without stopping the run: Triton's out-of-resources (shared
    memory, registers), ptxas and compilation errors."""
    import triton

    kinds: list[type[BaseException]] = []
    runtime = getattr(getattr(triton, "runtime", None), "errors", None)
    for name in ("OutOfResources", "PTXASError"):
        if runtime is not None and hasattr(runtime, name):
            kinds.append(getattr(runtime, name))
    compiler = getattr(getattr(triton, "compiler", None), "errors", None)
    if compiler is not None and hasattr(compiler, "CompilationError"):
        kinds.append(compiler.CompilationError)
    return tuple(kinds)


def _check_lengths(lengths: Sequence[int]) -> list[int]:
    if isinstance(lengths, (str, bytes)) or not isinstance(lengths, Iterable):
        raise TypeError(f"lengths: expected a sequence of ints, got {type(lengths).__name__}")
    out = []
    for n in lengths:
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n < 2**31:
            raise ValueError(f"lengths: expected ints in [1, 2**31), got {n!r}")
        out.append(n)
    if not out:
        raise ValueError("lengths: expected at least one key length, got none")
    return sorted(set(out))


def _check_ops(ops: Sequence[str], cases: Mapping[str, TuneCase]) -> list[str]:
    if isinstance(ops, str):
        raise TypeError(f"ops: expected a sequence of op names, got the string {ops!r}")
    bad = [op for op in ops if op not in cases]
    if bad:
        raise ValueError(f"ops: expected names from {', '.join(cases)}, got {bad[0]!r}")
    if not ops:
        raise ValueError(f"ops: expected at least one of {', '.join(cases)}, got none")
    return list(dict.fromkeys(ops))


def _prepare(
    case: TuneCase, shape: TuneShape, S: int, device: torch.device
) -> tuple[Prepared, ...]:
    """The case's calls at length ``S``, checked: ``cases=`` may hold cases written elsewhere."""
    calls = case.prepare(shape, S, device)
    if not (isinstance(calls, tuple) and calls and all(isinstance(p, Prepared) for p in calls)):
        got = type(calls).__name__ if not isinstance(calls, tuple) else f"a tuple {calls!r}"
        raise TypeError(
            f"cases[{case.op!r}].prepare: expected a non-empty tuple of Prepared, got {got}"
        )
    return calls


def _key(p: Prepared, shape: TuneShape) -> tuple:
    return (p.op, p.variant, shape.head_dim, shape.dtype, shape.group, length_bucket(p.seq_len))


def pick(times: Mapping[LaunchConfig, float], neighbours: Sequence[LaunchConfig]) -> LaunchConfig:
    """The config to write from ``times`` (ms per config that ran).

    Rule: the fastest config, unless a config chosen for the nearest length bucket of the same
    key (``neighbours``, from the target table or from this run) ran within 3% of it
    (``NEIGHBOUR_SLACK``): then that one (the fastest of them), so that a prefill crossing the
    bucket boundary compiles no new variant for a gain below 3%."""
    if not times:
        raise ValueError("pick: expected at least one timed config, got none")
    best = min(times, key=times.__getitem__)
    close = [c for c in neighbours if c in times and times[c] <= NEIGHBOUR_SLACK * times[best]]
    return min(close, key=times.__getitem__) if close else best


def _neighbours(key: tuple, entries: Iterable[TableEntry]) -> list[LaunchConfig]:
    """Configs of the entries with ``key`` but its bucket that are nearest in bucket."""
    same = [e for e in entries if e.key[:5] == key[:5] and e.bucket != key[5]]
    if not same:
        return []
    near = min(abs(e.bucket - key[5]) for e in same)
    return [e.config for e in same if abs(e.bucket - key[5]) == near]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _versions() -> dict[str, str]:
    import triton

    return {"torch": torch.__version__.split("+")[0], "triton": triton.__version__}


def tune(
    shape: TuneShape,
    lengths: Sequence[int],
    *,
    ops: Sequence[str] = OPS,
    out: str | Path | None = None,
    force: bool = False,
    device: torch.device | str | None = None,
    command: str = "",
    timer: Callable[[Callable[[], object]], float] | None = None,
    candidates: Mapping[str, Sequence[LaunchConfig]] | None = None,
    cases: Mapping[str, TuneCase] | None = None,
    log: Callable[[str], None] = _stderr,
) -> TuneResult:
    """Tune ``ops`` for one attention shape at each key length and write the table.

    For each op and length, the op's case (:mod:`sparse_kernels.tuning.cases`) builds one call
    per variant the op is tuned for (``vertical_slash`` and ``permuted``: 64x64 and 128x128
    tiles, on shared inputs; ``triangle``: a narrow and a wide window; every other op: one), each with inputs like a real call and the key its launcher
    looks up, and each variant is tuned as its own table entry: every candidate of the op's
    ``KernelSpec`` that fits the call's blocks is timed (``timer(call) -> ms``; default
    ``sparse_kernels._triton.config.bench_config``: one untimed call, then timing). A candidate
    that fails to compile or run out of resources is skipped and reported. The written config is
    :func:`pick`'s: the fastest, or the config of the nearest length bucket already chosen when
    it is within 3% of the fastest. Lengths run shortest first, so each bucket sees the one
    below it.

    Args:
        shape: the model's attention shape.
        lengths: key lengths, one table entry per op variant and length bucket.
        ops: op names from :data:`~sparse_kernels.tuning.cases.OPS`.
        out: the table to write; default the user cache of this GPU's family
            (:func:`~sparse_kernels.tuning.user_table_path`), read by every later process.
            An existing table there is merged into: keys already in it are not tuned again
            unless ``force``. Written atomically after each op, so a run stopped midway keeps
            the ops it finished.
        device: a CUDA device (default: the current one).
        command: the command line recorded in the table.
        timer, candidates, cases: what is timed and how (``candidates``: op -> configs, instead
            of the spec's list, for every variant; ``cases``: op -> :class:`TuneCase`, whose
            ``prepare`` returns a non-empty tuple of :class:`Prepared`, else ``TypeError``).
        log: one progress line per key (default: stderr).

    Returns a :class:`TuneResult`; :data:`~sparse_kernels.tuning.lookup.CHOOSER` is reloaded, so
    this process looks the new entries up.
    """
    if not isinstance(shape, TuneShape):
        raise TypeError(f"shape: expected a TuneShape, got {type(shape).__name__}")
    lengths = _check_lengths(lengths)
    cases = CASES if cases is None else cases
    ops = _check_ops(ops, cases)
    if not isinstance(force, bool):
        raise TypeError(f"force: expected a bool, got {type(force).__name__}")
    device = torch.device("cuda" if device is None else device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("tuning needs a CUDA GPU; torch sees none")
        gpu = torch.cuda.get_device_name(device)
        capability = "{}.{}".format(*torch.cuda.get_device_capability(device))
    else:  # the interpreter (tests): timings there mean nothing for a GPU
        gpu = f"{device.type} (Triton interpreter)"
        capability = ""
    family = family_of(gpu)
    path = Path(out) if out is not None else user_table_path(family)
    old = ConfigTable.load(path) if path.is_file() else ConfigTable(family)
    if old.family != family:
        raise ValueError(
            f"{path}: expected a table for GPU family {family!r} (this GPU: {gpu}), got a table "
            f"for {old.family!r}"
        )
    timer = _default_timer if timer is None else timer
    skip_errors = _failures_to_skip()
    have = {e.key: e for e in old.entries}
    tuned: dict[tuple, TableEntry] = {}
    skipped: list[tuple] = []
    failures: list[Failure] = []
    # Triton launches on the current device, not on the tensors' device.
    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
        for op in ops:
            case = cases[op]
            spec = case.spec()
            for S in lengths:
                for prepared in _prepare(case, shape, S, device):
                    key = _key(prepared, shape)
                    if key in tuned or key in skipped:  # a bucket's shortest length decides for it
                        continue
                    if key in have and not force:
                        skipped.append(key)
                        log(f"tune {_label(key)} @{S}: in {path} already (--force tunes it again)")
                        continue
                    configs = (
                        list(candidates[op])
                        if candidates is not None and op in candidates
                        else spec.fitting(prepared.blocks)
                    )
                    times: dict[LaunchConfig, float] = {}
                    errors = []
                    for config in configs:
                        try:
                            times[config] = float(timer(functools.partial(prepared.run, config)))
                        except skip_errors as e:
                            msg = (str(e).strip().splitlines() or [type(e).__name__])[0]
                            failures.append(Failure(key, config, f"{type(e).__name__}: {msg}"))
                            errors.append(f"{config}: {type(e).__name__}")
                    if not times:
                        why = "; ".join(errors) or f"none fits the blocks {prepared.blocks}"
                        raise RuntimeError(f"tune {_label(key)} @{S}: no candidate ran ({why})")
                    others = [e for e in (*have.values(), *tuned.values()) if e.key != key]
                    chosen = pick(times, _neighbours(key, others))
                    entry = TableEntry(*key, config=chosen, seq_len=S, ms=times[chosen])
                    tuned[key] = entry
                    best = min(times.values())
                    note = (
                        ""
                        if times[chosen] == best
                        else f" (neighbour bucket's; best {best:.3f} ms)"
                    )
                    fail = f"; {len(errors)} failed: {', '.join(errors)}" if errors else ""
                    log(f"tune {_label(key)} @{S}: {chosen} {times[chosen]:.3f} ms{note}, "
                        f"{len(times)} timed{fail}")  # fmt: skip
                del prepared  # the next length's inputs are allocated without these
            if any(key[0] == op for key in tuned):  # saved per op: a killed run keeps these
                table = _merged(old, tuned, gpu, capability, command)
                table.save(path)
    table = _merged(old, tuned, gpu, capability, command)
    if not path.is_file():
        table.save(path)
    CHOOSER.reload()
    return TuneResult(path, table, tuple(tuned.values()), tuple(skipped), tuple(failures))


def _merged(old: ConfigTable, tuned: dict, gpu: str, capability: str, command: str) -> ConfigTable:
    return ConfigTable(
        family=old.family,
        gpu=gpu,
        capability=capability,
        versions=_versions(),
        date=datetime.date.today().isoformat(),
        command=_commands(old.command, command),
        entries=old.entries,
    ).merged(list(tuned.values()))


def _commands(old: str, new: str) -> str:
    """The commands that made a merged table, each once, joined by `` ; ``."""
    parts = [c for c in old.split(" ; ") if c] if old else []
    if new and new not in parts:
        parts.append(new)
    return " ; ".join(parts)


def _label(key: tuple) -> str:
    op, variant, D, dtype, group, bucket = key
    return f"{op}{'/' + variant if variant else ''} D={D} {dtype} group={group} bucket={bucket}"

"""Which launch config a kernel call uses: looked up, never timed at run time.

Order, for a 16-bit call on a GPU (fp32 and the interpreter have their own fixed configs):

1. the user's tuning cache (:func:`~sparse_kernels.tuning.table.user_table_path`), exact key;
2. the table shipped for the GPU family, exact key;
3. the nearest entry of either with the same op and head dim whose tiles fit the call: same
   variant first, then same dtype, then the closest length bucket, then the closest GQA group.
   A family with neither table uses the shipped tables of GPUs of its compute capability
   (same shared memory and instructions: their configs fit), with a one-line hint; so does a
   variant that the family's tables lack (say a triangle window class tuned on an H100 only);
4. the kernel's safe config (:meth:`KernelSpec.safe`), with a one-line hint.

A hint is logged once per process and (GPU family, op, head dim), and names the tuning command.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from types import MappingProxyType

import torch

from .._validate import interpreter_enabled
from .configs import KernelSpec, LaunchConfig
from .table import (
    ConfigTable,
    TableEntry,
    length_bucket,
    shipped_table_path,
    shipped_tables,
    user_table_path,
)

log = logging.getLogger("sparse_kernels.tuning")

TUNE_COMMAND = "python -m sparse_kernels tune"
_DTYPE_NAMES = MappingProxyType(
    {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}
)
_MAX_MEMO = 4096


def gpu_family(device: torch.device | int | None = None) -> str:
    """Short lower-case name of a CUDA device's model, the key of the tables: ``"h100"`` for
    "NVIDIA H100 80GB HBM3", ``"h200"`` for "NVIDIA H200"; an unrecognised name is kept whole,
    lower-cased, with runs of other characters as ``-``."""
    name = torch.cuda.get_device_name(device)
    return family_of(name)


def family_of(name: str) -> str:
    m = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Z]?)\b", name)
    if m:
        return m.group(1).lower()
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown"


@dataclass(frozen=True)
class Choice:
    """A looked-up config and where it came from: ``"user"``, ``"shipped"``, ``"borrowed"`` (the
    exact key in another family's table of the same capability), ``"nearest"``, ``"safe"``,
    ``"fp32"`` or ``"interpreter"``; ``entry`` is the table entry used, if any."""

    config: LaunchConfig
    source: str
    entry: TableEntry | None = None


class ConfigChooser:
    """Loads the tables lazily (one family at a time, on its first lookup) and remembers each
    answer, so a launch pays one dict lookup. :meth:`reload` forgets both (after a tuning run
    wrote the user cache)."""

    def __init__(self) -> None:
        self._tables: dict[str, tuple[TableEntry, ...]] = {}
        self._user: dict[str, dict[tuple, TableEntry]] = {}
        self._borrowed: dict[str, str] = {}  # family -> the families whose tables it uses
        self._memo: dict[tuple, Choice] = {}
        self._hinted: set[tuple] = set()

    def reload(self) -> None:
        self._tables.clear()
        self._user.clear()
        self._borrowed.clear()
        self._memo.clear()

    def _load(self, family: str, capability: str) -> None:
        user: tuple[TableEntry, ...] = ()
        path = user_table_path(family)
        if path.is_file():
            user = ConfigTable.load(path).entries
        shipped: tuple[TableEntry, ...] = ()
        path = shipped_table_path(family)
        if path.is_file():
            shipped = ConfigTable.load(path).entries
        elif not user and capability:
            same = [t for t in shipped_tables() if t.capability == capability]
            shipped = tuple(e for t in same for e in t.entries)
            if same:
                self._borrowed[family] = ", ".join(t.family for t in same)
        self._user[family] = {e.key: e for e in user}
        self._tables[family] = user + shipped

    def choose(
        self,
        spec: KernelSpec,
        *,
        device: torch.device,
        head_dim: int,
        dtype: torch.dtype,
        group: int,
        seq_len: int,
        variant: str = "",
        blocks: tuple[int, ...] = (),
    ) -> Choice:
        """The config for one call (see the module docstring)."""
        if interpreter_enabled() or device.type != "cuda":
            return Choice(spec.interpreter, "interpreter")
        if dtype == torch.float32 and spec.fp32 is not None:
            return Choice(spec.fp32, "fp32")
        memo_key = (spec.name, device.index, variant, head_dim, dtype, group,
                    length_bucket(seq_len), blocks)  # fmt: skip
        got = self._memo.get(memo_key)
        if got is None:
            got = self.lookup(
                spec, family=gpu_family(device), head_dim=head_dim, dtype=dtype, group=group,
                seq_len=seq_len, variant=variant, blocks=blocks,
                capability="{}.{}".format(*torch.cuda.get_device_capability(device)),
            )  # fmt: skip
            if len(self._memo) >= _MAX_MEMO:
                self._memo.clear()
            self._memo[memo_key] = got
        return got

    def lookup(
        self,
        spec: KernelSpec,
        *,
        family: str,
        head_dim: int,
        dtype: torch.dtype,
        group: int,
        seq_len: int,
        variant: str = "",
        blocks: tuple[int, ...] = (),
        capability: str = "",
    ) -> Choice:
        """Steps 1-4 of the module docstring for a GPU family (no memo, no device needed);
        ``capability``: its compute capability, ``"9.0"`` (empty: no other family's tables)."""
        if family not in self._tables:
            self._load(family, capability)
        dname = _DTYPE_NAMES[dtype]
        bucket = length_bucket(seq_len)
        key = (spec.name, variant, head_dim, dname, group, bucket)
        exact = self._user[family].get(key)
        if exact is not None and spec.fits(exact.config, blocks):
            return Choice(exact.config, "user", exact)
        usable = [
            e
            for e in self._tables[family]
            if e.op == spec.name and e.head_dim == head_dim and spec.fits(e.config, blocks)
        ]
        if usable and family in self._borrowed:
            self._hint(family, spec.name, head_dim,
                       f"using those of {self._borrowed[family]} (same compute capability)")  # fmt: skip
        for e in usable:
            if e.key == key:
                return Choice(e.config, "borrowed" if family in self._borrowed else "shipped", e)

        def nearness(e: TableEntry) -> tuple:
            return (e.variant != variant, e.dtype != dname, abs(e.bucket - bucket),
                    abs(e.group - group))  # fmt: skip

        if family not in self._borrowed and not any(e.variant == variant for e in usable):
            kin = self._kin_entries(family, capability, spec, head_dim, variant, blocks)
            if kin:
                names = ", ".join(sorted({t.family for t, _ in kin}))
                self._hint(family, spec.name, head_dim,
                           f"using the {variant!r} entries of {names} (same compute capability)")  # fmt: skip
                best = min((e for _, e in kin), key=nearness)
                return Choice(best.config, "borrowed", best)
        if usable:
            best = min(usable, key=nearness)
            return Choice(best.config, "nearest", best)
        self._hint(family, spec.name, head_dim, "using a safe one")
        return Choice(spec.safe(blocks), "safe")

    @staticmethod
    def _kin_entries(
        family: str,
        capability: str,
        spec: KernelSpec,
        head_dim: int,
        variant: str,
        blocks: tuple[int, ...],
    ) -> list[tuple[ConfigTable, TableEntry]]:
        """The fitting entries of ``spec``'s op, head dim and variant in the shipped tables of the
        other families of compute capability ``capability`` (none without one)."""
        if not capability:
            return []
        return [
            (t, e)
            for t in shipped_tables()
            if t.family != family and t.capability == capability
            for e in t.entries
            if e.op == spec.name and e.head_dim == head_dim and e.variant == variant
            and spec.fits(e.config, blocks)
        ]  # fmt: skip

    def _hint(self, family: str, op: str, head_dim: int, what: str) -> None:
        key = (family, op, head_dim)
        if key not in self._hinted:
            self._hinted.add(key)
            log.warning(
                "sparse_kernels: no tuned %s config for GPU family %r with head dim %d; %s. "
                "`%s` (or `vlm-accel tune`) tunes it for this GPU.",
                op, family, head_dim, what, TUNE_COMMAND,
            )  # fmt: skip


CHOOSER = ConfigChooser()


def choose_config(
    spec: KernelSpec,
    *,
    device: torch.device,
    head_dim: int,
    dtype: torch.dtype,
    group: int,
    seq_len: int,
    variant: str = "",
    blocks: tuple[int, ...] = (),
) -> LaunchConfig:
    """The launch config of one kernel call (see the module docstring)."""
    return CHOOSER.choose(
        spec, device=device, head_dim=head_dim, dtype=dtype, group=group, seq_len=seq_len,
        variant=variant, blocks=blocks,
    ).config  # fmt: skip

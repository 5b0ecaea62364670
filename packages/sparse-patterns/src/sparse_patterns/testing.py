"""Synthetic heads with planted structure (tests, benchmarks, docs)."""

from __future__ import annotations

import torch


def planted_grid_qkv(
    B: int,
    H: int,
    H_KV: int,
    S: int,
    D: int,
    *,
    stride: int,
    phase: int,
    vline: bool = True,
    slash: bool = True,
    strength: float = 8.0,
    noise: float = 0.3,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q/k/v whose attention concentrates on a grid of the given stride and phase.

    Vertical lines: keys ``j = phase (mod stride)`` carry a shared direction every query
    aligns with. Slash lines: query ``i`` and key ``j`` share a residue embedding of
    ``i mod stride`` (needs ``D >= stride + 1`` unless ``slash=False``). Scores are scaled so
    that after the default ``D ** -0.5`` scale the planted logit is ``strength``.
    """
    g = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(B, H, S, D, generator=g) * noise
    k = torch.randn(B, H_KV, S, D, generator=g) * noise
    v = torch.randn(B, H_KV, S, D, generator=g)
    amp = (strength * D**0.5) ** 0.5
    i = torch.arange(S)
    if vline:
        q[..., 0] += amp
        k[..., (i - phase) % stride == 0, 0] += amp
    if slash:
        if stride + 1 > D:
            raise ValueError(
                f"planted slash lines need D >= stride + 1, got D={D}, stride={stride}"
            )
        res = torch.nn.functional.one_hot(i % stride, D - 1).float() * amp
        q[..., 1:] += res
        k[..., 1:] += res
    return q.to(device, dtype), k.to(device, dtype), v.to(device, dtype)


def planted_vertical_slash_qkv(
    B: int,
    H: int,
    H_KV: int,
    S: int,
    D: int,
    *,
    columns: list[int],
    offsets: list[int],
    strength: float = 8.0,
    noise: float = 0.3,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q/k/v whose attention concentrates on key ``columns`` (vertical lines) and on the
    diagonals ``offsets`` (slash lines, via rotary-like position codes)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(B, H, S, D, generator=g) * noise
    k = torch.randn(B, H_KV, S, D, generator=g) * noise
    v = torch.randn(B, H_KV, S, D, generator=g)
    amp = (strength * D**0.5) ** 0.5
    q[..., 0] += amp
    k[..., columns, 0] += amp
    # Slash lines: rotary-like codes with random frequencies make q_i . k_j a function of
    # i - j that peaks (value ``half``) where i - j is a planted offset.
    half = (D - 2) // 2
    freqs = torch.rand(half, generator=g, dtype=torch.float64) * torch.pi
    pos = torch.arange(S, dtype=torch.float64)

    def code(x: torch.Tensor) -> torch.Tensor:
        a = x[:, None] * freqs[None, :]
        return torch.cat([torch.cos(a), torch.sin(a)], -1)

    c = (strength * D**0.5 / half) ** 0.5
    q[..., 1 : 1 + 2 * half] += (code(pos) * c).float()
    k[..., 1 : 1 + 2 * half] += (sum(code(pos + o) for o in offsets) * c).float()
    return q.to(device, dtype), k.to(device, dtype), v.to(device, dtype)


def planted_boundary_qkv(
    spans: list[tuple[int, int]],
    *,
    H: int = 2,
    D: int = 64,
    strength: float = 10.0,
    seed: int = 0,
):
    """A planted Q-boundary head: text (modality 0) queries attend a few text columns, other
    queries attend a few video columns. Returns ``q [1, H, S, D], k, v [1, 1, S, D], layout``."""
    from .layout import TokenLayout

    lay = TokenLayout.from_spans(spans, tokens_per_frame=32)
    S = lay.modality.numel()
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, H, S, D, generator=g) * 0.3
    k = torch.randn(1, 1, S, D, generator=g) * 0.3
    v = torch.randn(1, 1, S, D, generator=g)
    amp = (strength * D**0.5) ** 0.5
    text = lay.modality == 0
    q[..., text, 0] += amp
    q[..., ~text, 1] += amp
    tcols = torch.nonzero(text).flatten()[[2, 9, 20]]
    vcols = torch.nonzero(~text).flatten()[[5, 40, 77, 150]]
    k[..., tcols, 0] += amp
    k[..., vcols, 1] += amp
    return q, k, v, lay


# ---------------------------------------------------------------------------------------------
# Host-device synchronisations, observed on the CPU


class SyncRecorder:
    """Records the operations that make the host wait for a CUDA device, while running on CPU
    tensors (where nothing waits): ``with SyncRecorder() as rec: ...``, then ``rec.events``, a
    list of ``(what, where)`` with ``where`` the innermost ``file:line (function)`` of the
    ``sparse_patterns`` / ``sparse_kernels`` sources.

    Recorded: reading a value back (``.item()``, ``int()`` / ``float()`` / ``bool()`` /
    ``__index__`` of a tensor, a Python ``if`` on one: ``aten._local_scalar_dense``;
    ``.tolist()``, ``.cpu()``, ``.numpy()``), ops whose output size depends on the data
    (``nonzero``, ``unique``, ``masked_select``, ``repeat_interleave`` without ``output_size``,
    indexing with a bool tensor), copies to another device without ``non_blocking``, and
    host-to-device copies of Python data (``torch.tensor(..., device=...)``, a list inside an
    index), which CUDA runs as a copy followed by a stream synchronisation.
    """

    _VALUE = frozenset({"_local_scalar_dense", "nonzero", "masked_select"})
    _METHODS = frozenset({"tolist", "cpu", "numpy"})

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self._modes: list = []

    def __enter__(self) -> SyncRecorder:
        from torch.overrides import TorchFunctionMode
        from torch.utils._python_dispatch import TorchDispatchMode

        rec = self

        class _Functions(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                rec._function(func, args, kwargs or {})
                return func(*args, **(kwargs or {}))

        class _Dispatch(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                rec._dispatch(func, args, kwargs or {})
                return func(*args, **(kwargs or {}))

        self._modes = [_Functions(), _Dispatch()]
        for m in self._modes:
            m.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for m in reversed(self._modes):
            m.__exit__(*exc)

    def _add(self, what: str) -> None:
        import traceback

        where = "?"
        for fr in reversed(traceback.extract_stack()):
            f = fr.filename.replace("\\", "/")
            if ("/sparse_patterns/" in f or "/sparse_kernels/" in f) and not f.endswith(
                "sparse_patterns/testing.py"
            ):
                where = f"{f.rsplit('/src/', 1)[-1]}:{fr.lineno} ({fr.name})"
                break
        self.events.append((what, where))

    def _function(self, func, args, kwargs) -> None:
        name = getattr(func, "__name__", "")
        if name in self._METHODS:
            self._add(f"Tensor.{name}")
        elif name in ("tensor", "as_tensor") and kwargs.get("device") is not None:
            if not (args and isinstance(args[0], torch.Tensor)):
                self._add(f"torch.{name}(python data, device=...)")
        elif name in ("__getitem__", "__setitem__") and len(args) >= 2:
            index = args[1] if isinstance(args[1], tuple) else (args[1],)
            if any(isinstance(i, list) for i in index):
                self._add(f"Tensor.{name} with a list index")

    def _dispatch(self, func, args, kwargs) -> None:
        name = func.__name__.split(".")[0]
        if name in self._VALUE or name.startswith(("unique", "_unique")):
            self._add(f"aten.{func.__name__}")
        elif name == "repeat_interleave" and kwargs.get("output_size") is None:
            if func.__name__.split(".")[-1] in ("Tensor", "self_Tensor"):  # repeats: a tensor
                self._add(f"aten.{func.__name__} without output_size")
        elif name in ("index", "index_put", "index_put_") and len(args) >= 2:
            if any(i is not None and i.dtype == torch.bool for i in args[1]):
                self._add(f"aten.{func.__name__} with a bool index")
        elif name in ("_to_copy", "to", "copy_"):
            src = args[1] if name == "copy_" else args[0]
            dst = args[0].device if name == "copy_" else kwargs.get("device")
            moved = dst is not None and torch.device(dst) != src.device
            if moved and not kwargs.get("non_blocking", False):
                self._add(f"aten.{func.__name__} across devices, blocking")

"""Input validation shared by the public ops: errors name what was expected and what came."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence

import torch

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# Triton kernels pad the head dim to the next power of two (at least 16) and mask the loads.
TRITON_MAX_HEAD_DIM = 128
IMPLS = ("auto", "triton", "fa4", "reference")
FLOAT32_MAX = torch.finfo(torch.float32).max


def check_tensor(t: object, name: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    return t


def check_qkv(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[int, int, int, int, int, int]:
    """Validate ``[B, H, S, D]`` q/k/v; return ``(B, H, H_KV, S_Q, S_KV, D)``."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(t, name)
        if t.ndim != 4:
            raise ValueError(
                f"{name}: expected a 4-D tensor [B, H, S, D], got {t.ndim}-D with shape {tuple(t.shape)}"
            )
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{name}: expected dtype float16, bfloat16 or float32, got {t.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype, got q={q.dtype}, k={k.dtype}, v={v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(
            f"q, k, v must be on one device, got q={q.device}, k={k.device}, v={v.device}"
        )
    B, H, S_Q, D = q.shape
    if D == 0:
        raise ValueError(f"head dim D: expected at least 1, got D=0 (q shape {tuple(q.shape)})")
    if k.shape != v.shape:
        raise ValueError(
            f"k and v must have the same shape [B, H_KV, S_KV, D], got k={tuple(k.shape)}, v={tuple(v.shape)}"
        )
    Bk, H_KV, S_KV, Dk = k.shape
    if Bk != B:
        raise ValueError(f"batch mismatch: expected k/v batch {B} (from q), got {Bk}")
    if Dk != D:
        raise ValueError(f"head dim mismatch: expected k/v head dim {D} (from q), got {Dk}")
    if H_KV == 0 or H % H_KV != 0:
        raise ValueError(
            f"GQA needs H % H_KV == 0: got H={H} query heads and H_KV={H_KV} key/value heads"
        )
    if S_Q == 0 or S_KV == 0 or B == 0 or H == 0:
        raise ValueError(f"expected non-empty tensors, got q={tuple(q.shape)}, k={tuple(k.shape)}")
    return B, H, H_KV, S_Q, S_KV, D


def check_bool(value: object, name: str, op: str) -> bool:
    """A flag must be a real ``bool``: a string such as ``"False"`` or ``None`` would otherwise be
    taken for its truth value and change the result without a word."""
    if not isinstance(value, bool):
        raise TypeError(f"{op}: {name}: expected a bool, got {type(value).__name__} {value!r:.60}")
    return value


def check_scale(scale: float | None, D: int) -> float:
    if scale is None:
        return D**-0.5
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale: expected a float or None, got {type(scale).__name__}")
    # The kernels take the scale as a float32 argument: a larger one is not representable.
    if not (math.isfinite(scale) and 0 < scale <= FLOAT32_MAX):
        raise ValueError(
            f"scale: expected a finite positive float at most {FLOAT32_MAX:.4g} (float32), got {scale}"
        )
    return float(scale)


def interpreter_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def resolve_impl(
    impl: str,
    device: torch.device,
    op: str,
    *,
    fa4: Callable[[], tuple[type[Exception], str] | None] | None = None,
    like: torch.Tensor | None = None,
    variant: tuple[int, int] | str | None = None,
) -> str:
    """The engine that runs ``op``: ``"reference"``, ``"triton"`` or ``"fa4"``.

    ``fa4`` is given by the ops FlashAttention-4 can run: it says why FA4 cannot run this input
    (``(exception type, reason)``) or ``None``; ``like`` is the op's ``q`` (its GPU, dtype and
    head dim key the auto table) and ``variant`` its variant there (the block size of the ops
    that take block lists, the triangle's window class, ``None`` for the others). ``"fa4"`` raises that reason (or, for an op without ``fa4``, that
    FA4 has no kernel for it). ``"auto"`` is the reference off CUDA; on CUDA it is FA4 where
    :data:`sparse_kernels.fa4.AUTO_FA4` lists the op for ``like`` and ``variant`` and FA4 can run
    the input, else triton.
    """
    if impl not in IMPLS:
        raise ValueError(f"{op}: impl must be one of {IMPLS}, got {impl!r}")
    if impl == "fa4":
        if fa4 is None:
            raise NotImplementedError(
                f"{op}: impl='fa4': FlashAttention-4 has no kernel for this op; impl='triton' "
                f"or 'auto' runs ours"
            )
        why = fa4()
        if why is not None:
            exc, reason = why
            raise exc(f"{op}: impl='fa4' {reason}")
        return "fa4"
    if impl == "auto":
        if device.type != "cuda":
            return "reference"
        if (
            fa4 is not None
            and like is not None
            and _auto_prefers_fa4(op, like, variant)
            and fa4() is None
        ):
            return "fa4"
        return "triton"
    if impl == "triton" and not (
        device.type == "cuda" or (device.type == "cpu" and interpreter_enabled())
    ):
        raise ValueError(
            f"{op}: impl='triton' needs CUDA tensors (or CPU tensors with TRITON_INTERPRET=1 set "
            f"before import, for the interpreter), got tensors on {device}"
        )
    return impl


def _auto_prefers_fa4(op: str, like: torch.Tensor, variant: tuple[int, int] | str | None) -> bool:
    from .fa4 import auto_prefers

    return auto_prefers(op, like, variant)


def check_triton_head_dim(D: int, op: str) -> None:
    if not 1 <= D <= TRITON_MAX_HEAD_DIM:
        raise NotImplementedError(
            f"{op}: the Triton kernel supports head dims 1..{TRITON_MAX_HEAD_DIM}, got {D} "
            f"(impl='reference' takes any head dim)"
        )


# The shared key loop (``_triton.inner._attn_tile_inner``) of the dense and triangle kernels
# addresses a key row as ``int32 column x int32 stride`` inside one (batch, KV head) slice.
INT32_OFFSET_LIMIT = 2**31


def check_int32_key_offsets(k: torch.Tensor, v: torch.Tensor, op: str) -> None:
    """Raise if an element offset inside one (batch, KV head) slice of ``k`` or ``v`` reaches
    2**31, which those kernels would wrap around. Contiguous ``[B, H_KV, S, D]`` tensors stay
    below it up to 16M tokens at D=128; a strided view of a ``[B, S, H_KV, D]`` tensor (HF's
    ``transpose(1, 2)``) reaches it at ``S * H_KV * D >= 2**31``, e.g. 32 KV heads at 512K."""
    for name, t in (("k", k), ("v", v)):
        S, D = t.shape[2], t.shape[3]
        top = (S - 1) * abs(t.stride(2)) + (D - 1) * abs(t.stride(3))
        if top >= INT32_OFFSET_LIMIT:
            raise ValueError(
                f"{op}: {name} offsets within one (batch, KV head) must stay below 2**31 "
                f"elements, got {top} (shape {tuple(t.shape)}, strides {tuple(t.stride())}); "
                f"pass {name}.contiguous() ([B, H_KV, S, D] order) or use impl='reference'"
            )


def _dim_text(label: str, allowed: int | tuple[int, ...] | None) -> str:
    if allowed is None:
        return label
    if isinstance(allowed, int):
        return f"{label}={allowed}"
    return f"{label} in {{{', '.join(str(a) for a in allowed)}}}"


def check_index_tensor(
    t: object,
    name: str,
    *,
    op: str,
    dims: Sequence[tuple[str, int | tuple[int, ...] | None]],
    device: torch.device,
    dtypes: tuple[torch.dtype, ...] = (torch.int32,),
) -> torch.Tensor:
    """Check an integer tensor argument (block lists, indices) before any launch: a tensor of
    one of ``dtypes`` on ``device`` with one size per ``dims`` entry ``(label, allowed)``, where
    ``allowed`` is ``None`` (any size), an int (exactly) or a tuple of sizes (e.g. ``(1, B)`` for
    a broadcast batch). Layout is left to the launcher (strides passed through, or a copy)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        want = " or ".join(str(d) for d in dtypes)
        raise TypeError(f"{op}: {name}: expected dtype {want}, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{op}: {name}: expected device {device} (q's), got {t.device}")
    ok = t.ndim == len(dims) and all(
        a is None or (n == a if isinstance(a, int) else n in a) for n, (_, a) in zip(t.shape, dims)
    )
    if not ok:
        want = ", ".join(_dim_text(label, a) for label, a in dims)
        raise ValueError(f"{op}: {name}: expected shape [{want}], got {tuple(t.shape)}")
    return t


def check_index_range(
    t: torch.Tensor,
    name: str,
    lo: int,
    hi: int,
    *,
    op: str,
    listed: torch.Tensor | None = None,
    what: str = "entries",
) -> None:
    """Raise ``ValueError`` unless every entry of ``t`` (where ``listed``, if given) lies in
    ``[lo, hi)``. The bounds are reduced on the tensor's device and read back once (one host
    synchronisation): callers that skip it on request say so in their docstring."""
    if t.numel() == 0:
        return
    if listed is None:
        ends = torch.stack([t.min(), t.max()])
    else:  # unlisted entries become the dtype's extremes, which move neither end
        info = torch.iinfo(t.dtype)
        ends = torch.stack(
            [torch.where(listed, t, info.max).min(), torch.where(listed, t, info.min).max()]
        )
    got_lo, got_hi = (int(a) for a in ends.tolist())
    if got_lo <= got_hi and (got_lo < lo or got_hi >= hi):  # got_lo > got_hi: none listed
        raise ValueError(
            f"{op}: {name}: {what} must lie in [{lo}, {hi}), got values in [{got_lo}, {got_hi}]"
        )

"""Public fused per-token ops: validation, then the Triton kernel or the PyTorch reference."""

from __future__ import annotations

import torch

from .._validate import SUPPORTED_DTYPES, check_tensor, resolve_impl
from .reference import rms_norm_reference, rotary_reference, silu_mul_reference

# One program normalises one row in registers; wider rows would spill.
MAX_RMS_NORM_WIDTH = 65536


def _check_float(t: torch.Tensor, name: str) -> None:
    if t.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{name}: expected dtype float16, bfloat16 or float32, got {t.dtype}")


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, *, eps: float = 1e-6, impl: str = "auto"
) -> torch.Tensor:
    """RMSNorm over the last dim, as HF's Llama/Qwen2 ``RMSNorm`` modules compute it.

    Args:
        x: ``[..., N]``; weight: ``[N]``; eps: added to the mean square.
        impl: ``"triton"``, ``"reference"`` or ``"auto"`` (triton on CUDA, reference elsewhere).

    Returns:
        ``weight * (x * rsqrt(mean(x^2) + eps))`` with the normalised row rounded to ``x.dtype``
        before the weight; dtype ``promote_types(weight.dtype, x.dtype)``, shape of ``x``.
    """
    check_tensor(x, "x")
    check_tensor(weight, "weight")
    _check_float(x, "x")
    _check_float(weight, "weight")
    if x.ndim < 1 or weight.ndim != 1 or weight.shape[0] != x.shape[-1]:
        raise ValueError(
            f"weight: expected shape ({x.shape[-1] if x.ndim else '?'},) to match x's last dim, "
            f"got weight {tuple(weight.shape)} for x {tuple(x.shape)}"
        )
    if weight.device != x.device:
        raise ValueError(f"weight: expected device {x.device} (from x), got {weight.device}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 <= eps < float("inf"):
        raise ValueError(f"eps: expected a finite float >= 0, got {eps!r}")
    if x.shape[-1] == 0:
        raise ValueError(
            f"x: expected a non-empty last dim to normalise, got shape {tuple(x.shape)}"
        )
    which = resolve_impl(impl, x.device, "rms_norm")
    if which == "reference":
        return rms_norm_reference(x, weight, float(eps))
    if x.shape[-1] > MAX_RMS_NORM_WIDTH:
        raise NotImplementedError(
            f"rms_norm: the Triton kernel supports rows up to {MAX_RMS_NORM_WIDTH} wide, got "
            f"{x.shape[-1]} (impl='reference' takes any width)"
        )
    from .triton import _launch_rms_norm

    out_dtype = torch.promote_types(weight.dtype, x.dtype)
    return _launch_rms_norm(x, weight.contiguous(), float(eps), out_dtype)


def silu_mul(gate: torch.Tensor, up: torch.Tensor, *, impl: str = "auto") -> torch.Tensor:
    """``silu(gate) * up`` elementwise, the middle of a SiLU-gated MLP, in one pass.

    Args:
        gate, up: tensors of one shape, dtype (fp16/bf16/fp32) and device.
        impl: ``"triton"``, ``"reference"`` or ``"auto"`` (triton on CUDA, reference elsewhere).

    Returns:
        A contiguous tensor of the inputs' shape and dtype, agreeing with the eager
        ``act_fn(gate) * up`` to rounding (the kernel asks for its rounding of the silu before
        the product; the compiler may keep float32 there).
    """
    check_tensor(gate, "gate")
    check_tensor(up, "up")
    _check_float(gate, "gate")
    if up.shape != gate.shape:
        raise ValueError(
            f"up: expected shape {tuple(gate.shape)} (from gate), got {tuple(up.shape)}"
        )
    if up.dtype != gate.dtype:
        raise TypeError(f"up: expected dtype {gate.dtype} (from gate), got {up.dtype}")
    if up.device != gate.device:
        raise ValueError(f"up: expected device {gate.device} (from gate), got {up.device}")
    which = resolve_impl(impl, gate.device, "silu_mul")
    if which == "reference":
        return silu_mul_reference(gate, up)
    from .triton import _launch_silu_mul

    return _launch_silu_mul(gate, up)


def rotary(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, impl: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary position embedding of queries and keys, ``x * cos + rotate_half(x) * sin`` (HF's
    ``apply_rotary_pos_emb`` with ``unsqueeze_dim=1``; M-RoPE too, whose sections HF merges into
    ``cos``/``sin`` before this step), one pass per tensor.

    Args:
        q: ``[B, H, S, D]``; k: ``[B, H_KV, S, D]`` (any strides, one dtype); D even.
        cos, sin: ``[B, S, D]`` or ``[1, S, D]`` (shared by the batch, as HF builds them when no
            position ids are given), one dtype. impl: ``"triton"``, ``"reference"`` or ``"auto"``.

    Returns:
        ``(q_embed, k_embed)`` of dtype ``promote_types(q.dtype, cos.dtype)``, in the inputs'
        memory order. The kernel asks for the eager roundings (each product, then the sum, to
        that dtype); the GPU compiler may keep float32 between them, so results agree with the
        eager form to one unit in the last place, not bit for bit.
    """
    for name, t in (("q", q), ("k", k), ("cos", cos), ("sin", sin)):
        check_tensor(t, name)
        _check_float(t, name)
    if q.ndim != 4 or k.ndim != 4:
        raise ValueError(
            f"q, k: expected 4-D [B, H, S, D], got q {tuple(q.shape)} and k {tuple(k.shape)}"
        )
    B, _, S, D = q.shape
    if k.shape[0] != B or k.shape[2:] != q.shape[2:]:
        raise ValueError(f"k: expected shape [{B}, H_KV, {S}, {D}] (from q), got {tuple(k.shape)}")
    if D % 2:
        raise ValueError(f"q: expected an even head dim (two rotated halves), got {D}")
    for name, t in (("cos", cos), ("sin", sin)):
        if t.ndim != 3 or t.shape[0] not in (1, B) or tuple(t.shape[1:]) != (S, D):
            raise ValueError(
                f"{name}: expected shape ({B}, {S}, {D}) or (1, {S}, {D}), got {tuple(t.shape)}"
            )
    if k.dtype != q.dtype or sin.dtype != cos.dtype:
        raise TypeError(f"expected k.dtype == q.dtype and sin.dtype == cos.dtype, got q {q.dtype}, "
                        f"k {k.dtype}, cos {cos.dtype}, sin {sin.dtype}")  # fmt: skip
    for name, t in (("k", k), ("cos", cos), ("sin", sin)):
        if t.device != q.device:
            raise ValueError(f"{name}: expected device {q.device} (from q), got {t.device}")
    which = resolve_impl(impl, q.device, "rotary")
    if which == "reference":
        return rotary_reference(q, k, cos, sin)
    from .triton import _launch_rotary

    out = torch.promote_types(q.dtype, cos.dtype)
    cos, sin = cos.expand(B, S, D), sin.expand(B, S, D)  # a shared table: batch stride 0
    return _launch_rotary(q, cos, sin, out), _launch_rotary(k, cos, sin, out)

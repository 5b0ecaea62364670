"""HF transformers models with the fused per-token ops (``sparse_kernels.fused``).

``fuse_per_token_ops(model)`` swaps, in every decoder layer of a Llama/Qwen2-style language model
(Qwen2.5-VL, Qwen2-VL, LLaVA-OneVision's Qwen2 included), the RMSNorms, the MLP's SiLU gate and
the rotary step for the fused kernels, and returns a handle (:class:`ForwardPatches`) whose
``remove()`` undoes it. It
imports nothing from transformers: it recognises the modules by what they hold.
"""

from __future__ import annotations

import inspect
import sys

import torch

from ..fused import rms_norm, rotary, silu_mul

_NORMS = ("input_layernorm", "post_attention_layernorm")


class ForwardPatches:
    """Replaced ``forward`` methods of modules, undone together by :meth:`remove` (once; later
    calls do nothing). Undoing puts back an instance's own ``forward`` attribute, or deletes the
    patch so that the class's method shows through again: no bound method is left behind."""

    def __init__(self):
        self._saved: list = []
        self._undo_more: list = []  # further undo callables, run after the forwards

    def set(self, mod, fn) -> None:
        """``mod.forward = fn``, remembering what to put back."""
        self._saved.append((mod, mod.__dict__.get("forward")))
        mod.forward = fn

    def also_undo(self, undo) -> None:
        """Run ``undo()`` on :meth:`remove`, after the forwards are back."""
        self._undo_more.append(undo)

    def remove(self) -> None:
        saved, self._saved = self._saved, []
        for mod, own in reversed(saved):
            if own is None:
                del mod.forward
            else:
                mod.forward = own
        more, self._undo_more = self._undo_more, []
        for undo in more:
            undo()

    def __enter__(self) -> ForwardPatches:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


def _language_model(model):
    inner = getattr(model, "model", model)
    return getattr(inner, "language_model", inner)


def _is_rms_norm(mod) -> bool:
    return type(mod).__name__.endswith("RMSNorm") and hasattr(mod, "variance_epsilon")


def _is_silu_mlp(mod) -> bool:
    act = getattr(mod, "act_fn", None)
    silu = isinstance(act, torch.nn.SiLU) or type(act).__name__ == "SiLUActivation"
    return silu and all(hasattr(mod, n) for n in ("gate_proj", "up_proj", "down_proj"))


def _check(layers, norms, mlps) -> list[str]:
    """The modeling modules whose ``apply_rotary_pos_emb`` is swapped; raises ValueError,
    naming the part, for anything this does not know how to fuse."""
    if not layers:
        raise ValueError("expected a model with decoder layers (model.layers, "
                         "model.model.layers or model.model.language_model.layers), found none")  # fmt: skip
    for name, mod in norms:
        if not _is_rms_norm(mod):
            raise ValueError(f"expected an RMSNorm (weight, variance_epsilon) at {name}, got "
                             f"{type(mod).__name__}")  # fmt: skip
    for name, mod in mlps:
        if not _is_silu_mlp(mod):
            act = type(getattr(mod, "act_fn", None)).__name__
            raise ValueError(f"expected a SiLU-gated MLP (gate/up/down_proj) at {name}, got "
                             f"{type(mod).__name__} with act_fn {act}")  # fmt: skip
    ropes = sorted({type(layer.self_attn).__module__ for layer in layers})
    for name in ropes:
        if not callable(getattr(sys.modules.get(name), "apply_rotary_pos_emb", None)):
            raise ValueError(f"expected {name} to define apply_rotary_pos_emb (HF's rotary "
                             "step), found none")  # fmt: skip
    for cls in {type(layer.self_attn) for layer in layers}:
        try:
            calls = "apply_rotary_pos_emb(" in inspect.getsource(cls.forward)
        except (OSError, TypeError):
            calls = False
        if not calls:  # swapping the module function would change nothing: say so
            raise ValueError(f"expected {cls.__name__}.forward to call its module's "
                             "apply_rotary_pos_emb, found no such call")  # fmt: skip
    return ropes


def fuse_per_token_ops(model, *, impl: str = "auto") -> ForwardPatches:
    """Run every decoder layer's RMSNorms (and the final norm), the SiLU gate of its MLP and the
    rotary embedding of its queries and keys through ``sparse_kernels.fused`` (one Triton pass
    each on CUDA; the PyTorch reference elsewhere).

    Same arithmetic as HF's eager code; the norm's sum runs in another order and the compiled
    kernels may skip an intermediate rounding, so outputs agree to rounding, not bit for bit
    (the reference is bit-equal). The rotary step is the module-level ``apply_rotary_pos_emb``
    of each attention class's modeling module, swapped until ``remove()``.

    Raises ValueError, patching nothing, on a model whose norms are not Llama/Qwen2-style
    RMSNorms, whose MLPs are not SiLU-gated, or whose attention does not call its module's
    ``apply_rotary_pos_emb``. ``impl`` is passed to the ops (``"triton"`` runs the kernels under
    ``TRITON_INTERPRET=1`` on the CPU).
    """
    lm = _language_model(model)
    layers = list(getattr(lm, "layers", []))
    norms = [(f"layers.{i}.{n}", getattr(layer, n)) for i, layer in enumerate(layers)
             for n in _NORMS]  # fmt: skip
    if getattr(lm, "norm", None) is not None:
        norms.append(("norm", lm.norm))
    mlps = [(f"layers.{i}.mlp", layer.mlp) for i, layer in enumerate(layers)]
    ropes = _check(layers, norms, mlps)

    def rope(q, k, cos, sin, unsqueeze_dim=1):
        if unsqueeze_dim != 1:
            raise ValueError(f"fused rotary: expected unsqueeze_dim=1 ([B, H, S, D] q/k), got "
                             f"{unsqueeze_dim}")  # fmt: skip
        return rotary(q, k, cos, sin, impl=impl)

    patches = ForwardPatches()
    for _, mod in norms:
        patches.set(mod, lambda x, _m=mod: rms_norm(x, _m.weight, eps=_m.variance_epsilon,
                                                    impl=impl))  # fmt: skip
    for _, mod in mlps:
        patches.set(mod, lambda x, _m=mod: _m.down_proj(
            silu_mul(_m.gate_proj(x), _m.up_proj(x), impl=impl)))  # fmt: skip
    for name in ropes:
        module = sys.modules[name]
        fn = module.apply_rotary_pos_emb
        patches.also_undo(lambda _m=module, _f=fn: setattr(_m, "apply_rotary_pos_emb", _f))
        module.apply_rotary_pos_emb = rope
    return patches

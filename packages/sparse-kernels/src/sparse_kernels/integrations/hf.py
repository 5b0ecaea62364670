"""HF transformers models: the attention seam and the fused per-token ops.

* ``swap_attention(model, fn, name=...)`` runs every decoder attention module of ``model``
  through ``fn`` (an ``AttentionInterface`` function, registered with transformers under
  ``name``) and returns an :class:`AttentionSwap` whose ``remove()`` puts back exactly what was
  there. The integrations of sparse-patterns, triangle-mix and seqpar-approx all swap through it.
* ``dense_attention(impl=...)`` is such a function: dense causal attention through one of our
  engines (``"fa4"``: FlashAttention-4), for ``swap_attention(model, dense_attention(), ...)``.
* ``fuse_per_token_ops(model)`` swaps, in every decoder layer of a Llama/Qwen2-style language
  model (Qwen2.5-VL, Qwen2-VL, LLaVA-OneVision's Qwen2 included), the RMSNorms, the MLP's SiLU
  gate and the rotary step for the fused kernels, and returns a handle
  (:class:`ForwardPatches`) whose ``remove()`` undoes it. It imports nothing from transformers:
  it recognises the modules by what they hold.

transformers is imported lazily, by :func:`swap_attention` only.
"""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Callable

import torch

from ..attention import attention
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


# ---- the attention seam -------------------------------------------------------------------------

# Where a swapped attention module keeps its AttentionSwap (the module's own __dict__).
_SWAP_ATTR = "_attention_swap"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _transformers():
    try:
        import transformers
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    except ImportError as e:  # pragma: no cover - exercised only without transformers
        raise ImportError(
            "swap_attention needs transformers: pip install transformers (or the 'hf' extra "
            "of sparse-patterns, triangle-mix or seqpar-approx)"
        ) from e
    return transformers, ALL_ATTENTION_FUNCTIONS, ALL_MASK_ATTENTION_FUNCTIONS


def _swapped_attention(module, *args, **kwargs):
    """What transformers calls under every :func:`swap_attention` name: the function of the swap
    active on ``module``. Names are registered once and shared; the function lives on each
    module, so two models (or two swaps nested on one model) never see each other's."""
    swap = module.__dict__.get(_SWAP_ATTR)
    if swap is None:
        impl = getattr(getattr(module, "config", None), "_attn_implementation", None)
        raise RuntimeError(
            f"{type(module).__name__} (layer {getattr(module, 'layer_idx', None)}): "
            f"attn_implementation {impl!r} is a swap_attention name, but no swap is active on "
            "this module (set it through swap_attention, not by hand)"
        )
    return swap.fn(module, *args, **kwargs)


def attention_modules(model) -> list:
    """The decoder attention modules of a HF model: those with an int ``layer_idx`` and a
    ``config`` naming their attention implementation. Vision towers' attention modules have no
    ``layer_idx`` and are not among them."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    return [
        m for m in model.modules()
        if isinstance(getattr(m, "layer_idx", None), int)
        and hasattr(getattr(m, "config", None), "_attn_implementation")
    ]  # fmt: skip


def _config_tree(configs) -> list:
    """``configs`` and their sub-configs, parents first, each once: setting a config's
    ``_attn_implementation`` also sets its sub-configs', so all of them are saved."""
    out, seen, todo = [], set(), list(configs)
    while todo:
        c = todo.pop(0)
        if id(c) in seen:
            continue
        seen.add(id(c))
        out.append(c)
        for key in getattr(c, "sub_configs", None) or {}:
            sub = getattr(c, key, None)
            if sub is not None:
                todo.append(sub)
    return out


class AttentionSwap:
    """Undo handle of :func:`swap_attention` (also a context manager).

    ``remove()`` puts back each attention module's previous swap (or none) and each config's
    previous ``_attn_implementation``; later calls do nothing. Swaps nested on one model are
    undone in reverse order; removing one while a later swap is still active on its modules
    raises RuntimeError.
    """

    def __init__(self, name: str, fn: Callable, modules: list):
        self.name, self.fn = name, fn
        configs = list({id(m.config): m.config for m in modules}.values())
        self._modules: list | None = [(m, m.__dict__.get(_SWAP_ATTR)) for m in modules]
        self._configs = [(c, c._attn_implementation) for c in _config_tree(configs)]
        for m in modules:
            m.__dict__[_SWAP_ATTR] = self
        for c in configs:
            c._attn_implementation = name

    @property
    def active(self) -> bool:
        return self._modules is not None

    def remove(self) -> None:
        if self._modules is None:
            return
        later = [m for m, _ in self._modules if m.__dict__.get(_SWAP_ATTR) is not self]
        if later:
            raise RuntimeError(
                f"swap {self.name!r}: expected to be the latest swap on its modules, but "
                f"{len(later)} of them hold another one: remove the later swap first"
            )
        for m, before in self._modules:
            if before is None:
                del m.__dict__[_SWAP_ATTR]
            else:
                m.__dict__[_SWAP_ATTR] = before
        for c, before in self._configs:  # parents first: a parent's set reaches its children
            c._attn_implementation = before
        self._modules = None

    def __enter__(self) -> AttentionSwap:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

    def __repr__(self) -> str:
        n = "removed" if self._modules is None else f"{len(self._modules)} modules"
        return f"AttentionSwap(name={self.name!r}, {n})"


def swap_attention(
    model, fn: Callable, *, name: str, mask: str | Callable | None = None
) -> AttentionSwap:
    """Run every decoder attention module of ``model`` (:func:`attention_modules`) through
    ``fn`` until the returned handle's ``remove()``.

    ``fn(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs)`` is an
    ``AttentionInterface`` function returning ``(out [B, S, H, D], weights or None)``. ``name``
    is what ``config._attn_implementation`` reads while the swap is active; it is registered
    with ``transformers.AttentionInterface`` (and reused by later swaps of the same name).
    ``mask``: the mask builder transformers runs for ``name``: None (it builds no mask: ``fn``
    gets ``attention_mask=None`` and applies causality itself), the name of a registered mask
    function (``"sdpa"``: the mask SDPA gets) or a mask function; a name keeps one mask builder.

    Raises, before changing anything: TypeError for a ``fn`` that is not callable or a model
    that is not a ``torch.nn.Module``; ValueError for a name that transformers already uses
    for another function (``"sdpa"``, ``"eager"``, ...) or with another mask, and for a model
    without attention modules.
    """
    tf, functions, masks = _transformers()
    if not callable(fn):
        raise TypeError(f"fn: expected an attention function, got {type(fn).__name__}")
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name == "eager":
        raise ValueError(
            f"name: expected an identifier other than 'eager' (letters, digits, _), got {name!r}"
        )
    if functions.get(name, _swapped_attention) is not _swapped_attention:
        raise ValueError(
            f"name: expected a name free for swap_attention, got {name!r}, which transformers' "
            "AttentionInterface already maps to another function"
        )
    if isinstance(mask, str):
        if mask not in masks:
            raise ValueError(
                f"mask: expected a registered mask function name ({sorted(masks)}), got {mask!r}"
            )
        mask = masks[mask]
    elif mask is not None and not callable(mask):
        raise TypeError(
            f"mask: expected None, a name or a mask function, got {type(mask).__name__}"
        )
    # A name swapped before keeps the mask builder of its first swap (None included).
    if masks.get(name) is not mask and (name in masks or name in functions):
        raise ValueError(
            f"mask: expected the mask that {name!r} was first swapped with "
            f"({masks.get(name)!r}), got {mask!r}"
        )
    mods = attention_modules(model)
    if not mods:
        raise ValueError(
            f"model: expected attention modules (an int layer_idx and a config with "
            f"_attn_implementation, as in HF's Llama/Qwen2 families), found none in "
            f"{type(model).__name__}"
        )
    tf.AttentionInterface.register(name, _swapped_attention)
    if mask is not None:
        masks.register(name, mask)
    return AttentionSwap(name, fn, mods)


def dense_attention(*, impl: str = "auto") -> Callable:
    """An ``AttentionInterface`` function for :func:`swap_attention` (with ``mask=None``): dense
    causal attention by :func:`sparse_kernels.attention` with engine ``impl`` (``"fa4"``,
    ``"triton"``, ``"auto"``, ``"reference"``), causality bottom-right aligned as a chunked
    prefill or a decode step needs it. For one prompt at a time: with ``mask=None`` transformers
    builds no padding mask, so a batch (which may be padded) is refused, as are what the
    function would otherwise ignore: dropout, a non-causal module, sliding windows, soft-capping
    and attention sinks (``NotImplementedError``, naming which). Not for a static cache, whose
    keys are padded to its length. ``impl`` itself is checked on the first call, by the op."""

    def fn(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        refused = [
            f"{name}={kwargs[name]!r}"
            for name in ("sliding_window", "softcap", "s_aux")
            if kwargs.get(name) is not None
        ]
        if query.shape[0] != 1:
            refused.append(f"a batch of {query.shape[0]} prompts (run them one at a time)")
        if attention_mask is not None:
            refused.append("an attention mask (swap with mask=None)")
        if dropout:
            refused.append(f"dropout={dropout}")
        if getattr(module, "is_causal", True) is False:
            refused.append("a non-causal attention module")
        if refused:
            raise NotImplementedError(
                "dense_attention: expected one prompt's causal attention, got " + ", ".join(refused)
            )
        scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
        out = attention(query, key, value, causal=True, scale=scale, impl=impl).out
        return out.transpose(1, 2).contiguous(), None

    return fn

"""TriangleMix for HuggingFace transformers models (Llama and Qwen2 families first).

:func:`apply_triangle_mix` registers an attention function through transformers'
``AttentionInterface`` under the name ``"triangle_mix"`` and switches the model to it; the
function reads ``module.layer_idx`` and runs that layer's kind from the :class:`LayerPolicy`:

- ``dense`` layers call transformers' own SDPA attention with the same arguments, so an
  all-dense policy reproduces the unpatched (``sdpa``) model bit for bit;
- ``triangle`` / ``streaming`` layers call :func:`sparse_kernels.triangle_attention`;
- ``dynamic`` layers call the :class:`~triangle_mix.policy.DynamicAttention` given to apply;
- decoding steps (one query row against the cache) are dense in every layer: TriangleMix
  changes the prefill only.

Unsupported, with a ``NotImplementedError`` naming it: padding masks (batched prompts of
different lengths) in non-dense layers, and chunked prefill (several query rows against a
longer cache) in non-dense layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from sparse_kernels import attention, triangle_attention

from ..policy import DynamicAttention, LayerPolicy

ATTN_NAME = "triangle_mix"
_STATE_ATTR = "_triangle_mix_state"


@dataclass
class _State:
    policy: LayerPolicy
    dynamic: DynamicAttention | None


def _transformers():
    try:
        import transformers
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    except ImportError as e:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "triangle_mix.integrations.hf needs transformers: pip install 'triangle-mix[hf]'"
        ) from e
    return transformers, sdpa_attention_forward, ALL_MASK_ATTENTION_FUNCTIONS


def _attention_fn(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    _, sdpa_forward, _ = _transformers()
    st: _State | None = getattr(module, _STATE_ATTR, None)
    if st is None:
        raise RuntimeError(
            f"attn_implementation={ATTN_NAME!r} needs triangle_mix.integrations.hf.apply_triangle_mix(model, policy)"
        )
    layer = int(module.layer_idx)
    pol = st.policy
    if layer >= pol.num_layers:
        raise ValueError(f"LayerPolicy has {pol.num_layers} layers, the model called layer {layer}")
    kind = pol.kinds[layer]
    S_Q, S_KV = query.shape[2], key.shape[2]
    scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
    decoding = S_Q == 1 and S_KV > 1
    last_row = pol.last_row_only and layer == pol.num_layers - 1 and S_Q > 1
    if (kind == "dense" and not last_row) or decoding:
        return sdpa_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    if attention_mask is not None:
        raise NotImplementedError(
            f"triangle-mix layer {layer} ({kind}): padding masks (batched prompts of different lengths) are not supported"
        )
    if S_Q != S_KV:
        raise NotImplementedError(
            f"triangle-mix layer {layer} ({kind}): chunked prefill (S_Q={S_Q} rows against S_KV={S_KV} cached keys)"
        )
    if last_row:
        # Only the next token is wanted: the last query row against all keys (§2.4).
        out = torch.zeros_like(query)
        out[:, :, -1:] = attention(query[:, :, -1:], key, value, causal=True, scale=scale).out
    elif kind == "dense":
        out = attention(query, key, value, causal=True, scale=scale).out
    elif kind == "triangle":
        out = triangle_attention(
            query, key, value, sink=pol.sink, window=pol.window, last=pol.last, scale=scale
        ).out
    elif kind == "streaming":
        out = triangle_attention(
            query, key, value, sink=pol.sink, window=pol.window, last=0, scale=scale
        ).out
    else:  # dynamic
        out = st.dynamic(query, key, value, layer_idx=layer, scale=scale)
    return out.transpose(1, 2).contiguous(), None


def register() -> str:
    """Register the attention function (and SDPA's mask builder) with transformers."""
    tf, _, masks = _transformers()
    tf.AttentionInterface.register(ATTN_NAME, _attention_fn)
    masks.register(ATTN_NAME, masks["sdpa"])
    return ATTN_NAME


def _attention_modules(model):
    return [
        m for m in model.modules() if hasattr(m, "layer_idx") and hasattr(m, "num_key_value_groups")
    ]


def _set_impl(model, name: str | None) -> None:
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(name)
    else:  # pragma: no cover - older transformers
        model.config._attn_implementation = name


class TriangleMixHandle:
    """Undo handle returned by :func:`apply_triangle_mix` (also a context manager)."""

    def __init__(self, model, modules, previous):
        self._model, self._modules, self._previous = model, modules, previous
        self.active = True

    def remove(self) -> None:
        if not self.active:
            return
        for m in self._modules:
            if hasattr(m, _STATE_ATTR):
                delattr(m, _STATE_ATTR)
        _set_impl(self._model, self._previous)
        self.active = False

    def __enter__(self) -> TriangleMixHandle:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


def apply_triangle_mix(
    model, policy: LayerPolicy, *, dynamic: DynamicAttention | None = None
) -> TriangleMixHandle:
    """Run ``model``'s attention layers by ``policy``; returns a handle whose ``remove()`` restores
    the previous attention implementation exactly."""
    if not isinstance(policy, LayerPolicy):
        raise TypeError(f"policy: expected a LayerPolicy, got {type(policy).__name__}")
    mods = _attention_modules(model)
    if not mods:
        raise NotImplementedError(
            f"{type(model).__name__}: no attention modules with a layer_idx found (supported: Llama, Qwen2 families)"
        )
    n = max(int(m.layer_idx) for m in mods) + 1
    if n != policy.num_layers:
        raise ValueError(f"policy: expected {n} layers (the model's), got {policy.num_layers}")
    if policy.needs_dynamic and dynamic is None:
        raise ValueError("policy has 'dynamic' layers: pass dynamic=<a DynamicAttention>")
    if dynamic is not None and not callable(dynamic):
        raise TypeError(
            f"dynamic: expected a callable DynamicAttention, got {type(dynamic).__name__}"
        )
    previous = getattr(model.config, "_attn_implementation", None)
    register()
    state = _State(policy, dynamic)
    for m in mods:
        setattr(m, _STATE_ATTR, state)
    _set_impl(model, ATTN_NAME)
    return TriangleMixHandle(model, mods, previous)

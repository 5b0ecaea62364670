"""TriangleMix for HuggingFace transformers models (Llama and Qwen2 families first).

:func:`apply_triangle_mix` runs the model's decoder attention through a function (by
:func:`sparse_kernels.integrations.hf.swap_attention`, under the name ``"triangle_mix"``, with
SDPA's mask) that reads ``module.layer_idx`` and runs that layer's kind from the
:class:`LayerPolicy`:

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

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from sparse_kernels import attention, triangle_attention
from sparse_kernels.integrations.hf import AttentionSwap, attention_modules, swap_attention

from ..policy import DynamicAttention, LayerPolicy

ATTN_NAME = "triangle_mix"


@dataclass(frozen=True)
class _State:
    policy: LayerPolicy
    dynamic: DynamicAttention | None
    sdpa_forward: Callable  # transformers' own SDPA attention function


def _transformers():
    try:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
    except ImportError as e:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "triangle_mix.integrations.hf needs transformers: pip install 'triangle-mix[hf]'"
        ) from e
    return sdpa_attention_forward


def _attention_fn(
    st: _State, module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs
):
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
        return st.sdpa_forward(
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


def apply_triangle_mix(
    model, policy: LayerPolicy, *, dynamic: DynamicAttention | None = None
) -> AttentionSwap:
    """Run ``model``'s attention layers by ``policy``; returns the
    :class:`~sparse_kernels.integrations.hf.AttentionSwap` whose ``remove()`` (or ``with``-exit)
    restores the previous attention implementation exactly."""
    if not isinstance(policy, LayerPolicy):
        raise TypeError(f"policy: expected a LayerPolicy, got {type(policy).__name__}")
    mods = attention_modules(model)
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
    fn = functools.partial(_attention_fn, _State(policy, dynamic, _transformers()))
    return swap_attention(model, fn, name=ATTN_NAME, mask="sdpa")

"""HuggingFace transformers integration (imported only here; transformers is loaded lazily).

* :func:`apply_pattern_config` runs the model's decoder attention through MMInference (by
  :func:`sparse_kernels.integrations.hf.swap_attention`, under the name ``ATTN_NAME``); it
  returns the swap's :class:`~sparse_kernels.integrations.hf.AttentionSwap`, whose
  ``remove()`` restores the previous attention implementation.
* The attention function reads ``module.layer_idx``, takes the layer's heads from the
  :class:`~sparse_patterns.config.PatternConfig` and the token layout from, in order: the
  ``modality_layout`` keyword argument of the forward call (``model(**inputs,
  modality_layout=layout)``: HF hands extra forward kwargs down to attention functions; some
  models' ``generate`` refuses them), else the ``layout`` given to :func:`apply_pattern_config`,
  else "all text".
* :func:`capture_qkv` runs a model once and returns the post-RoPE q/k/v of chosen layers (what
  the offline search needs).

Prefill only: a call whose query length differs from the key length (decoding with a KV
cache) or is shorter than ``min_sparse_len`` runs dense SDPA. This is the documented policy
(decoding is a single row; short prompts gain nothing), not an error path. Padding masks
(batched prompts of different lengths) are not supported: a non-None 4-D mask with B > 1
raises ``NotImplementedError``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from sparse_kernels.integrations.hf import AttentionSwap, swap_attention

from ..config import PatternConfig

ATTN_NAME = "sparse_patterns_mminference"
CAPTURE_NAME = "sparse_patterns_capture"


def _transformers():
    try:
        import transformers
    except ImportError as e:  # pragma: no cover
        raise ImportError(
            "sparse_patterns.integrations.hf needs transformers: pip install 'sparse-patterns[hf]'"
        ) from e
    return transformers


def _dense(query, key, value, scaling):
    G = query.shape[1] // key.shape[1]
    if G > 1:
        key = key.repeat_interleave(G, dim=1)
        value = value.repeat_interleave(G, dim=1)
    S_Q, S_KV = query.shape[2], key.shape[2]
    mask = None
    if S_Q > 1:
        pos = torch.arange(S_Q, device=query.device)[:, None] + (S_KV - S_Q)
        mask = torch.arange(S_KV, device=query.device)[None, :] <= pos
    return torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, scale=scaling
    )


def make_attention_function(
    config: PatternConfig,
    *,
    layout=None,
    block: int = 64,
    min_sparse_len: int = 256,
    impl: str = "auto",
):
    """The ``AttentionInterface`` function applying ``config``; returns ``(out [B,S,H,D], None)``.
    ``layout``: used by calls without a ``modality_layout`` kwarg (None: all text).

    The function holds one :class:`~sparse_patterns.MMInferencePlanner` for every layer and call
    of the model: what it keeps per shape (the Grid heads' CUDA graphs) serves each layer after
    the first."""
    from ..mminference import MMInferencePlanner, mminference_attention

    planner = MMInferencePlanner(block=block, impl=impl)

    def attention_fn(
        module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs
    ):
        layer = getattr(module, "layer_idx", None)
        if layer is None:
            raise ValueError(
                "mminference attention: expected the attention module to have an int "
                "`layer_idx`, got None"
            )
        if query.shape[1] != config.num_heads:
            raise ValueError(
                f"mminference attention: config has {config.num_heads} heads, layer {layer} "
                f"got {query.shape[1]}"
            )
        if attention_mask is not None and query.shape[0] > 1:
            raise NotImplementedError("mminference attention: padding masks (batched prompts)")
        S_Q, S_KV = query.shape[2], key.shape[2]
        if S_Q != S_KV or min_sparse_len > S_Q:
            out = _dense(query, key, value, scaling)
        else:
            lay = kwargs.get("modality_layout")
            heads = config.layer(int(layer))
            out = mminference_attention(
                query,
                key,
                value,
                heads,
                layout if lay is None else lay,
                scale=scaling,
                planner=planner,
            ).out
        return out.transpose(1, 2).contiguous(), None

    return attention_fn


def apply_pattern_config(
    model,
    config: PatternConfig,
    *,
    layout=None,
    block: int = 64,
    min_sparse_len: int = 256,
    impl: str = "auto",
) -> AttentionSwap:
    """Switch ``model``'s decoder attention to MMInference driven by ``config``; returns the
    :class:`~sparse_kernels.integrations.hf.AttentionSwap` whose ``remove()`` undoes it.
    ``layout`` (a ``TokenLayout`` or ``modality_index.ModalityLayout``): the token layout of the
    prompts the model will run (a forward's ``modality_layout`` kwarg overrides it); None: all
    text."""
    _transformers()
    text = model.config.get_text_config()  # a VLM's language-model sizes
    n_layers = getattr(text, "num_hidden_layers", None)
    n_heads = getattr(text, "num_attention_heads", None)
    if n_layers is not None and n_layers != config.num_layers:
        raise ValueError(
            f"PatternConfig is for {config.num_layers} layers, the model has {n_layers}"
        )
    if n_heads is not None and n_heads != config.num_heads:
        raise ValueError(
            f"PatternConfig is for {config.num_heads} query heads per layer, the model has "
            f"{n_heads}"
        )
    fn = make_attention_function(
        config, layout=layout, block=block, min_sparse_len=min_sparse_len, impl=impl
    )
    return swap_attention(model, fn, name=ATTN_NAME)


def capture_qkv(
    model, inputs: dict, *, layers: Sequence[int] | None = None
) -> list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Run ``model(**inputs)`` once (no grad) and return ``(layer_idx, q, k, v)`` for the
    requested layers (post-RoPE, ``[B, H, S, D]`` / ``[B, H_KV, S, D]``, on their device)."""
    _transformers()
    want = None if layers is None else set(int(x) for x in layers)
    got: list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def fn(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        li = int(module.layer_idx)
        if want is None or li in want:
            got.append((li, query.detach().clone(), key.detach().clone(), value.detach().clone()))
        return _dense(query, key, value, scaling).transpose(1, 2).contiguous(), None

    with swap_attention(model, fn, name=CAPTURE_NAME), torch.no_grad():
        model(**inputs)
    return sorted(got, key=lambda t: t[0])

"""The Spava attention seam of a HF decoder: :func:`use_spava` runs the *language model's*
attention (the vision tower keeps its own) through the Spava attention function, by
:func:`sparse_kernels.integrations.hf.swap_attention` under ``ATTN_NAME`` (with a no-op mask
function: the layout defines causality), and returns the swap's
:class:`~sparse_kernels.integrations.hf.AttentionSwap`, whose ``remove()`` (or ``with``-exit)
restores the previous implementation. The attention function reads what it needs from the
state :func:`use_spava` binds to it: prefill rows run Spava (or a baseline) over the process
group; decoding attends this rank's share of the cache and LSE-merges over ranks.

The whole job (vision, sharding, prefill, decoding) is
:func:`seqpar_approx.integrations.hf.sharded_generate`.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field

import torch
from sparse_kernels import attention, merge_attention
from sparse_kernels.integrations.hf import AttentionSwap, swap_attention

from .._comm import all_gather, world
from ..baselines import zigzag_ring_attention
from ..config import SpavaConfig
from ..host_attention import DENSE, HostSparsity
from ..layout import SpavaLayout
from ..methods import METHODS
from ..spava import simulate_spava_attention, spava_attention
from ..timing import SectionTimer, section

ATTN_NAME = "seqpar_approx"


@dataclass
class _State:
    method: str
    layout: SpavaLayout | None
    config: SpavaConfig | None
    group: object
    rank: int
    owned: torch.Tensor | None  # local prefill rows this rank's decoding attends (None: all)
    impl: str = "auto"
    simulate: bool = False
    on_layer: object = None
    timings: dict = field(default_factory=dict)
    events: list = field(default_factory=list)
    sparsity: HostSparsity | None = None
    token_layout: object = None  # sparse_patterns.TokenLayout of the prompt (None: text)
    timer: SectionTimer | None = None  # the prefill's sections; None while decoding

    def host_attention(self, layer):
        if self.sparsity is None:
            return DENSE
        if layer is None:
            raise ValueError("sparse host attention needs the module's layer_idx, got None")
        return self.sparsity.for_layer(layer, self.token_layout)

    def attention_seconds(self) -> float:
        """Time spent in attention (CUDA events on GPU; call after a synchronize)."""
        return sum(self.timings.values()) + sum(a.elapsed_time(b) for a, b in self.events) / 1e3


def _decode_attention(st: _State, q, k, v, scale):
    """New tokens' attention over this rank's share of the cache, merged over ranks."""
    pre = k.shape[2] - q.shape[2]  # cached rows before the new tokens
    owned = torch.arange(pre) if st.owned is None else st.owned
    owned = owned.to(k.device)
    first = st.rank == 0
    idx = torch.cat([owned, torch.arange(pre, k.shape[2], device=k.device)]) if first else owned
    ks, vs = k.index_select(2, idx), v.index_select(2, idx)
    r = attention(q, ks, vs, causal=first, scale=scale, impl=st.impl)
    _, size = world(st.group)
    if size == 1 or st.method == "dense" or st.simulate:
        return r.out
    outs = all_gather(r.out, st.group, async_op=False).wait()
    lses = all_gather(r.lse, st.group, async_op=False).wait()
    return merge_attention(outs, lses, impl=st.impl).out


def _attention_fn(
    st: _State, module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs
):
    layer = getattr(module, "layer_idx", None)
    cuda = query.device.type == "cuda"
    if cuda:  # events, not host time: kernels run asynchronously
        ev0 = torch.cuda.Event(enable_timing=True)
        ev0.record()
    t0 = time.perf_counter()
    if query.shape[2] == key.shape[2]:  # prefill of the local rows
        with section(st.timer, "attention"):
            out = _prefill_attention(st, layer, query, key, value, scaling)
    else:
        out = _decode_attention(st, query, key, value, scaling)
    if cuda:
        ev1 = torch.cuda.Event(enable_timing=True)
        ev1.record()
        st.events.append((ev0, ev1))
    else:
        st.timings[layer] = st.timings.get(layer, 0.0) + time.perf_counter() - t0
    if st.on_layer is not None:
        st.on_layer(layer)
    return out.transpose(1, 2).contiguous(), None


def _prefill_attention(st: _State, layer, query, key, value, scaling):
    if st.method == "dense":
        return attention(query, key, value, causal=True, scale=scaling, impl=st.impl).out
    if st.simulate:
        return simulate_spava_attention(
            query,
            key,
            value,
            st.layout,
            st.config,
            scale=scaling,
            impl=st.impl,
            host_attention=st.host_attention(layer),
        ).out
    if st.method == "ring":
        return zigzag_ring_attention(
            query,
            key,
            value,
            st.layout,
            st.group,
            overlap_comm=st.config.overlap_comm,
            scale=scaling,
            impl=st.impl,
        ).out
    return spava_attention(
        query,
        key,
        value,
        st.layout,
        st.config,
        st.group,
        scale=scaling,
        impl=st.impl,
        host_attention=st.host_attention(layer),
        timer=st.timer,
    ).out


def _no_mask(*args, **kwargs):
    return None


def language_model(model):
    """The decoder stack: ``model.model.language_model`` (VLMs) or ``model.model`` (LMs)."""
    inner = getattr(model, "model", model)
    return getattr(inner, "language_model", inner)


def owned_rows(method: str, layout: SpavaLayout | None, rank: int, local_len: int) -> torch.Tensor:
    """Local prefill rows whose keys rank ``rank`` contributes when decoding: each key once over
    all ranks (anchor slice ``rank``, its blocks, the query on rank 0; ring: all local rows)."""
    if method in ("dense", "ring"):
        return torch.arange(local_len)
    rows, off = [], 0
    a0, a1 = layout.anchor_slice(rank)
    for kind, s, e in layout.local_segments(rank):
        if kind == "anchor":
            rows.append(torch.arange(off + a0, off + a1))
        elif kind == "block" or (kind == "query" and rank == 0):
            rows.append(torch.arange(off, off + e - s))
        off += e - s
    return torch.cat(rows)


def use_spava(
    model,
    *,
    method: str = "spava",
    layout: SpavaLayout | None = None,
    config: SpavaConfig | None = None,
    group=None,
    impl: str = "auto",
    on_layer=None,
    simulate: bool = False,
    sparsity: HostSparsity | None = None,
    token_layout=None,
    timer: SectionTimer | None = None,
) -> AttentionSwap:
    """Make every attention layer of ``model``'s language model run ``method`` on this rank's shard.

    ``layout``/``config`` come from :func:`layout_for` (``dense`` needs neither).
    ``simulate=True``: one process holds the full sequence and runs
    :func:`simulate_spava_attention` (spava / star / apb) — the reference for the distributed run.
    ``sparsity``: the host attention step of each layer (spava / star / apb); ``token_layout``:
    the prompt's ``sparse_patterns.TokenLayout`` its MMInference layers estimate with (None:
    text). ``timer``: where the prefill's attention time is counted, per section.
    Returns the :class:`~sparse_kernels.integrations.hf.AttentionSwap` restoring the previous
    attention implementation.
    """
    st = _spava_state(
        model, method=method, layout=layout, config=config, group=group, impl=impl,
        on_layer=on_layer, simulate=simulate, sparsity=sparsity, token_layout=token_layout,
        timer=timer,
    )  # fmt: skip
    return _swap(model, st)


def _swap(model, st: _State) -> AttentionSwap:
    fn = functools.partial(_attention_fn, st)
    return swap_attention(language_model(model), fn, name=ATTN_NAME, mask=_no_mask)


def _spava_state(
    model, *, method, layout, config, group, impl, on_layer, simulate, sparsity, token_layout, timer
) -> _State:
    """The checked state of :func:`use_spava` (raises before anything is patched)."""
    if simulate and method in ("dense", "ring"):
        raise ValueError(f"simulate=True is for spava/star/apb, got method {method!r}")
    if method not in METHODS:
        raise ValueError(f"method: expected one of {METHODS}, got {method!r}")
    if method != "dense" and layout is None:
        raise ValueError(f"method {method!r} needs a layout (see layout_for)")
    if config is not None and not config.fused_query:
        raise NotImplementedError(
            "fused_query=False at the HF model level (two forward passes per layer); the "
            "unfused ablation exists only in benchmarks/bench_spava.py's layer stack"
        )
    if sparsity is not None:
        _check_sparsity(model, method, sparsity)
    rank, _ = world(group)
    if simulate or method == "dense":
        rank, owned = 0, None
    else:
        local_len = layout.local_len(rank) if layout is not None else 0
        owned = owned_rows(method, layout, rank, local_len)
    return _State(
        method=method,
        layout=layout,
        config=config,
        group=group,
        rank=rank,
        owned=owned,
        impl=impl,
        simulate=simulate,
        on_layer=on_layer,
        sparsity=sparsity,
        token_layout=token_layout,
        timer=timer,
    )


def _check_sparsity(model, method: str, sparsity) -> None:
    if not isinstance(sparsity, HostSparsity):
        raise TypeError(f"sparsity: expected a HostSparsity, got {type(sparsity).__name__}")
    if method not in ("spava", "star", "apb"):
        raise ValueError(
            f"sparsity: expected method 'spava', 'star' or 'apb' (hosts with their own rows), "
            f"got {method!r}"
        )
    cfg = language_model(model).config
    if sparsity.num_layers != cfg.num_hidden_layers:
        raise ValueError(
            f"sparsity: expected {cfg.num_hidden_layers} layers (the model's), got "
            f"{sparsity.num_layers}"
        )
    if sparsity.patterns is not None and sparsity.patterns.num_heads != cfg.num_attention_heads:
        raise ValueError(
            f"sparsity.patterns: expected {cfg.num_attention_heads} heads (the model's), got "
            f"{sparsity.patterns.num_heads}"
        )

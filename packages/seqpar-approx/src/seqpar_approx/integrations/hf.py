"""Run a HuggingFace decoder (Qwen2 / Qwen2.5-VL language model, Llama / SmolLM2) with Spava or a
baseline in every layer, each rank holding its shard of the hidden states.

* :func:`use_spava` (from :mod:`seqpar_approx.integrations.hf_attention`, the attention seam)
  runs the *language model's* attention through Spava and returns the
  :class:`~sparse_kernels.integrations.hf.AttentionSwap` that undoes it.
* :func:`frame_parallel_visual` patches the vision tower so each rank encodes its frames (Eq. 6)
  and all-gathers the embeddings; the :class:`~sparse_kernels.integrations.hf.ForwardPatches`
  it returns undoes the patch.
* :func:`sharded_generate` is the whole job: embeddings + positions of the full prompt (vision
  tower frame-parallel), shard by the layout, one prefill forward per rank, then greedy decoding
  where each new token's attention is split over ranks (each key counted once) and LSE-merged,
  so decoding is exact over the KV cache that the (approximate) prefill produced.

``sparsity=HostSparsity(...)`` runs each host's own rows with TriangleMix and/or MMInference
(see :mod:`seqpar_approx.host_attention`); the query block stays exact. ``sharded_generate``
counts the prefill's time per section (attention, estimation, MLP, communication: see
:mod:`seqpar_approx.timing`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from sparse_kernels.integrations.hf import ForwardPatches

from .._comm import all_gather_uneven, world
from ..config import SpavaConfig
from ..host_attention import HostSparsity
from ..layout import SpavaLayout, split_frames
from ..methods import layout_for
from ..timing import SectionTimer
from .hf_attention import (
    ATTN_NAME,
    _check_sparsity,
    _spava_state,
    _swap,
    language_model,
    owned_rows,
    use_spava,
)

__all__ = [
    "ATTN_NAME",
    "GenerationResult",
    "frame_parallel_visual",
    "language_model",
    "owned_rows",
    "prompt_embeddings",
    "prompt_token_layout",
    "sharded_generate",
    "tiny_llama_config",
    "tiny_qwen2_5_vl_config",
    "use_spava",
]


def _transformers():
    try:
        import transformers
    except ImportError as e:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "seqpar_approx.integrations.hf needs transformers: pip install 'seqpar-approx[hf]'"
        ) from e
    return transformers


def prompt_token_layout(model, inputs: dict, seq_len: int):
    """The ``sparse_patterns.TokenLayout`` of a prompt: per-token modality and the video's
    tokens per frame (Qwen2-VL / Qwen2.5-VL inputs), or None for a text prompt."""
    if "pixel_values_videos" not in inputs and "pixel_values" not in inputs:
        return None
    from modality_index.integrations.hf import layout_from_hf
    from sparse_patterns import TokenLayout

    lay = layout_from_hf(model.config, inputs["input_ids"][0].cpu(), **{
        k: v.cpu() for k, v in inputs.items()
        if k in ("image_grid_thw", "video_grid_thw", "mm_token_type_ids")
    })  # fmt: skip
    if lay.modality.shape[0] != seq_len:
        raise ValueError(
            f"prompt layout: expected {seq_len} tokens (the embeddings'), got {lay.modality.shape[0]}"
        )
    dev = next(model.parameters()).device
    return TokenLayout(lay.modality.to(dev), lay.tokens_per_frame)


def _mlp_hooks(model, timer: SectionTimer) -> ForwardPatches:
    """Count each decoder layer's ``mlp`` in ``timer``'s ``"mlp"`` section (forward hooks, not an
    attention swap: undone by the returned handle)."""
    patches = ForwardPatches()
    for layer in getattr(language_model(model), "layers", []):
        mlp = getattr(layer, "mlp", None)
        if mlp is None:
            continue
        patches.also_undo(mlp.register_forward_pre_hook(lambda m, a: timer.enter("mlp")).remove)
        patches.also_undo(mlp.register_forward_hook(lambda m, a, o: timer.exit("mlp")).remove)
    return patches


# ---- frame-parallel vision -----------------------------------------------------------------------


def frame_parallel_visual(model, group=None) -> ForwardPatches:
    """Patch ``model``'s vision tower (Qwen2.5-VL ``model.model.visual``) so that for one video
    (``grid_thw`` of one row ``[t, h, w]``) rank ``r`` encodes the temporal groups of
    ``split_frames(t, H)[r]`` and the merged embeddings are all-gathered. Qwen2.5-VL's vision
    attention never crosses temporal groups, so the result equals encoding every frame locally.
    """
    inner = getattr(model, "model", model)
    visual = getattr(inner, "visual", None)
    if visual is None:
        raise ValueError("frame_parallel_visual: the model has no .model.visual vision tower")
    orig = visual.forward
    rank, size = world(group)
    merge = getattr(visual, "spatial_merge_size", 2) ** 2

    def forward(hidden_states, grid_thw=None, **kwargs):
        if size == 1 or grid_thw is None or grid_thw.shape[0] != 1:
            if grid_thw is not None and grid_thw.shape[0] != 1 and size > 1:
                raise NotImplementedError(
                    f"frame-parallel vision of {grid_thw.shape[0]} images/videos in one call; "
                    "only one video per prompt is split over ranks"
                )
            return orig(hidden_states, grid_thw=grid_thw, **kwargs)
        t, h, w = (int(x) for x in grid_thw[0])
        parts = split_frames(t, size)
        per_t = h * w
        mine = parts[rank]
        if len(mine) == 0:
            raise ValueError(
                f"video too short for frame parallelism: {t} temporal groups over {size} ranks "
                "(set frame_parallel_vision=False or use more frames)"
            )
        local = hidden_states[mine.start * per_t : mine.stop * per_t]
        local_grid = grid_thw.new_tensor([[len(mine), h, w]])
        res = orig(local, grid_thw=local_grid, **kwargs)
        lens = [len(p) * per_t // merge for p in parts]
        if isinstance(res, torch.Tensor):
            return all_gather_uneven(res, lens, group)
        res.pooler_output = all_gather_uneven(res.pooler_output, lens, group)
        if getattr(res, "last_hidden_state", None) is not None:
            lens_full = [len(p) * per_t for p in parts]
            if res.last_hidden_state.shape[0] == lens_full[rank]:
                res.last_hidden_state = all_gather_uneven(res.last_hidden_state, lens_full, group)
        return res

    patches = ForwardPatches()
    patches.set(visual, forward)
    return patches


# ---- the whole job ------------------------------------------------------------------------------


class _Captured(Exception):
    pass


def prompt_embeddings(model, inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """``(inputs_embeds [B, n, d], position_ids)`` that ``model`` would hand its language model
    (VLMs: vision features scattered in, M-RoPE positions ``[3 or 4, B, n]``; LMs: ``[1, n]``)."""
    lm = language_model(model)
    if lm is getattr(model, "model", model) and "pixel_values_videos" not in inputs:
        ids = inputs["input_ids"]
        pos = torch.arange(ids.shape[1], device=ids.device)[None].expand(ids.shape[0], -1)
        return model.get_input_embeddings()(ids), pos
    import inspect

    params = inspect.signature(model.forward).parameters
    if "mm_token_type_ids" in inputs and "mm_token_type_ids" not in params:
        inputs = {k: v for k, v in inputs.items() if k != "mm_token_type_ids"}  # older transformers
    box = {}

    def hook(module, args, kwargs):
        box.update(kwargs)
        raise _Captured

    h = lm.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            model(**inputs, use_cache=False)
    except _Captured:
        pass
    finally:
        h.remove()
    if "inputs_embeds" not in box:
        raise RuntimeError("could not capture the language model inputs from the model's forward")
    return box["inputs_embeds"], box["position_ids"]


@dataclass
class GenerationResult:
    """Greedy tokens and this rank's timings in seconds: ``ttft_s = vision_s + prefill_s``
    (vision encoder and prompt embedding, then the language model over the prompt up to the
    first token); ``attention_s`` is the part of ``prefill_s`` spent in attention;
    ``decode_s`` covers the tokens after the first. ``sections``: the prefill's exclusive time
    per section (``attention``, ``estimation``, ``mlp``, ``communication``; see
    :mod:`seqpar_approx.timing`), the sections the run used."""

    tokens: list[int]
    ttft_s: float
    prefill_s: float
    vision_s: float
    decode_s: float
    attention_s: float
    seq_len: int
    layout: SpavaLayout | None
    first_logits: torch.Tensor  # next-token logits after the prompt, float32 [vocab] (rank 0's)
    sections: dict = field(default_factory=dict)


def sharded_generate(
    model,
    inputs: dict,
    *,
    query_len: int,
    method: str = "spava",
    config: SpavaConfig | None = None,
    group=None,
    max_new_tokens: int = 16,
    eos_token_id: int | None = None,
    impl: str = "auto",
    watchdog=None,
    simulate_hosts: int | None = None,
    sparsity: HostSparsity | None = None,
) -> GenerationResult:
    """Prefill ``inputs`` (processor output, batch 1) sharded over the ranks of ``group`` with
    ``method``, then greedy-decode up to ``max_new_tokens``; every rank returns the same tokens.

    ``query_len``: prompt tokens after the video (the query block). ``config``: Spava's switches
    (``frame_parallel_vision``, ``overlap_comm``, ``anchor_len``, ``passing_len``).
    ``simulate_hosts=H``: run this process alone with the single-process simulation of ``method``
    over ``H`` hosts (the reference the distributed run must match).
    ``sparsity``: TriangleMix / MMInference inside every host (:class:`HostSparsity`).
    """
    rank, size = world(group)
    solo = simulate_hosts is not None or size == 1  # no collective at all in this call
    if simulate_hosts is not None:
        rank, size, group = 0, 1, None
    dev = next(model.parameters()).device
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    beat = watchdog.beat if watchdog is not None else (lambda phase: None)
    if method == "dense" and size != 1:
        raise ValueError(f"method 'dense' runs on one process, the group has {size} ranks")
    if sparsity is not None:
        _check_sparsity(model, method, sparsity)
    fp = config.frame_parallel_vision if config is not None else True
    sync()
    t0 = time.perf_counter()
    vis = (
        frame_parallel_visual(model, group)
        if (fp and size > 1 and "pixel_values_videos" in inputs)
        else None
    )
    try:
        embeds, pos = prompt_embeddings(model, inputs)
    finally:
        if vis is not None:
            vis.remove()
    sync()
    t_vis = time.perf_counter()
    beat("vision")
    n = embeds.shape[1]
    hosts = simulate_hosts if simulate_hosts is not None else size
    layout, cfg = layout_for(method, n, query_len=query_len, num_hosts=hosts, config=config)
    if layout is not None and simulate_hosts is None:
        local_embeds = layout.shard(embeds, rank, dim=1)
        local_pos = layout.shard(pos, rank, dim=pos.ndim - 1)
    else:
        local_embeds, local_pos = embeds, pos
    token_layout = None
    if sparsity is not None and sparsity.patterns is not None:
        token_layout = prompt_token_layout(model, inputs, n)
    tf = _transformers()
    cache = tf.DynamicCache()
    lm = language_model(model)
    head = model.get_output_embeddings()
    timer = SectionTimer(dev)
    st = _spava_state(
        model,
        method=method,
        layout=layout,
        config=cfg,
        group=group,
        impl=impl,
        on_layer=lambda i: beat(f"layer {i}"),
        simulate=simulate_hosts is not None and method != "dense",
        sparsity=sparsity,
        token_layout=token_layout,
        timer=timer,
    )
    with _mlp_hooks(model, timer) as mlp_hooks, _swap(model, st), torch.no_grad():
        out = lm(
            inputs_embeds=local_embeds,
            position_ids=local_pos,
            past_key_values=cache,
            use_cache=True,
        )
        # the prompt's last token is the last local row on rank 0 for every method
        logits = head(out.last_hidden_state[:, -1:])
        tok = _agree(logits.argmax(-1), group, solo)
        first_logits = logits[0, -1].float().cpu()
        sync()
        t_first = time.perf_counter()
        # read before decoding: attention_s is the part of the prefill spent in attention
        att = st.attention_seconds()
        sections = timer.seconds()
        st.timer = None  # decoding is not part of the prefill's sections
        mlp_hooks.remove()
        tokens = [int(tok)]
        nxt = int(pos.max()) + 1
        for step in range(max_new_tokens - 1):
            if eos_token_id is not None and tokens[-1] == eos_token_id:
                break
            e = model.get_input_embeddings()(torch.tensor([[tokens[-1]]], device=dev))
            p = torch.full((*pos.shape[:-1], 1), nxt + step, dtype=pos.dtype, device=dev)
            out = lm(inputs_embeds=e, position_ids=p, past_key_values=cache, use_cache=True)
            tokens.append(int(_agree(head(out.last_hidden_state[:, -1:]).argmax(-1), group, solo)))
            beat(f"decode step {step}")
        sync()
        t_end = time.perf_counter()
    return GenerationResult(
        tokens=tokens,
        ttft_s=t_first - t0,
        prefill_s=t_first - t_vis,
        vision_s=t_vis - t0,
        decode_s=t_end - t_first,
        attention_s=att,
        seq_len=n,
        layout=layout,
        first_logits=first_logits,
        sections=sections,
    )


def _agree(tok: torch.Tensor, group, solo: bool) -> torch.Tensor:
    """Rank 0's token on every rank (rank 0 always holds the prompt's last row)."""
    _, size = world(group)
    if solo or size == 1:
        return tok.reshape(())
    t = tok.reshape(1).clone()
    src = dist.get_global_rank(group, 0) if group is not None else 0
    dist.broadcast(t, src=src, group=group)
    return t.reshape(())


# ---- tiny random models (tests and the no-checkpoint demo) --------------------------------------


def tiny_llama_config(*, vocab_size: int = 256, layers: int = 2):
    """A 2-layer Llama (SmolLM2's architecture) small enough for CPU tests."""
    tf = _transformers()
    return tf.LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )


def tiny_qwen2_5_vl_config(*, layers: int = 2):
    """The tiny random Qwen2.5-VL of modality_index (64-wide text model, real token ids and
    processor geometry)."""
    from modality_index.integrations.hf import tiny_qwen2_5_vl_config as tiny

    return tiny(layers=layers)

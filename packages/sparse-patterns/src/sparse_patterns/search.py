"""Offline, kernel-aware pattern search (Algorithm 4, App. A and C.5).

For every layer, every head: candidates (Table 3 plus boundary variants) are planned for all
heads at once, their cost is taken from the current device, candidates over the budget are
dropped, and the one with the best attention-OUTPUT recall against dense attention on one
calibration sample wins. Steps, as in Algorithm 4:

1. intra-modality: Table 3 patterns (Grid, A-shape, Vertical-Slash) with No-Boundary;
2. cross-modality: the best intra patterns that boundaries support, run as Q-Boundary and
   2D-Boundary (Grid: Q-Boundary only; only when the layout has more than one modality);
3. inter-modality: per head, the argmin of the output error over all of the above.

Cost model (``cost="auto"``): on CUDA, the measured time of the candidate's online estimation
(``MMInferencePlanner.plan`` of the layer, one planner for every candidate) plus its kernel
launch (``BlockPlan.run``), each the median of a few CUDA-event timings, cached in a JSON cost
table keyed by candidate, shape, dtype and GPU; elsewhere the documented proxy = computed blocks
of the plan (mean per head). The paper budgets kernel time; the estimation is counted too
because a head pays for it on every prefill, and a pattern whose plan costs more than its kernel
saves (the element-level boundary plans of static patterns grow as S^2) must not win on kernel
time alone. The config's metadata says which cost model was used. The budget is the cost of
``budget_pattern`` (default: the paper's A-shape with 1K sink + 4K local at 25K tokens, scaled
to the calibration length).

Memory: recall is computed over chunks of query rows (``metrics.recall_many``); no S x S matrix.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import torch

from .config import PatternConfig
from .layout import as_token_layout
from .metrics import eval_rows, recall_many
from .mminference import MMInferencePlanner
from .patterns import (
    AShape,
    Dense,
    Grid,
    HeadConfig,
    NoBoundary,
    QBoundary,
    TwoDBoundary,
    VerticalSlash,
)

# Table 3 (A-shape and Vertical-Slash entries at the paper's 25K-token calibration length).
_TABLE3_ASHAPE = ((128, 1024), (128, 2048), (128, 4096))
_TABLE3_VS = (
    (1000, 1024),
    (1000, 2048),
    (2000, 2048),
    (1000, 3096),
    (2000, 3096),
    (1000, 4096),
    (2000, 4096),
    (3500, 200),
    (1000, 2500),
)
_GRID_FLAGS = (
    (True, False, False),
    (False, True, False),
    (False, False, True),
    (True, True, False),
    (False, True, True),
    (True, True, True),
)
PAPER_CALIBRATION_TOKENS = 25_000


def _scaled(x: int, S: int, lo: int) -> int:
    return max(lo, round(x * S / PAPER_CALIBRATION_TOKENS))


def table3_candidates(
    S: int,
    *,
    tokens_per_frame: int | None = None,
    scale_to_length: bool = True,
    exact_a_shape: bool = True,
) -> list[HeadConfig]:
    """Table 3 as HeadConfigs (No-Boundary). With ``scale_to_length`` the token counts of
    A-shape and Vertical-Slash are scaled from the paper's 25K calibration to ``S``. Grid
    entries: the frame stride (``tokens_per_frame``) when known, and a searched stride.
    ``exact_a_shape``: the A-shape entries as ``AShape(exact=True)`` (default: the paper's sink +
    local window with no block rounding, run by ``triangle_attention``; on an H100 1.1-1.3x faster
    than the block lists of the rounded set,
    ``results/triangle/exact-a-shape-H100-2026-11-24.json``), or, with ``False``, block-rounded in
    the layer's block-sparse launch."""
    f = (lambda x, lo: _scaled(x, S, lo)) if scale_to_length else (lambda x, lo: x)
    out: list[HeadConfig] = []
    for sink, local in _TABLE3_ASHAPE:
        out.append(
            HeadConfig(AShape(sink=f(sink, 4), window=f(local, 64), exact=bool(exact_a_shape)))
        )
    for nv, ns in _TABLE3_VS:
        out.append(HeadConfig(VerticalSlash(n_vertical=f(nv, 8), n_slash=f(ns, 8))))
    strides = [tokens_per_frame, None] if tokens_per_frame else [None]
    for st in strides:
        for h, vl, sl in _GRID_FLAGS:
            out.append(HeadConfig(Grid(stride=st, use_hline=h, use_vline=vl, use_slash=sl)))
    return out


def _block_rounded(pattern):
    """``pattern`` with its exact execution flag off (``AShape.exact``,
    ``VerticalSlash.exact_verticals``), the form that boundaries support."""
    if isinstance(pattern, AShape) and pattern.exact:
        return dataclasses.replace(pattern, exact=False)
    if isinstance(pattern, VerticalSlash) and pattern.exact_verticals:
        return dataclasses.replace(pattern, exact_verticals=False)
    return pattern


def default_budget_pattern(S: int) -> AShape:
    """1K sink + 4K local at 25K tokens (C.5), scaled to ``S``."""
    return AShape(sink=_scaled(1000, S, 4), window=_scaled(4096, S, 64))


class CostTable:
    """Measured kernel cost per (candidate, shape, dtype, device), optionally persisted as JSON."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self.table: dict[str, float] = {}
        if self.path is not None and self.path.exists():
            self.table = json.loads(self.path.read_text())

    def get(self, key: str) -> float | None:
        return self.table.get(key)

    def put(self, key: str, value: float) -> None:
        self.table[key] = value
        if self.path is not None:
            self.path.write_text(json.dumps(self.table, indent=1, sort_keys=True))


MEASURED_COST_MODEL = "measured_estimation_plus_kernel_ms"


def _cost_key(hc: HeadConfig, q: torch.Tensor, k: torch.Tensor, block: int) -> str:
    dev = torch.cuda.get_device_name(q.device) if q.is_cuda else "cpu"
    return json.dumps(
        [MEASURED_COST_MODEL, hc.to_dict(), list(q.shape), list(k.shape), str(q.dtype), block,
         dev],
        sort_keys=True,
    )  # fmt: skip


def _time_ms(fn, *, warmup: int, rep: int) -> float:
    from sparse_kernels.benchmarking import cuda_time_ms

    return cuda_time_ms(fn, warmup=warmup, rep=rep)


def _measure(estimate: Callable[[], object], plan, q, k, v, limit: float | None = None) -> float:
    """Estimation (``estimate()``, one layer's plan; the caller has built one plan
    already, so the first call here is warm) plus the kernel launch of ``plan``. An estimation
    whose one warm call already exceeds ``limit`` ms is not timed further and the kernel not at
    all: the candidate is over budget either way (element-level boundary plans take seconds)."""
    first = _time_ms(estimate, warmup=0, rep=1)
    if limit is not None and first > limit:
        return first
    est = min(first, _time_ms(estimate, warmup=0, rep=2))
    return est + _time_ms(lambda: plan.run(q, k, v), warmup=2, rep=5)


def search_layer(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout=None,
    *,
    candidates: Sequence[HeadConfig] | None = None,
    budget_pattern=None,
    budget_slack: float = 1.1,
    boundary_top: int = 2,
    block: int = 64,
    n_eval_rows: int | None = None,
    cost: str = "auto",
    cost_table: CostTable | None = None,
    min_output_recall: float | None = None,
    exact_a_shape: bool = True,
) -> tuple[tuple[HeadConfig, ...], dict]:
    """Search one layer from its calibration ``q [1, H, S, D]``, ``k``, ``v``.

    Per head, the candidate with the best output recall among those whose cost fits the budget
    (the paper's Algorithm 4); the budget pattern when none fits. ``min_output_recall`` (not in
    the paper; ``None`` = off) puts accuracy before the budget: a head whose choice recalls less
    gets the cheapest candidate that reaches the floor even over budget (``"over_budget"`` in
    its info), or ``Dense`` when no candidate does (``"dense_fallback"``).

    ``exact_a_shape``: with the default candidates, whether the A-shape entries are
    ``AShape(exact=True)`` (default) or block-rounded (see :func:`table3_candidates`); ignored when
    ``candidates`` is given.

    Returns the chosen HeadConfig per query head and info (per-head output recall, mass
    recall, cost, budget, cost model).
    """
    if cost not in ("auto", "measured", "blocks"):
        raise ValueError(f"cost: expected 'auto', 'measured' or 'blocks', got {cost!r}")
    if min_output_recall is not None and not (
        isinstance(min_output_recall, (int, float)) and 0.0 < min_output_recall <= 1.0
    ):
        raise ValueError(
            f"min_output_recall: expected None or a float in (0, 1], got {min_output_recall!r}"
        )
    measured = cost == "measured" or (cost == "auto" and q.is_cuda)
    if measured and not q.is_cuda:
        raise NotImplementedError("cost='measured' needs CUDA tensors (the kernel is timed)")
    B, H, S, D = q.shape
    lay = as_token_layout(layout, S, q.device)
    scale = D**-0.5
    if candidates is None:
        candidates = table3_candidates(
            S, tokens_per_frame=lay.tokens_per_frame, exact_a_shape=exact_a_shape
        )
    budget_pattern = budget_pattern or default_budget_pattern(S)
    table = cost_table or CostTable()
    rows = eval_rows(S, n_eval_rows, q.device)
    # One planner for every candidate: the estimation is timed as a model that holds one runs it.
    planner = MMInferencePlanner(block=block)

    def cost_of(hc: HeadConfig, plan, limit: float | None = None) -> torch.Tensor:
        if not measured:
            return plan.kv_block_counts.sum(-1).float().mean(0)  # [H] computed blocks
        key = _cost_key(hc, q, k, block)
        c = table.get(key)
        if c is None:
            c = _measure(lambda: planner.plan(q, k, hc, lay), plan, q, k, v, limit)
            table.put(key, c)
        return torch.full((H,), float(c), device=q.device)

    def known_over_budget(hc: HeadConfig) -> torch.Tensor | None:
        """The cached cost of a candidate that cannot be chosen (over every head's budget, no
        recall floor to send heads over budget): it is neither planned nor scored again."""
        if not measured or min_output_recall is not None:
            return None
        c = table.get(_cost_key(hc, q, k, block))
        if c is None or c <= budget_max:
            return None
        return torch.full((H,), float(c), device=q.device)

    def evaluate(cands: list[HeadConfig]):
        out: list = [None] * len(cands)
        todo = []
        for i, hc in enumerate(cands):
            c = known_over_budget(hc)
            if c is None:
                todo.append(i)
            else:
                unscored = torch.full((B, H), -1.0, device=q.device, dtype=torch.float64)
                out[i] = (hc, None, c, (unscored, unscored))
        plans = [planner.plan(q, k, cands[i], lay) for i in todo]
        masks = [p.row_mask for p in plans]
        rec = recall_many(q, k, v, masks, scale=scale, rows=rows) if masks else []
        for i, p, r in zip(todo, plans, rec):
            out[i] = (cands[i], p, cost_of(cands[i], p, budget_max), r)
        return out

    budget_hc = HeadConfig(budget_pattern)
    budget_plan = planner.plan(q, k, budget_hc, lay)
    budget = cost_of(budget_hc, budget_plan) * budget_slack  # [H]
    budget_max = float(budget.max())

    # 1. intra-modality
    results = evaluate(list(candidates))
    # 2. cross-modality: boundary variants of the best supported intra patterns
    if torch.unique(lay.modality).numel() > 1:
        ok = [r for r in results if isinstance(r[0].pattern, (VerticalSlash, AShape, Grid))]
        score = [float(torch.where(r[2] <= budget, r[3][1].mean(0), -1.0).mean()) for r in ok]
        best = [ok[i][0] for i in sorted(range(len(ok)), key=lambda i: -score[i])[:boundary_top]]
        # Boundaries run in the block-sparse launch: exact A-shape / exact-vertical patterns
        # take their block-rounded form there.
        bounded = [_block_rounded(b.pattern) for b in best]
        extra = [HeadConfig(p, QBoundary()) for p in bounded]
        # 2D-Boundary has no Grid variant.
        extra += [HeadConfig(p, TwoDBoundary()) for p in bounded if not isinstance(p, Grid)]
        results += evaluate(extra)
    # 3. inter-modality: per head argmin of output error among affordable candidates
    out_rec = torch.stack([r[3][1].mean(0) for r in results])  # [C, H]
    mass_rec = torch.stack([r[3][0].mean(0) for r in results])
    costs = torch.stack([r[2] for r in results])
    fits = costs <= budget[None]
    choice_score = torch.where(fits, out_rec, -1e9)
    best = choice_score.argmax(0)
    chosen, info_heads = [], []
    for h in range(H):
        c = int(best[h])
        fit = bool(fits[c, h])
        flags: dict[str, bool] = {}
        if min_output_recall is not None and not (
            fit and float(out_rec[c, h]) >= min_output_recall
        ):
            reach = (out_rec[:, h] >= min_output_recall).nonzero().flatten()
            if reach.numel():
                c = int(reach[costs[reach, h].argmin()])
                fit = True
                flags["over_budget"] = not bool(fits[c, h])
            else:
                chosen.append(HeadConfig(Dense(), NoBoundary()))
                info_heads.append(
                    {"output_recall": 1.0, "mass_recall": 1.0, "cost": float("nan"),
                     "dense_fallback": True}
                )  # fmt: skip
                continue
        if not fit:
            hc = HeadConfig(budget_pattern, NoBoundary())
            c_out, c_mass, c_cost = float("nan"), float("nan"), float(budget[h] / budget_slack)
        else:
            hc = results[c][0]
            c_out, c_mass, c_cost = float(out_rec[c, h]), float(mass_rec[c, h]), float(costs[c, h])
        chosen.append(hc)
        info_heads.append({"output_recall": c_out, "mass_recall": c_mass, "cost": c_cost, **flags})
    info = {
        "heads": info_heads,
        "budget": [float(b) for b in budget],
        "cost_model": MEASURED_COST_MODEL if measured else "computed_blocks_proxy",
        "n_candidates": len(results),
        "skipped_over_budget": sum(r[1] is None for r in results),
        "min_output_recall": min_output_recall,
    }
    return tuple(chosen), info


QKVProvider = Callable[[object], Iterable[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]]]


def search_config(
    model_or_qkv_provider,
    inputs,
    layout=None,
    *,
    model_id: str,
    num_layers: int | None = None,
    num_heads: int | None = None,
    layers: Sequence[int] | None = None,
    default: HeadConfig | None = None,
    progress: Callable[[int, dict], object] | None = None,
    **search_kwargs,
) -> PatternConfig:
    """Search every layer and return a :class:`PatternConfig`.

    Args:
        model_or_qkv_provider: a HF model (q/k/v captured by
            ``sparse_patterns.integrations.hf.capture_qkv``), or a callable
            ``provider(inputs) -> iterable of (layer_idx, q, k, v)`` (pure tensor-level search).
        inputs: the calibration sample (model kwargs dict for a HF model, anything for a
            provider).
        layers: layers to capture with a HF model (default all); layers not searched get
            ``default`` (Dense).
        progress: called as ``progress(layer_idx, info)`` after each layer is searched.
        search_kwargs: passed to :func:`search_layer` (candidates, budget_pattern, block, ...).
    """
    if callable(model_or_qkv_provider) and not hasattr(model_or_qkv_provider, "config"):
        items = model_or_qkv_provider(inputs)
    else:
        from .integrations.hf import capture_qkv

        items = capture_qkv(model_or_qkv_provider, inputs, layers=layers)
        # A VLM's language-model sizes live in its text config (``get_text_config`` is the
        # config itself for a text-only model).
        cfg = model_or_qkv_provider.config.get_text_config()
        num_layers = num_layers or cfg.num_hidden_layers
        num_heads = num_heads or cfg.num_attention_heads
    found: dict[int, tuple[HeadConfig, ...]] = {}
    infos: dict[str, dict] = {}
    # One cost table for every layer: each candidate is timed once per search, not per layer.
    search_kwargs.setdefault("cost_table", CostTable())
    for li, q, k, v in items:
        chosen, info = search_layer(q, k, v, layout, **search_kwargs)
        found[int(li)] = chosen
        infos[str(int(li))] = info
        num_heads = num_heads or q.shape[1]
        if progress is not None:
            progress(int(li), info)
    if num_layers is None:
        num_layers = max(found) + 1 if found else 0
    if num_heads is None:
        raise ValueError("search_config: no layer was captured; cannot infer num_heads")
    dflt = default or HeadConfig(Dense())
    all_layers = tuple(found.get(i, (dflt,) * num_heads) for i in range(num_layers))
    cost_models = {i["cost_model"] for i in infos.values()}
    meta = {
        "cost_model": sorted(cost_models)[0] if len(cost_models) == 1 else sorted(cost_models),
        "searched_layers": sorted(found),
        "layers": infos,
    }
    return PatternConfig(model_id, num_layers, num_heads, all_layers, meta)

"""The gradient probe of TriangleMix §2.3: which layers need the Middle Q-K section.

A multiplier ``theta`` (all ones) scales the attention probabilities of every layer; the
derivative of the ground-truth logit ``y_gt`` w.r.t. ``theta[l, h, i, j]`` is
``A[i, j] * (dO_i . v_j)`` (``A`` the probabilities, ``dO`` the gradient at the layer's
attention output). Grad(M, l) is its mean over a section M, Att(M, l) the mean of ``A``; both
summed over heads. Sections (0-based rows ``i``, keys ``j <= i``, outside the streaming part
``j < sink or i - j < window``): Middle = rows ``i < N - last``; Last = rows ``i >= N - last``.

The probe runs through a custom autograd function per layer: the forward keeps only q, k, v;
the backward recomputes one layer's probabilities, accumulates the section sums and returns the
exact gradients of q, k, v. So at most one layer's attention matrix exists at a time.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import torch
from sparse_kernels.integrations.hf import swap_attention

from .prompts import encode_for_model, kv_retrieval_prompt, pairs_for_tokens

PROBE_ATTN_NAME = "triangle_mix_probe"


@dataclass(frozen=True)
class ProbeResult:
    """Per-layer curves (index = layer) averaged over samples, and the suggested start layer."""

    grad_middle: tuple[float, ...]
    grad_last: tuple[float, ...]
    att_middle: tuple[float, ...]
    att_last: tuple[float, ...]
    suggested_start_layer: int
    threshold: float
    n_samples: int
    tokens: int
    sink: int
    window: int
    last: int
    model_id: str | None = None  # the model probed, when the caller names it

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> ProbeResult:
        """The result written by :meth:`to_json` (files without ``model_id`` load with None).
        Wrong or missing fields raise ValueError naming the field, expected and received."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(
                f"expected a ProbeResult JSON object, got invalid JSON ({e})"
            ) from None
        if not isinstance(data, dict):
            raise ValueError(f"expected a ProbeResult JSON object, got {type(data).__name__}")
        curves = ("grad_middle", "grad_last", "att_middle", "att_last")
        ints = ("suggested_start_layer", "n_samples", "tokens", "sink", "window", "last")
        missing = [f for f in (*curves, *ints, "threshold") if f not in data]
        if missing:
            raise ValueError(f"expected the ProbeResult fields {missing}, got keys {sorted(data)}")
        unknown = sorted(set(data) - {*curves, *ints, "threshold", "model_id"})
        if unknown:
            raise ValueError(f"expected only ProbeResult fields, got unknown keys {unknown}")
        n = len(data["grad_middle"]) if isinstance(data["grad_middle"], list) else -1
        number = lambda x: isinstance(x, (int, float)) and not isinstance(x, bool)  # noqa: E731
        for f in curves:
            v = data[f]
            if not (isinstance(v, list) and len(v) == n and n > 0 and all(map(number, v))):
                raise ValueError(
                    f"{f}: expected a list of {n if n > 0 else 'one or more'} numbers (one per "
                    f"layer), got {v!r:.80}"
                )
        for f in ints:
            v = data[f]
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{f}: expected an integer >= 0, got {v!r}")
        if not 0 <= data["suggested_start_layer"] <= n:
            raise ValueError(
                f"suggested_start_layer: expected 0..{n} (the curves have {n} layers), got "
                f"{data['suggested_start_layer']}"
            )
        th = data["threshold"]
        if isinstance(th, bool) or not isinstance(th, (int, float)):
            raise ValueError(f"threshold: expected a number, got {th!r}")
        mid = data.get("model_id")
        if mid is not None and not isinstance(mid, str):
            raise ValueError(f"model_id: expected a string or null, got {mid!r}")
        return cls(
            **{f: tuple(float(x) for x in data[f]) for f in curves},
            **{f: data[f] for f in ints}, threshold=float(th), model_id=mid,
        )  # fmt: skip


def suggest_start_layer(
    grad_middle: list[float] | tuple[float, ...], threshold: float = 0.1
) -> int:
    """First layer from which every later layer's Middle gradient is at most ``threshold`` times
    the largest one (the sharp drop of the paper's Fig. 2/4)."""
    g = [abs(x) for x in grad_middle]
    top = max(g) if g else 0.0
    if top == 0.0:
        return 0
    start = len(g)
    for layer in range(len(g) - 1, -1, -1):
        if g[layer] <= threshold * top:
            start = layer
        else:
            break
    return start


class _Acc:
    def __init__(self, n_layers: int):
        z = lambda: torch.zeros(n_layers, dtype=torch.float64)
        self.g_mid, self.g_last, self.a_mid, self.a_last = z(), z(), z(), z()


class _ProbeAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, scale, layer, acc, sink, window, last):
        rep = q.shape[1] // k.shape[1]
        kk, vv = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        out = torch.nn.functional.scaled_dot_product_attention(
            q, kk, vv, is_causal=True, scale=scale
        )
        ctx.save_for_backward(q, k, v)
        ctx.cfg = (scale, layer, acc, sink, window, last, rep)
        return out

    @staticmethod
    def backward(ctx, dO):
        q, k, v = ctx.saved_tensors
        scale, layer, acc, sink, window, last, rep = ctx.cfg
        kk, vv = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        N = q.shape[2]
        i = torch.arange(N, device=q.device)[:, None]
        j = torch.arange(N, device=q.device)[None, :]
        causal = j <= i
        outside = causal & ~((j < sink) | (i - j < window))
        mid = outside & (i < N - last)
        lst = outside & (i >= N - last)
        s = (q @ kk.transpose(-1, -2)) * scale
        A = torch.softmax(s.masked_fill(~causal, float("-inf")), dim=-1)
        dA = dO @ vv.transpose(-1, -2)
        G = A * dA  # d y_gt / d theta
        per_head = lambda x, m: (x * m).sum(dim=(-1, -2)) / m.sum().clamp_min(1)
        acc.g_mid[layer] += per_head(G, mid).sum().double().item()
        acc.g_last[layer] += per_head(G, lst).sum().double().item()
        acc.a_mid[layer] += per_head(A, mid).sum().double().item()
        acc.a_last[layer] += per_head(A, lst).sum().double().item()
        dV = A.transpose(-1, -2) @ dO
        dS = A * (dA - (dA * A).sum(-1, keepdim=True))
        dQ = (dS @ kk) * scale
        dK = (dS.transpose(-1, -2) @ q) * scale
        B, H, _, D = q.shape
        fold = lambda x: x.view(B, H // rep, rep, N, D).sum(2)
        return dQ, fold(dK), fold(dV), None, None, None, None, None, None


def probe_start_layer(
    model,
    tokenizer,
    *,
    samples: int = 8,
    tokens: int = 2000,
    sink: int = 64,
    window: int = 128,
    last: int = 128,
    threshold: float = 0.1,
    seed: int = 0,
    model_id: str | None = None,
) -> ProbeResult:
    """Run the probe on ``samples`` key-value retrieval prompts of about ``tokens`` tokens
    (paper: 100 samples of ~2K tokens, sink 64, window 128, last 128). ``model`` is a causal
    LM or a VLM (the probe runs its language model on text); ``model_id`` is stored in the
    result."""
    # A VLM's config keeps the language model's sizes in its text config.
    n_layers = model.config.get_text_config().num_hidden_layers
    acc = _Acc(n_layers)

    def fn(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw):
        scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
        if query.shape[2] != key.shape[2]:
            raise NotImplementedError("the probe runs one full prefill (no KV cache)")
        out = _ProbeAttention.apply(
            query, key, value, scale, int(module.layer_idx), acc, sink, window, last
        )
        return out.transpose(1, 2).contiguous(), None

    n_pairs = pairs_for_tokens(tokenizer, tokens)
    lengths = []
    swap = swap_attention(model, fn, name=PROBE_ATTN_NAME)
    req = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    try:
        emb = model.get_input_embeddings()
        for s in range(samples):
            sample = kv_retrieval_prompt(n_pairs, seed + s)
            ids = encode_for_model(tokenizer, sample.prompt)
            gt = tokenizer(sample.answer, add_special_tokens=False).input_ids[0]
            x = emb(ids).detach().requires_grad_(True)
            logits = model(inputs_embeds=x, use_cache=False, logits_to_keep=1).logits
            logits[0, -1, gt].backward()
            lengths.append(ids.shape[1])
    finally:
        swap.remove()
        for p, r in zip(model.parameters(), req):
            p.requires_grad_(r)
    mean = lambda t: tuple(float(x) / samples for x in t)
    gm = mean(acc.g_mid)
    return ProbeResult(
        grad_middle=gm, grad_last=mean(acc.g_last), att_middle=mean(acc.a_mid), att_last=mean(acc.a_last),
        suggested_start_layer=suggest_start_layer(gm, threshold), threshold=threshold, n_samples=samples,
        tokens=int(sum(lengths) / len(lengths)), sink=sink, window=window, last=last,
        model_id=model_id,
    )  # fmt: skip


def plot_probe(result: ProbeResult, path, *, title: str | None = None):
    """Like the paper's Fig. 4: Att and Grad of the Middle and Last sections per layer, the
    suggested start layer and the threshold that chose it, written as a PNG to ``path``.
    Returns the matplotlib ``Figure``."""
    if not isinstance(result, ProbeResult):
        raise TypeError(f"result: expected a ProbeResult, got {type(result).__name__}")
    try:
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError as e:  # pragma: no cover
        raise ImportError("plot_probe needs matplotlib: pip install 'triangle-mix[plot]'") from e
    layers = range(len(result.grad_middle))
    start = result.suggested_start_layer
    fig = Figure(figsize=(8, 6.5), dpi=110, layout="constrained")
    att, grad = fig.subplots(2, 1, sharex=True)
    for ax, mid, last in (
        (att, result.att_middle, result.att_last),
        (grad, result.grad_middle, result.grad_last),
    ):
        ax.plot(layers, mid, "o-", label=f"Middle Q-K (rows before the last {result.last})")
        ax.plot(layers, last, "s-", label=f"Last Q-K (last {result.last} rows)")
        ax.axvline(start, color="gray", ls="--", label=f"suggested start layer: {start}")
        ax.grid(alpha=0.3)
    att.set_ylabel("Att(M, l)\nmean attention probability,\nsummed over heads")
    top = max((abs(g) for g in result.grad_middle), default=0.0)
    grad.axhline(
        result.threshold * top,
        color="tab:red",
        ls=":",
        label=f"threshold: {result.threshold:g} x largest Middle Grad",
    )
    grad.set_ylabel("Grad(M, l)\nmean d(answer logit) / d(theta),\nsummed over heads")
    grad.set_xlabel("layer")
    grad.xaxis.set_major_locator(MaxNLocator(integer=True))
    att.legend(fontsize=8)
    grad.legend(fontsize=8)
    fig.suptitle(
        (title + "\n" if title else "")
        + f"TriangleMix gradient probe: {result.n_samples} key-value retrieval prompts of "
        f"~{result.tokens} tokens; streaming part: sink {result.sink}, window {result.window}",
        fontsize=10,
    )
    fig.savefig(path, format="png")
    return fig

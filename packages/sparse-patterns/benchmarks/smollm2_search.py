"""Real attention from SmolLM2-135M on a 4K-token prompt (CPU, run by hand):

1. Vertical-Slash recall of attention mass at MInference budgets, per captured layer;
2. the offline search over every layer, written to ``configs/smollm2-135m.json``.

    uv run --group test --group models python packages/sparse-patterns/benchmarks/smollm2_search.py [--tokens 4096]

It prints its numbers; the config it writes is what docs/mminference.md describes.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from sparse_patterns import HeadConfig, VerticalSlash, plan_layer, search_config
from sparse_patterns.integrations.hf import capture_qkv
from sparse_patterns.integrations.smollm2 import MODEL_ID, calibration_ids, load_smollm2
from sparse_patterns.metrics import eval_rows, recall_many

HERE = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--eval-rows", type=int, default=512)
    ap.add_argument("--out", default=str(HERE / "configs" / "smollm2-135m.json"))
    ap.add_argument(
        "--min-output-recall",
        type=float,
        default=None,
        help="per-head output-recall floor (search_layer's min_output_recall; default off)",
    )
    ap.add_argument("--skip-recall", action="store_true", help="only run the search")
    args = ap.parse_args()
    torch.manual_seed(0)
    model, tok = load_smollm2()
    ids = calibration_ids(tok, args.tokens)
    S = ids.shape[1]
    inputs = {"input_ids": ids}
    rows = eval_rows(S, args.eval_rows, "cpu")
    print(f"# SmolLM2-135M, S={S}")
    for nv, ns in () if args.skip_recall else ((1000, 1024), (1000, 2048), (250, 256)):
        pat = HeadConfig(VerticalSlash(n_vertical=nv, n_slash=ns))
        res = []
        for li, q, k, v in capture_qkv(model, inputs, layers=[0, 5, 10, 15, 20, 25, 29]):
            plan = plan_layer(q, k, pat, None, block=64)
            ((mass, outr),) = recall_many(
                q, k, v, [plan.row_mask], scale=q.shape[-1] ** -0.5, rows=rows
            )
            res.append(
                (li, float(mass.mean()), float(mass.min()), float(outr.mean()), plan.density())
            )
        print(f"VS({nv},{ns}):")
        for li, mm, mn, o, d in res:
            print(
                f"  layer {li:2d}: mass recall mean {mm:.4f} min {mn:.4f}, output recall {o:.4f}, density {d:.3f}"
            )
    t = time.time()
    cfg = search_config(
        model,
        inputs,
        None,
        model_id=MODEL_ID,
        block=64,
        n_eval_rows=args.eval_rows,
        min_output_recall=args.min_output_recall,
    )
    cfg.metadata["calibration_tokens"] = S
    cfg.metadata["search_seconds"] = round(time.time() - t, 1)
    cfg.save(args.out)
    kinds: dict[str, int] = {}
    for layer in cfg.layers:
        for h in layer:
            kinds[h.pattern.kind] = kinds.get(h.pattern.kind, 0) + 1
    recs = [h["output_recall"] for li in cfg.metadata["layers"].values() for h in li["heads"]]
    print(
        "search:",
        json.dumps(kinds),
        f"mean output recall {sum(recs) / len(recs):.4f}",
        f"min {min(recs):.4f}",
        f"{cfg.metadata['search_seconds']} s",
    )


if __name__ == "__main__":
    main()

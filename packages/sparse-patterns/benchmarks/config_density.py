"""Computed-block density of a SmolLM2-135M PatternConfig on the real calibration text (CPU):
``plan_layer`` of every layer with the config's heads on the captured q/k, density = computed
blocks / causal blocks, averaged over the heads of all layers.

    uv run --group test --group models python packages/sparse-patterns/benchmarks/config_density.py \
        packages/sparse-patterns/configs/smollm2-135m-recall95-8k.json --tokens 8192
"""

from __future__ import annotations

import argparse

import torch
from sparse_patterns import PatternConfig, plan_layer
from sparse_patterns.integrations.hf import capture_qkv
from sparse_patterns.integrations.smollm2 import MODEL_ID, calibration_ids, load_smollm2


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--block", type=int, default=64)
    a = ap.parse_args()
    cfg = PatternConfig.load(a.config, model_id=MODEL_ID)
    model, tok = load_smollm2()
    ids = calibration_ids(tok, a.tokens)
    dens = []
    for li, q, k, _ in capture_qkv(model, {"input_ids": ids}):
        plan = plan_layer(q, k, cfg.layers[li], None, block=a.block)
        dens.append(plan.density())
        print(f"layer {li:2d}: density {dens[-1]:.3f}", flush=True)
    print(
        f"{a.config} at S={ids.shape[1]}: mean computed-block density {sum(dens) / len(dens):.3f} "
        f"of the causal blocks (min layer {min(dens):.3f}, max {max(dens):.3f})"
    )


if __name__ == "__main__":
    torch.manual_seed(0)
    main()

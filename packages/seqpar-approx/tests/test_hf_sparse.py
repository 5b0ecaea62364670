"""Model level: Spava with TriangleMix / MMInference inside every host, sharded over gloo ranks
against the single-process simulation, and the prefill's time per section."""

import pytest
import torch

pytest.importorskip("transformers")

from seqpar_approx import SECTIONS, SpavaConfig  # noqa: E402
from seqpar_approx.integrations.hf import sharded_generate  # noqa: E402
from seqpar_approx.testing import build_tiny_model, hf_worker, model_inputs, spawn  # noqa: E402
from seqpar_approx.testing_hosts import SPARSE_KINDS, model_sparsity  # noqa: E402

TOL = dict(atol=2e-5, rtol=1e-4)
SPAVA = dict(anchor_len=4, passing_len=3)


# TriangleMix alone starts at layer 0: the last layer's query rows are exact, so a triangle
# only in the last layer of the 2-layer model could not change the logits.
START = {"mminference": 0, "trianglemix": 0, "mminference+trianglemix": 1}
RUNS = {
    kind: dict(
        kind="qwen2_5_vl",
        method="spava",
        n=120,
        query_len=6,
        seed=3,
        config=SPAVA,
        sparse=kind,
        start_layer=START[kind],
    )
    for kind in SPARSE_KINDS
}


@pytest.fixture(scope="module")
def hf_results():
    return spawn(hf_worker, 2, runs=list(RUNS.values()), timeout_s=240)


@pytest.mark.parametrize("name", list(RUNS))
def test_sharded_sparse_model_matches_simulation(hf_results, name):
    run = RUNS[name]
    i = list(RUNS).index(name)
    assert all(r[i][0] == hf_results[0][i][0] for r in hf_results)
    tokens, logits = hf_results[0][i]
    model = build_tiny_model(run["kind"], run["seed"])
    inputs, nq = model_inputs(
        run["kind"], model, n=run["n"], query_len=run["query_len"], seed=run["seed"]
    )
    common = dict(
        query_len=nq, method="spava", config=SpavaConfig(num_hosts=2, **SPAVA), simulate_hosts=2
    )
    ref = sharded_generate(
        model,
        inputs,
        sparsity=model_sparsity(name, model, start_layer=START[name]),
        max_new_tokens=4,
        **common,
    )
    torch.testing.assert_close(logits, ref.first_logits, **TOL)
    assert tokens == ref.tokens
    # the sparse step is applied: the logits differ from Spava's dense hosts
    plain = sharded_generate(model, inputs, max_new_tokens=1, **common)
    assert (ref.first_logits - plain.first_logits).abs().max() > 1e-5


def test_prefill_time_is_split_into_sections():
    model = build_tiny_model("qwen2_5_vl", 0)
    inputs, nq = model_inputs("qwen2_5_vl", model, n=120, query_len=6, seed=1)
    r = sharded_generate(
        model,
        inputs,
        query_len=nq,
        method="spava",
        config=SpavaConfig(num_hosts=1, anchor_len=4, passing_len=3),
        sparsity=model_sparsity("mminference", model),
        max_new_tokens=2,
    )
    assert set(r.sections) == set(SECTIONS), r.sections
    assert all(t > 0 for t in r.sections.values()), r.sections
    assert sum(r.sections.values()) <= r.prefill_s


def test_sparsity_errors_name_expected_and_received():
    model = build_tiny_model("llama", 0)
    inputs, nq = model_inputs("llama", model, n=60, query_len=5, seed=1)
    sp = model_sparsity("trianglemix", model)
    with pytest.raises(ValueError, match="expected method 'spava', 'star' or 'apb'.*got 'ring'"):
        sharded_generate(model, inputs, query_len=nq, method="ring", sparsity=sp)
    other = type(sp)(policy=type(sp.policy)(sp.policy.kinds + ("dense",)))
    with pytest.raises(ValueError, match="sparsity: expected 2 layers .* got 3"):
        sharded_generate(model, inputs, query_len=nq, method="spava", sparsity=other)
    with pytest.raises(TypeError, match="sparsity: expected a HostSparsity, got str"):
        sharded_generate(model, inputs, query_len=nq, method="spava", sparsity="trianglemix")

"""Model level: a HF decoder with Spava / baselines in every layer, sharded over gloo ranks."""

import pytest
import torch

pytest.importorskip("transformers")

from seqpar_approx import SpavaConfig  # noqa: E402
from seqpar_approx.integrations.hf import (  # noqa: E402
    ATTN_NAME,
    frame_parallel_visual,
    prompt_embeddings,
    sharded_generate,
    use_spava,
)
from seqpar_approx.testing import build_tiny_model, hf_worker, model_inputs, spawn  # noqa: E402

TOL = dict(atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", ["llama", "qwen2_5_vl"])
def test_dense_method_reproduces_unpatched_model(kind):
    model = build_tiny_model(kind, 0)
    inputs, nq = model_inputs(kind, model, n=90, query_len=7, seed=1)
    with torch.no_grad():
        ref_logits = model(**inputs).logits[0, -1]
        ref_tokens = model.generate(**inputs, max_new_tokens=4, do_sample=False)
    r = sharded_generate(model, inputs, query_len=nq, method="dense", max_new_tokens=4)
    torch.testing.assert_close(r.first_logits, ref_logits, **TOL)
    assert r.tokens == ref_tokens[0, inputs["input_ids"].shape[1] :].tolist()


def test_handle_restores_attention_implementation():
    from sparse_kernels.integrations.hf import AttentionSwap

    model = build_tiny_model("llama", 0)
    before = model.config._attn_implementation
    with use_spava(model, method="dense") as h:
        assert isinstance(h, AttentionSwap)
        assert model.config._attn_implementation == ATTN_NAME
    assert model.config._attn_implementation == before
    model.config._attn_implementation = ATTN_NAME  # by hand, outside use_spava
    ids = torch.zeros(1, 5, dtype=torch.long)
    with pytest.raises(RuntimeError, match="no swap is active"), torch.no_grad():
        model(input_ids=ids)


def test_two_models_run_their_own_spava_state():
    """Each model's attention reads the state of its own use_spava, not the latest one."""
    a, b = build_tiny_model("llama", 0), build_tiny_model("llama", 1)
    seen = []
    ids = torch.randint(0, 200, (1, 9), generator=torch.Generator().manual_seed(0))
    with (
        use_spava(a, method="dense", on_layer=lambda i: seen.append(("a", i))),
        use_spava(b, method="dense", on_layer=lambda i: seen.append(("b", i))),
        torch.no_grad(),
    ):
        a(input_ids=ids)
    assert {m for m, _ in seen} == {"a"} and len(seen) == a.config.num_hidden_layers


def test_unfused_query_at_model_level_is_not_implemented():
    model = build_tiny_model("llama", 0)
    with pytest.raises(NotImplementedError, match="fused_query=False at the HF model level"):
        use_spava(
            model,
            method="spava",
            layout=object(),
            config=SpavaConfig(num_hosts=1, fused_query=False),
        )


def test_simulation_with_whole_block_passing_is_exact():
    model = build_tiny_model("qwen2_5_vl", 0)
    inputs, nq = model_inputs("qwen2_5_vl", model, n=90, query_len=7, seed=1)
    dense = sharded_generate(model, inputs, query_len=nq, method="dense", max_new_tokens=3)
    cfg = SpavaConfig(num_hosts=4, anchor_len=3, passing_len=64)
    sim = sharded_generate(
        model, inputs, query_len=nq, method="spava", config=cfg, simulate_hosts=4, max_new_tokens=3
    )
    torch.testing.assert_close(sim.first_logits, dense.first_logits, **TOL)
    assert sim.tokens == dense.tokens
    approx = sharded_generate(
        model,
        inputs,
        query_len=nq,
        method="spava",
        config=SpavaConfig(num_hosts=4, anchor_len=3, passing_len=1),
        simulate_hosts=4,
    )
    assert (approx.first_logits - dense.first_logits).abs().max() > 1e-4


RUNS = {
    "llama-dense-rank0-alone": dict(
        kind="llama", method="dense", n=90, query_len=7, seed=2, rank0_alone=True
    ),
    "llama-spava-n90": dict(
        kind="llama",
        method="spava",
        n=90,
        query_len=7,
        seed=2,
        config=dict(anchor_len=3, passing_len=2),
    ),
    "llama-ring-n90": dict(kind="llama", method="ring", n=90, query_len=7, seed=2),
    "qwenvl-spava-n90": dict(
        kind="qwen2_5_vl",
        method="spava",
        n=90,
        query_len=6,
        seed=3,
        config=dict(anchor_len=4, passing_len=3),
    ),
    "qwenvl-spava-exact-lp64": dict(
        kind="qwen2_5_vl",
        method="spava",
        n=90,
        query_len=6,
        seed=3,
        config=dict(anchor_len=4, passing_len=64),
    ),
    "qwenvl-star": dict(
        kind="qwen2_5_vl", method="star", n=90, query_len=6, seed=3, config=dict(anchor_len=4)
    ),
    "qwenvl-ring": dict(kind="qwen2_5_vl", method="ring", n=90, query_len=6, seed=3),
}


@pytest.fixture(scope="module")
def hf_results():
    return spawn(hf_worker, 2, runs=list(RUNS.values()), timeout_s=150)


@pytest.mark.parametrize("name", list(RUNS))
def test_sharded_model_matches_single_process_reference(hf_results, name):
    run = RUNS[name]
    i = list(RUNS).index(name)
    if run.get("rank0_alone"):  # ran on rank 0 only; the runs after it prove nobody hung
        assert all(r[i] == (None, None) for r in hf_results[1:])
    else:  # every rank decodes the same tokens
        assert all(r[i][0] == hf_results[0][i][0] for r in hf_results)
    tokens, logits = hf_results[0][i]
    model = build_tiny_model(run["kind"], run["seed"])
    inputs, nq = model_inputs(
        run["kind"], model, n=run["n"], query_len=run["query_len"], seed=run["seed"]
    )
    dense = sharded_generate(model, inputs, query_len=nq, method="dense", max_new_tokens=4)
    if run["method"] in ("ring", "dense") or run.get("config", {}).get("passing_len") == 64:
        ref = dense
    else:
        cfg = SpavaConfig(num_hosts=2, **run["config"]) if run["method"] == "spava" else None
        if run["method"] == "star":
            cfg = SpavaConfig(num_hosts=2, anchor_len=run["config"]["anchor_len"])
        ref = sharded_generate(
            model,
            inputs,
            query_len=nq,
            method=run["method"],
            config=cfg,
            simulate_hosts=2,
            max_new_tokens=4,
        )
    torch.testing.assert_close(logits, ref.first_logits, **TOL)
    assert tokens == ref.tokens


def test_frame_parallel_vision_in_one_process_is_identity():
    model = build_tiny_model("qwen2_5_vl", 0)
    inputs, _ = model_inputs("qwen2_5_vl", model, n=90, query_len=6, seed=3)
    e0, p0 = prompt_embeddings(model, inputs)
    with frame_parallel_visual(model):
        e1, p1 = prompt_embeddings(model, inputs)
    assert torch.equal(e0, e1) and torch.equal(p0, p1)

"""Hostile input: PatternConfig JSON and the q/k/v of plan_layer and mminference_attention are
refused with a ValueError/TypeError that names the field, what it must be and what came."""

import json

import pytest
import torch
from sparse_patterns import (
    AShape,
    Grid,
    HeadConfig,
    PatternConfig,
    TwoDBoundary,
    VerticalSlash,
    mminference_attention,
    plan_layer,
)


def _cfg() -> PatternConfig:
    return PatternConfig(
        "org/model",
        1,
        2,
        ((HeadConfig(Grid(stride=4)), HeadConfig(VerticalSlash(), TwoDBoundary())),),
        {"cost_model": "x"},
    )


def _load(mutate):
    d = json.loads(_cfg().to_json())
    mutate(d)
    return PatternConfig.from_json(json.dumps(d))


def _grid(**kw):
    return lambda d: d["layers"][0][0]["pattern"].update(**kw)


@pytest.mark.parametrize(
    "mutate, err, expected, received",
    [
        pytest.param(
            _grid(stride=10**30),
            ValueError,
            "Grid.stride: expected an int in [1, 2147483647]",
            "got int 1000000000000000000000000000000",
            id="grid-stride-1e30",
        ),
        pytest.param(
            _grid(stride=-3), ValueError, "Grid.stride: expected an int in [1,", "-3", id="neg"
        ),
        pytest.param(
            _grid(stride=True), TypeError, "Grid.stride: expected an int", "bool True", id="bool"
        ),
        pytest.param(
            _grid(stride=4.0), TypeError, "Grid.stride: expected an int", "float 4.0", id="float"
        ),
        pytest.param(
            _grid(max_stride=2**31), ValueError, "Grid.max_stride: expected", "2147483648", id="max"
        ),
        pytest.param(
            lambda d: d["layers"][0][1]["boundary"].update(cross_vertical=10**40),
            ValueError,
            "layers[0][1].boundary: TwoDBoundary.cross_vertical: expected an int in [0,",
            "10000000000",
            id="boundary-huge",
        ),
        pytest.param(
            lambda d: d["layers"][0][1]["pattern"].update(n_vertical=[1]),
            TypeError,
            "layers[0][1].pattern: VerticalSlash.n_vertical: expected an int",
            "list [1]",
            id="list-for-int",
        ),
        pytest.param(
            lambda d: d.update(metadata=[1]),
            TypeError,
            "metadata: expected a JSON object",
            "got list [1]",
            id="metadata-list",
        ),
        pytest.param(
            lambda d: d.update(num_heads=10**30),
            ValueError,
            "num_heads: expected an int in [1,",
            "1000000000000000000000000000000",
            id="num-heads-huge",
        ),
        pytest.param(
            lambda d: d.update(num_layers=1.0),
            TypeError,
            "num_layers: expected an int",
            "float 1.0",
            id="num-layers-float",
        ),
        pytest.param(
            lambda d: d.update(version=True),
            ValueError,
            "version: expected 1",
            "bool True",
            id="version-bool",
        ),
        pytest.param(
            lambda d: d["layers"][0][0]["pattern"].update(kind=["grid"]),
            ValueError,
            "layers[0][0].pattern.kind: expected one of",
            "list ['grid']",
            id="kind-unhashable",
        ),
        pytest.param(
            lambda d: d["layers"][0].__setitem__(0, {"pattern": {"kind": "sf_fixed", "local": 4}}),
            ValueError,
            "layers[0][0].pattern (sf_fixed): missing fields",
            "['vline_stride']",
            id="missing-required",
        ),
    ],
)
def test_loader_rejects_with_expected_and_received(mutate, err, expected, received):
    with pytest.raises(err) as ei:
        _load(mutate)
    msg = str(ei.value)
    assert expected in msg and received in msg, msg
    assert "\n" not in msg


def test_deeply_nested_json_is_a_value_error_not_recursion():
    text = "[" * 100_000 + "]" * 100_000
    with pytest.raises(ValueError, match="expected JSON nested at most 64 levels deep"):
        PatternConfig.from_json(text)
    nested_metadata = _cfg().to_json().replace('"metadata": {', '"metadata": {"x": ' + "[" * 5000)
    nested_metadata = nested_metadata.replace('"x"}', '"x"' + "]" * 5000 + "}")
    with pytest.raises(ValueError, match="nested at most 64"):
        PatternConfig.from_json(nested_metadata)
    # brackets inside strings are not nesting
    d = json.loads(_cfg().to_json())
    d["metadata"]["note"] = "[" * 500 + '\\"{' * 100
    back = PatternConfig.from_json(json.dumps(d))
    assert back.metadata["note"] == d["metadata"]["note"]


def test_integer_past_the_digit_limit_is_a_clear_value_error():
    text = _cfg().to_json().replace('"stride": 4', '"stride": ' + "9" * 5000)
    with pytest.raises(ValueError, match=r"PatternConfig: not valid JSON \(Exceeds the limit"):
        PatternConfig.from_json(text)


def test_duplicate_key_is_refused():
    text = _cfg().to_json().replace('"stride": 4', '"stride": 4, "stride": 8')
    with pytest.raises(ValueError, match="expected each key once per JSON object, got 'stride'"):
        PatternConfig.from_json(text)


def test_constructor_rejects_metadata_list_and_huge_stride():
    with pytest.raises(TypeError, match=r"metadata: expected a dict .* got list \[1\]"):
        PatternConfig("m", 1, 1, ((HeadConfig(Grid()),),), [1])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="got an int of about 301 digits"):
        Grid(stride=10**300)


# ------------------------------------------------------------------------------------------
# plan_layer / mminference_attention: the tensors are checked before the estimation

_HEADS = [HeadConfig(AShape(sink=4, window=16)), HeadConfig(VerticalSlash(8, 8, last_q=8))]


def _qkv(B=1, H=2, H_KV=1, S=80, D=16, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, S, D, generator=g).to(dtype)
    k = torch.randn(B, H_KV, S, D, generator=g).to(dtype)
    return q, k, torch.randn(B, H_KV, S, D, generator=g).to(dtype)


_TENSOR_CASES = {
    "D0": (lambda: _qkv(D=0), ValueError, r"head dim D: expected at least 1, got D=0"),
    "S0": (lambda: _qkv(S=0), ValueError, r"expected non-empty tensors, got q=\(1, 2, 0, 16\)"),
    "B0": (lambda: _qkv(B=0), ValueError, r"expected non-empty tensors, got q=\(0, 2, 80, 16\)"),
    "H%H_KV": (lambda: _qkv(H=3, H_KV=2), ValueError, r"H % H_KV == 0: got H=3 .* H_KV=2"),
    "D-mismatch": (
        lambda: (_qkv()[0], *_qkv(D=8)[1:]),
        ValueError,
        r"expected k/v head dim 16 .*, got 8",
    ),
    "B-mismatch": (
        lambda: (_qkv(B=2)[0], *_qkv()[1:]),
        ValueError,
        r"expected k/v batch 2 .*, got 1",
    ),
    "float64": (
        lambda: _qkv(dtype=torch.float64),
        TypeError,
        r"expected dtype float16, .*got torch.float64",
    ),
    "k-on-meta": (
        lambda: (_qkv()[0], _qkv()[1].to("meta"), _qkv()[2]),
        ValueError,
        r"one device, got q=cpu, k=meta",
    ),
}
# mminference_attention already refused these two (in the kernel's checks, after the estimation)
_KERNEL_CAUGHT = {"B-mismatch", "float64"}


@pytest.mark.parametrize(
    "entry, case",
    [
        pytest.param(entry, case, id=f"{entry}-{case}")
        for entry in ("plan_layer", "mminference_attention")
        for case in _TENSOR_CASES
        if entry == "plan_layer" or case not in _KERNEL_CAUGHT
    ],
)
def test_layer_tensors_are_checked_before_estimation(entry, case):
    make, exc, match = _TENSOR_CASES[case]
    q, k, v = make()
    heads = _HEADS * (q.shape[1] // 2) + _HEADS[: q.shape[1] % 2]
    with pytest.raises(exc, match=match):
        if entry == "plan_layer":
            plan_layer(q, k, heads)
        else:
            mminference_attention(q, k, v, heads, impl="reference")


def test_plan_layer_flag_must_be_a_bool():
    q, k, _ = _qkv()
    with pytest.raises(TypeError, match=r"exact_vertical_lists: expected a bool, got str"):
        plan_layer(q, k, _HEADS, exact_vertical_lists="no")


def test_block_larger_than_the_sequence_runs_as_one_block():
    # the reference's element mask is O(S^2) whatever the block size
    q, k, v = _qkv(S=40)
    heads = [HeadConfig(AShape(sink=4, window=16, exact=False))] * 2
    got = mminference_attention(q, k, v, heads, block=2**40, impl="reference")
    assert got.out.shape == q.shape and torch.isfinite(got.out).all()


@pytest.mark.parametrize(
    "kw, exc, match",
    [
        pytest.param(dict(block=0), ValueError, r"block: expected an int >= 1, got 0", id="block"),
        pytest.param(dict(block=True), ValueError, r"block: expected an int >= 1", id="block-bool"),
        pytest.param(
            dict(impl="cuda"), ValueError, r"impl: expected one of .*'reference'.*got 'cuda'",
            id="impl",
        ),
        pytest.param(
            dict(boundary_lists="element"), ValueError,
            r"boundary_lists: expected one of \('runs', 'reference'\), got 'element'",
            id="boundary-lists",
        ),
        pytest.param(
            dict(boundary_chunk_elems=0), ValueError,
            r"boundary_chunk_elems: expected an int >= 1, got 0", id="chunk",
        ),
    ],
)  # fmt: skip
def test_planner_settings_are_checked(kw, exc, match):
    from sparse_patterns import MMInferencePlanner

    with pytest.raises(exc, match=match):
        MMInferencePlanner(**kw)


def test_mminference_attention_refuses_an_unknown_impl_before_estimating(monkeypatch):
    from sparse_patterns import estimate

    estimated = []
    real = estimate.last_line_scores
    monkeypatch.setattr(
        estimate, "last_line_scores", lambda *a, **kw: estimated.append(1) or real(*a, **kw)
    )
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"impl: expected one of .* got 'fast'"):
        mminference_attention(q, k, v, _HEADS, impl="fast")
    assert estimated == []


def test_the_functions_take_block_and_impl_from_the_planner_they_are_given():
    from sparse_patterns import MMInferencePlanner

    q, k, v = _qkv()
    planner = MMInferencePlanner(block=32)
    with pytest.raises(
        ValueError, match=r"block: expected None or the planner's block 32 .* got 64"
    ):
        plan_layer(q, k, _HEADS, block=64, planner=planner)
    with pytest.raises(ValueError, match=r"impl: expected None or the planner's impl 'auto'"):
        mminference_attention(q, k, v, _HEADS, impl="reference", planner=planner)
    with pytest.raises(
        TypeError, match=r"planner: expected a MMInferencePlanner or None, got dict"
    ):
        plan_layer(q, k, _HEADS, planner={"block": 32})
    assert plan_layer(q, k, _HEADS, block=32, planner=planner).block == 32

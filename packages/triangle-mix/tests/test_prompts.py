"""The retrieval prompts: deterministic from the seed, one answer, honoured token lengths."""

from __future__ import annotations

import re

import pytest
import torch
from triangle_mix import kv_short_prompt
from triangle_mix.prompts import (
    filler_for_tokens,
    kv_retrieval_prompt,
    kv_short_filler_for_tokens,
    passkey_prompt,
)


class _WordTokenizer:
    """Whitespace tokenizer with no chat template (stands in for a real one)."""

    chat_template = None

    def __call__(self, text, return_tensors=None, add_special_tokens=True):
        class _Enc:
            pass

        e = _Enc()
        e.input_ids = torch.zeros(1, len(text.split()), dtype=torch.long)
        return e


@pytest.mark.parametrize("seed", [0, 7, 123], ids=["seed0", "seed7", "seed123"])
def test_passkey_is_deterministic_and_present_once(seed):
    a, b = passkey_prompt(37, seed), passkey_prompt(37, seed)
    assert a == b
    assert len(a.answer) == 5 and a.answer.isdigit()
    assert a.prompt.count(a.answer) == 1
    assert a.prompt.endswith("The pass key is")
    assert passkey_prompt(37, seed + 1) != a


@pytest.mark.parametrize(
    ("depth", "first"), [(0.0, True), (1.0, False)], ids=["depth0-start", "depth1-end"]
)
def test_passkey_depth_places_the_needle(depth, first):
    s = passkey_prompt(20, 3, depth=depth)
    body_start = s.prompt.index("I will quiz you about it. ") + len("I will quiz you about it. ")
    starts_with_needle = s.prompt[body_start:].startswith("The pass key is")
    assert starts_with_needle is first
    assert s.prompt.count(s.answer) == 1


@pytest.mark.parametrize("target", [300, 1001, 4097], ids=["t300", "t1001", "t4097"])
def test_filler_for_tokens_honours_the_target(target):
    tok = _WordTokenizer()
    n = filler_for_tokens(tok, target)
    got = len(passkey_prompt(n, 5).prompt.split())
    per = len(passkey_prompt(1, 0).prompt.split()) - len(passkey_prompt(0, 0).prompt.split())
    assert abs(got - target) <= per


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"n_filler": -1}, "n_filler"), ({"n_filler": 3, "depth": 1.5}, "depth")],
    ids=["negative-filler", "depth-out-of-range"],
)
def test_passkey_rejects_bad_input(kwargs, match):
    n = kwargs.pop("n_filler")
    with pytest.raises(ValueError, match=match):
        passkey_prompt(n, 0, **kwargs)


def test_kv_prompt_unchanged_and_answer_once():
    s = kv_retrieval_prompt(12, 4)
    assert s == kv_retrieval_prompt(12, 4)
    assert s.prompt.count(s.answer) == 1 and len(s.answer) == 36


# ---- the short key-value task ---------------------------------------------------------------

_PAIR = re.compile(r"(?<![A-Za-z])([a-z]+)(\d{5})\. ")


def _pairs(prompt):
    """(key, value) of every pair in the data, in order."""
    return _PAIR.findall(prompt)


@pytest.mark.parametrize(
    ("n_filler", "seed", "n_pairs"),
    [(0, 0, 1), (37, 7, 20), (5, 123, 50)],
    ids=["F0-seed0-P1", "F37-seed7-P20", "F5-seed123-P50"],
)
def test_kv_short_is_deterministic_with_one_answer(n_filler, seed, n_pairs):
    s = kv_short_prompt(n_filler, seed, n_pairs=n_pairs)
    assert s == kv_short_prompt(n_filler, seed, n_pairs=n_pairs)
    assert kv_short_prompt(n_filler, seed + 1, n_pairs=n_pairs) != s
    pairs = _pairs(s.prompt)
    assert len(pairs) == s.n_pairs == n_pairs
    assert len({k for k, _ in pairs}) == n_pairs and len({v for _, v in pairs}) == n_pairs
    assert (s.key, s.answer) in pairs
    assert s.prompt.count(s.answer) == 1
    assert s.prompt.endswith(f"What is the number after {s.key}? {s.key}")


def test_kv_short_keys_occur_only_where_placed():
    """Every key (all of them in one prompt) is a whole word only at its pair, and the queried
    one also in the question: no key is a word of the filler or of the prompt's sentences."""
    s = kv_short_prompt(3, 11, n_pairs=104)
    for k, _ in _pairs(s.prompt):
        n = len(re.findall(rf"(?<![A-Za-z]){k}(?![A-Za-z])", s.prompt))
        assert n == (3 if k == s.key else 1), k


def test_kv_short_query_position_varies_with_seed():
    indices, offsets = set(), set()
    for seed in range(20):
        s = kv_short_prompt(40, seed)
        indices.add([k for k, _ in _pairs(s.prompt)].index(s.key))
        offsets.add(s.prompt.index(s.key + s.answer))
    assert len(indices) >= 8 and len(offsets) >= 15


@pytest.mark.parametrize("query_index", [0, 6, 11], ids=["q0", "q6", "q11-last"])
def test_kv_short_query_index_picks_the_pair(query_index):
    s = kv_short_prompt(9, 4, n_pairs=12, query_index=query_index)
    assert _pairs(s.prompt)[query_index] == (s.key, s.answer)
    assert _pairs(s.prompt) == _pairs(kv_short_prompt(9, 4, n_pairs=12).prompt)


@pytest.mark.parametrize(
    ("target", "n_pairs"),
    [(300, 20), (1999, 20), (8001, 33)],
    ids=["t300-P20", "t1999-P20", "t8001-P33"],
)
def test_kv_short_filler_for_tokens_honours_the_target(target, n_pairs):
    tok = _WordTokenizer()
    n = kv_short_filler_for_tokens(tok, target, n_pairs=n_pairs)
    got = len(kv_short_prompt(n, 5, n_pairs=n_pairs).prompt.split())
    per = len(passkey_prompt(1, 0).prompt.split()) - len(passkey_prompt(0, 0).prompt.split())
    assert abs(got - target) <= per / 2 + 1


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        ((-1, 0), {}, "n_filler: expected an int >= 0, got -1"),
        ((True, 0), {}, "n_filler"),
        ((3, 0), {"n_pairs": 0}, r"n_pairs: expected an int in \[1, 104\], got 0"),
        ((3, 0), {"n_pairs": 105}, "n_pairs"),
        ((3, 0), {"n_pairs": 4, "query_index": 4}, r"query_index: expected an int in \[0, 3\], got 4"),
        ((3, 0), {"query_index": -1}, "query_index"),
    ],
    ids=["negative-filler", "bool-filler", "zero-pairs", "too-many-pairs", "query-past-end",
         "negative-query"],
)  # fmt: skip
def test_kv_short_rejects_bad_input(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        kv_short_prompt(*args, **kwargs)


def test_kv_short_filler_for_tokens_rejects_bad_target():
    with pytest.raises(ValueError, match="target_tokens: expected an int >= 1, got 0"):
        kv_short_filler_for_tokens(_WordTokenizer(), 0)

"""The retrieval prompts: deterministic from the seed, one answer, honoured token lengths."""

from __future__ import annotations

import pytest
import torch
from triangle_mix.prompts import filler_for_tokens, kv_retrieval_prompt, passkey_prompt


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

"""The key-value retrieval task of TriangleMix App. A.1 (UUID pairs)."""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass


@dataclass(frozen=True)
class KVSample:
    prompt: str
    answer: str
    key: str
    n_pairs: int


def kv_retrieval_prompt(n_pairs: int, seed: int, *, query_index: int | None = None) -> KVSample:
    """App. A.1's prompt with ``n_pairs`` random version-4 UUID key/value pairs (seeded).

    The queried pair is ``query_index`` (default: drawn from the seed)."""
    if n_pairs < 1:
        raise ValueError(f"n_pairs: expected >= 1, got {n_pairs}")
    rng = random.Random(seed)
    pairs = [
        (
            str(uuid.UUID(int=rng.getrandbits(128), version=4)),
            str(uuid.UUID(int=rng.getrandbits(128), version=4)),
        )
        for _ in range(n_pairs)
    ]
    qi = rng.randrange(n_pairs) if query_index is None else query_index
    data = " ".join(f"{k}: {v}" for k, v in pairs)
    key, answer = pairs[qi]
    prompt = (
        "Extract the value corresponding to the specified key in the data below. "
        f"Data: {data} Extract the value corresponding to this key: key: {key} "
        "Please directly output the corresponding value without outputing anything else. value:"
    )
    return KVSample(prompt, answer, key, n_pairs)


def encode_for_model(tokenizer, text: str):
    """Token ids of ``text`` as a user turn with the generation prompt when the tokenizer has a
    chat template, else the plain text. Returns a ``[1, S]`` LongTensor."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, return_tensors="pt",
            return_dict=True,
        )["input_ids"]  # fmt: skip
    return tokenizer(text, return_tensors="pt").input_ids


def pairs_for_tokens(tokenizer, target_tokens: int) -> int:
    """How many pairs make a prompt of about ``target_tokens`` tokens for this tokenizer."""
    one = encode_for_model(tokenizer, kv_retrieval_prompt(1, 0).prompt).shape[1]
    ten = encode_for_model(tokenizer, kv_retrieval_prompt(11, 0).prompt).shape[1]
    per_pair = (ten - one) / 10
    return max(1, int((target_tokens - one) / per_pair) + 1)


# ---- an easier long-context retrieval task (passkey in filler text) ----------------------

_FILLER = (
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
)


@dataclass(frozen=True)
class PasskeySample:
    prompt: str
    answer: str
    n_filler: int
    depth: float


def passkey_prompt(n_filler: int, seed: int, *, depth: float | None = None) -> PasskeySample:
    """A five-digit pass key hidden in ``n_filler`` repetitions of a filler paragraph (seeded).

    The key sentence goes in after ``round(depth * n_filler)`` repetitions (``depth`` drawn from
    the seed in [0, 1] when not given); the answer occurs exactly once in the prompt."""
    if isinstance(n_filler, bool) or not isinstance(n_filler, int) or n_filler < 0:
        raise ValueError(f"n_filler: expected an int >= 0, got {n_filler!r}")
    if depth is not None and not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth: expected a float in [0, 1], got {depth!r}")
    rng = random.Random(seed)
    key = str(rng.randrange(10000, 100000))
    d = rng.random() if depth is None else float(depth)
    at = round(d * n_filler)
    needle = f"The pass key is {key}. Remember it. "
    body = _FILLER * at + needle + _FILLER * (n_filler - at)
    prompt = (
        "There is an important piece of information hidden inside a lot of irrelevant text. "
        "Find it and memorize it. I will quiz you about it. "
        f"{body}What is the pass key? The pass key is"
    )
    return PasskeySample(prompt, key, n_filler, d)


def filler_for_tokens(tokenizer, target_tokens: int) -> int:
    """How many filler repetitions make a :func:`passkey_prompt` of about ``target_tokens``
    tokens (as encoded by :func:`encode_for_model`) for this tokenizer."""
    one = encode_for_model(tokenizer, passkey_prompt(1, 0).prompt).shape[1]
    eleven = encode_for_model(tokenizer, passkey_prompt(11, 0).prompt).shape[1]
    per = (eleven - one) / 10
    return max(0, round((target_tokens - one) / per) + 1)

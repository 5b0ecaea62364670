"""Long-context retrieval prompts: the key-value task of TriangleMix App. A.1 (UUID pairs), a
pass key in filler text, and a short key-value task (word keys, five-digit values, in filler)."""

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


# ---- a key-value task that a small model can do (short keys and values in filler) ---------

# Keys: common English words, each a single SmolLM2 token both with and without a leading space
# (checked with the SmolLM2-135M-Instruct tokenizer), none of them a word of the filler or of the
# prompt's own sentences. The value is written right after its key with no separator, so the
# queried key is the token just before the first digit both in the data and at the end of the
# prompt: a lookup that a 135M model does far more reliably than one through "key: value".
_KV_SHORT_KEYS = (
    "anchor", "apple", "bell", "bird", "boat", "book", "bread", "bridge", "brush", "button",
    "camera", "card", "cat", "chain", "chair", "clock", "cloud", "coat", "coin", "cookie",
    "corn", "dog", "door", "egg", "engine", "fish", "flag", "flower", "forest", "fox", "glass",
    "gold", "hat", "heart", "horn", "horse", "house", "iron", "jar", "king", "lake", "leaf",
    "lion", "mask", "milk", "moon", "mouse", "music", "nest", "night", "nose", "ocean",
    "orange", "owl", "paper", "pen", "pickle", "pig", "pine", "pipe", "planet", "plate",
    "radio", "rain", "rice", "ring", "river", "road", "robot", "rock", "rose", "salt", "sand",
    "seed", "shell", "ship", "shirt", "snake", "snow", "sock", "soup", "star", "stone",
    "storm", "sugar", "summer", "table", "tooth", "tower", "train", "tree", "van", "wall",
    "wallet", "water", "wheat", "wheel", "wind", "window", "wing", "winter", "wire", "wolf",
    "wood",
)  # fmt: skip

_KV_SHORT_HEAD = (
    "There are several important numbers hidden inside a lot of irrelevant text, each one "
    "written right after its key word. Find them and memorize them. I will quiz you about one "
    "of them. "
)


def kv_short_prompt(
    n_filler: int, seed: int, *, n_pairs: int = 20, query_index: int | None = None
) -> KVSample:
    """``n_pairs`` key-value pairs (a word key, a five-digit value written right after it, e.g.
    ``lemon48213.``) spread at seeded random places through ``n_filler`` repetitions of the
    pass-key filler; the prompt ends with the question and the queried key, for the model to
    continue with its value (plain continuation, no chat template).

    Keys are distinct words, values distinct numbers in [10000, 99999]: the answer occurs exactly
    once in the prompt, right after the queried key. The queried pair is ``query_index`` in the
    order of the data (default: drawn from the seed)."""
    if isinstance(n_filler, bool) or not isinstance(n_filler, int) or n_filler < 0:
        raise ValueError(f"n_filler: expected an int >= 0, got {n_filler!r}")
    n_keys = len(_KV_SHORT_KEYS)
    if isinstance(n_pairs, bool) or not isinstance(n_pairs, int) or not 1 <= n_pairs <= n_keys:
        raise ValueError(f"n_pairs: expected an int in [1, {n_keys}], got {n_pairs!r}")
    if query_index is not None and (
        isinstance(query_index, bool)
        or not isinstance(query_index, int)
        or not 0 <= query_index < n_pairs
    ):
        raise ValueError(f"query_index: expected an int in [0, {n_pairs - 1}], got {query_index!r}")
    rng = random.Random(seed)
    keys = rng.sample(_KV_SHORT_KEYS, n_pairs)
    values = [str(v) for v in rng.sample(range(10000, 100000), n_pairs)]
    slots = sorted(rng.choices(range(n_filler + 1), k=n_pairs))
    qi = rng.randrange(n_pairs) if query_index is None else query_index
    parts, j = [], 0
    for slot in range(n_filler + 1):
        while j < n_pairs and slots[j] == slot:
            parts.append(f"{keys[j]}{values[j]}. ")
            j += 1
        if slot < n_filler:
            parts.append(_FILLER)
    key = keys[qi]
    prompt = f"{_KV_SHORT_HEAD}{''.join(parts)}What is the number after {key}? {key}"
    return KVSample(prompt, values[qi], key, n_pairs)


def kv_short_filler_for_tokens(tokenizer, target_tokens: int, *, n_pairs: int = 20) -> int:
    """How many filler repetitions make a :func:`kv_short_prompt` of about ``target_tokens``
    tokens for this tokenizer, encoded as plain text (no chat template, as the prompt is meant
    to be continued)."""
    if isinstance(target_tokens, bool) or not isinstance(target_tokens, int) or target_tokens < 1:
        raise ValueError(f"target_tokens: expected an int >= 1, got {target_tokens!r}")

    def n_tokens(n_filler: int) -> int:
        text = kv_short_prompt(n_filler, 0, n_pairs=n_pairs).prompt
        return tokenizer(text, return_tensors="pt").input_ids.shape[1]

    zero, ten = n_tokens(0), n_tokens(10)
    per = (ten - zero) / 10
    return max(0, round((target_tokens - zero) / per))

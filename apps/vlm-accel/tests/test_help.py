"""CLI conventions: --version, a description, examples and every default in each --help, one
dtype vocabulary, and --help without importing torch or transformers."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from importlib import metadata

import pytest
from vlm_accel.cli import build_parser, main

COMMANDS = ["run", "search", "bench", "show", "probe", "demo"]


def _subparsers():
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"vlm-accel {metadata.version('vlm-accel')}"


@pytest.mark.parametrize("command", COMMANDS)
def test_help_has_description_examples_and_every_default(command):
    sp = _subparsers()[command]
    text = sp.format_help()
    assert sp.description and " ".join(sp.description.split()) in " ".join(text.split())
    examples = text.split("examples:\n", 1)[1]
    assert f"vlm-accel {command}" in examples
    blocks = {b.split()[0].rstrip(","): " ".join(b.split()) for b in re.split(r"\n  (?=-)", text)}
    for action in sp._actions:
        takes_value = action.nargs != 0 and not isinstance(action, argparse._HelpAction)
        if not takes_value or action.required:
            continue
        block = blocks[action.option_strings[0]]
        assert "default" in block, block
        if action.default is not None:  # help wraps long values at hyphens
            assert f"default:{action.default}" in "".join(block.split()), block


def test_one_dtype_vocabulary():
    for command in ("run", "search", "bench", "show", "probe"):
        (dtype,) = [a for a in _subparsers()[command]._actions if a.dest == "dtype"]
        assert tuple(dtype.choices) == ("bfloat16", "float16", "float32")


def test_help_imports_neither_torch_nor_transformers():
    code = (
        "import sys\n"
        "from vlm_accel.cli import main\n"
        f"for cmd in {COMMANDS!r} + [None]:\n"
        "    try:\n"
        "        main([cmd, '--help'] if cmd else ['--help'])\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules), file=sys.stderr)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stderr.strip() == "[]"

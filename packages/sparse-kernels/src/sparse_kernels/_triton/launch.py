"""A cheaper launch path for ``@triton.jit`` kernels that a planner launches on every layer.

``fn[grid](*args)`` binds the arguments, computes Triton's specialization of each one, hashes a
cache key, looks the compiled kernel up and then launches it: 15-60 us of host time per launch
on an H100 host, which a 128K-token Grid estimation of six launches notices (its GPU work is
about 0.3 ms). :func:`launch` makes the first launch of each specialization through
``fn[grid]`` and keeps the compiled kernel under a key of everything Triton specializes on,
then launches it directly through the compiled kernel's launcher (the call ``JITFunction.run``
itself makes, and the one PyTorch Inductor makes): about 7 us.

The key is a superset of Triton's: per tensor its dtype and its address modulo 16 bytes; per
int, float or bool its type and value (Triton specializes ints on being 1, on divisibility by
16 and on their width); the keyword arguments (constexprs and launch options); the device. Equal keys therefore mean the same compiled kernel. The direct path is off under the
interpreter, while a Triton launch hook is set (profilers read what ``run`` passes them), and
with ``SPARSE_KERNELS_DIRECT_LAUNCH=0``; then every launch is ``fn[grid]``.
"""

from __future__ import annotations

import os

import torch
import triton
from triton.runtime import driver
from triton.runtime.jit import JITFunction

_KERNELS: dict[tuple, tuple] = {}
_MAX_KERNELS = 4096
_PARAMS: dict[int, tuple] = {}


def direct_enabled() -> bool:
    """Whether :func:`launch` may bypass ``JITFunction.run`` (see the module docstring)."""
    from .._validate import interpreter_enabled

    if interpreter_enabled() or os.environ.get("SPARSE_KERNELS_DIRECT_LAUNCH", "1") == "0":
        return False
    knobs = getattr(triton, "knobs", None)
    rt = getattr(knobs, "runtime", None)
    if rt is None:  # a Triton without knobs: its launcher API is not the one used here
        return False
    return not (_hooked(rt.launch_enter_hook) or _hooked(rt.launch_exit_hook))


def _hooked(hook) -> bool:
    """Whether a launch hook is set: Triton's ``HookChain`` (3.4 and later) holds its hooks in
    ``calls`` and is never None; a plain callable is a hook."""
    return hook is not None and bool(getattr(hook, "calls", True))


def spec_key(args: tuple) -> tuple:
    """What Triton may specialize a kernel on in its positional arguments, as a superset (see
    the module docstring): per tensor its dtype and address modulo 16, per int its value, per
    other value its type and value."""
    T = torch.Tensor
    return tuple(
        [
            (a.dtype, a.data_ptr() & 15)
            if isinstance(a, T)
            else a
            if type(a) is int
            else (type(a), a)
            for a in args
        ]
    )


def _params(fn: JITFunction) -> tuple:
    """``(names, defaults)`` of ``fn``'s parameters in order (constexprs included: the launcher
    takes every bound argument and skips the constexprs itself)."""
    got = _PARAMS.get(id(fn))
    if got is None:
        names = tuple(p.name for p in fn.params)
        defaults = tuple(p.default if p.has_default else None for p in fn.params)
        got = _PARAMS[id(fn)] = (fn, names, defaults)
    return got[1:]


def launch(fn, grid: tuple[int, ...], *args, **kwargs) -> None:
    """``fn[grid](*args, **kwargs)``, launched directly when :func:`direct_enabled` (see the
    module docstring). ``args``: every runtime argument, positionally; ``kwargs``: constexprs
    by name and launch options (``num_warps``, ``num_stages``)."""
    if not isinstance(fn, JITFunction) or not direct_enabled():
        fn[grid](*args, **kwargs)
        return
    device = torch.cuda.current_device()
    key = (id(fn), device, spec_key(args), tuple(kwargs.items()))
    got = _KERNELS.get(key)
    if got is None:
        kernel = fn[grid](*args, **kwargs)
        kernel = kernel.result() if hasattr(kernel, "result") else kernel
        names, defaults = _params(fn)
        rest = tuple(
            kwargs.get(n, d) for n, d in zip(names[len(args) :], defaults[len(args) :], strict=True)
        )
        if len(_KERNELS) >= _MAX_KERNELS:  # many shapes seen: start over (entries are cheap)
            _KERNELS.clear()
        _KERNELS[key] = (kernel, rest, fn)  # fn kept alive: its id stays its own
        return
    kernel, rest, _ = got
    g1 = grid[1] if len(grid) > 1 else 1
    g2 = grid[2] if len(grid) > 2 else 1
    stream = driver.active.get_current_stream(device)
    kernel.run(
        grid[0], g1, g2, stream, kernel.function, kernel.packed_metadata, None, None, None,
        *args, *rest,
    )  # fmt: skip

"""A cheaper launch path for the ``@triton.jit`` kernels that every op and planner launches.

``fn[grid](*args)`` binds the arguments, computes Triton's specialization of each one, hashes a
cache key, looks the compiled kernel up and then launches it: 15-60 us of host time per launch
on an H100 host, which a 128K-token Grid estimation of five launches notices (its GPU work is
about 0.3 ms), and so does a 32K-token A-shape head (under 1 ms). :func:`launch` makes the
first launch of each specialization through ``fn[grid]`` and keeps the compiled kernel under a
key of everything Triton specializes on, then launches it directly through the compiled
kernel's launcher (the call ``JITFunction.run`` itself makes, and the one PyTorch Inductor
makes): 7-12 us on the same hosts.

The key is a superset of Triton's: per tensor its dtype and its address modulo 16 bytes (per
tensor descriptor, those of its base and its other fields); the scalars' values and types
(Triton specializes ints on being 1, on divisibility by 16 and on their width); the keyword
arguments (constexprs and launch options); the device. Equal keys therefore mean the same
compiled kernel. The direct path is off under the interpreter (its kernels are not
``JITFunction``s) and while a Triton launch hook is set (profilers read what ``run`` passes
them); then every launch is ``fn[grid]``. A hook is also how a caller sees every launch take
the standard path, e.g. to compare both paths.
"""

from __future__ import annotations

import dataclasses
import functools

import triton
from triton.runtime import driver
from triton.runtime.jit import JITFunction

_KERNELS: dict[tuple, tuple] = {}
_MAX_KERNELS = 4096
_RUNTIME = getattr(getattr(triton, "knobs", None), "runtime", None)


@functools.cache
def _current() -> tuple:
    """Triton's (current device, current stream) getters, looked up once: ``driver.active``
    resolves its backend on each attribute access."""
    return driver.active.get_current_device, driver.active.get_current_stream


def direct_enabled() -> bool:
    """Whether :func:`launch` may bypass ``JITFunction.run`` (see the module docstring; under
    the interpreter the kernels are not ``JITFunction``s, and every launch is ``fn[grid]``)."""
    if _RUNTIME is None:  # (a Triton without knobs: another launcher API)
        return False
    return not (_hooked(_RUNTIME.launch_enter_hook) or _hooked(_RUNTIME.launch_exit_hook))


def _hooked(hook) -> bool:
    """Whether a launch hook is set: Triton's ``HookChain`` (3.4 and later) holds its hooks in
    ``calls`` and is never None; a plain callable is a hook."""
    return hook is not None and bool(getattr(hook, "calls", True))


def _pointer_key(t) -> tuple | None:
    """A pointer-like argument's part of :func:`spec_key`: a tensor's dtype and address modulo
    16; a tensor descriptor's type, its base tensor's, and every other field of it (block shape,
    shape, strides, padding: Triton specializes on some, the launcher encodes the rest); None as
    itself (an absent descriptor)."""
    if t is None:
        return None
    if dataclasses.is_dataclass(t):  # triton.tools.tensor_descriptor.TensorDescriptor
        fields = (getattr(t, f.name) for f in dataclasses.fields(t) if f.name != "base")
        rest = tuple(tuple(v) if isinstance(v, list) else v for v in fields)
        return (type(t), *_pointer_key(t.base), rest)
    return (t.dtype, t.data_ptr() & 15)


def spec_key(tensors: tuple, scalars: tuple) -> tuple:
    """What Triton may specialize a kernel on in its arguments, as a superset (see the module
    docstring): per tensor its dtype and address modulo 16 (per descriptor, see
    :func:`_pointer_key`); the scalars' values and types."""
    return (
        tuple([_pointer_key(t) for t in tensors]),
        scalars,
        tuple(map(type, scalars)),
    )


@functools.cache
def _params(fn: JITFunction) -> tuple:
    """``(names, defaults)`` of ``fn``'s parameters in order (constexprs included: the launcher
    takes every bound argument and skips the constexprs itself)."""
    names = tuple(p.name for p in fn.params)
    defaults = tuple(p.default if p.has_default else None for p in fn.params)
    return names, defaults


def launch(fn, grid: tuple[int, ...], tensors: tuple, scalars: tuple, **kwargs) -> None:
    """``fn[grid](*tensors, *scalars, **kwargs)``, launched directly when
    :func:`direct_enabled` (see the module docstring). ``tensors``: the kernel's leading
    arguments (tensors, tensor descriptors, or None for an absent descriptor); ``scalars``: the
    runtime arguments after them (ints, floats, bools), each position always of one type;
    ``kwargs``: constexprs by name and launch options (``num_warps``, ``num_stages``)."""
    if not isinstance(fn, JITFunction) or not direct_enabled():
        fn[grid](*tensors, *scalars, **kwargs)
        return
    get_device, get_stream = _current()
    device = get_device()
    key = (id(fn), device, spec_key(tensors, scalars), tuple(kwargs.items()))
    got = _KERNELS.get(key)
    if got is None:
        kernel = fn[grid](*tensors, *scalars, **kwargs)
        kernel = kernel.result() if hasattr(kernel, "result") else kernel
        names, defaults = _params(fn)
        n = len(tensors) + len(scalars)
        rest = tuple(kwargs.get(k, d) for k, d in zip(names[n:], defaults[n:], strict=True))
        if len(_KERNELS) >= _MAX_KERNELS:  # many shapes seen: start over (entries are cheap)
            _KERNELS.clear()
        _KERNELS[key] = (kernel, rest, fn)  # fn kept alive: its id stays its own
        return
    kernel, rest, _ = got
    g1 = grid[1] if len(grid) > 1 else 1
    g2 = grid[2] if len(grid) > 2 else 1
    kernel.run(
        grid[0], g1, g2, get_stream(device), kernel.function, kernel.packed_metadata, None,
        None, None, *tensors, *scalars, *rest,
    )  # fmt: skip

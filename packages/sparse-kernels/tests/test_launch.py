"""The direct launch path (``sparse_kernels._triton.launch``): its key separates every
specialization Triton makes, and a direct launch computes what ``fn[grid]`` computes."""

import contextlib

import pytest
import torch
import triton
import triton.language as tl
from sparse_kernels._triton import launch as L
from sparse_kernels.testing import default_device

DEV = default_device()


@triton.jit
def _axpy(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr, NEG: tl.constexpr = False):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < n
    v = alpha * tl.load(x_ptr + i, mask=ok, other=0.0) + tl.load(y_ptr + i, mask=ok, other=0.0)
    tl.store(out_ptr + i, -v if NEG else v, mask=ok)


def _run(x, y, n, alpha, **kw) -> torch.Tensor:
    out = torch.full_like(x, -7.0)
    L.launch(_axpy, (triton.cdiv(max(n, 1), 64),), (x, y, out), (n, alpha), BLOCK=64, **kw)
    return out


@contextlib.contextmanager
def _launch_hook():
    """A no-op Triton launch hook while inside: every launch takes the standard ``fn[grid]``
    path, as under a profiler."""
    chain = L._RUNTIME.launch_enter_hook if L._RUNTIME is not None else None
    if not hasattr(chain, "add"):
        pytest.skip("this Triton has no launch hook chain (triton.knobs.HookChain)")

    def hook(*args, **kwargs):
        return None

    chain.add(hook)
    try:
        yield
    finally:
        chain.remove(hook)


def _gold(x, y, n, alpha, neg=False) -> torch.Tensor:
    # alpha: a power of two, so that alpha * x is exact and the kernel's fused multiply-add
    # rounds like torch's multiply then add.
    out = torch.full_like(x, -7.0)
    v = alpha * x[:n] + y[:n]
    out[:n] = -v if neg else v
    return out


def test_spec_key_separates_what_triton_specializes_on():
    base = torch.zeros(64, dtype=torch.float32)

    def key(tensors=(), scalars=()):
        return L.spec_key(tensors, scalars)

    assert key((base,)) == key((torch.zeros(64, dtype=torch.float32),))  # data apart
    assert key((base,)) != key((base[1:],))  # address modulo 16 bytes
    assert key((base,)) != key((base.half(),))  # dtype
    assert key(scalars=(1,)) != key(scalars=(2,)) and key(scalars=(16,)) != key(scalars=(32,))
    assert key(scalars=(1,)) != key(scalars=(True,))  # equal values, types apart
    assert key(scalars=(1,)) != key(scalars=(1.0,))
    assert key(scalars=(0.5,)) == key(scalars=(0.5,))


def test_spec_key_separates_tensor_descriptors():
    from triton.tools.tensor_descriptor import TensorDescriptor

    def desc(t, block=(1, 16, 32), padding="zero"):
        return TensorDescriptor(t, list(t.shape), list(t.stride()), list(block), padding=padding)

    def key(*descs):
        return L.spec_key(descs, ())

    a = torch.zeros(2, 64, 32, dtype=torch.float16)
    assert key(desc(a)) == key(desc(torch.ones_like(a)))  # data apart
    assert key(desc(a)) != key(desc(a, block=(1, 32, 32)))  # block shape
    assert key(desc(a)) != key(desc(a.float()))  # dtype
    assert key(desc(a)) != key(desc(a[:, :32]))  # shape
    assert key(desc(a)) != key(desc(a, padding="nan"))
    assert key(None) != key(desc(a)) and key(None) == key(None)  # an absent descriptor
    assert key(desc(a)) != L.spec_key((a,), ())  # a descriptor is not its base tensor


def test_direct_path_is_off_under_the_interpreter_and_under_a_launch_hook():
    if DEV == "cpu":  # the CPU tests run the interpreter: its kernels are not JITFunctions
        assert not isinstance(_axpy, L.JITFunction)
    assert L.direct_enabled()
    with _launch_hook():
        assert not L.direct_enabled()
    assert L.direct_enabled()


def test_a_launch_hook_turns_the_direct_path_off():
    class Chain:  # Triton's HookChain: never None, its hooks in ``calls``
        def __init__(self, calls):
            self.calls = calls

    assert not L._hooked(None) and not L._hooked(Chain([]))
    assert L._hooked(Chain([print])) and L._hooked(print)


def test_launch_computes_what_the_kernel_computes():
    x = torch.randn(200, device=DEV)
    y = torch.randn(200, device=DEV)
    for n, alpha, neg in ((200, 0.5, False), (200, 2.0, True), (1, 0.5, False), (130, 0.5, False)):
        got = _run(x, y, n, alpha, NEG=neg)
        torch.testing.assert_close(got, _gold(x, y, n, alpha, neg), rtol=0, atol=0)


@pytest.mark.gpu
def test_direct_launch_keys_and_results_gpu():
    assert L.direct_enabled()
    L._KERNELS.clear()
    x = torch.randn(4096, device="cuda")
    y = torch.randn(4096, device="cuda")
    calls = [
        (x, y, 4096, 0.5),  # compiles (or finds) the kernel: the standard path
        (x * 2, y, 4096, 0.5),  # same key, other data: the direct path
        (x[1:], y[1:], 4095, 0.5),  # unaligned: a new key (Triton specializes on alignment)
        (x[1:], y[1:], 1, 0.5),  # n == 1: a new key (Triton specializes ints equal to 1)
        (x, y, 4096, -4.0),  # another float: a new key, the same kernel
        (x, y, 4096, -4.0),  # direct again
    ]
    for i, (a, b, n, alpha) in enumerate(calls):
        got = _run(a, b, n, alpha)
        torch.testing.assert_close(got, _gold(a, b, n, alpha), rtol=0, atol=0, msg=f"call {i}")
    assert len(L._KERNELS) == 4
    # A launch on another stream goes to that stream.
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        got = _run(x, y, 4096, 0.5)
    s.synchronize()
    torch.testing.assert_close(got, _gold(x, y, 4096, 0.5), rtol=0, atol=0)


@pytest.mark.gpu
def test_direct_and_standard_launch_agree_on_the_planner_kernels_gpu():
    """The line-fold search through the direct path equals it through ``fn[grid]``."""
    from sparse_kernels.estimate import line_fold_search

    q = torch.randn(1, 4, 64, 64, device="cuda", dtype=torch.float16)
    k = torch.randn(1, 2, 4096, 64, device="cuda", dtype=torch.float16)
    kw = dict(period=32, lo=64, hi=4000, strides=[4, 8, 16, 32], scale=0.125, impl="triton")
    got = [line_fold_search(q, k, 4032, **kw) for _ in range(3)]  # standard, then direct
    with _launch_hook():
        ref = line_fold_search(q, k, 4032, **kw)
    for g in got:
        for a, b in zip(g, ref, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.gpu
def test_direct_and_standard_launch_agree_on_the_attention_kernels_gpu():
    """The ops' kernels, tensor descriptors among their arguments on Hopper, launch directly
    once their key is known, and compute what ``fn[grid]`` computes."""
    from sparse_kernels import attention, triangle_attention
    from triton.tools.tensor_descriptor import TensorDescriptor

    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (
        torch.randn(1, h, 1024, 64, device="cuda", dtype=torch.float16, generator=g)
        for h in (4, 2, 2)
    )
    calls = {
        "dense": lambda: attention(q, k, v, causal=True, impl="triton"),
        "a-shape": lambda: triangle_attention(q, k, v, sink=8, window=64, impl="triton"),
        "triangle": lambda: triangle_attention(q, k, v, sink=8, window=64, last=96, impl="triton"),
    }
    for name, call in calls.items():
        L._KERNELS.clear()
        got = [call() for _ in range(3)]  # standard (first of each kernel), then direct
        assert L._KERNELS, f"{name}: no kernel took the direct path"
        if name == "dense" and torch.cuda.get_device_capability() >= (9, 0):
            # its K/V tiles come through the copy engine there: descriptors in the key
            pointers = [p for key in L._KERNELS for p in key[2][0]]
            assert any(p is not None and p[0] is TensorDescriptor for p in pointers)
        with _launch_hook():
            ref = call()
        for g_ in got:
            for a, b in zip(g_, ref, strict=True):
                torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)

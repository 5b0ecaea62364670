"""CUDA graphs of the Grid index launches that serve every layer of one shape.

A layer's Grid index launches a few kernels whose host cost (Python, argument binding, the
driver's launch) can exceed their GPU time at 128K tokens. :class:`OffsetGraph` captures
them once and replays them with one host call. A graph bakes in every address, so two things
make one graph serve other inputs:

- the kernels that read the layer's ``q`` and ``k`` take, through a small device tensor, the
  element offsets of this call's tensors from the captured ones: the host writes them to
  page-locked memory before each replay, and the graph's first node copies them over. (The
  kernels could read the page-locked memory directly, which unified addressing maps at the
  same address, but on H100s that made the graph about 12 us slower: every program of the
  fold kernel then reads across PCIe);
- every output is a view of one storage, which each replay overwrites: the replay returns
  the same views of a copy of it, so a plan never aliases the graph's memory.
"""

from __future__ import annotations

import torch


class OffsetGraph:
    """``launch(q, k, qk_offsets) -> (base, outputs, to_host)`` captured once, replayed per call.

    ``launch`` must read ``q`` and ``k`` only at ``qk_offsets`` (int64 ``[2]``, element
    offsets; see :func:`~sparse_kernels.grid_index.fold_launch.fold_partials`), return ``base`` (an
    allocation of its own, whose byte size every output dtype divides), ``outputs``, a tuple of
    tensors that are views of ``base``, and ``to_host``, a small integer tensor whose values the
    host reads after each replay (:meth:`read`: the graph copies them to page-locked memory).
    It must make no host read and reference no tensor that it does not keep alive itself (it is
    kept with the graph; ``q`` and ``k`` are not). Replays take tensors of the captured shapes,
    strides and dtype whose addresses are the captured ones modulo 16 bytes (:meth:`key_of` is
    the part of a cache key that says so; a replay does not check it), on the current device
    and stream of the call (the capture's device). One thread: a replay's :meth:`read` comes
    before the next replay.

    Capturing synchronises the device and empties PyTorch's cache of free GPU memory
    (``torch.cuda.graph``), so a workload whose every call has a new shape pays that per shape.
    """

    def __init__(self, launch, q: torch.Tensor, k: torch.Tensor):
        if q.dtype != k.dtype:
            raise ValueError(f"q, k: expected one dtype, got {q.dtype} and {k.dtype}")
        dev = q.device
        self._launch = launch  # (and the tensors it holds, which the graph reads)
        self._offs = torch.zeros(2, dtype=torch.int64).pin_memory()
        self._offs_np = self._offs.numpy()
        # Read by every replay: kept with the graph (a freed one would be reused by others).
        self._offs_dev = torch.zeros(2, dtype=torch.int64, device=dev)
        self._q0, self._k0, self._es = q.data_ptr(), k.data_ptr(), q.element_size()
        # The warm-up compiles what the capture launches (offsets 0: q and k).
        _, _, to_host = launch(q, k, self._offs_dev)
        self._host = torch.empty(to_host.shape, dtype=to_host.dtype).pin_memory()
        self._graph = torch.cuda.CUDAGraph()
        with (
            torch.cuda.device(dev),
            torch.cuda.graph(self._graph, capture_error_mode="thread_local"),
        ):
            self._offs_dev.copy_(self._offs, non_blocking=True)
            base, outs, to_host = launch(q, k, self._offs_dev)
            self._host.copy_(to_host, non_blocking=True)
        _check_outputs(base, outs)
        self._host_np = self._host.numpy()
        self._base = base
        self._views = tuple((t.dtype, tuple(t.shape), t.stride(), t.storage_offset()) for t in outs)
        self._dtypes = tuple({t.dtype for t in outs} - {base.dtype})
        self._done = torch.cuda.Event()  # after a replay: its offsets copied, its values out
        self._copied = torch.cuda.Event()  # after the copy of a replay's outputs
        self._unread = False  # a replay whose host values were not read (so not waited for)

    @staticmethod
    def key_of(q: torch.Tensor, k: torch.Tensor) -> tuple:
        """What a replay needs to equal in ``q`` and ``k``: shapes, strides, dtype, device and
        the addresses modulo 16 bytes (Triton specializes on 16-byte alignment)."""
        return (
            tuple(q.shape), q.stride(), tuple(k.shape), k.stride(), q.dtype, k.dtype, q.device,
            q.data_ptr() & 15, k.data_ptr() & 15,
        )  # fmt: skip

    def __call__(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The outputs of ``launch(q, k)``: the graph replayed on ``q`` and ``k`` (of the
        captured :meth:`key_of`, not checked here), as views of a copy of its outputs."""
        if self._unread:  # the last replay may not have copied its offsets yet
            self._done.synchronize()
        self._offs_np[0] = (q.data_ptr() - self._q0) // self._es
        self._offs_np[1] = (k.data_ptr() - self._k0) // self._es
        stream = torch.cuda.current_stream()
        stream.wait_event(self._copied)  # (another stream's last copy of the outputs)
        self._graph.replay()
        self._done.record(stream)
        self._unread = True
        out = self._base.clone()
        self._copied.record(stream)
        as_dtype = {out.dtype: out, **{d: out.view(d) for d in self._dtypes}}
        return tuple(as_dtype[d].as_strided(s, st, o) for d, s, st, o in self._views)

    def read(self) -> list:
        """The last replay's ``to_host`` values: the host waits for that replay (one
        synchronisation, as a read of a device tensor would be)."""
        self._done.synchronize()
        self._unread = False
        return self._host_np.tolist()


def _check_outputs(base: torch.Tensor, outs: tuple) -> None:
    """What :class:`OffsetGraph` needs of a launch's outputs (see its docstring)."""
    if base.storage_offset() != 0 or not base.is_contiguous():
        raise ValueError(
            f"launch: expected a contiguous base tensor of its own allocation, got storage "
            f"offset {base.storage_offset()} and strides {base.stride()}"
        )
    at, nbytes = base.untyped_storage().data_ptr(), base.numel() * base.element_size()
    for i, t in enumerate(outs):
        if t.untyped_storage().data_ptr() != at:
            raise ValueError(
                f"launch: expected every output to be a view of its base, got output {i} outside it"
            )
        if nbytes % t.element_size():
            raise ValueError(
                f"launch: expected a base of a whole number of {t.dtype} elements (output {i}), "
                f"got {nbytes} bytes"
            )

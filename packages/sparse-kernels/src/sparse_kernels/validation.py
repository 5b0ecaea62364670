"""The input checks the ops run, for libraries that build on them and want the same contracts
(errors that name the expected and the received value; ``docs/kernels/contracts.md``)."""

from ._validate import TRITON_MAX_HEAD_DIM, check_bool, check_qkv, check_scale, resolve_impl

__all__ = ["TRITON_MAX_HEAD_DIM", "check_bool", "check_qkv", "check_scale", "resolve_impl"]

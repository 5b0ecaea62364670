"""Private helpers shared by the Triton kernels."""

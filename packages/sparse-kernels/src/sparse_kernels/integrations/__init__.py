"""Integrations of the kernels with model libraries (see ``hf``)."""

"""Integrations with model libraries (imported explicitly: ``seqpar_approx.integrations.hf``)."""

__all__: list[str] = []

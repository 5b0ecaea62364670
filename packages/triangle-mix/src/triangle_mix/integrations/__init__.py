"""Integrations with model libraries (transformers), imported only on demand."""

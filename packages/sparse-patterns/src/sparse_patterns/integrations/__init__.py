"""Integrations with other libraries (imported lazily; nothing heavy at import)."""

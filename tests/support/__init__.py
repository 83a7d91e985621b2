"""Shared test infrastructure: the tiny model and the vLLM server fixture."""

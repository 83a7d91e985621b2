"""Tests of agl_store."""

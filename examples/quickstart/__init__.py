"""Quickstart: a LangChain agent behind `agl proxy serve`, and the token ids it leaves in the store."""

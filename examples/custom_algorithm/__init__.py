"""A custom algorithm in Python: a store, an `LLMProxy`, rollouts, a tiny agent, and the token ids it leaves."""

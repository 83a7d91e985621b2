"""The training core: spans to rows in pure Python (no torch, no verl).

`traces` reads a rollout's spans into calls, `call_graph` links them (whose context each
prompt continues), `aggregate` turns calls into training rows, `prefix_break` explains where a
call's prompt stops extending the previous call's tokens, and `update_cap` bounds how many rows
a step trains on. Reads spans only through the LightningStore interface. The package exports
nothing: import names from the modules.
"""

"""agl_train: from token-level spans to verl training rows, advantages and losses."""

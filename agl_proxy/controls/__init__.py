"""What the trainer sets on a running proxy: the pause gate that holds calls around a weight
update, and sampling imposed for every call or by the rollout's mode (the row budget, which only
the token chain applies, lives in `chain.row_budget`)."""

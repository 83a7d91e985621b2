"""A small agent that is none of the examples, trained by `agl train` end to end (tests/train/test_train_command.py)."""

"""`./scripts/agl demo`: what agl is for, on this machine, in one command.

A tiny random model with Qwen2.5's real vocabulary and chat template on vLLM (with the token-in
endpoints), `agl proxy serve` in front of it (embedded store, web view), and an unmodified
multi-turn OpenAI-SDK agent with a tool. For each rollout the demo prints its calls, how the
proxy made each prompt (rendered, or bridged from an earlier call's ids), and the one training
row the trainer builds from them (trained and masked tokens); then the token view's address.

    ./scripts/agl demo                      # sets up .venv (scripts/setup.sh demo) first when needed
    python -m examples.demo --rollouts 1 --no-wait
"""

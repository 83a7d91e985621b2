"""A small arithmetic dataset, generated deterministically (no download needed).

Each task is `{"question": str, "answer": str}`; `env_map` passes both to the agent.
"""

from __future__ import annotations

import random

from examples.calc_agent.calculator import calculate, format_number

TEMPLATES = (
    "What is {a} + {b} * {c}?",
    "Compute ({a} + {b}) * {c}.",
    "A shop sells {a} boxes of {b} apples and {c} loose apples. How many apples is that?",
    "What is {a} * {b} - {c}?",
)
EXPRESSIONS = ("{a} + {b} * {c}", "({a} + {b}) * {c}", "{a} * {b} + {c}", "{a} * {b} - {c}")


def make_tasks(count: int, seed: int) -> list[dict[str, str]]:
    rng = random.Random(seed)
    tasks = []
    for _ in range(count):
        k = rng.randrange(len(TEMPLATES))
        a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 99)
        tasks.append(
            {
                "question": TEMPLATES[k].format(a=a, b=b, c=c),
                "answer": format_number(calculate(EXPRESSIONS[k].format(a=a, b=b, c=c))),
            }
        )
    return tasks


def train_tasks() -> list[dict[str, str]]:
    return make_tasks(256, seed=0)


def val_tasks() -> list[dict[str, str]]:
    return make_tasks(32, seed=1)

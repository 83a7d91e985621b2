"""Train the calculator agent with agl + verl.

    python examples/calc_agent/train.py [key=value ...]

`config.yaml` beside this file is merged over agl's trainer config; `key=value` arguments
(OmegaConf dotlist) are merged last. The proxy must be running at `agentlightning.agl_base_url`
(see run.sh).
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # so that `examples.calc_agent.agent` imports in the agent processes too

from omegaconf import OmegaConf  # noqa: E402

from agl_train.verl_glue.config import compose_config  # noqa: E402
from agl_train.verl_glue.entry import run_ppo  # noqa: E402
from examples.calc_agent.dataset import train_tasks, val_tasks  # noqa: E402


def load_config(argv: list[str]) -> object:
    """agl's config, then this example's config.yaml, then the command line."""
    config = compose_config()
    OmegaConf.set_struct(config, False)  # the example adds env_map entries
    config = OmegaConf.merge(
        config, OmegaConf.load(Path(__file__).with_name("config.yaml")), OmegaConf.from_dotlist(argv)
    )
    OmegaConf.set_struct(config, True)
    return config


def main(argv: list[str]) -> None:
    run_ppo(load_config(argv), train_tasks(), val_tasks())


if __name__ == "__main__":
    main(sys.argv[1:])

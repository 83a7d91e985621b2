"""The actor's attention implementation: flash-attention where it is installed, else SDPA.

verl's model config (`HFModelConfig`) asks transformers for `flash_attention_2` unless
`actor_rollout_ref.model.override_config.attn_implementation` says otherwise, and that fails
when loading the actor on a machine without the `flash-attn` package. agl's overlay sets the key
to `auto`; `resolve_attn_implementation(config)` replaces `auto` with `flash_attention_2` when
flash-attn can be imported and with `sdpa` (PyTorch's scaled-dot-product attention, always
there) otherwise, and logs the choice once. An explicit `flash_attention_2` without flash-attn
is an error that names the key.

The choice is made where the model is loaded: each verl worker resolves its own
`actor_rollout_ref` config (`workers.AglWorker`, `key=MODEL_ATTN_KEY`), so a driver without
flash-attn does not hold back GPU workers that have it, nor the reverse. The driver leaves `auto`.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any

logger = logging.getLogger(__name__)

ATTN_KEY = "actor_rollout_ref.model.override_config.attn_implementation"
MODEL_ATTN_KEY = ATTN_KEY.removeprefix("actor_rollout_ref.")
"""The same key in the `actor_rollout_ref` part of the config, which is what a worker gets."""
AUTO = "auto"
FLASH = "flash_attention_2"
SDPA = "sdpa"


def flash_attn_installed() -> bool:
    """Whether the `flash_attn` package can be imported here (without importing it: it loads CUDA)."""
    return importlib.util.find_spec("flash_attn") is not None


def resolve_attn_implementation(config: Any, *, key: str = ATTN_KEY, flash_attn: bool | None = None) -> str:
    """Set `key` in `config` (an OmegaConf DictConfig) to what this machine can run; returns it.

    `auto` (agl's default) or an absent key becomes `flash_attention_2` with flash-attn and
    `sdpa` without; any other value stays. Messages name the full key (`ATTN_KEY`) whichever
    part of the config is given. `flash_attn` overrides the detection (tests).
    """
    from omegaconf import OmegaConf, open_dict

    available = flash_attn_installed() if flash_attn is None else flash_attn
    chosen = OmegaConf.select(config, key, default=AUTO)
    if chosen in (AUTO, None):
        chosen = FLASH if available else SDPA
        if not available:
            logger.warning("flash-attn is not installed: the actor uses %s=%s", ATTN_KEY, SDPA)
    elif chosen == FLASH and not available:
        raise ValueError(
            f"{ATTN_KEY}={FLASH} needs the flash-attn package, which is not installed; "
            f"install it (requirements/gpu.txt) or set {ATTN_KEY}={SDPA} (or {AUTO})"
        )
    with open_dict(config):
        OmegaConf.update(config, key, chosen, force_add=True)
    return str(chosen)


__all__ = ["ATTN_KEY", "AUTO", "MODEL_ATTN_KEY", "FLASH", "SDPA", "flash_attn_installed", "resolve_attn_implementation"]

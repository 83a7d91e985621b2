"""The reward curve of a run as a PNG: each rollout's reward by the weight version it ran on
(`run_store.rewards_by_version`)."""

from __future__ import annotations

import math
from pathlib import Path


def plot_curve(by_version: dict[int, list[float]], path: Path, title: str = "agl train") -> None:
    """The training curve as a PNG: each rollout's reward (dots) and the step mean ± one standard
    deviation, by step. Drawn with Pillow (no plotting library needed)."""
    from PIL import Image, ImageDraw, ImageFont

    width, height, left, right, top, bottom = 720, 420, 70, 20, 40, 50
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default()
    steps = sorted(by_version)
    x_min, x_max = steps[0] - 0.5, steps[-1] + 0.5

    def xy(step: float, reward: float) -> tuple[float, float]:
        x = left + (step - x_min) / (x_max - x_min) * (width - left - right)
        return x, top + (1.0 - reward) * (height - top - bottom)

    for tick in (0.0, 0.25, 0.5, 0.75, 1.0):
        _, y = xy(x_min, tick)
        draw.line([(left, y), (width - right, y)], fill=(230, 230, 230))
        draw.text((left - 40, y - 6), f"{tick:.2f}", fill="black", font=font)
    for step in steps:
        x, _ = xy(step, 0.0)
        draw.text((x - 4, height - bottom + 8), str(step), fill="black", font=font)
    means, bands = [], []
    for step in steps:
        rewards = by_version[step]
        mean = sum(rewards) / len(rewards)
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
        for reward in rewards:
            x, y = xy(step, reward)
            draw.ellipse([x - 2, y - 2, x + 2, y + 2], fill=(160, 190, 230))
        means.append(xy(step, mean))
        bands.append((xy(step, min(1.0, mean + std)), xy(step, max(0.0, mean - std))))
    for upper, lower in bands:
        draw.line([upper, lower], fill=(30, 90, 180), width=2)
    draw.line(means, fill=(200, 40, 40), width=3)
    for x, y in means:
        draw.ellipse([x - 4, y - 4, x + 4, y + 4], fill=(200, 40, 40))
    draw.rectangle([left, top, width - right, height - bottom], outline="black")
    draw.text((left, 12), f"{title}: reward per rollout (dots), step mean (red) ± std", fill="black", font=font)
    draw.text(((width - left) // 2, height - 20), "training step (weight version)", fill="black", font=font)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)

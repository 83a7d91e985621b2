"""Build agl's tiny test model: a seeded, randomly initialised Qwen2-style LM with a locally trained tokenizer.

Nothing is downloaded. The tokenizer is a byte-level BPE trained on text generated here, wrapped with Qwen2's
special tokens and a Qwen2.5-style chat template (tools, tool calls, tool results). vLLM serves the result on a
CPU in about a minute, which is what the test suite needs: real token ids, not sensible text.

Usage: ``python -m examples.tiny_vllm.tiny_model OUTDIR`` (idempotent: a finished build is reused).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

SERVED_MODEL_NAME = "tiny-qwen2"
DEFAULT_DIR = Path(__file__).resolve().parents[2] / ".cache" / "tiny-qwen2"

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
# Added but not special (as in Qwen2.5): vLLM's hermes tool parser looks them up in the vocabulary and
# refuses to start without them; keeping them non-special leaves them visible in decoded text.
TOOL_CALL_TOKENS = ("<tool_call>", "</tool_call>")

SEED = 0
VOCAB_SIZE = 2048
HIDDEN_SIZE = 64
NUM_LAYERS = 2
NUM_HEADS = 2  # head_dim = 32: vLLM's CPU attention needs head_dim >= 32
MAX_POSITIONS = 2048

_STAMP = "agl-tiny-model.json"
_TEMPLATE = Path(__file__).with_name("chat_template.jinja")

_WORDS = (
    "the a an agent tool call result model token span store rollout attempt reward proxy trainer batch "
    "weather city paris london tokyo today tomorrow temperature sunny rain cloud wind search query answer "
    "question user assistant system function name arguments value number list string true false null "
    "please tell me what is how many why when where which hello thanks sure here you are it was "
    "one two three four five six seven eight nine ten add subtract multiply divide sum total count "
    "python code file line error test run server client request response stream json data text"
).split()


def recipe_hash() -> str:
    """Hash of everything that decides the model's bytes; a cached build with another hash is rebuilt."""
    digest = hashlib.sha256()
    digest.update(Path(__file__).read_bytes())
    digest.update(_TEMPLATE.read_bytes())
    return digest.hexdigest()[:16]


def is_built(outdir: Path, recipe: str | None = None) -> bool:
    """True when ``outdir`` holds a finished build of ``recipe`` (default: this module's, the toy model)."""
    stamp = outdir / _STAMP
    if not stamp.is_file():
        return False
    return json.loads(stamp.read_text()).get("recipe") == (recipe or recipe_hash())


def _corpus(rng: random.Random) -> Iterator[str]:
    """Yield ASCII training text shaped like chat turns, JSON tool calls and plain sentences."""
    for _ in range(6000):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(3, 14))]
        sentence = " ".join(words).capitalize() + rng.choice([".", "?", "!", ":", ","])
        yield sentence
        kind = rng.random()
        if kind < 0.2:
            args = {rng.choice(_WORDS): rng.choice([rng.choice(_WORDS), rng.randint(0, 999)])}
            call = {"name": f"{rng.choice(_WORDS)}_{rng.choice(_WORDS)}", "arguments": args}
            yield f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
        elif kind < 0.4:
            role = rng.choice(["system", "user", "assistant"])
            yield f"{IM_START}{role}\n{sentence}{IM_END}\n"
        elif kind < 0.5:
            yield f"<tool_response>\n{json.dumps({'result': rng.randint(0, 10**6)})}\n</tool_response>"
    # Every printable ASCII character appears, so the learned vocabulary covers all ASCII input.
    yield "".join(chr(c) for c in range(32, 127)) + "\n\t\r"


def _ascii_alphabet() -> list[str]:
    """The byte-level (GPT-2) characters for the 128 ASCII bytes.

    Restricting the alphabet to ASCII keeps every token id decodable on its own into valid UTF-8, so the
    random model's outputs decode identically whether detokenised incrementally (vLLM) or at once (tests).
    Non-ASCII input is dropped by this tokenizer; tests use ASCII text.
    """
    return [_byte_char(b) for b in range(128)]


def _byte_char(byte: int) -> str:
    """GPT-2's bytes_to_unicode for one byte (the mapping ByteLevel uses)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    if byte in printable:
        return chr(byte)
    shifted = [b for b in range(256) if b not in printable]
    return chr(256 + shifted.index(byte))


def build_tokenizer(outdir: Path) -> None:
    """Train the byte-level BPE and save it as a Qwen2-style fast tokenizer with its chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[ENDOFTEXT, IM_START, IM_END],
        initial_alphabet=_ascii_alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(random.Random(SEED)), trainer=trainer)

    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        additional_special_tokens=[IM_START, IM_END],
        clean_up_tokenization_spaces=False,
        model_max_length=MAX_POSITIONS,
    )
    wrapped.add_tokens(list(TOOL_CALL_TOKENS), special_tokens=False)
    wrapped.chat_template = _TEMPLATE.read_text()
    wrapped.save_pretrained(outdir)


EmbeddingInit = Callable[[Any, Any], None]
"""``init(embeddings, tokenizer)``: rewrite a freshly initialised ``vocab_size x hidden`` embedding matrix in place."""


def build_model(
    outdir: Path,
    vocab_size: int,
    token_ids: dict[str, int],
    *,
    tie_word_embeddings: bool = False,
    init_embeddings: EmbeddingInit | None = None,
    tokenizer: Any = None,
) -> None:
    """Save a seeded random Qwen2ForCausalLM (float32, safetensors) and its generation config;
    ``init_embeddings(weight, tokenizer)`` then rewrites its input embeddings (the lm_head too when tied)."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=HIDDEN_SIZE,
        intermediate_size=2 * HIDDEN_SIZE,
        num_hidden_layers=NUM_LAYERS,
        num_attention_heads=NUM_HEADS,
        num_key_value_heads=NUM_HEADS,
        max_position_embeddings=MAX_POSITIONS,
        # The toy model unties: tied random weights just repeat the last token under greedy decoding.
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=token_ids[ENDOFTEXT],
        eos_token_id=token_ids[IM_END],
        pad_token_id=token_ids[ENDOFTEXT],
        use_sliding_window=False,
        dtype="float32",
    )
    torch.manual_seed(SEED)
    model = Qwen2ForCausalLM(config).to(torch.float32).eval()
    if init_embeddings is not None:
        with torch.no_grad():
            init_embeddings(model.model.embed_tokens.weight, tokenizer)
    model.save_pretrained(outdir, safe_serialization=True)
    GenerationConfig(
        bos_token_id=token_ids[ENDOFTEXT],
        eos_token_id=[token_ids[IM_END], token_ids[ENDOFTEXT]],
        pad_token_id=token_ids[ENDOFTEXT],
        do_sample=True,
    ).save_pretrained(outdir)


def build(outdir: Path = DEFAULT_DIR) -> Path:
    """Build the tiny model into ``outdir`` unless a build of the current recipe is already there."""
    return build_staged(outdir, recipe_hash(), SERVED_MODEL_NAME, build_tokenizer)


def build_staged(
    outdir: Path,
    recipe: str,
    served_model_name: str,
    make_tokenizer: Callable[[Path], None],
    *,
    vocab_size: int | None = None,
    tie_word_embeddings: bool = False,
    init_embeddings: EmbeddingInit | None = None,
) -> Path:
    """Build a tokenizer (``make_tokenizer(dir)``) and a random model on it into ``outdir``, unless ``recipe`` is built.

    ``vocab_size`` pads the model's vocabulary past the tokenizer's (as real Qwen2 checkpoints do);
    ``init_embeddings`` rewrites the random embeddings (``build_model``). The build
    happens in a sibling temporary directory and is moved into place at the end, so an interrupted build never
    leaves a half-written model behind.
    """
    outdir = outdir.resolve()
    if is_built(outdir, recipe):
        return outdir
    outdir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{outdir.name}-", dir=outdir.parent))
    try:
        from transformers import AutoTokenizer

        make_tokenizer(staging)
        tokenizer = AutoTokenizer.from_pretrained(staging)
        token_ids = {t: tokenizer.convert_tokens_to_ids(t) for t in (ENDOFTEXT, IM_START, IM_END)}
        vocab_size = vocab_size or len(tokenizer)
        build_model(
            staging,
            vocab_size,
            token_ids,
            tie_word_embeddings=tie_word_embeddings,
            init_embeddings=init_embeddings,
            tokenizer=tokenizer,
        )
        stamp = {"recipe": recipe, "served_model_name": served_model_name, "vocab_size": vocab_size}
        (staging / _STAMP).write_text(json.dumps(stamp, indent=2) + "\n")
        staging.chmod(0o755)  # mkdtemp makes it private; the model is not a secret
        if outdir.exists():
            shutil.rmtree(outdir)
        staging.rename(outdir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return outdir


def main(argv: list[str] | None = None) -> int:
    """Command line: build the tiny model into OUTDIR (default: .cache/tiny-qwen2 in the repo)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir", nargs="?", type=Path, default=DEFAULT_DIR)
    args = parser.parse_args(argv)
    already = is_built(args.outdir)
    path = build(args.outdir)
    print(f"tiny model {'up to date' if already else 'built'}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

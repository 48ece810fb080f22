"""BPE tokenizer trained on the built-in corpus (digits split one by one, punctuation
pre-split, byte-level so that no text is unknown), saved with the run."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from harness.run_layout import RunLayout
from reference_trainer.errors import RunDirError

EOT = "<|endoftext|>"


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """Train a byte-level BPE of ``vocab_size`` tokens, with `EOT` as token 0."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.Punctuation(behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def save_tokenizer(tokenizer: Tokenizer, run_dir: Path) -> Path:
    """Write ``run_dir/tokenizer.json`` atomically (a reader never sees half a file)."""
    path = RunLayout(run_dir).tokenizer
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tokenizer.save(str(tmp))
    os.replace(tmp, path)
    return path


def load_tokenizer(run_dir: Path, vocab_size: int) -> Tokenizer:
    """Read the run's tokenizer and check it is the size the model expects."""
    path = RunLayout(run_dir).tokenizer
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises plain Exception on bad files
        raise RunDirError(f"cannot read the run's tokenizer {path}: {exc}") from exc
    if tokenizer.token_to_id(EOT) != 0 or tokenizer.get_vocab_size() > vocab_size:
        raise RunDirError(
            f"tokenizer {path} does not fit this run: expected {EOT} as id 0 and at most "
            f"{vocab_size} tokens, found {tokenizer.get_vocab_size()}"
        )
    return tokenizer

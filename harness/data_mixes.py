"""The reference trainer's named data mixes, by name: the one list that a suite's
``trainer.data_mix`` is checked against (the trainer holds their weights, in
`reference_trainer.corpus.mixes`; `tests/test_corpus_mixes.py` pins the two)."""

from __future__ import annotations

#: Mix name -> what it draws (``--data-mix NAME``).
DATA_MIXES = {
    "default": "technical_docs 0.4, social_chatter 0.2, product_reviews 0.2, code 0.2",
    "llama": "web 0.60, encyclopedia 0.15, code 0.25",
}

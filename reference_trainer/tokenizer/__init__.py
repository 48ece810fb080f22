"""The tokenizer: a byte-level BPE trained on the corpus (`bpe`), its frequent words kept
whole, its fallback for documents it spells byte by byte, and the cache of trained ones."""

"""The built-in corpus: a deterministic stream of documents mixed from several generated
sources (one file per kind of source), and its named mixes."""

"""The model, its optimizer recipe, and the data it trains on: corpus, tokenizer, streaming
dedup."""

"""The model and its optimizer recipe: the GPT (`gpt`), its stable token embedding, the
parameter groups and learning-rate schedule (`optim`), Sophia-G and 8-bit AdamW."""

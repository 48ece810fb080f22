"""The document stages a document passes before it becomes tokens (`stage`: the protocol):
the duplicate filter, semantic dedup and the toxicity filter, with what they load."""

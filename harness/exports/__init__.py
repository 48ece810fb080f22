"""A run written out in the formats other tools read (docs/exports.md)."""

"""Glue to the tools teams already run tightrope beside (docs/chaostoolkit.md)."""

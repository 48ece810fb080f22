"""The command line (`tightrope`) and the pytest plugin."""

"""``python -m harness``: the `tightrope` command."""

from harness.commands.main import main

if __name__ == "__main__":
    raise SystemExit(main())

"""A job whose file events are not the same from run to run, as two ranks racing to make a
shared folder are not: the first run of a series (``--counter FILE``, outside the run dir,
counts them) writes ``scratch.txt`` before anything else; every later run does not. Then two
saves: ``ckpt.tmp`` written, replaced into ``ckpt``, and a ``latest`` marker.

``python tests/trainers/shifting_events.py --out DIR --counter FILE``. Standard library
only (a crash point's runs here cost no torch import). The test of ``tightrope crashpoints``
that a point is met by its event's op, path and occurrence, not by its number.
"""

from __future__ import annotations

import argparse
import os


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--counter", required=True)
    args = parser.parse_args()
    runs = 0
    if os.path.exists(args.counter):
        with open(args.counter) as f:
            runs = int(f.read())
    with open(args.counter, "w") as f:
        f.write(str(runs + 1))
    os.makedirs(args.out, exist_ok=True)
    if runs == 0:
        with open(os.path.join(args.out, "scratch.txt"), "w") as f:
            f.write("the first run only\n")
    tmp, ckpt = os.path.join(args.out, "ckpt.tmp"), os.path.join(args.out, "ckpt")
    for step in (1, 2):
        with open(tmp, "w") as f:
            f.write(f"step {step}\n")
        os.replace(tmp, ckpt)
        with open(os.path.join(args.out, "latest"), "w") as f:
            f.write(f"{step}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

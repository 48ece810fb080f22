"""``tightrope review RUN_DIR``: the documents the toxicity filter held for review, and the
accept/reject decisions that the trainer honours when it next meets them (docs/data.md)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from harness.records.review import (
    Decision,
    ReviewError,
    append_decision,
    read_decisions,
    read_queue,
)
from harness.run_layout import RunLayout

_EXCERPT = 72  # characters of the excerpt on one listing line


def add_commands(commands: Any) -> None:
    """Add ``review`` to the ``tightrope`` parser."""
    review = commands.add_parser(
        "review",
        help="list documents held for toxicity review; accept or reject them",
        description="List the documents the toxicity filter held out of training as "
        "ambiguous (id, source, score, decision, excerpt), or record decisions: an accepted "
        "document is trained on and a rejected one dropped, without scoring, when the "
        "trainer next meets it (a resume from an earlier checkpoint, or a new run over the "
        "same data). Exit 0 on success, 2 on bad input.",
    )
    review.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    review.add_argument("--accept", action="append", default=[], metavar="ID")
    review.add_argument("--reject", action="append", default=[], metavar="ID")
    review.set_defaults(handler=_review)


def _review(args: argparse.Namespace) -> int:
    layout = RunLayout(args.run_dir)
    if not layout.root.is_dir() or not (layout.config.exists() or layout.journal.is_dir()):
        raise ReviewError(f"{layout.root} is not a run directory (no config.json nor journal/)")
    queue = read_queue(layout.review_queue)
    decisions = read_decisions(layout.review_decisions)
    wanted: list[tuple[str, Decision]] = [(i, "accept") for i in args.accept]
    wanted += [(i, "reject") for i in args.reject]
    if wanted:
        known = {entry.id for entry in queue}
        both = set(args.accept) & set(args.reject)
        if both:
            raise ReviewError(f"both accepted and rejected: {', '.join(sorted(both))}")
        unknown = [doc_id for doc_id, _ in wanted if doc_id not in known]
        if unknown:
            raise ReviewError(
                f"not in the review queue of {layout.root}: {', '.join(unknown)} "
                "(`tightrope review RUN_DIR` lists the ids)"
            )
        for doc_id, decision in wanted:
            append_decision(layout.review_decisions, doc_id, decision)
            print(f"{doc_id}: {decision}ed")
        return 0
    if not queue:
        print(f"no documents held for review in {layout.root}")
        return 0
    print(f"{'id':<16} {'source':<16} {'score':>5}  {'decision':<8} excerpt")
    for entry in queue:
        excerpt = " ".join(entry.excerpt.split())
        if len(excerpt) > _EXCERPT:
            excerpt = excerpt[: _EXCERPT - 3] + "..."
        said: str = decisions.get(entry.id) or "-"
        print(f"{entry.id:<16} {entry.source:<16} {entry.score:5.3f}  {said:<8} {excerpt}")
    pending = sum(entry.id not in decisions for entry in queue)
    print(f"{len(queue)} held, {pending} undecided")
    return 0

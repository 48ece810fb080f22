"""junit.xml: one testsuite, one testcase per scenario, for any CI's test report view."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from harness.running.results import ScenarioResult, SuiteResult
from harness.scorecard.text import clean_text, describe_check, format_score, raw_figure


def _seconds(value: float) -> str:
    return f"{max(value, 0.0):.3f}"


def _properties(parent: ET.Element, values: list[tuple[str, str]]) -> None:
    block = ET.SubElement(parent, "properties")
    for name, value in values:
        ET.SubElement(block, "property", name=name, value=clean_text(value))


def _testcase(parent: ET.Element, suite: str, r: ScenarioResult) -> None:
    case = ET.SubElement(
        parent,
        "testcase",
        classname=clean_text(f"tightrope.{suite}.{r.fault_class}"),
        name=clean_text(r.name),
        time=_seconds(r.seconds),
    )
    # CI trend views (Jenkins, GitLab) chart numeric properties, so every figure is one.
    values: list[tuple[str, str]] = []
    for c in r.checks:
        values.append((c.name, raw_figure(c.figure)))
        values += [(f"{c.name}.{key}", raw_figure(v)) for key, v in c.figures.items()]
    values += [("score", repr(r.score)), ("resilience_score", format_score(100 * r.score))]
    # A cluster's lost attempts (docs/cluster.md): counted, never the trainer's failure.
    values += [("lost_attempts", str(len(r.lost_attempts)))] if r.lost_attempts else []
    _properties(case, values)
    if r.status == "error":
        error = ET.SubElement(
            case, "error", message=clean_text(r.error or "error"), type="ScenarioError"
        )
        exit_code = "killed at its deadline" if r.exit_code is None else f"exit code {r.exit_code}"
        body = [f"{r.error} ({exit_code})"]
        body += [
            f"check failed: {describe_check(c)}" if c.judged else f"check {describe_check(c)}"
            for c in r.failed_checks
        ]
        if r.log_tail.strip():
            body.append(f"\nlog tail:\n{r.log_tail}")
        error.text = clean_text("\n".join(body))
    elif r.status == "failed":
        # A check that was not judged fails the case too; its entry starts "not judged:".
        failed = [c for c in r.failed_checks if c.judged]
        parts = [describe_check(c) for c in r.unjudged_checks]
        if failed:
            summary = "; ".join(describe_check(c) for c in failed)
            parts.insert(0, f"{len(failed)} of {len(r.checks)} checks failed: {summary}")
        kind = "CheckFailed" if failed else "CheckNotJudged"
        failure = ET.SubElement(case, "failure", message=clean_text("; ".join(parts)), type=kind)
        body = [
            f"{describe_check(c)}\n  {c.detail}" if c.judged else describe_check(c)
            for c in r.failed_checks
        ]
        if r.log_tail.strip():
            body.append(f"log tail:\n{r.log_tail}")
        failure.text = clean_text("\n".join(body))
    if r.log_tail.strip():
        ET.SubElement(case, "system-out").text = clean_text(r.log_tail)


def render_junit(result: SuiteResult) -> str:
    """junit.xml's text: failures list the failed and the not-judged checks with their
    figures."""
    counts = result.counts()
    totals = {
        "tests": str(len(result.scenarios)),
        "failures": str(counts["failed"]),
        "errors": str(counts["error"]),
        "skipped": "0",
        "time": _seconds(result.seconds),
    }
    root = ET.Element("testsuites", {"name": "tightrope", **totals})
    suite = ET.SubElement(root, "testsuite", {"name": clean_text(result.suite), **totals})
    if result.started:
        suite.set("timestamp", result.started)
    suite_values = [("preset", result.preset), ("resilience_score", format_score(result.score))]
    suite_values += [
        (f"resilience_score.{name}", format_score(score))
        for name, score in result.class_scores().items()
    ]
    if result.min_score is not None:
        suite_values.append(("min_score", repr(result.min_score)))
    _properties(suite, suite_values)
    for r in result.scenarios:
        _testcase(suite, result.suite, r)
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"

"""scorecard.json: writing it (strict JSON, whatever the figures) and reading it back."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from faults.input_limits import InputLimitError, load_json, read_bytes
from harness.records.journal import NONFINITE, json_safe
from harness.running.results import ScorecardError, SuiteResult

SCORECARD_JSON = "scorecard.json"
#: The largest scorecard.json read: a suite of thousands of scenarios writes a few MB.
MAX_SCORECARD_BYTES = 256 << 20


def _decode_figure(value: Any) -> Any:
    return NONFINITE.get(value, value) if isinstance(value, str) else value


def _decode_checks(data: Any) -> Any:
    # Figures are the only number fields whose type may also be a string, so only
    # they need the non-finite strings turned back into floats; float() does the rest.
    if not isinstance(data, dict) or not isinstance(data.get("scenarios"), list):
        return data
    for scenario in data["scenarios"]:
        checks = scenario.get("checks") if isinstance(scenario, dict) else None
        for check in checks if isinstance(checks, list) else []:
            if not isinstance(check, dict):
                continue
            if "figure" in check:
                check["figure"] = _decode_figure(check["figure"])
            if isinstance(check.get("figures"), dict):
                check["figures"] = {k: _decode_figure(v) for k, v in check["figures"].items()}
    return data


def dumps_scorecard(result: SuiteResult) -> str:
    """scorecard.json's text: `SuiteResult.to_dict`, indented, non-finite floats as strings."""
    # default=str: a stray Path or enum in a scenario's spec must not cost the whole
    # scorecard at the end of a long suite.
    return json.dumps(json_safe(result.to_dict()), indent=2, allow_nan=False, default=str) + "\n"


def scorecard_json_path(path: str | os.PathLike[str]) -> Path:
    """The scorecard.json meant by ``path``: the file itself, or the one in a directory."""
    path = Path(path)
    if path.is_dir():
        inner = path / SCORECARD_JSON
        if not inner.exists():
            raise ScorecardError(f"{path} holds no {SCORECARD_JSON}; is it a scorecard directory?")
        return inner
    if not path.exists():
        raise ScorecardError(f"no scorecard at {path}: the file does not exist")
    return path


def load_scorecard(path: str | os.PathLike[str]) -> SuiteResult:
    """A saved scorecard, from its directory or its scorecard.json."""
    file = scorecard_json_path(path)
    try:
        text = read_bytes(file, "scorecard", MAX_SCORECARD_BYTES).decode("utf-8")
    except UnicodeDecodeError:
        raise ScorecardError(f"{file} is not a scorecard: it is not UTF-8 text") from None
    except OSError as exc:
        raise ScorecardError(f"cannot read scorecard {file}: {exc.strerror}") from None
    except InputLimitError as exc:
        raise ScorecardError(str(exc)) from None
    try:
        data = load_json(text, str(file))
    except InputLimitError as exc:
        raise ScorecardError(str(exc)) from None
    except json.JSONDecodeError as exc:
        raise ScorecardError(
            f"{file} is not a scorecard: not valid JSON (line {exc.lineno}, column {exc.colno}: "
            f"{exc.msg})"
        ) from None
    return SuiteResult.from_dict(_decode_checks(data), where=str(file))

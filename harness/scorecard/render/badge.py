"""badge.svg: a shields-style "resilience | 87" badge for a README or a CI page."""

from __future__ import annotations

import math
from html import escape

GREEN = "#4c1"
YELLOW = "#dfb317"
RED = "#e05d44"
_LABEL_GREY = "#555"

# Verdana 11px advance widths, roughly; shields.io measures the same font. Digits and
# lower-case letters dominate the two texts, so a coarse table is close enough.
_NARROW = set("fijlrt1 .")
_WIDE = set("mwMW%")


def badge_value(score: float) -> int:
    """The whole number a badge shows; 100 only for a perfect score."""
    if not math.isfinite(score):
        return 0
    # Rounding 99.6 up to "100" would claim a perfect run that was not.
    return max(0, min(math.floor(score + 0.5), 99)) if score < 100 else 100


def badge_color(score: float) -> str:
    """Green from 90, yellow from 70, red below (judged on the number the badge shows)."""
    value = badge_value(score)
    if value >= 90:
        return GREEN
    return YELLOW if value >= 70 else RED


def _text_width(text: str) -> float:
    return sum(4.0 if c in _NARROW else 10.0 if c in _WIDE else 7.0 for c in text)


def render_badge(score: float, *, label: str = "resilience", id_prefix: str = "badge") -> str:
    """The badge's SVG text; ``id_prefix`` keeps its ids unique when inlined in a page."""
    value = str(badge_value(score))
    color = badge_color(score)
    left = round(_text_width(label) + 12)
    right = round(_text_width(value) + 12)
    width = left + right
    title = escape(f"{label}: {value}")
    label_text = escape(label)
    grad, clip = f"{id_prefix}-gloss", f"{id_prefix}-round"
    texts = []
    for text, centre in ((label_text, left / 2), (value, left + right / 2)):
        # A dark copy one pixel lower is the shields look: legible on any fill.
        texts.append(
            f'<text x="{centre:.1f}" y="15" fill="#010101" fill-opacity=".3">{text}</text>'
            f'<text x="{centre:.1f}" y="14">{text}</text>'
        )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="20" '
        f'role="img" aria-label="{title}" class="badge">'
        f"<title>{title}</title>"
        f'<linearGradient id="{grad}" x2="0" y2="100%">'
        '<stop offset="0" stop-color="#bbb" stop-opacity=".1"/>'
        '<stop offset="1" stop-opacity=".1"/></linearGradient>'
        f'<clipPath id="{clip}"><rect width="{width}" height="20" rx="3" fill="#fff"/></clipPath>'
        f'<g clip-path="url(#{clip})">'
        f'<rect width="{left}" height="20" fill="{_LABEL_GREY}"/>'
        f'<rect x="{left}" width="{right}" height="20" fill="{color}"/>'
        f'<rect width="{width}" height="20" fill="url(#{grad})"/></g>'
        '<g fill="#fff" text-anchor="middle" '
        'font-family="Verdana,Geneva,DejaVu Sans,sans-serif" font-size="11">'
        f"{''.join(texts)}</g></svg>\n"
    )

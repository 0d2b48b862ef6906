"""The report's sentences: one Jinja2 template per section (`normprop_cli/templates/<name>.md.j2`),
filled from that section's table of facts, so the numbers a paragraph states are computed in one place
and its words are written in another.

A template is markdown with Jinja2's `{{ fact }}` and `{% if %}`/`{% for %}`; `render` drops the
lines that hold only a block tag, so templates can be written one clause per line. Within a paragraph
(text between blank lines) the lines are soft-wrapped: they join with one space into a single line,
except a line that starts a table row (`|`) or a list item (`- `, `* `, `1. `), which keeps its own
line. Lines lose their indentation, except list items (a nested list). Paragraphs that render empty
are dropped. Undefined facts are errors (StrictUndefined), never blank text.

Filters besides Jinja2's own: `ci` ((mean, low, high) as statistics.format_ci writes it, digits
optional), `mean_ci` (a mean_ci mapping), `fmt` (a Python format spec: `{{ x | fmt(".3f") }}`) and
`signed` (`+0.12` / `-0.12`, a spec optional)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from functools import cache

from normprop_cli.statistics import format_ci, format_mean_ci

_KEEPS_LINE = re.compile(r"^\s*(\||[-*] |\d+\. )")
_LIST_ITEM = re.compile(r"^\s*([-*] |\d+\. )")  # keeps its indentation (a nested list); other lines lose theirs


def _ci(triple: Sequence[float], digits: int = 2) -> str:
    mean, low, high = (float(v) for v in triple)
    return format_ci(mean, low, high, digits)


def _fmt(value, spec: str = "g") -> str:
    return format(value, spec)


def _signed(value, spec: str = ".2f") -> str:
    return format(value, "+" + spec)


@cache
def environment():
    """The one Jinja2 environment of the report's templates."""
    from jinja2 import Environment, PackageLoader, StrictUndefined

    env = Environment(
        loader=PackageLoader("normprop_cli", "templates"),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
        keep_trailing_newline=False,
    )
    env.filters.update(ci=_ci, mean_ci=format_mean_ci, fmt=_fmt, signed=_signed)
    return env


def unwrap(text: str) -> list[str]:
    """The paragraphs of rendered text: blank lines part them, soft-wrapped lines join with a space,
    table rows and list items keep their lines, empty paragraphs go."""
    out = []
    for block in re.split(r"\n\s*\n", text):
        lines: list[str] = []
        for line in block.split("\n"):
            if not line.strip():
                continue
            if _KEEPS_LINE.match(line) or not lines:
                lines.append(line.rstrip() if _LIST_ITEM.match(line) else line.strip())
            else:
                lines[-1] = f"{lines[-1]} {line.strip()}"
        if lines:
            out.append("\n".join(lines))
    return out


def render(name: str, facts: Mapping) -> list[str]:
    """The paragraphs of template `name` (templates/<name>.md.j2) filled from `facts`."""
    return unwrap(environment().get_template(f"{name}.md.j2").render(**facts))


def text(name: str, facts: Mapping) -> str:
    """`render`'s paragraphs as one text, parted by a blank line as the report parts paragraphs (a section
    part that its caller hands on as one string)."""
    return "\n\n".join(render(name, facts))


def render_string(source: str, facts: Mapping) -> list[str]:
    """`render` of a template given as text (tests, and sentences too short for a file of their own)."""
    return unwrap(environment().from_string(source).render(**facts))

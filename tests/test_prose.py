"""The report's sentence renderer (normprop_cli/prose.py) and its templates: words in the templates,
numbers from each section's table of facts, no claim id written into a sentence."""

import re
import textwrap
from pathlib import Path

import jinja2
import pytest

import normprop_cli
from normprop_cli import prose
from normprop_cli.statistics import format_ci

PACKAGE = Path(normprop_cli.__file__).parent
TEMPLATES = sorted((PACKAGE / "templates").glob("*.md.j2"))
CLAIM_ID = re.compile(r"\bC[1-9]\b")


def test_soft_wrapped_lines_join_and_tables_and_lists_keep_their_lines():
    source = textwrap.dedent("""\
    {% if shown %}
    NormProp's error is
      {{ x | fmt(".1f") }}%
    here.
    {% endif %}

    | a | b |
    |---|---|
    | 1 | 2 |

    - first item,
      wrapped
    - second
    """)
    assert prose.render_string(source, {"shown": True, "x": 7.25}) == [
        "NormProp's error is 7.2% here.",
        "| a | b |\n|---|---|\n| 1 | 2 |",
        "- first item, wrapped\n- second",
    ]


def test_a_paragraph_that_renders_empty_is_dropped():
    source = "First.\n\n{% if shown %}\nHidden.\n{% endif %}\n\n\nLast."
    assert prose.render_string(source, {"shown": False}) == ["First.", "Last."]


def test_an_undefined_fact_is_an_error_not_blank_text():
    with pytest.raises(jinja2.UndefinedError):
        prose.render_string("The gap is {{ gap }} pp.", {})


def test_the_interval_filter_writes_what_the_tables_write():
    triple = (1.23456, -0.5, 2.999)
    assert prose.render_string("{{ t | ci }}; {{ t | ci(3) }}", {"t": triple}) == [
        f"{format_ci(*triple)}; {format_ci(*triple, 3)}"
    ]
    assert prose.render_string("{{ d | signed }}", {"d": 0.5}) == ["+0.50"]


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.name)
def test_a_template_states_no_measured_number_and_no_claim_id(path):
    """A decimal in a template would be a number not read from the section's facts; a claim id in a
    sentence would outlive a renumbering of conf/claims.yaml (the facts carry it)."""
    text = path.read_text()
    prose.environment().parse(text)
    assert re.findall(r"\d\.\d", text) == []
    assert CLAIM_ID.findall(text) == []


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.name)
def test_every_template_is_rendered_by_the_package(path):
    name = path.name.removesuffix(".md.j2")
    code = "\n".join(p.read_text() for p in PACKAGE.rglob("*.py"))
    assert f'"{name}"' in code, f"no module renders {path.name}"

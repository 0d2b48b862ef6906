"""The report's sentence renderer (normprop_cli/prose.py) and its templates: words in the templates,
numbers from each section's table of facts, no claim id written into a sentence."""

import ast
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


def _docstrings(tree: ast.AST) -> set[int]:
    kinds = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, kinds) and node.body and isinstance(node.body[0], ast.Expr)
    }


def claim_ids_in_prose(source: str) -> list[str]:
    """The strings of a module's code (docstrings aside) that write a claim id into words."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docs
        and " " in node.value.strip()
        and CLAIM_ID.search(node.value)
    ]


def test_no_sentence_of_the_package_spells_a_claim_id():
    """A sentence takes its claim's id from conf/claims.yaml, so renumbering the claims renumbers the report."""
    found = {
        path.relative_to(PACKAGE).as_posix(): hits
        for path in sorted(PACKAGE.rglob("*.py"))
        if (hits := claim_ids_in_prose(path.read_text()))
    }
    assert found == {}


def test_the_claim_id_scan_sees_an_f_string_and_spares_a_docstring_and_a_lookup():
    source = 'def f(c):\n    """C8\'s measure."""\n    x = claims["C8"]\n    return f"{c} fails C8 here"\n'
    assert claim_ids_in_prose(source) == [" fails C8 here"]

"""The README and docs/ hold together: every relative link reaches a file (and a heading, for an anchor),
every `normprop ...` command they show parses (the subcommand and each --option exist), the README stays
short and narrow, its prose states no number that `normprop report` does not write there or a committed
source does not give, and no page tells history (no "session", no commit hash)."""

import re
from pathlib import Path

import pytest
import typer

from normprop_cli.cli import app

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(```|~~~)")
LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
MARKERS = ("<!-- verdicts:start -->", "<!-- verdicts:end -->")


def rel(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def split(text: str) -> tuple[list[str], list[list[str]]]:
    """The page's lines outside fenced code blocks (blanked inside them, so line numbers hold), and the
    blocks' lines."""
    prose, blocks, block = [], [], None
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            if block is None:
                block = []
            else:
                blocks.append(block)
                block = None
            prose.append("")
        elif block is not None:
            block.append(line)
            prose.append("")
        else:
            prose.append(line)
    assert block is None, "an unclosed code fence"
    return prose, blocks


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped but hyphens and underscores, spaces to hyphens."""
    text = re.sub(r"`|\*\*?|__?", "", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    prose, _ = split(page.read_text())
    seen: dict[str, int] = {}
    out = set()
    for line in prose:
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            out.add(base if n == 0 else f"{base}-{n}")
            seen[base] = n + 1
    return out


def links(page: Path) -> list[str]:
    prose, _ = split(page.read_text())
    return [m.group(1) for m in LINK.finditer("\n".join(prose))]


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_relative_link_reaches_a_file_and_its_heading(page):
    for target in links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        where = (page.parent / path).resolve() if path else page
        assert where.exists(), f"{rel(page)}: {target} does not exist"
        if anchor:
            assert where.suffix == ".md", f"{rel(page)}: {target}: an anchor into a file that is not markdown"
            assert anchor in anchors(where), f"{rel(page)}: {target}: no such heading in {rel(where)}"


def test_every_page_of_docs_is_linked_from_the_readme():
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in links(ROOT / "README.md") if not t.startswith("http")}
    assert [rel(p) for p in PAGES[1:] if p.resolve() not in linked] == []


def test_the_link_checker_sees_a_broken_link_and_a_broken_anchor(tmp_path):
    (tmp_path / "a.md").write_text("# A\n\n## The `run` command\n\n[x](b.md) [y](#the-run-command) [z](#nope)\n")
    assert links(tmp_path / "a.md") == ["b.md", "#the-run-command", "#nope"]
    assert anchors(tmp_path / "a.md") == {"a", "the-run-command"}
    assert slug("Runs that never lose work") == "runs-that-never-lose-work"
    assert slug("make gpu-check") == "make-gpu-check"


# --- the commands shown ------------------------------------------------------------------------------


def commands(page: Path) -> list[str]:
    """Every `normprop ...` command the page shows: a code block's line that starts with it (with the lines
    indented under it, the options of a long command), and inline code that starts with it."""
    text = page.read_text()
    prose, blocks = split(text)
    found = []
    for block in blocks:
        current = None
        for line in block:
            stripped = re.sub(r"^(\$ |\.venv/bin/)", "", line.strip())
            if re.match(r"normprop(\s|$)", stripped):
                current = stripped
                found.append(current)
            elif current is not None and line.startswith(" ") and stripped.startswith("["):
                found[-1] += " " + stripped  # a long command's options, wrapped under it
            else:
                current = None
    for m in re.finditer(r"`([^`]+)`", "\n".join(prose)):
        code = re.sub(r"^(\.venv/bin/)", "", m.group(1).strip())
        if re.match(r"normprop(\s|$)", code):
            found.append(" ".join(code.split()))
    return [re.split(r"\s#\s", c)[0].strip() for c in found]  # a shell comment is no part of the command


def options_of(param) -> set[str]:
    return {o for o in (*param.opts, *getattr(param, "secondary_opts", ())) if o.startswith("-")}


@pytest.fixture(scope="module")
def cli():
    group = typer.main.get_command(app)
    top = set().union(*(options_of(p) for p in group.params)) | {"--help"}
    subcommands = {
        name: set().union(*(options_of(p) for p in command.params)) | {"--help"}
        for name, command in group.commands.items()
    }
    return top, subcommands


def problems(command: str, cli) -> list[str]:
    """What does not parse in `command`: an unknown subcommand, an option the subcommand lacks."""
    top, subcommands = cli
    words = command.split()[1:]
    options = re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", command)
    if not words or words[0].startswith("-"):
        return [f"{o} is not an option of normprop" for o in options if o not in top]
    name = words[0]
    if name not in subcommands:
        return [f"no command {name!r}"]
    return [f"{o} is not an option of normprop {name}" for o in options if o not in subcommands[name]]


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_command_shown_parses(page, cli):
    shown = commands(page)
    wrong = {c: p for c in shown if (p := problems(c, cli))}
    assert wrong == {}


def test_the_commands_are_found_and_a_wrong_one_is_caught(cli):
    readme = commands(ROOT / "README.md")
    assert "normprop reproduce-all --results-dir /tmp/fresh" in readme
    assert any(c.startswith("normprop list") for c in readme)
    assert problems("normprop run table1 --preset paper --jobs 2", cli) == []
    assert problems("normprop run table1 --no-such-option", cli) == [
        "--no-such-option is not an option of normprop run"
    ]
    assert problems("normprop report --seeds 2", cli) == ["--seeds is not an option of normprop report"]
    assert problems("normprop frobnicate", cli) == ["no command 'frobnicate'"]
    assert problems("normprop gpu-check --tests/--no-tests", cli) == []


# --- the README's shape, and no history ----------------------------------------------------------------


def test_the_readme_is_short_and_narrow():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    prose, _ = split(text)
    generated = False
    for number, line in enumerate(prose, 1):
        if line.strip() in MARKERS:
            generated = line.strip() == MARKERS[0]  # the verdict table: `normprop report` writes it
            continue
        if not generated and not line.lstrip().startswith("|"):
            assert len(line) <= 120, f"README.md:{number} is {len(line)} characters"


@pytest.mark.parametrize("page", PAGES[1:], ids=rel)
def test_every_page_of_docs_is_at_most_400_lines(page):
    assert len(page.read_text().splitlines()) <= 400


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_no_page_speaks_of_sessions(page):
    assert re.findall(r"\bsession\b", page.read_text(), re.I) == []


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_no_commit_hash(page):
    found = [(n + 1, h) for n, line in enumerate(page.read_text().splitlines()) for h in HASH.findall(line)]
    assert found == []


def test_a_commit_hash_is_seen_and_words_of_hex_letters_or_digits_alone_are_not():
    text = "at 5ba05ea and f71c051, not avx512 nor 1234567 nor deadbeef nor float32, bfloat16, sm90 or 3x32x32"
    assert HASH.findall(text) == ["5ba05ea", "f71c051"]


# --- the README's numbers ---------------------------------------------------------------------------------

NUMBER = re.compile(r"[\w.,:%/+-]*\d[\w.,:%/+-]*")
# What the README's prose may quote: the paper's citation, the claims' ids and words, the data sets' names.
SOURCES = [ROOT / "CITATION.cff", ROOT / "pyproject.toml", ROOT / "conf" / "claims.yaml",
           *sorted((ROOT / "conf" / "dataset").glob("*.yaml"))]  # fmt: skip


def numbers(text: str) -> set[str]:
    return {t.strip(".,:;") for t in NUMBER.findall(text)}


def prose_numbers(text: str) -> list[tuple[int, str]]:
    """(line, token) of every digit-bearing word of the README outside what `normprop report` writes
    (between the markers), code blocks, inline code and link targets."""
    prose, _ = split(text)
    found, generated = [], False
    for number, line in enumerate(prose, 1):
        if line.strip() in MARKERS:
            generated = line.strip() == MARKERS[0]
            continue
        if not generated:
            line = re.sub(r"\]\([^)]*\)", "]", re.sub(r"`[^`]*`", "", line))
            found += [(number, t) for t in sorted(numbers(line))]
    return found


def test_every_number_in_the_readmes_prose_is_generated_or_given_by_a_committed_source():
    allowed = set().union(*(numbers(p.read_text()) for p in SOURCES))
    stray = [(n, t) for n, t in prose_numbers((ROOT / "README.md").read_text()) if t not in allowed]
    assert stray == [], "a number the README states by hand: have `normprop report` write it, or leave it out"


def test_the_number_check_sees_a_stray_number_and_not_a_generated_one():
    text = f"A step took 1.09 times as long.\n{MARKERS[0]}\n| C1 | 0.01 [-0.60, 0.63] pp |\n{MARKERS[1]}\n"
    text += "Run `make reproduce-all` ([x](a/b2.md)) on C5.\n```\nx = torch.randn(2, 1, 8, 8)\n```\n"
    assert prose_numbers(text) == [(1, "1.09"), (5, "C5")]


def test_the_first_screen_says_what_normprop_is_what_it_found_on_what_evidence_and_the_two_commands():
    first = "\n".join((ROOT / "README.md").read_text().splitlines()[:40])
    assert "Normalization Propagation" in first
    assert MARKERS[0] in first and MARKERS[1] in first  # the findings, whole
    assert "strongest evidence" in first and "width" in first and "CIFAR-10" in first and "quick preset" in first
    assert "`make reproduce-all`" in first and "`make test`" in first

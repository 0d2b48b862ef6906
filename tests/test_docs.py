"""The configs' comments and the docs say what the code does: `normprop list` gives whole sentences, the
seeds and epochs a comment names are the composed ones, every preset is listed, the times the README, the
presets and the configs give are those of docs/performance.md's table of measurements, the presets' workers
are the composed ones, and docs/experiments.md has a section for every experiment, theory's naming the
figures it draws."""

import re
from pathlib import Path

import pytest

from normprop_cli import config
from normprop_cli.experiments.theory.figures import FIGURES

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"
CONF = ROOT / "conf"


def header(group: str, name: str) -> str:
    """The YAML's leading comment block up to its examples (indented) or its first key, in one line."""
    lines = (CONF / group / f"{name}.yaml").read_text().splitlines()
    lines = [line for line in lines if "@package" not in line]
    end = next((i for i, line in enumerate(lines) if not line.startswith("#") or line.startswith("#  ")), len(lines))
    return " ".join(line.lstrip("#").strip() for line in lines[:end])


def balanced(text: str) -> bool:
    depth = 0
    for ch in text:
        depth += (ch in "([") - (ch in ")]")
        if depth < 0:
            return False
    return depth == 0


@pytest.mark.parametrize(
    "group, name", [(g, n) for g in ("experiment", "dataset", "preset") for n in config.options(g)]
)
def test_list_descriptions_are_whole_sentences_of_the_header(group, name):
    text = config.describe(group, name)
    assert text and "\n" not in text
    assert balanced(text), text  # never cut inside parentheses
    assert text.endswith("."), text  # ends at a sentence's end...
    full = header(group, name)
    assert full.startswith(text)  # ...of the header, from its start
    rest = full[len(text) :]
    assert rest == "" or re.match(r"\s+[A-Z`]", rest), rest[:40]  # and the next sentence starts there


def test_describe_reads_a_sentence_over_lines_and_past_abbreviations(tmp_path, monkeypatch):
    (tmp_path / "preset").mkdir()
    (tmp_path / "preset" / "x.yaml").write_text(
        "# @package _global_\n# Fig. 4 (section 5.4: one\n# clause. Two) ends here: yes. Next one.\n"
        "#   normprop run x   (an example)\nseeds: 1\n"
    )
    monkeypatch.setattr(config, "conf_dir", lambda: tmp_path)
    assert config.describe("preset", "x") == "Fig. 4 (section 5.4: one clause. Two) ends here: yes."


def claimed_budgets():
    """(experiment, preset, seeds, epochs or None) for each `normprop run` example line naming 'N seeds'."""
    for exp in config.options("experiment"):
        for line in (CONF / "experiment" / f"{exp}.yaml").read_text().splitlines():
            m = re.match(rf"#\s+normprop run {re.escape(exp)}\b(.*?)\((.*)", line)
            budget = m and re.search(r"(\d+) seeds(?: x (\d+) epochs)?", m.group(2))
            if budget:
                preset = re.search(r"--preset (\w+)", m.group(1))
                epochs = budget.group(2) and int(budget.group(2))
                yield exp, preset.group(1) if preset else "quick", int(budget.group(1)), epochs


@pytest.mark.parametrize("exp, preset, seeds, epochs", list(claimed_budgets()))
def test_the_seeds_and_epochs_an_experiment_comment_names_are_the_presets(exp, preset, seeds, epochs):
    cfg = config.load(exp, preset=preset)
    assert cfg.seeds == seeds
    assert epochs is None or cfg.train.epochs == epochs


def test_the_root_config_lists_every_preset():
    line = next(line for line in (CONF / "config.yaml").read_text().splitlines() if "preset/<name>.yaml" in line)
    listed = set(re.findall(r"[a-z]+", line.split("preset/<name>.yaml", 1)[1]))
    assert listed == set(config.options("preset"))


def minutes(text: str) -> float:
    """The first 'N h M min', 'N min S s' or 'S s' of `text`, in minutes."""
    m = re.search(r"(?:(\d+) h )?(\d+) min(?: (\d+) s)?|(\d+) s\b", text)
    if m.group(4):
        return int(m.group(4)) / 60
    return int(m.group(1) or 0) * 60 + int(m.group(2)) + int(m.group(3) or 0) / 60


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split(" | ")]


def table(text: str, *columns: str) -> list[dict[str, str]]:
    """The rows of the first markdown table in `text` whose header starts with `columns`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| " + " | ".join(columns) + " |"))
    header = cells(lines[start])
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(header, cells(line), strict=True)))
    return rows


def wall_times() -> list[dict[str, str]]:
    """docs/performance.md's one table of measured wall times: date, CPU, command, time."""
    text = (DOCS / "performance.md").read_text().split("## Measured wall times", 1)[1]
    rows = table(text, "date")
    assert rows and set(rows[0]) == {"date", "CPU model and cores", "command", "time"}
    return rows


def quick_measurement() -> tuple[dict[str, str], list[dict[str, str]]]:
    """The row of the quick preset's whole `reproduce-all` from empty (all ten experiments) and the rows of
    its parts, measured in the same run and listed right under it: timing alone, the others together, the
    report."""
    rows = wall_times()
    wholes = [
        i
        for i, r in enumerate(rows)
        if re.match(r"`(make|normprop) reproduce-all[` ]", r["command"]) and "all ten" in r["command"]
    ]
    assert len(wholes) == 1, "one measurement of each command: the newest"
    whole = rows[wholes[0]]
    parts = []
    for r in rows[wholes[0] + 1 :]:
        if not r["command"].startswith("within it"):
            break
        parts.append(r)
    assert all(r["CPU model and cores"] == whole["CPU model and cores"] for r in parts)
    return whole, parts


def test_the_quick_presets_time_is_the_measurement():
    whole, parts = quick_measurement()
    times = [p["time"] for p in parts if "report" not in p["command"]]  # timing alone, the others together
    assert len(times) >= 2
    total = minutes(whole["time"])
    # the parts add up to the whole, but for the configs composed before the first experiment (seconds)
    assert 0 <= total - sum(minutes(p["time"]) for p in parts) < 10 / 60
    comment = header("preset", "quick")
    assert int(re.search(r"about (\d+) minutes", comment)[1]) == round(total)
    assert all(t in comment for t in times)
    # The README's findings call the quick preset a quarter-hour demonstration, and the presets table states
    # the measurement.
    assert "quarter-hour demonstration" in README and 10 <= total <= 20


def test_the_cpu_presets_header_gives_its_measured_times_and_the_presets_table_none():
    times = [r["time"] for r in wall_times() if re.search(r"PRESET=cpu|--preset cpu", r["command"])]
    assert len(times) == 2 and all(t in header("preset", "cpu") for t in times)
    # A time is stated once in docs/, in performance.md's table: the presets table points there.
    text = (DOCS / "presets-and-data.md").read_text()
    assert "performance.md#measured-wall-times" in text
    assert not re.search(r"\d+ (min|h|hours|minutes)\b", text.split("## Presets", 1)[1].split("\n### ", 1)[0])


def test_every_wall_time_names_its_date_cpu_and_command():
    for row in wall_times():
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", row["date"]), row
        assert "cores" in row["CPU model and cores"], row
        assert re.match(r"`(make|normprop) ", row["command"]) or row["command"].startswith("within it"), row
        assert minutes(row["time"]) > 0, row


def test_the_presets_table_lists_every_preset_and_the_fashion_preset_its_experiments():
    text = (DOCS / "presets-and-data.md").read_text()
    rows = table(text, "preset")
    assert {re.match(r"`([a-z]+)`", r["preset"])[1] for r in rows} == set(config.options("preset"))
    listed = list(config.root("fashion").preset.experiments)
    fashion = next(r for r in rows if r["preset"] == "`fashion`")["what it is for"]
    named = re.search(r"experiments on real images \(([^)]*)\)", fashion)[1].split(", ")
    assert named == listed
    words = {6: "six", 7: "seven", 8: "eight", 9: "nine", 10: "ten"}
    assert f"`fashion`: {words[len(listed)]} experiments" in README


def jobs(preset: str, experiment: str) -> int:
    return int(config.load(experiment, preset=preset).jobs)


def test_the_workers_table_gives_the_composed_jobs():
    rows = {r["preset"]: r["workers"] for r in table((DOCS / "presets-and-data.md").read_text(), "preset", "workers")}
    for preset in ("quick", "cpu"):
        assert rows["`quick`, `cpu`"].startswith(f"{jobs(preset, 'data-norm')} of one thread")
        assert f"normalizers {jobs(preset, 'normalizers')}" in rows["`quick`, `cpu`"]
    assert rows["`fashion`"].startswith(f"{jobs('fashion', 'data-norm')}, normalizers included")
    assert jobs("fashion", "normalizers") == jobs("fashion", "data-norm")
    assert rows["`paper`, `smoke`"] == str(jobs("paper", "data-norm")) == str(jobs("smoke", "data-norm"))


def experiment_section(name: str) -> str:
    text = (DOCS / "experiments.md").read_text()
    return text.split(f"\n## {name}\n", 1)[1].split("\n## ", 1)[0]


@pytest.mark.parametrize("name", config.options("experiment"))
def test_every_experiment_has_its_section_saying_where_the_paper_has_it(name):
    where = re.sub(r"\s*\(.*\)", "", str(config.load(name).experiment.paper))  # "Fig. 2, section 5.2"
    first_paragraph = experiment_section(name).strip().split("\n\n", 1)[0]
    assert where.lower() in first_paragraph.lower(), (where, first_paragraph[:80])


def test_the_theory_section_names_every_figure_it_draws():
    section = experiment_section("theory")
    for stem in FIGURES:
        assert f"`{stem}.png`" in section, stem

"""The configs' comments and the README say what the code does: `normprop list` gives whole
sentences, the seeds and epochs a comment names are the composed ones, every preset is listed, the times
agree with the measurements, and the theory row names the figures the experiment draws."""

import re
from pathlib import Path

import pytest

from normprop_cli import config
from normprop_cli.experiments.theory.figures import FIGURES

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
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
    m = re.fullmatch(r"(\d+) min(?: (\d+) s)?", text)
    return int(m.group(1)) + int(m.group(2) or 0) / 60


def test_the_quick_presets_time_is_the_readmes_measurement():
    measured = README.split("Measured on this project's", 1)[1].split("\n\n", 1)[0]
    quick = measured.split("PRESET=cpu", 1)[0]
    parts = re.findall(r"(\d+ min \d+ s)", quick)  # the eight, activations, normalizers
    total = sum(minutes(p) for p in parts)
    assert len(parts) == 3 and round(total) == int(re.search(r"all ten come to about (\d+) minutes", quick)[1])
    comment = header("preset", "quick")
    claimed = int(re.search(r"about (\d+) minutes", comment)[1])
    assert claimed == round(total)
    assert all(p in comment for p in parts)


def test_the_presets_table_gives_the_cpu_presets_measured_times():
    measured = README.split("Measured on this project's", 1)[1].split("\n\n", 1)[0].split("PRESET=cpu", 1)[1]
    times = re.findall(r"(\d+ min \d+ s)", measured)
    row = next(line for line in README.splitlines() if line.startswith("| `cpu` |"))
    assert len(times) == 2 and all(t in row for t in times)
    assert not re.search(r"about \d+ minutes", row)  # no other figure beside the measurements
    assert all(t in header("preset", "cpu") for t in times)


def test_the_theory_row_names_every_figure_it_draws():
    row = next(line for line in README.splitlines() if line.startswith("| `normprop run theory` |"))
    for stem in FIGURES:
        assert f"`{stem}.png`" in row, stem

"""Were the budgets and the rule fixed before the results they judge? Per results tree (preset) and
experiment, from git: the commit of the last change of its budget and rule values, the first result it
judges, and every such value changed after that result (old -> new, commit, committer date).
`budget_text.budget_section` is the report's table for one results tree.

The values: conf/config.yaml, conf/dataset/<dataset>.yaml and conf/model/<model>.yaml (under `dataset.`
and `model.`), conf/experiment/<experiment>.yaml, conf/experiment_dataset/<experiment>_<dataset>.yaml,
conf/preset/<preset>.yaml, conf/experiment_preset/<experiment>_<preset>.yaml, merged in that order
(conf/config.yaml's defaults): a later file's key wins, a `grid` replaces the earlier one whole. This
approximates Hydra's composition (no interpolation, no command-line overrides, of `defaults` only
config.yaml's model; the data sets are the tree's results/<tree>/<experiment>/<dataset>/ directories).
The budget keys: BUDGET_KEYS, every key under experiment.lr_sweep, and of the grid its ids in order
(grid.ids), each entry's seeds (grid.<id>.seeds) and the budget keys its `set` gives
(grid.<id>.train.batch_size, ...); learning rates and other settings are not budgets. The rule: `kind`,
`margin` and `relative_to` of each claim in conf/claims.yaml on the experiment (claims.<id>.margin, ...);
the rule's code (verdicts/rule.py) is not followed.

Values, not text: the files are read as YAML at every commit that touched one (`git log --reverse`), so
a comment edit is no change; an absent file gives nothing, an unset key reads as null. The working
tree's values that differ from HEAD's are "uncommitted", changed after every result. The first result
judged: the earliest `started` of results/<tree>/<experiment>/*/runs/*/manifest.json, sweep runs
included. Runs seen and then removed (manifests a commit deleted; a tree outside the checkout, a copy,
is looked for under config.yaml's results_dir) that started before it: the values changed between the
first of them and the first result judged are listed too. Without git (no .git, no git, a shallow
clone) the section says so in one line; a git failure never raises here.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import yaml

from normprop_cli.io import parse_yaml

BUDGET_KEYS = frozenset({
    "seed", "seeds", "train.epochs", "train.lr_halve_every", "train.batch_size", "train.max_steps",
    "train.probe_images", "dataset.limit", "dataset.train_limit", "model.width", "experiment.early_epochs",
    "experiment.epochs", "experiment.batch_sizes", "experiment.lr_halve_every", "experiment.methods",
    "experiment.extra_seeds",
    "experiment.warmup_epochs", "theory.propagation_seeds", "theory.depth", "theory.width", "theory.batch",
})  # fmt: skip
BUDGET_PREFIXES = ("experiment.lr_sweep.", "experiment.extra_seeds.")
RULE_FIELDS = ("kind", "margin", "relative_to")
UNCOMMITTED = "uncommitted"
WORKTREE = ""  # the working tree's files, as a "commit" to read them at
UNSET = type("Unset", (), {"__repr__": lambda self: "unset"})()  # a key no file gives


@dataclass(frozen=True)
class Change:
    """One value changed: its key, old and new value (UNSET where no file gave it), the commit's short
    hash ("uncommitted" for the working tree) and its committer date (None for the working tree)."""

    key: str
    old: object
    new: object
    commit: str
    date: datetime | None


@dataclass(frozen=True)
class Budget:
    """One experiment of one results tree: the last commit that changed its values ("" where none did),
    whether the working tree changes them further, the first result it judges (None: no manifest), the
    changes after it; runs removed before it (the earliest's start, the commits that removed them) and
    the changes between the two (`before_rerun`)."""

    experiment: str
    commit: str
    date: datetime | None
    uncommitted: bool
    first_result: datetime | None
    changes: tuple[Change, ...]
    removed_first: datetime | None = None
    removed_in: tuple[str, ...] = ()
    before_rerun: tuple[Change, ...] = ()


def _git(repo: Path, *args: str, stdin: bytes | None = None) -> bytes | None:
    """git's stdout in `repo`, None where git is missing or fails."""
    try:
        done = subprocess.run(["git", *args], cwd=repo, input=stdin, capture_output=True, check=False, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def checkout(start: Path) -> Path | None:
    """The directory holding conf/config.yaml: `start` or one above it, else the package's checkout."""
    start = Path(start).resolve()
    for directory in (start, *start.parents, Path(__file__).resolve().parents[2]):
        if (directory / "conf" / "config.yaml").is_file():
            return directory
    return None


def git_top(repo: Path | None) -> tuple[Path | None, str]:
    """(the git work tree's top, "") or (None, a sentence saying why there is no history)."""
    if repo is None:
        return None, "Budget history unavailable: no conf/config.yaml found beside the results or the package."
    top = _git(repo, "rev-parse", "--show-toplevel")
    if top is None:
        return None, "Budget history unavailable: the configs are not in a git checkout (or git is missing)."
    if (_git(repo, "rev-parse", "--is-shallow-repository") or b"").strip() == b"true":
        return None, "Budget history unavailable: the checkout is a shallow clone (`git fetch --unshallow`)."
    return Path(top.decode().strip()), ""


def parse_time(text: str) -> datetime | None:
    """An ISO time as an aware datetime (UTC where it names no offset); None where it is no time."""
    try:
        value = datetime.fromisoformat(str(text).strip())
    except ValueError:
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def first_result(tree: Path, experiment: str) -> datetime | None:
    """The earliest `started` of the experiment's run manifests in the tree, sweep runs included."""
    times = [_started(p.read_bytes()) for p in Path(tree).glob(f"{experiment}/*/runs/*/manifest.json") if p.is_file()]
    return min((t for t in times if t), default=None)


def flatten(data: object, prefix: str = "") -> dict[str, object]:
    """Dotted keys of nested mappings; a list is one value. The top-level `grid` becomes grid.ids and,
    per entry, grid.<id>.seeds and grid.<id>.<key> for each key of its `set`."""
    out: dict[str, object] = {}
    if not isinstance(data, dict):
        return out
    for key, value in data.items():
        if not prefix and key == "grid" and isinstance(value, list):
            out |= _grid(value)
        elif isinstance(value, dict):
            out |= flatten(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def _grid(entries: list) -> dict[str, object]:
    entries = [e for e in entries if isinstance(e, dict)]
    out: dict[str, object] = {"grid.ids": [e.get("id") for e in entries]}
    for e in entries:
        if "seeds" in e:
            out[f"grid.{e.get('id')}.seeds"] = e["seeds"]
        for key, value in flatten(e.get("set") or {}).items():
            out[f"grid.{e.get('id')}.{key}"] = value
    return out


def is_budget(key: str) -> bool:
    if key.startswith("grid."):
        return key == "grid.ids" or key.endswith(".seeds") or is_budget(key.split(".", 2)[2])
    return key in BUDGET_KEYS or key.startswith(BUDGET_PREFIXES)


def files(conf: str, experiment: str, preset: str, dataset: str, model: str) -> list[tuple[str, str]]:
    """(path from the git top, the package it lands in) of every file of one experiment's values, in
    the order Hydra composes them (a later one wins)."""
    parts = [("config.yaml", ""), (f"dataset/{dataset}.yaml", "dataset."), (f"model/{model}.yaml", "model."),
             (f"experiment/{experiment}.yaml", ""), (f"experiment_dataset/{experiment}_{dataset}.yaml", ""),
             (f"preset/{preset}.yaml", ""), (f"experiment_preset/{experiment}_{preset}.yaml", "")]  # fmt: skip
    return [(f"{conf}/{p}" if conf else p, package) for p, package in parts]


def compose(layers: list[tuple[dict | None, str]]) -> dict[str, object]:
    """The budget values of the files, merged in order: a later file's key wins, its grid replaces the
    earlier grid whole."""
    out: dict[str, object] = {}
    for data, package in layers:
        flat = {package + k: v for k, v in flatten(data, "").items()} if package else flatten(data)
        if "grid.ids" in flat:
            out = {k: v for k, v in out.items() if not k.startswith("grid.")}
        out |= {k: v for k, v in flat.items() if is_budget(k)}
    return out


def rule(claims: dict | None, experiment: str) -> dict[str, object]:
    """claims.<id>.kind, .margin and .relative_to of every claim on the experiment."""
    found = {k: v for k, v in flatten((claims or {}).get("claims")).items() if k.count(".") == 1}
    ids = {k.split(".")[0] for k, v in found.items() if k.endswith(".experiment") and v == experiment}
    return {f"claims.{k}": v for k, v in found.items() if k.split(".")[0] in ids and k.split(".")[1] in RULE_FIELDS}


class History:
    """The config files of one git checkout at every commit that touched them, read once."""

    def __init__(self, top: Path, conf: Path):
        self.top = top
        self.conf = conf.relative_to(top).as_posix() if conf.is_relative_to(top) else ""
        self.blobs: dict[tuple[str, str], bytes | None] = {}
        self.parsed: dict[bytes, dict | None] = {}
        default = self.load(WORKTREE, self.path("config.yaml")) or {}
        models = [d["model"] for d in default.get("defaults", []) if isinstance(d, dict) and "model" in d]
        self.model = str(models[0]) if models else "nin"

    def path(self, name: str) -> str:
        return f"{self.conf}/{name}" if self.conf else name

    def commits(self, paths: list[str]) -> list[tuple[str, datetime]]:
        """(hash, committer date) of each commit that touched a path, oldest first."""
        out = _git(self.top, "log", "--reverse", "--no-renames", "--format=%H %cI", "--", *paths) or b""
        rows = [line.split() for line in out.decode().splitlines() if line.strip()]
        return [(r[0], t) for r in rows if len(r) == 2 and (t := parse_time(r[1]))]

    def read(self, pairs: list[tuple[str, str]]) -> None:
        """Read (commit, path) pairs not read yet, with one `git cat-file --batch` (commit may be
        `<hash>^`)."""
        todo = sorted({p for p in pairs if p not in self.blobs and p[0] != WORKTREE})
        out = _git(self.top, "cat-file", "--batch", stdin="".join(f"{c}:{p}\n" for c, p in todo).encode()) or b""
        at = 0
        for pair in todo:
            end = out.find(b"\n", at)
            head = out[at:end].split() if end >= 0 else []
            if len(head) == 3 and head[1] == b"blob" and head[2].isdigit():
                size = int(head[2])
                self.blobs[pair] = out[end + 1 : end + 1 + size]
                at = end + 1 + size + 1
            else:  # missing (or the output ended): the file is absent at that commit
                self.blobs[pair] = None
                at = end + 1 if end >= 0 else len(out)

    def load(self, commit: str, path: str) -> dict | None:
        """The file's YAML at a commit (WORKTREE: on disk), None where it is absent."""
        if commit == WORKTREE and (commit, path) not in self.blobs:
            self.blobs[(commit, path)] = (self.top / path).read_bytes() if (self.top / path).is_file() else None
        elif (commit, path) not in self.blobs:
            self.read([(commit, path)])
        text = self.blobs[(commit, path)]
        if text is not None and text not in self.parsed:
            self.parsed[text] = _yaml(text)
        return None if text is None else self.parsed[text]

    def removed(
        self, tree: Path, root: Path, experiment: str, preset: str = ""
    ) -> tuple[datetime | None, tuple[str, ...]]:
        """The earliest `started` of the experiment's run manifests that a commit deleted from the
        tree, and those commits (short hashes, oldest first); (None, ()) where none did. A tree outside
        the checkout (a copy of its results) is looked for as config.yaml's results_dir/<tree under root>."""
        tree, root = Path(tree).resolve(), Path(root).resolve()
        if tree.is_relative_to(self.top):
            where = tree.relative_to(self.top).as_posix()
        elif tree.is_relative_to(root):  # a copy: the preset's own tree, where its runs were committed
            own = (self.load(WORKTREE, self.path(f"preset/{preset}.yaml")) or {}).get("results_dir") if preset else None
            results = own or (self.load(WORKTREE, self.path("config.yaml")) or {}).get("results_dir") or "results"
            where = Path(str(results)).as_posix() if own else (Path(str(results)) / tree.relative_to(root)).as_posix()
        else:
            return None, ()
        spec = f"{'' if where == '.' else where + '/'}{experiment}/*/runs/*/manifest.json"
        out = _git(self.top, "log", "--reverse", "--diff-filter=D", "--no-renames", "--format=@%H", "--name-only",
                   "--", spec) or b""  # fmt: skip
        deleted, commit = [], ""
        for line in out.decode().splitlines():
            if line.startswith("@"):
                commit = line[1:].strip()
            elif line.strip() and commit:
                deleted.append((f"{commit}^", line.strip()))
        self.read(deleted)
        times = [t for pair in deleted if (t := _started(self.blobs.get(pair)))]
        return min(times, default=None), tuple(dict.fromkeys(c[:7] for c, _ in deleted))


def _yaml(text: bytes) -> dict | None:
    """A file's YAML, None where it is no mapping; unparseable YAML counts as absent."""
    try:
        data = parse_yaml(text.decode("utf-8", "replace"))
    except yaml.YAMLError:
        return None
    return data if isinstance(data, dict) else None


def _started(text: bytes | None) -> datetime | None:
    """A run manifest's `started`, None where there is none."""
    try:
        started = json.loads(text).get("started") if text else None
    except (ValueError, AttributeError):
        return None
    return parse_time(started) if started else None


def values(history: History, commit: str, experiment: str, preset: str, sets: list[str]) -> dict[str, object]:
    """Every budget and rule value of the experiment at a commit (WORKTREE: the working tree); with
    several data sets, each data set's values as "key (dataset)"."""
    out: dict[str, object] = {}
    for dataset in sets or [""]:
        found = files(history.conf, experiment, preset, dataset, history.model)
        budget = compose([(history.load(commit, path), package) for path, package in found])
        out |= {f"{k} ({dataset})" if len(sets) > 1 else k: v for k, v in budget.items()}
    return out | rule(history.load(commit, history.path("claims.yaml")), experiment)


def diff(old: dict, new: dict, commit: str, date: datetime | None) -> list[Change]:
    """The keys whose values differ (an unset key reads as null), sorted."""

    def same(a, b):
        return json.dumps(None if a is UNSET else a, default=str) == json.dumps(None if b is UNSET else b, default=str)

    return [Change(k, old.get(k, UNSET), new.get(k, UNSET), commit, date)
            for k in sorted(old.keys() | new.keys()) if not same(old.get(k, UNSET), new.get(k, UNSET))]  # fmt: skip


def budget(history: History, tree: Path, root: Path, experiment: str, preset: str) -> Budget:
    """One experiment's Budget in one results tree (of `preset`)."""
    sets = sorted(d.parent.name for d in Path(tree).glob(f"{experiment}/*/runs") if d.is_dir())  # data sets
    paths = sorted({p for d in sets or [""] for p, _ in files(history.conf, experiment, preset, d, history.model)})
    paths.append(history.path("claims.yaml"))
    commits = history.commits(paths)
    history.read([(c, p) for c, _ in commits for p in paths])
    last, last_date, before, every = "", None, {}, []
    for commit, date in commits:
        now = values(history, commit, experiment, preset, sets)
        found = diff(before, now, commit[:7], date)
        if found:
            last, last_date, every = commit[:7], date, every + found
        before = now
    uncommitted = diff(before, values(history, WORKTREE, experiment, preset, sets), UNCOMMITTED, None)
    first = first_result(tree, experiment)
    changes = [c for c in every if first is not None and c.date > first] + (uncommitted if first else [])
    removed, removed_in = history.removed(tree, root, experiment, preset)
    if removed is None or (first is not None and removed >= first):
        removed, removed_in = None, ()
    rerun = [c for c in every if removed and c.date > removed and (not first or c.date <= first)]
    rerun += uncommitted if removed and first is None else []
    return Budget(experiment, last, last_date, bool(uncommitted), first, tuple(changes), removed, removed_in,
                  tuple(rerun))  # fmt: skip


def budgets(tree: Path, root: Path, preset: str, experiments: list[str], repo: Path | None = None) -> list | str:
    """Each experiment's Budget in a results tree (sorted by experiment), or a sentence saying why git's
    history is unavailable. `repo`: the checkout whose conf/ holds the values (default: the one above
    `root`, else the package's)."""
    repo = checkout(Path(repo) if repo is not None else Path(root))
    top, why = git_top(repo)
    if top is None:
        return why
    history = History(top.resolve(), (repo / "conf").resolve())
    return [budget(history, Path(tree), Path(root), e, preset) for e in sorted(set(experiments))]

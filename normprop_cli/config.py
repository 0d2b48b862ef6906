"""Hydra configs: find `conf/`, list its options, compose a run's config.

Data flows one way: Typer command -> this module -> experiment runner.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import threading
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.config_repository import IConfigRepository
from hydra.core.global_hydra import GlobalHydra
from hydra.core.object_type import ObjectType
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError
from omegaconf.nodes import BooleanNode, FloatNode, IntegerNode, StringNode

from normprop_cli import schema
from normprop_cli.errors import UserError, first_line


def conf_dir() -> Path:
    """`conf/` as shipped in the wheel (normprop_cli/conf) or beside the package in a checkout."""
    pkg = Path(__file__).resolve().parent
    for candidate in (pkg / "conf", pkg.parent / "conf"):
        if (candidate / "config.yaml").is_file():
            return candidate
    raise UserError(f"no Hydra configs found in {pkg / 'conf'} or {pkg.parent / 'conf'}; reinstall normprop")


def options(group: str) -> list[str]:
    """The choices of a config group, e.g. options('preset') -> ['paper', 'quick', 'smoke']."""
    return sorted(p.stem for p in (conf_dir() / group).glob("*.yaml"))


def describe(group: str, name: str) -> str:
    """What an option is, in one line: the first sentence of its YAML's header, whole.

    The header is the leading comment block (after `@package`) up to the first indented comment line (the
    command examples) or the first line that is not a comment; it may span lines. Its first sentence ends
    at a full stop outside parentheses followed by a capital letter or the header's end ("Fig. 4" goes
    on); a header without one is given whole.
    """
    words: list[str] = []
    for line in (conf_dir() / group / f"{name}.yaml").read_text().splitlines():
        text = line.lstrip("#").strip()
        if text.startswith("@package"):
            continue
        if not line.startswith("#") or not text or line.startswith("#  "):
            if words:
                break
            continue
        words += text.split()
    header, depth = " ".join(words), 0
    for i, ch in enumerate(header):
        depth += (ch in "([") - (ch in ")]")
        if ch == "." and not depth and (i + 1 == len(header) or header[i + 1 : i + 3].strip()[:1].isupper()):
            return header[: i + 1]
    return header


def check_choice(group: str, name: str) -> None:
    known = options(group)
    if name not in known:
        raise UserError(f"unknown {group} '{name}'; known: {', '.join(known)}")


def root(preset: str | None = None) -> DictConfig:
    """The root config under a preset, no experiment chosen: the preset's own keys
    (`preset.experiments`) and its results directory."""
    if preset is not None:
        check_choice("preset", preset)
    return _checked([f"preset={preset}"] if preset is not None else [], [])


def load(
    experiment: str,
    preset: str | None = None,
    dataset: str | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    **settings,
) -> DictConfig:
    """Compose the config of one experiment: root, experiment, preset, options, overrides.

    `settings` are the command's options (seeds=3, device='cpu', ...); None means not given.
    Trailing `overrides` win over everything, as on Hydra's own command line; OmegaConf checks each
    against the config's schema (normprop_cli/schema.py): its key must exist, its value fit the key's
    type. The experiment's grid is as its YAML gives it:
    `experiments.grid.load` builds the grids that are built from a list of methods and applies
    the overrides that set a grid key.
    """
    return compose_checked(experiment, preset, dataset, overrides, **settings)[0]


def compose_checked(
    experiment: str,
    preset: str | None = None,
    dataset: str | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    **settings,
) -> tuple[DictConfig, list[Override]]:
    """`load`'s config, and the trailing overrides parsed (what `experiments.grid` checks against the
    grid)."""
    check_choice("experiment", experiment)
    given = [f"experiment={experiment}"]
    for group, name in (("preset", preset), ("dataset", dataset)):
        if name is not None:
            check_choice(group, name)
            given.append(f"{group}={name}")
    for key, value in settings.items():
        if value is not None:
            given.append(f"{key}={override_value(value)}")
    user = _parse(list(overrides))
    for o in user:
        if (conf_dir() / o.key_or_group).is_dir() and not o.is_delete():  # a group's option: one that exists
            check_choice(o.key_or_group, o.input_line.split("=", 1)[-1])
    cfg = _checked(given, user, experiment)
    plus = [o for o in user if o.is_add() or o.is_force_add()]
    if plus:  # the schema refuses what `+` adds but to an experiment's own keys (schema.Experiment is open)
        keys = _keys(_compose(given))
        for o in plus:
            if o.key_or_group not in keys:
                raise unknown_key(o, o.key_or_group, keys, experiment)
    return cfg, user


_COMPOSED: dict[tuple, DictConfig] = {}
_COMPOSING = threading.Lock()  # Hydra's GlobalHydra is one per process: reproduce-all's experiment threads take turns


def _conf_state(directory: Path) -> str:
    """What a composition reads: a digest of every YAML file's path and bytes under `directory` (cheap beside a
    composition; a modification time can miss a rewrite within the file system's clock tick)."""
    digest = hashlib.sha1()
    for f in sorted(directory.rglob("*.yaml")):
        digest.update(f"{f}\0".encode() + f.read_bytes() + b"\0")
    return digest.hexdigest()


def _compose(overrides: list[str]) -> DictConfig:
    """Hydra's composition of config.yaml under `overrides` (struct mode: `key=value` of a key the config
    lacks is refused), merged into its schema (schema.checked: a key the schema lacks, one that `+key=value`
    added, and a value of the wrong type are refused); Hydra's or OmegaConf's error is raised as it is.
    A report asks for the same few dozen compositions, and a deep copy costs a fraction of one: each is
    kept, keyed by the overrides and the contents of the config files (a changed or added file composes
    anew), and handed out as a copy that the caller may change."""
    directory = conf_dir()
    state = _conf_state(directory)
    key = (str(directory), tuple(overrides), state)
    with _COMPOSING:
        if key not in _COMPOSED:
            cfg = schema.checked(_composed(directory, state, overrides))
            while len(_COMPOSED) >= 64:  # a bound for processes that compose many (a test session)
                del _COMPOSED[next(iter(_COMPOSED))]
            _COMPOSED[key] = cfg
        return copy.deepcopy(_COMPOSED[key])


_DEFAULTS: dict[tuple, DictConfig] = {}


def _composed(directory: Path, state: str, overrides: list[str]) -> DictConfig:
    """Hydra's composition, in two steps as Hydra takes them: the config groups' choices (`experiment=`,
    `preset=`, ...) pick the files of the defaults list and Hydra merges them, which is most of a
    composition's cost; then the overrides of keys (`train.lr=0.1`, `+key=v`, `~key`) are applied, by
    Hydra's own code, to the merged config. Runs differ mostly in their keys' overrides, so the first step
    is kept per choice of groups (and contents of the config files) and only the second is done again.
    An override that is not plainly one or the other (a sweep `a,b`, one of Hydra's own `hydra.*` keys)
    and an override Hydra cannot parse go through Hydra whole, which words their error."""
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception:  # Hydra's parse errors: raised by Hydra's composition itself
        return _hydra(directory, overrides, state)
    groups, keys = [], []
    for o in parsed:
        if o.is_sweep_override() or o.key_or_group.split("/")[0].split(".")[0] == "hydra":
            return _hydra(directory, overrides, state)
        # as Hydra's defaults list tells them apart: a mapping is a key's value, even under a group's name
        group = (directory / o.key_or_group).is_dir() and not isinstance(o.value(), dict)
        (groups if group else keys).append(o)
    base = (str(directory), state, tuple(o.input_line for o in groups))
    if base not in _DEFAULTS:
        cfg = _hydra(directory, [o.input_line for o in groups], state)
        while len(_DEFAULTS) >= 64:
            del _DEFAULTS[next(iter(_DEFAULTS))]
        _DEFAULTS[base] = cfg
    cfg = copy.deepcopy(_DEFAULTS[base])
    ConfigLoaderImpl._apply_overrides_to_config(keys, cfg)
    return cfg


def _hydra(directory: Path, overrides: list[str], state: str | None = None) -> DictConfig:
    """Hydra's own composition of config.yaml under `overrides`. With the config files' `state`, the files
    Hydra loads are kept for the next composition (`_Kept`)."""
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(directory), version_base="1.3"):
            if state is not None:
                loader = GlobalHydra.instance().hydra.config_loader
                while len(_KEPT) >= 8 and (str(directory), state) not in _KEPT:
                    del _KEPT[next(iter(_KEPT))]
                loader.repository = _Kept(loader.repository, _KEPT.setdefault((str(directory), state), {}))
            return compose(config_name="config", overrides=overrides)
    finally:
        GlobalHydra.instance().clear()


_KEPT: dict[tuple[str, str], dict] = {}


class _Kept(IConfigRepository):
    """Hydra's repository of config files, keeping each file it loaded (parsed, its defaults list read) for
    the compositions that follow: each composition loads the same few dozen small files, and parsing them
    is nearly half of its cost. A file is handed out as a copy, which Hydra may change. Hydra copies its
    repository at each composition to add search paths to it; the kept files go with the copy, keyed by
    the search path they were found on."""

    def __init__(self, delegate: IConfigRepository, kept: dict) -> None:
        self.delegate, self.kept = delegate, kept

    def __deepcopy__(self, memo: dict) -> _Kept:
        return _Kept(copy.deepcopy(self.delegate, memo), self.kept)

    def load_config(self, config_path: str):
        key = (config_path, tuple((s.provider, s.path) for s in self.delegate.get_sources()))
        if key not in self.kept:
            self.kept[key] = self.delegate.load_config(config_path=config_path)
        return copy.deepcopy(self.kept[key])

    def get_schema_source(self):
        return self.delegate.get_schema_source()

    def initialize_sources(self, config_search_path) -> None:
        self.delegate.initialize_sources(config_search_path)

    def group_exists(self, config_path: str) -> bool:
        return self.delegate.group_exists(config_path=config_path)

    def config_exists(self, config_path: str) -> bool:
        return self.delegate.config_exists(config_path=config_path)

    def get_group_options(self, group_name: str, results_filter: ObjectType | None = ObjectType.CONFIG) -> list[str]:
        return self.delegate.get_group_options(group_name=group_name, results_filter=results_filter)

    def get_sources(self) -> list:
        return self.delegate.get_sources()


def _checked(given: list[str], user: list[Override], experiment: str | None = None) -> DictConfig:
    """`_compose(given + user)`, its refusal worded as one line (`refusal`)."""
    try:
        return _compose(given + [o.input_line for o in user])
    except Exception as exc:  # Hydra's composition errors, OmegaConf's unknown keys and wrong types
        raise refusal(exc, given, user, experiment) from None


def _parse(overrides: list[str]) -> list[Override]:
    try:
        return OverridesParser.create().parse_overrides(overrides)
    except Exception as exc:  # Hydra's parse errors
        raise bad_override(exc) from None


def bad_override(exc: Exception) -> UserError:
    return UserError(f"bad override ({first_line(exc)}); write overrides as key=value, e.g. train.epochs=5")


# The words for the type OmegaConf found a value does not fit (the node it would have gone into).
KIND = {IntegerNode: "a whole number", FloatNode: "a number", BooleanNode: "true or false", StringNode: "a string",
        ListConfig: "a list, e.g. [a,b]", DictConfig: "a mapping, e.g. {a: 1}"}  # fmt: skip


def refusal(exc: Exception, given: list[str], user: list[Override], experiment: str | None) -> UserError:
    """Hydra's or OmegaConf's refusal of an override, one line: a key the config lacks (`key=value`, or
    `+key=value`, which would add it) names the nearest key that exists (`epochs=3`: did you mean
    `train.epochs=3`?); a value of the wrong type names the type and the default. An error that is none of
    these, or not an override's, is given as the library words it."""
    cause = exc
    while cause is not None and not isinstance(cause, OmegaConfBaseException):
        cause = cause.__cause__  # Hydra wraps OmegaConf's error
    if cause is None:
        return bad_override(exc)
    o = _culprit(cause.full_key or "", user)
    if o is None:
        return UserError(f"the composed config does not fit its schema (normprop_cli/schema.py): {first_line(cause)}")
    key, value = o.key_or_group, o.input_line.split("=", 1)[-1]
    defaults = _compose(given)
    if isinstance(cause, ValidationError):
        kind = KIND.get(type(cause.child_node))
        default = OmegaConf.select(defaults, key, default=None)
        default = "a mapping" if isinstance(default, DictConfig) else override_value(default)
        if kind is None:
            return UserError(f"bad override {o.input_line!r}: {first_line(cause)} ({key}'s default is {default})")
        return UserError(f"{key}={value} is not {kind}, as {key} must be (its default is {default})")
    if not isinstance(cause, (ConfigAttributeError, ConfigKeyError)):
        return bad_override(cause)
    keys = _keys(defaults)
    if key in keys:  # the unknown key is inside the override's value: `experiment.lr_scale={nonee: 0.5}`
        return unknown_key(o, cause.full_key, [k for k in keys if k.startswith(f"{key}.")], experiment)
    return unknown_key(o, key, keys, experiment)


def unknown_key(o: Override, key: str, keys: list[str], experiment: str | None) -> UserError:
    """`key` of override `o` is not in the config: the nearest of `keys` that is (`epochs=3`: did you mean
    `train.epochs=3`?), with Hydra's `+`/`++`, which would add it, as without."""
    value = o.input_line.split("=", 1)[-1] if key == o.key_or_group else "..."
    near = nearest(key, keys)
    todo = f"did you mean `{near}={value}`?" if near else f"`normprop config {experiment}` shows every key"
    plus = o.is_add() or o.is_force_add()
    adds = " (`+` adds no keys: every key normprop reads is in the config)" if plus else ""
    return UserError(f"bad override {o.input_line!r}: unknown key '{key}'{adds}; {todo}")


def _culprit(full_key: str, user: list[Override]) -> Override | None:
    """The override that the key of a library error belongs to: that key itself, one inside it (a list's
    element, `experiment.lr[0]`), or its first part that the config lacks (`no` of `no.such.key=1`)."""
    for o in reversed(user):  # the last override of a key is the one that counts
        key = o.key_or_group
        if key == full_key or full_key.startswith((f"{key}.", f"{key}[")) or key.startswith(f"{full_key}."):
            return o
    return None


def _keys(cfg: DictConfig, prefix: str = "") -> list[str]:
    """Every dotted key of a config, mappings and their values alike (not inside lists)."""
    out = []
    for k, v in cfg.items_ex(resolve=False):
        out.append(f"{prefix}{k}")
        if isinstance(v, DictConfig):
            out += _keys(v, f"{prefix}{k}.")
    return out


def nearest(key: str, keys: list[str]) -> str | None:
    """The key meant by a mistyped one: the same last part elsewhere (`lr` -> `train.lr`), else the
    closest whole key (`train.epoch` -> `train.epochs`), else the closest last part."""
    last = key.rsplit(".", 1)[-1]
    same = [k for k in keys if k.rsplit(".", 1)[-1] == last]
    if same:
        return min(same, key=lambda k: (-difflib.SequenceMatcher(None, key, k).ratio(), k.count("."), k))
    close = difflib.get_close_matches(key, keys, n=1, cutoff=0.75)
    if close:
        return close[0]
    ends = {k.rsplit(".", 1)[-1]: k for k in sorted(keys, key=lambda k: k.count("."), reverse=True)}
    close = difflib.get_close_matches(last, list(ends), n=1, cutoff=0.75)
    return ends[close[0]] if close else None


def override_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, Path)):
        text = str(value)
        return f"'{text}'" if any(c in text for c in " ,=[]{}'\"") else text
    return str(value)

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
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from omegaconf import DictConfig, ListConfig, OmegaConf

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
    return _compose([f"preset={preset}"] if preset is not None else [])


def load(
    experiment: str,
    preset: str | None = None,
    dataset: str | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    **settings,
) -> DictConfig:
    """Compose the config of one experiment: root, experiment, preset, options, overrides.

    `settings` are the command's options (seeds=3, device='cpu', ...); None means not given.
    Trailing `overrides` win over everything, as on Hydra's own command line; each is checked
    against the type of the value it replaces. The experiment's grid is as its YAML gives it:
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
    defaults = _compose(given) if user else None
    try:
        cfg = _compose(given + list(overrides))
    except UserError:
        check_keys(defaults, user, experiment)  # a key that does not exist: say which, and the nearest that does
        raise
    if user:
        # `+key=value` / `++key=value` compose whatever key they name: one the config lacks is a typo here
        check_keys(defaults, [o for o in user if o.is_add() or o.is_force_add()], experiment)
        check_types(defaults, cfg, user)
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
    """Hydra's composition of config.yaml under `overrides`, struct off. A report asks for the same few
    dozen compositions, and a deep copy costs a fraction of one: each is kept, keyed by the overrides and
    the contents of the config files (a changed or added file composes anew), and handed out as a copy
    that the caller may change."""
    directory = conf_dir()
    key = (str(directory), tuple(overrides), _conf_state(directory))
    with _COMPOSING:
        if key not in _COMPOSED:
            GlobalHydra.instance().clear()
            try:
                with initialize_config_dir(config_dir=str(directory), version_base="1.3"):
                    cfg = compose(config_name="config", overrides=overrides)
            except Exception as exc:  # Hydra's missing-key and composition errors
                raise bad_override(exc) from None
            finally:
                GlobalHydra.instance().clear()
            OmegaConf.set_struct(cfg, False)
            while len(_COMPOSED) >= 64:  # a bound for processes that compose many (a test session)
                del _COMPOSED[next(iter(_COMPOSED))]
            _COMPOSED[key] = cfg
        return copy.deepcopy(_COMPOSED[key])


def _parse(overrides: list[str]) -> list[Override]:
    try:
        return OverridesParser.create().parse_overrides(overrides)
    except Exception as exc:  # Hydra's parse errors
        raise bad_override(exc) from None


def bad_override(exc: Exception) -> UserError:
    return UserError(f"bad override ({first_line(exc)}); write overrides as key=value, e.g. train.epochs=5")


def check_keys(defaults: DictConfig | None, user: list[Override], experiment: str) -> None:
    """An override of a key the composed config lacks is a one-line error naming the key and the
    nearest key that exists (`epochs=3`: did you mean `train.epochs=3`?), with Hydra's `+`/`++` (which
    would add the key) as without; one of a config group (dataset=..., model=...), the group's options."""
    keys = _keys(defaults) if defaults is not None else []
    for o in user:
        key, value = o.key_or_group, o.input_line.split("=", 1)[-1]
        if (conf_dir() / key).is_dir() and not o.is_delete():
            check_choice(key, value)
        if o.is_delete() or OmegaConf.select(defaults, key, default=_ABSENT) is not _ABSENT:
            continue
        near = nearest(key, keys)
        todo = f"did you mean `{near}={value}`?" if near else f"`normprop config {experiment}` shows every key"
        plus = o.is_add() or o.is_force_add()
        adds = " (`+` adds no keys: every key normprop reads is in the config)" if plus else ""
        raise UserError(f"bad override {o.input_line!r}: unknown key '{key}'{adds}; {todo}")


_ABSENT = object()


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


KINDS = {bool: "true or false", int: "a whole number", float: "a number", list: "a list, e.g. [a,b]",
         dict: "a mapping, e.g. {a: 1}"}  # fmt: skip


def check_types(defaults: DictConfig, cfg: DictConfig, user: list[Override]) -> None:
    """An override's value must have the kind of the value it replaces (a number where a number
    belongs, ...): a wrong one is a one-line error here, not a traceback in a runner."""
    for o in user:
        if o.is_delete():
            continue
        key = o.key_or_group
        default = OmegaConf.select(defaults, key, default=None)
        if isinstance(default, DictConfig):
            default = {}
        elif isinstance(default, ListConfig):
            default = []
        value = OmegaConf.select(cfg, key, default=None)
        value = OmegaConf.to_container(value) if isinstance(value, (DictConfig, ListConfig)) else value
        kind = next((k for k in KINDS if isinstance(default, k)), None)  # bool before int: bool is an int
        if kind is None or value is None and kind in (list, dict):  # null: no grid, no mapping
            continue
        fits = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
        if kind is float:
            fits = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not fits:
            raise UserError(f"{key}={o.input_line.split('=', 1)[-1]} is not {KINDS[kind]}, as {key} must be "
                            f"(its default is {override_value(default)})")  # fmt: skip


def override_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, Path)):
        text = str(value)
        return f"'{text}'" if any(c in text for c in " ,=[]{}'\"") else text
    return str(value)

"""Every setting of a run, written once: ``OptimizeConfig``'s fields hold each default, and those a user sets carry
their flag and help (``Option``). The command line, the effort levels, a config file and the docs' table of defaults
all come from here:

- ``add_flags(parser, group_titles)`` adds a flag for each option (argparse default None: "not given");
- ``resolve(given, effort, file)`` starts from the defaults, applies the effort level (``EFFORTS``), then the config
  file's values, then the flags given;
- ``python -m kernelevolve.settings`` prints the table of defaults that ``docs/cli.md`` holds (a test compares them).

A config file is TOML whose keys are the field names below (``max_evals = 40``, ``effort = "thorough"``).
"""
from __future__ import annotations

import argparse
import sys
import tomllib
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

# The baselines a run's winner meets in the head-to-head by default, by the Baseline field that timed each:
# "compiled" is torch.compile's default mode; "max_autotune" (max-autotune without CUDA graphs) may be asked for too
# (evaluate/headtohead.py's SIDES name them all).
BASELINES = ("eager", "compiled")
# Where runs are stored and written, and the prompt budget of the prompted proposers, by default.
DEFAULT_DB = "kernelevolve.db"
DEFAULT_OUT = "kernelevolve-out"
PROMPT_TOKENS = 12000

# Candidates per screen batch by default on a GPU: a template family's neighbourhood of the best config, in one batch.
SCREEN_BATCH = 32


@dataclass(frozen=True)
class Option:
    """How a field is set from the command line: ``flag`` with ``help``, under argparse group ``group``.
    ``negate``: a switch (``--no-...``) that sets the field False. ``none_at``: the value given on the command line
    that means None (no limit), where 0 does. ``unit``: said after the default in the help."""
    flag: str
    help: str
    group: str = "search"
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    negate: bool = False
    none_at: Any = ...
    unit: str = ""


def option(default: Any, flag: str, help: str, **how: Any) -> Any:
    return field(default=default, metadata={"option": Option(flag, help, **how)})


@dataclass(frozen=True)
class OptimizeConfig:
    device: str = "cpu"
    # None: template,inductor on a GPU; inductor first on the CPU, where Triton kernels run interpreted and untimed
    proposers: tuple[str, ...] = ("template", "inductor")
    selector: str = "greedy"
    max_evals: int = option(20, "--max-evals", "candidates judged at most (those the screen only ranks do not count)",
                            metavar="N")
    time_budget_s: float | None = option(None, "--time-budget", "seconds of search, counted from the first proposal",
                                         metavar="S")
    target_speedup: float | None = option(None, "--target-speedup", "stop once this speedup over eager is reached",
                                          metavar="X")
    stall: int | None = option(10, "--stall", "stop after this many evaluations without a new best (0: never)",
                               metavar="N", none_at=0)
    timeout_s: float = option(600.0, "--timeout", "hard limit per candidate", metavar="S", unit="s")
    workers: int | None = option(None, "--workers", "parallel evaluations (default: one per GPU, 1 on CPU; with Ray: "
                                 "the cluster's GPUs, or its CPUs with --device cpu)", metavar="N")
    trials: int = 3
    timing_budget_ms: float = option(1000.0, "--timing-budget-ms", "measured time per candidate", metavar="MS",
                                     unit="ms")
    profile: bool = True
    proposer_options: dict[str, Any] = field(default_factory=dict)  # see make_proposers; never holds a key
    executor: str = option("local", "--executor", "where evaluations run: worker processes here, or Ray tasks on a "
                           "cluster", choices=("local", "ray"))
    ray_address: str | None = option(None, "--ray-address", "the Ray cluster (host:port, ray://host:port or 'auto')",
                                     metavar="ADDR")
    ray_retries: int = option(2, "--ray-retries", "retries of an evaluation lost with its Ray worker or node",
                              metavar="N")
    # The screen: batches of this many candidates checked once and timed briefly, the fastest ``finalists`` of each
    # then judged. None: on for CUDA (SCREEN_BATCH), off on the CPU, where Triton runs interpreted and untimed and
    # the screen cannot rank; 0: off.
    screen_batch: int | None = option(None, "--screen-batch", f"candidates per screen batch (default: {SCREEN_BATCH} "
                                      "on CUDA, 0 on the CPU; 0: judge every candidate)", group="screen", metavar="N")
    finalists: int = option(2, "--finalists", "the fastest of each batch sent on to the judge", group="screen",
                            metavar="K")
    # a batch's finalists after its fastest are judged only where the judge's time of an earlier one is off what its
    # screen time predicts by more than this fraction (or it failed there): SearchConfig.backup_agree; None judges
    # every finalist (--judge-all-finalists)
    backup_agree: float | None = 0.05
    max_screened: int | None = option(480, "--max-screened", "screened candidates per run; past it candidates are "
                                      "judged directly (0: no limit)", group="screen", metavar="N", none_at=0)
    screen_timeout_s: float = option(120.0, "--screen-timeout", "hard limit per candidate in the screen",
                                     group="screen", metavar="S", unit="s")
    screen_share: float = option(0.6, "--screen-share", "the most of --time-budget spent screening; past it "
                                 "candidates are judged", group="screen", metavar="F")
    # once the search stops, judge what the screen or a baseline already timed faster than the best (at most
    # ``finalists`` evaluations, past time_budget_s): SearchConfig.closing
    closing: bool = option(True, "--no-closing-round", "end the search at once when it stops; by default, up to "
                           "--finalists candidates that the screen (waiting finalists) or the baseline (torch.compile's "
                           "own kernel) timed faster than the best are judged first, which can run past --time-budget",
                           group="screen", negate=True)
    # the user's kernels the run starts from (--start): {"name": the file's name, "source": its text}, each judged
    # first, a root of the tree, and tuned by the start proposer
    starts: tuple[dict[str, str], ...] = ()
    # hardware counters (ncu) of the reference, the start kernels and the best, on CUDA where ncu is on the PATH
    counters: bool = option(True, "--no-ncu", "skip the hardware counters of the reference, the start kernels and "
                            "the best (read with ncu on CUDA where it is on the PATH)", negate=True)
    # the clock that ranks kernels: "call" (the latency of a call from Python) or "graph" (CUDA-graph replay)
    timing: str = option("call", "--timing", "the clock that ranks kernels: call (the latency of a call from Python, "
                         "as an eager program makes it) or graph (replays of a CUDA graph of the call, for models "
                         "served with CUDA graphs); both are reported on a GPU", choices=("call", "graph"))
    # before the run answers, its winner and the baselines timed in interleaved rounds (evaluate/headtohead.py):
    # the speedups it reports come from those rounds, and a winner not faster beyond their noise loses
    head_to_head: bool = option(True, "--no-head-to-head", "skip timing the winner against the baselines in "
                                "interleaved rounds before the answer (the speedups then come from the judge's "
                                "separate timings)", negate=True)
    # the baselines the winner meets there (headtohead.SIDES); eager and compiled only where the baseline timed them
    rivals: tuple[str, ...] = BASELINES

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def screen_size(self) -> int:
        """Candidates per screen batch, 0 when the screen is off."""
        if self.screen_batch is not None:
            return max(0, self.screen_batch)
        return SCREEN_BATCH if self.device == "cuda" else 0

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "OptimizeConfig":
        d = dict(d)
        d["proposers"] = tuple(d.get("proposers", ("inductor",)))
        d["starts"] = tuple(d.get("starts", ()))
        d["rivals"] = tuple(d.get("rivals", BASELINES))
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


DEFAULTS = OptimizeConfig()

# Effort levels: what each changes from the defaults (a config file or a flag still overrides them).
EFFORTS: dict[str, dict[str, Any]] = {
    "quick": {"max_evals": 8, "stall": 4, "max_screened": 96, "timing_budget_ms": 300.0},
    "default": {},
    "thorough": {"max_evals": 80, "stall": 30, "max_screened": 2000, "finalists": 3},
}

GROUPS = {"search": None, "screen": "the screen: many candidates checked once and timed briefly, the fastest judged"}


class SettingsError(ValueError):
    """A config file or effort level that cannot be used (one line)."""


def options() -> list[tuple[str, Option]]:
    """(field name, its Option) for every field a user sets, in field order."""
    return [(f.name, f.metadata["option"]) for f in fields(OptimizeConfig) if "option" in f.metadata]


def _default_text(name: str, opt: Option) -> str | None:
    value = getattr(DEFAULTS, name)
    if opt.negate or value is None or "(default" in opt.help:
        return None
    return f"{value:g}{opt.unit}" if isinstance(value, float) else f"{value}{opt.unit}"


def add_flags(parser: argparse.ArgumentParser, groups: dict[str, Any] | None = None, only: tuple[str, ...] = ()) -> None:
    """A flag for every option (or for the fields ``only``), each defaulting to None so that ``resolve`` can tell a
    flag given from one left out; its help says the default. ``groups``: argparse groups by Option.group (default: the
    parser itself)."""
    for name, opt in options():
        if only and name not in only:
            continue
        target = (groups or {}).get(opt.group, parser)
        if opt.negate:
            target.add_argument(opt.flag, dest=name, action="store_false", default=None, help=opt.help)
            continue
        kind = _kind(name)
        default = _default_text(name, opt)
        help_text = opt.help + (f" (default: {default})" if default is not None else "")
        target.add_argument(opt.flag, dest=name, type=kind, default=None, metavar=opt.metavar, choices=opt.choices,
                            help=help_text.replace("%", "%%"))


def _kind(name: str) -> type:
    """The type a flag's value is read as, from the field's annotation (``float | None`` -> float)."""
    note = str(OptimizeConfig.__dataclass_fields__[name].type)
    return float if "float" in note else int if "int" in note else str


def add_effort_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--effort", choices=list(EFFORTS), default=None,
                        help="how much search: " + "; ".join(f"{k}: {_effort_text(v)}" for k, v in EFFORTS.items())
                             + " (default: default)")
    parser.add_argument("--config", metavar="FILE", type=Path, default=None,
                        help="a TOML file of settings by field name (max_evals = 40, effort = \"thorough\", ...); "
                             "flags override it")


def _effort_text(changes: dict[str, Any]) -> str:
    return ", ".join(f"{dict(options())[k].flag} {v:g}" if isinstance(v, float) else f"{dict(options())[k].flag} {v}"
                     for k, v in changes.items()) or "the defaults"


def read_file(path: Path) -> dict[str, Any]:
    """A config file's settings: field names of OptimizeConfig (those with a flag), and ``effort``."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise SettingsError(f"{path}: {e}") from None
    known = {name for name, _ in options()} | {"effort"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise SettingsError(f"{path}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return data


def resolve(given: dict[str, Any], effort: str | None = None, file: Path | None = None,
            base: OptimizeConfig = DEFAULTS) -> OptimizeConfig:
    """``base`` with the effort level's changes, then the file's settings, then ``given`` (field name -> value, None
    where a flag was not given); a flag's ``none_at`` value becomes None."""
    from_file = read_file(file) if file else {}
    level = effort or from_file.pop("effort", None) or "default"
    from_file.pop("effort", None)
    if level not in EFFORTS:
        raise SettingsError(f"unknown effort {level!r}; known: {', '.join(EFFORTS)}")
    how = dict(options())
    values: dict[str, Any] = {**EFFORTS[level], **from_file}
    for name, value in given.items():
        if value is not None:
            values[name] = value
    for name, value in list(values.items()):
        if name in how and how[name].none_at is not ... and value == how[name].none_at:
            values[name] = None
    return replace(base, **values)


def markdown() -> str:
    """The table of the run's settings and their defaults, as docs/cli.md holds it."""
    rows = ["| flag | default | what it sets |", "|---|---|---|"]
    for name, opt in options():
        default = "not set" if opt.negate else _default_text(name, opt) or "see what it sets"
        if getattr(DEFAULTS, name) is None and "(default" not in opt.help:
            default = "none"
        flag = opt.flag + (f" {opt.metavar}" if opt.metavar else "") + (f" {{{','.join(opt.choices)}}}"
                                                                         if opt.choices else "")
        rows.append(f"| `{flag}` | {default} | {opt.help.replace('|', '/')} |")
    rows += [f"| `--effort {name}` | | {_effort_text(changes)} |" for name, changes in EFFORTS.items()]
    return "\n".join(rows)


if __name__ == "__main__":
    sys.stdout.write(markdown() + "\n")

"""The run's settings are written once (kernelevolve/settings.py): the flags, the search's own config, the effort
levels, a config file and the docs' table all come from OptimizeConfig's fields."""
import re
from dataclasses import fields
from pathlib import Path

import pytest

from kernelevolve.cli import build_parser, optimize_config
from kernelevolve.search import SearchConfig
from kernelevolve.settings import DEFAULTS, EFFORTS, SettingsError, markdown, options, resolve

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = str(ROOT / "examples" / "gelu_mlp.py")


def _config(*argv: str):
    args = build_parser().parse_args(["optimize", EXAMPLE, "--device", "cpu", *argv])
    return optimize_config(args, "cpu")


def test_no_flag_given_is_the_defaults():
    cfg = _config()
    for name, _ in options():
        assert getattr(cfg, name) == getattr(DEFAULTS, name), name


def test_the_search_config_takes_its_defaults_from_the_run_config():
    shared = {f.name for f in fields(SearchConfig)} & {f.name for f in fields(DEFAULTS)}
    assert {"max_evals", "stall", "finalists", "max_screened", "screen_share", "closing"} <= shared
    for name in shared - {"screen_batch"}:  # the search's screen_batch is the resolved size (screen_size())
        assert getattr(SearchConfig(), name) == getattr(DEFAULTS, name), name


def test_flags_override_the_file_which_overrides_the_effort(tmp_path):
    path = tmp_path / "ke.toml"
    path.write_text('effort = "thorough"\nmax_evals = 40\nscreen_share = 0.5\n')
    cfg = _config("--config", str(path), "--screen-share", "0.3")
    assert cfg.max_evals == 40  # the file over the effort level
    assert cfg.screen_share == 0.3  # the flag over the file
    assert cfg.stall == EFFORTS["thorough"]["stall"]  # the effort level over the defaults
    assert _config("--effort", "quick").max_evals == EFFORTS["quick"]["max_evals"]


def test_zero_means_no_limit_and_switches_turn_off():
    cfg = _config("--stall", "0", "--max-screened", "0", "--no-closing-round", "--no-head-to-head")
    assert cfg.stall is None and cfg.max_screened is None and cfg.closing is False and cfg.head_to_head is False


def test_a_bad_file_or_effort_is_one_clear_error(tmp_path):
    path = tmp_path / "ke.toml"
    path.write_text("max_eval = 3\n")
    with pytest.raises(SettingsError, match="unknown setting.*max_eval"):
        resolve({}, None, path)
    with pytest.raises(SettingsError, match="unknown effort"):
        resolve({}, "enormous")


def test_every_default_is_said_in_the_help_as_it_is():
    text = build_parser()._subparsers._group_actions[0].choices["optimize"].format_help()
    text = re.sub(r"\s+", " ", text)
    for name, opt in options():
        value = getattr(DEFAULTS, name)
        if opt.negate or value is None or "(default" in opt.help:
            continue
        shown = f"{value:g}" if isinstance(value, float) else str(value)
        assert f"{opt.flag}" in text and f"(default: {shown}{opt.unit})" in text, (opt.flag, shown)


def test_the_docs_table_is_the_generated_one():
    """docs/cli.md holds settings.markdown() between its markers; regenerate with
    ``python -m kernelevolve.settings``."""
    doc = (ROOT / "docs" / "cli.md").read_text()
    table = doc.split("<!-- settings:begin -->\n", 1)[1].split("\n<!-- settings:end -->", 1)[0]
    assert table == markdown(), "docs/cli.md's settings table is stale: paste `python -m kernelevolve.settings`"

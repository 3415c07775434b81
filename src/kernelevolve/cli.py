"""Command line: optimize, check, inspect, runs, show, report, and the service: submit, serve, jobs."""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import traceback
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from kernelevolve.model.budget import MIN_SHARE
from kernelevolve.settings import (DEFAULT_DB, DEFAULT_OUT, DEFAULTS, GROUPS, PROMPT_TOKENS, SettingsError,
                                   add_effort_flags, add_flags, options, resolve)

if TYPE_CHECKING:
    from kernelevolve.rows import Node

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    pass


def _console():
    from rich.console import Console

    return Console(stderr=False, highlight=False)


def _device(args: argparse.Namespace) -> str:
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available() and getattr(args, "executor", "local") != "ray":
        raise UsageError("--device cuda: no CUDA device is available")
    return device


def _fmt_x(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}x"


def _fmt_ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.4g} ms"


# --- optimize -------------------------------------------------------------------------------------------------------
def cmd_optimize(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from kernelevolve.optimize import optimize
    from kernelevolve.store import Store

    cfg = optimize_config(args, _device(args))
    console = _console()
    if cfg.device == "cpu" and not args.resume:
        console.print(cpu_note(cfg), markup=False, soft_wrap=True)
    if args.resume and args.start:
        console.print("note: --resume keeps the run's own start kernels; --start is for a new run", markup=False)
    store = Store(args.db)
    counts: dict[str, int] = {}
    run: dict[str, int] = {}
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[status]}"), console=console, transient=False) as progress:
        task = progress.add_task("starting", total=cfg.max_evals, status="")

        def on_stage(stage: str) -> None:
            progress.update(task, description=stage)

        def status() -> str:
            line = " ".join(f"{k}:{v}" for k, v in sorted(counts.items()))
            usage = store.llm_usage(run["id"]) if "id" in run else None
            if not usage:
                return line
            options = store.run(run["id"]).config.get("proposer_options") or {}  # a resumed run's own budget
            return f"{line}  model {spend_line(usage, options)}"

        def on_result(node: Node, result: Any) -> None:
            counts[result.status.value] = counts.get(result.status.value, 0) + 1
            progress.advance(task)
            line = f"node {node.id:>3} {node.proposer:<9} {result.status.value:<13} "
            reason = result.reason + (f"; SUSPECT: {result.details['suspect']}" if result.details.get("suspect") else "")
            line += f"{_fmt_ms(result.runtime_ms):>12}  {_fmt_x(result.speedup_eager)} vs eager  {reason}"
            # one line whatever its length: the terminal wraps it, not rich in the middle of the reason
            progress.console.print(line, markup=False, soft_wrap=True)
            progress.update(task, status=status())

        def on_screen(screened: int, sent: int) -> None:
            counts["screened"] = counts.get("screened", 0) + screened
            progress.console.print(f"screened {screened} candidate(s); {sent} sent on to the judge"
                                   + (" (the fastest first; the others only if the judge disagrees with the screen)"
                                      if sent > 1 and cfg.backup_agree is not None else ""), markup=False)
            progress.update(task, status=status())

        outcome = optimize(args.problem, cfg, store, Path(args.out), resume=args.resume, on_result=on_result,
                           on_stage=on_stage, on_screen=on_screen, on_run=lambda rid: run.update(id=rid),
                           new_options=budget_options(args) if args.resume else None)
    _print_usage(console, store, outcome.run_id)
    _print_outcome(console, outcome, args.db)
    return EXIT_OK if outcome.best_result is not None else EXIT_FAIL


def cpu_note(cfg: Any) -> str:
    """One line on what a CPU run can show: what is timed there, and the template proposer's share."""
    line = ("CPU run: Triton kernels (template, llm, manual and start candidates) are verified under Triton's "
            "interpreter but not timed; only torch.compile (inductor) and plain torch candidates are timed and can "
            "show a speedup")
    cap = cfg.proposer_options.get("template_max")
    if cap is not None and "template" in cfg.proposers:
        line += f"; the template proposer gets at most {cap} of the {cfg.max_evals} evaluations"
    return line


def cmd_optimize_model(args: argparse.Namespace) -> int:
    from kernelevolve.model.compose import HOSTS
    from kernelevolve.model.plan import ModelError
    from kernelevolve.model.run import optimize_model
    from kernelevolve.store import Store

    cfg = optimize_config(args, _device(args))
    console = _console()
    budget = args.time_budget_s if args.time_budget_s is not None else MODEL_BUDGET_S
    hosts = tuple(h for h in (args.hosts or "").split(",") if h) or None
    if hosts and any(h not in HOSTS for h in hosts):
        raise UsageError(f"--hosts takes {' or '.join(HOSTS)} (comma-separated), not {args.hosts!r}")
    with console.status("starting") as status:
        def on_stage(stage: str) -> None:
            console.print(stage, markup=False)
            status.update(stage)

        try:
            outcome = optimize_model(args.problem, cfg, Store(args.db), Path(args.out), budget, args.min_share,
                                     on_stage=on_stage, on_plan=lambda plan: _print_model_plan(console, plan),
                                     hosts=hosts, resume=args.resume,
                                     region_head_to_head=args.region_head_to_head)
        except ModelError as e:
            raise UsageError(str(e)) from e
    for r in outcome.regions:
        if r.run_id is None:
            what = r.why
        elif r.answer == "candidate":
            what = f"run {r.run_id}: a kernel, {r.speedup:.2f}x its best baseline" if r.speedup else \
                f"run {r.run_id}: a kernel"
        else:
            what = f"run {r.run_id}: {r.why}"
        console.print(f"{r.name}: {what}", markup=False, soft_wrap=True)
    for line in outcome.dropped:
        console.print(f"dropped {line}", markup=False)
    for line in outcome.notes:
        console.print(f"note: {line}", markup=False, soft_wrap=True)
    if outcome.waterfall:
        from kernelevolve.model.report import waterfall_lines

        for line in waterfall_lines(outcome.waterfall):
            console.print(line, markup=False)
    h = outcome.head_to_head
    if h is not None and h.answer:
        from kernelevolve.model.report import ends_line

        console.print(f"end to end: {ends_line(outcome)}", markup=False)
    console.print(f"{outcome.best_model}: {outcome.why}", markup=False)
    if outcome.time_line():
        console.print(outcome.time_line(), markup=False, soft_wrap=True)
    if outcome.report is not None:
        console.print(f"report: {outcome.report}", markup=False)
    if outcome.run_id is not None:
        console.print(f"model run {outcome.run_id} in {args.db}: kernelevolve show {outcome.run_id}; to export it, "
                      f"kernelevolve approve {outcome.run_id} --note TEXT, then kernelevolve export {outcome.run_id} "
                      "--out FILE.py", markup=False, soft_wrap=True)
    return EXIT_OK if outcome.status in ("ok", "") else EXIT_FAIL


MODEL_BUDGET_S = 600.0  # a whole model's search when --time-budget is not given


def _print_model_plan(console: Any, plan: Any) -> None:
    from rich.table import Table

    from kernelevolve.model.profile import hot_regions

    graph = plan.times.graph_ms
    ops = f" (its graph op by op: {graph:.3f} ms)" if graph is not None and plan.times.model_ms is not None else ""
    t = Table(title=f"{plan.problem.name}: {plan.times.total_ms:.3f} ms on {plan.times.device}{ops}, "
                    f"{len(plan.partition.regions)} regions, {len(plan.groups)} problems")
    for col in ("region", "kind", "where", "instances", "ms", "share"):
        t.add_column(col)
    for h in hot_regions(plan.partition, plan.times)[:12]:
        t.add_row(h.name, h.kind, h.where, str(h.instances), f"{h.ms:.4f}", f"{h.share:.1%}")
    console.print(t)
    for g in plan.groups:
        console.print(f"{g.name} ({g.path.name}): {g.share.why if g.share else ''}", markup=False)
    for note in plan.notes:
        console.print(f"note: {note}", markup=False)


def optimize_config(args: argparse.Namespace, device: str) -> Any:
    """The OptimizeConfig of the optimize flags (shared by optimize and submit), checked before any work is done:
    a bad proposer name, --executor ray without an address or a bad LLM setting raise a one-line error."""
    from kernelevolve.propose import default_proposers, make_proposers

    try:
        given = {name: getattr(args, name) for name, _ in options()}
        cfg = resolve(given, args.effort, args.config)
    except SettingsError as e:
        raise UsageError(str(e)) from None
    names, defaults = default_proposers(device, cfg.max_evals)
    if args.proposer is not None:
        names, defaults = tuple(p for p in args.proposer.split(",") if p), {}
    cfg = replace(cfg, device=device, proposers=names, proposer_options={**_proposer_options(args), **defaults},
                  backup_agree=None if args.judge_all_finalists else cfg.backup_agree, starts=start_files(args.start))
    if cfg.finalists < 1 or (cfg.screen_batch is not None and cfg.screen_batch < 0) or (cfg.max_screened or 0) < 0:
        raise UsageError("--finalists takes a positive count, --screen-batch and --max-screened 0 or more")
    if not 0 < cfg.screen_share <= 1 or cfg.screen_timeout_s <= 0:
        raise UsageError("--screen-share takes a fraction in (0, 1], --screen-timeout a positive number of seconds")
    if cfg.executor == "ray" and not cfg.ray_address:
        raise UsageError("--executor ray needs --ray-address ADDR (host:port of the cluster's head, or 'auto')")
    make_proposers(list(cfg.proposers), cfg.device, cfg.proposer_options)  # fail on a bad name before any work
    return cfg


def _proposer_options(args: argparse.Namespace) -> dict[str, Any]:
    """The prompted proposers' settings from the flags: JSON-safe, stored with the run, and never holding a key (only
    the name of the variable that holds it)."""
    opts: dict[str, Any] = {"knowledge_dirs": list(args.knowledge or []), "prompts_dir": args.prompts,
                            "prompt_tokens": args.prompt_tokens, "manual_dir": args.manual_dir,
                            "manual_timeout_s": args.manual_timeout, **budget_options(args)}
    if args.llm_model or args.llm_config:
        from dataclasses import replace

        from kernelevolve.propose.providers import LLMSettings, load_llm_config, parse_models

        try:
            if args.llm_config:
                settings = load_llm_config(args.llm_config)
            else:
                prices = [float(v) for v in args.llm_price.split(",")] if args.llm_price else [None, None]
                if len(prices) != 2:
                    raise ValueError("--llm-price takes IN,OUT: USD per million input and output tokens")
                models = tuple(replace(m, price_in=prices[0], price_out=prices[1]) for m in
                               parse_models(args.llm_model, args.llm_provider, args.llm_base_url, args.llm_key_env))
                settings = LLMSettings(models, timeout_s=args.llm_timeout, max_retries=args.llm_retries,
                                       concurrency=args.llm_concurrency, max_tokens=args.llm_max_tokens)
        except (ValueError, OSError) as e:
            raise UsageError(str(e)) from e
        opts["llm"] = settings.to_dict()
    return opts


def spend_line(usage: dict[str, Any], options: dict[str, Any]) -> str:
    """Calls, tokens and cost so far against the run's budget, in a few characters."""
    from kernelevolve.propose.llm import SpendLimits

    lim = SpendLimits.from_options(options)
    calls, tokens, cost = lim.calls, lim.tokens, lim.cost_usd
    used = usage["input_tokens"] + usage["output_tokens"]
    line = f"calls {usage['calls']}/{calls or '∞'} tokens {_kilo(used)}/{_kilo(tokens) if tokens else '∞'}"
    if usage["cost_usd"] is not None:
        line += f" ${usage['cost_usd']:.2f}/{f'${cost:g}' if cost else '∞'}"
    return line


def _kilo(n: float) -> str:
    return f"{n / 1e6:.3g}M" if n >= 1e6 else f"{n / 1e3:.0f}k" if n >= 1e3 else f"{n:.0f}"


def start_files(paths: list[str]) -> tuple[dict[str, str], ...]:
    """The --start files, read now: a missing one is a usage error (one line, exit 2)."""
    starts, names = [], set()
    for path in map(Path, paths):
        if not path.is_file():
            raise UsageError(f"{path}: no such start file")
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(f"{path}: cannot read the start file: {e}") from None
        name = path.name if path.name not in names else f"{path.name}#{len(starts) + 1}"
        names.add(name)
        starts.append({"name": name, "source": source})
    return tuple(starts)


def budget_options(args: argparse.Namespace) -> dict[str, Any]:
    """The model-budget flags given on the command line, as proposer options (absent: not given)."""
    given = {"max_calls": args.llm_calls, "max_tokens": args.llm_tokens, "max_cost_usd": args.llm_cost}
    if any(v is not None and v < 0 for v in given.values()):
        raise UsageError("--llm-calls, --llm-tokens and --llm-cost take 0 (no limit) or more")
    return {k: v for k, v in given.items() if v is not None}


def _print_usage(console: Any, store: Any, run_id: int) -> None:
    usage = store.llm_usage(run_id)
    if usage:
        cost = "" if usage["cost_usd"] is None else f", ${usage['cost_usd']:.4f}"
        console.print(f"model calls: {usage['calls']} ({usage['candidates']} candidates, {usage['no_code']} without "
                      f"code, {usage['repeats']} repeats, {usage['errors']} failed); tokens {usage['input_tokens']} "
                      f"in, {usage['output_tokens']} out{cost}", markup=False)


def _print_outcome(console: Any, outcome: Any, db: str) -> None:
    from kernelevolve.evaluate.headtohead import LABELS

    b, best = outcome.baseline, outcome.best_result
    console.print(f"run {outcome.run_id}: {outcome.search.evaluations} evaluation(s); stopped: "
                  f"{outcome.search.stop_reason}", markup=False)
    if b is not None:
        console.print(f"reference: eager {_fmt_ms(b.eager.median_ms if b.eager else None)}, torch.compile "
                      f"{_fmt_ms(b.compiled.median_ms if b.compiled else None)}", markup=False)
    if outcome.phases:
        console.print("time: " + ", ".join(f"{k.removesuffix('_s').replace('_', ' ')} {v:.1f} s"
                                           for k, v in outcome.phases.items()), markup=False)
    for node in outcome.starts:  # the kernels the user asked to improve, and how the best stands against each
        r = node.result
        if r.timed and r.runtime_ms is not None:
            over = (f"; the best is {r.runtime_ms / best.runtime_ms:.2f}x faster than it" if best is not None
                    and best.timed and best.runtime_ms else "")
            if best is not None and outcome.search.best is not None and outcome.search.best.id == node.id:
                over = "; the best is the start kernel itself"
            console.print(f"start kernel {node.meta['start']}: {_fmt_ms(r.runtime_ms)} "
                          f"({_fmt_x(r.speedup_eager)} vs eager, {_fmt_x(r.speedup_compile)} vs torch.compile){over}",
                          markup=False)
        else:
            console.print(f"start kernel {node.meta['start']}: verified, untimed", markup=False)
    h2h = outcome.head_to_head
    if best is None:
        console.print(outcome.best_why, markup=False)
    elif h2h is not None and h2h.answer:
        console.print(h2h.line(), markup=False)
        what = f"best ({outcome.search.best_why})" if h2h.wins else f"answer ({LABELS[h2h.answer]})"
        console.print(f"{what}: {_fmt_ms(h2h.ms[h2h.answer])} in the rounds; speedup "
                      f"{_fmt_x(h2h.speedup.get('eager'))} vs eager, {_fmt_x(h2h.speedup.get('compiled'))} vs "
                      f"torch.compile", markup=False)
    elif outcome.best_why.startswith("no candidate beat"):
        console.print(outcome.best_why, markup=False)
    else:
        if h2h is not None:
            console.print(h2h.line(), markup=False)
        clocks = clock_line(best.timing) if best.timing else ""
        console.print(f"best ({outcome.search.best_why}): {_fmt_ms(best.runtime_ms)}{clocks}; speedup "
                      f"{_fmt_x(best.speedup_eager)} vs eager, {_fmt_x(best.speedup_compile)} vs torch.compile",
                      markup=False)
    for name, path in outcome.files.items():
        console.print(f"{name}: {path}", markup=False)
    console.print(f"search tree: kernelevolve show {outcome.run_id} --db {db}", markup=False, style="dim")


# --- check ----------------------------------------------------------------------------------------------------------
def cmd_check(args: argparse.Namespace) -> int:
    from kernelevolve.candidate import Candidate
    from kernelevolve.evaluate.result import CLOCK_KEYS
    from kernelevolve.optimize import make_evaluator
    from kernelevolve.problem import load_problem

    device = _device(args)
    problem = load_problem(args.problem, device)
    path = Path(args.candidate)
    if not path.is_file():
        raise UsageError(f"{path}: no such candidate file")
    cfg = resolve({"timeout_s": args.timeout_s, "timing_budget_ms": args.timing_budget_ms, "timing": args.timing},
                  base=replace(DEFAULTS, device=device))
    evaluator = make_evaluator(problem, cfg)
    result = evaluator.evaluate(Candidate(path.read_text(), proposer="manual"))
    baseline = None
    if result.ok and result.timed and not args.no_baseline:
        baseline = evaluator.baseline()
        result = result.with_baseline(baseline)
    if args.json:
        payload = {"status": result.status.value, "reason": result.reason, "runtime_ms": result.runtime_ms,
                   "timed": result.timed, "compile_s": result.compile_s, "load_s": result.load_s,
                   "wall_s": result.wall_s, "speedup_eager": result.speedup_eager,
                   "speedup_compile": result.speedup_compile,
                   "eager_ms": baseline.eager.median_ms if baseline and baseline.eager else None,
                   "compile_ms": baseline.compiled.median_ms if baseline and baseline.compiled else None,
                   **(result.timing.clocks() if result.timing else dict.fromkeys(CLOCK_KEYS)),
                   "error": result.error[-2000:] if result.error else ""}
        print(json.dumps(payload))
    else:
        print(f"{result.status.value}: {result.reason}")
        if result.timing:
            print(f"runtime {_fmt_ms(result.runtime_ms)} (median of {result.timing.reps}, {result.timing.clock} clock"
                  f"{clock_line(result.timing)}); speedup {_fmt_x(result.speedup_eager)} vs eager, "
                  f"{_fmt_x(result.speedup_compile)} vs torch.compile")
        if result.error and args.verbose:
            print(result.error)
    return EXIT_OK if result.ok else EXIT_FAIL


def clock_line(t: Any) -> str:
    """The clocks beside the median, for one line: device and host time (naming a launch-bound call), the graph's."""
    parts = []
    if t.device_ms is not None:
        parts.append(f"device {t.device_ms:.4g} ms")
    if t.host_ms is not None and t.method == "cuda-events":
        parts.append(f"host {t.host_ms:.4g} ms" + (", launch-bound" if t.launch_bound else ""))
    if t.graph_ms is not None:
        parts.append(f"graph {t.graph_ms:.4g} ms")
    elif t.graph_note:
        parts.append(f"no graph: {t.graph_note[:80]}")
    return "; " + "; ".join(parts) if parts else ""


# --- inspect / runs / show / report ---------------------------------------------------------------------------------
def cmd_inspect(args: argparse.Namespace) -> int:
    from kernelevolve.problem import load_problem
    from kernelevolve.profile import profile_problem, render_profile

    device = _device(args)
    problem = load_problem(args.problem, device)
    if args.candidate and not args.ncu:
        raise UsageError("--candidate goes with --ncu (the profile above is the reference's)")
    if args.candidate and not Path(args.candidate).is_file():
        raise UsageError(f"{args.candidate}: no such candidate file")
    print(f"problem {problem.name} ({problem.short_sha}); outputs {', '.join(problem.output_dtypes)}; "
          f"{problem.n_shapes} shape(s)")
    print(render_profile(profile_problem(problem, device, measure_ceilings=args.measure)))
    print(_render_plan(problem, device))
    if args.ncu:
        _print_counters(problem, device, args.candidate)
    return EXIT_OK


def _print_counters(problem: Any, device: str, candidate: str | None) -> None:
    """The hardware-counter table of the reference (and of ``candidate``), or one line on why there is none."""
    from kernelevolve.counters import CountersError, diagnose, render

    from kernelevolve.counters import ncu_path

    if device != "cuda":
        print("hardware counters: none on the CPU (ncu reads NVIDIA GPUs); the profile above stands")
        return
    if ncu_path() is None:
        print("hardware counters: ncu is not on the PATH; the profile above stands")
        return
    import torch

    major = torch.cuda.get_device_capability()[0]
    for label, path in [("reference", None)] + ([(f"candidate {candidate}", candidate)] if candidate else []):
        try:
            print(f"\nhardware counters of the {label} (ncu, --clock-control none):")
            print(render(diagnose(problem.path, device, path, major=major)))
        except CountersError as e:
            print(f"hardware counters: {e}")


def cmd_prompt(args: argparse.Namespace) -> int:
    """Print the prompt the llm and manual proposers would send next; no model is called."""
    from kernelevolve.problem import load_problem
    from kernelevolve.propose.base import ProposalContext
    from kernelevolve.propose.llm import PromptedProposer, fastest_verified
    from kernelevolve.propose.prompt import build_prompt

    import torch

    run = None
    if args.run:
        from kernelevolve.store import Store

        store = Store(args.db)
        run = store.run(args.run)
    # A prompt needs no GPU: a CUDA run's prompt is written here from the problem read on the CPU, without a profile
    # (a stored run's own profile, device and device name where --run names one)
    device = run.device if run is not None else args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    here = device == "cpu" or torch.cuda.is_available()
    if not here and not (args.no_profile or args.run):
        raise UsageError("--device cuda: no CUDA device here to profile the reference on; add --no-profile (and "
                         "--device-name NAME for the device's facts) to write the prompt without a profile")
    problem = load_problem(args.problem, device if here else "cpu")
    history, profile, experience = [], None, []
    if run is not None:
        from kernelevolve.search.turns import rank_experience

        if run.problem_sha != problem.sha:
            raise UsageError(f"run {run.id} is of another problem (or of an older version of {args.problem})")
        history, profile = store.nodes(run.id), run.profile
        experience = rank_experience(store.experience(run.device_key, None, exclude_run=run.id), profile)
    elif not args.no_profile:
        from kernelevolve.profile import profile_problem

        profile = profile_problem(problem, device)
    preview = type("PromptPreview", (PromptedProposer,), {"name": args.proposer})  # whose failures it repairs
    proposer = preview(device, seed=args.seed, knowledge_dirs=args.knowledge or (), prompts_dir=args.prompts,
                       budget_tokens=args.prompt_tokens)
    proposer.device_name = args.device_name
    ctx = ProposalContext(problem, device, profile, history, [], experience)
    pin = proposer.prompt_inputs(ctx)
    strategy, parent, kids = proposer.expander.plan(history, 1)[0]
    prompt = build_prompt(strategy, pin, parent, kids, fastest_verified(history), args.prompt_tokens)
    print(f"# System\n\n{prompt.system}\n# Prompt\n\n{prompt.user}")
    print(f"<!-- strategy {strategy}{' from node ' + str(parent.id) if parent else ''}; about "
          f"{prompt.tokens} tokens of {args.prompt_tokens}; dropped: {', '.join(prompt.dropped) or 'nothing'} -->")
    return EXIT_OK


def cmd_approve(args: argparse.Namespace) -> int:
    from kernelevolve.export import ExportError, approve
    from kernelevolve.store import Store

    store = Store(args.db)
    try:
        a = approve(store, args.run, args.candidate, args.note, args.by)
    except ExportError as e:
        raise UsageError(str(e)) from e
    print(f"approved node {a.node_id} of run {a.run_id} (source {a.candidate_sha[:12]}) by {a.approved_by} at "
          f"{a.created}: {a.note}")
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    from kernelevolve.export import (ExportError, approve, build_export, check_approval, resolve, stored_problem,
                                     verify_shapes)
    from kernelevolve.store import Store

    store = Store(args.db)
    console = _console()
    out = Path(args.out)
    try:
        node = resolve(store, args.run, args.candidate)
        run = store.run(node.run_id)
        if args.auto_approve and not store.approvals(run.id, node.id):
            approve(store, run.id, node.id, "exported with --auto-approve", f"--auto-approve ({_who()})")
        approval = check_approval(store, node)
        device = args.device or run.device
        problem = stored_problem(store, run, out.parent / f".{out.stem}-work")
        console.print(f"verifying node {node.id} of run {run.id} on every shape ({device})", markup=False)
        shapes = verify_shapes(problem, node.source, device, out.parent / f".{out.stem}-work",
                               timeout_s=args.timeout, on_case=lambda case, row: console.print(
                                   f"  {row['label']:<22} {row['verdict']:<8} "
                                   f"{'—' if row.get('speedup') is None else format(row['speedup'], '.2f') + 'x':>8}"
                                   f"  {row.get('reason', '')[:80]}", markup=False))
        dispatch = ("wins",) if args.dispatch == "wins" else ("wins", "ties", "loses", "untimed")
        module, test = build_export(store, run.id, node.id, out, shapes, approval, dispatch, args.aoti)
    except ExportError as e:
        raise UsageError(str(e)) from e
    on = [r["label"] for r in shapes if r["verdict"] in dispatch]
    console.print(f"kernel dispatched on: {', '.join(on) if on else 'no shape (every call runs the reference)'}",
                  markup=False)
    console.print(f"module: {module}\ntest: {test}  (python -m pytest -q {test})", markup=False)
    if args.register is not None:
        from kernelevolve.registry import Registry, RegistryError

        try:
            registry = Registry(args.register or None)
            console.print(f"registered: {registry.add(module)}", markup=False)
        except RegistryError as e:
            raise UsageError(str(e)) from e
    return EXIT_OK


def _who() -> str:
    from kernelevolve.export import _user

    return _user()


def _render_plan(problem, device: str) -> str:
    """The regions the template library claims in the reference's ATen graph, and what runs as plain ATen."""
    from kernelevolve.propose.template import plan_problem

    plan = plan_problem(problem, device)
    if plan.error:
        return f"template plan: none ({plan.error})"
    claimed = {n for r in plan.regions for n in r.match.nodes}
    lines = [f"template plan: {len(plan.regions)} region(s) over {len(plan.graph.calls())} ATen op(s)"]
    for r in plan.regions:
        ops = ", ".join(dict.fromkeys(str(n.target).split(".")[1] if "." in str(n.target) else n.name
                                      for n in r.match.nodes))
        lines.append(f"  {r.match.kind:<20} {r.match.family:<15} {len(r.match.nodes):>3} op(s): {ops}")
    rest = [n for n in plan.graph.calls() if n not in claimed]
    if rest:
        lines.append(f"  {'aten (unclaimed)':<36} {len(rest):>3} op(s): "
                     + ", ".join(dict.fromkeys(str(n.target) for n in rest)))
    return "\n".join(lines)


def cmd_runs(args: argparse.Namespace) -> int:
    from rich.measure import Measurement
    from rich.table import Table

    from kernelevolve.store import Store

    runs = Store(args.db).runs()
    if args.json:
        print(json.dumps([{"id": r.id, "problem": r.name, "problem_sha": r.problem_sha, "device": r.device,
                           "device_key": r.device_key, "status": r.status, "created": r.created,
                           "finished": r.finished, "stop_reason": r.stop_reason, "nodes": r.n_nodes,
                           "screened": r.screened, "evaluated": r.evaluated} for r in runs], indent=1))
        return EXIT_OK
    table = Table("run", "problem", "device", "status", "nodes", "screened", "judged", "created", "stopped because")
    for r in runs:
        table.add_row(str(r.id), r.name, r.device_key, r.status, str(r.n_nodes), str(r.screened), str(r.evaluated),
                      r.created, r.stop_reason or "")
    console = _console()
    if Measurement.get(console, console.options.update_width(10_000), table).maximum > console.width:
        print(_compact_runs(runs, console.width))
        return EXIT_OK
    console.print(table)
    return EXIT_OK


def _compact_runs(runs: list[Any], width: int) -> str:
    """The run listing for a narrow terminal: one line of short columns per run (the creation time to the minute),
    then its device and the reason it stopped, indented and wrapped to ``width``."""
    import textwrap

    head = ("run", "problem", "status", "nodes", "scr.", "judged", "created (UTC)")
    rows = [(str(r.id), r.name, r.status, str(r.n_nodes), str(r.screened), str(r.evaluated),
             r.created[5:16].replace("T", " ")) for r in runs]
    widths = [max(len(c) for c in col) for col in zip(head, *rows)]
    right = {0, 3, 4, 5}  # counts align right

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    out = [line(head).rstrip()]
    indent = " " * (widths[0] + 2)
    for r, cells in zip(runs, rows):
        out.append(line(cells).rstrip())
        rest = r.device_key + (f"; stopped: {r.stop_reason}" if r.stop_reason else "")
        out += textwrap.wrap(rest, max(width, 40), initial_indent=indent, subsequent_indent=indent)
    return "\n".join(out)


def cmd_show(args: argparse.Namespace) -> int:
    from rich.tree import Tree

    from kernelevolve.report import report_view
    from kernelevolve.store import Store

    if args.diff is not None:
        return _show_diff(Store(args.db), args.run, args.diff)
    view = report_view(Store(args.db), args.run)
    run = view["run"]
    sc = view.get("screen")
    tree = Tree(f"run {run['id']} · {view['problem']['name']} · {run['device']} · {run['status']}"
                + (f" · {run['stop_reason']}" if run.get("stop_reason") else "")
                + (f" · screened {sc['screened']}, {sc['finalists']} sent on to the judge"
                   + (f", screen times {_fmt_ms(sc['ms']['min'])} to {_fmt_ms(sc['ms']['max'])} "
                      f"(median {_fmt_ms(sc['ms']['median'])})" if sc.get("ms") else "") if sc else ""))
    branches: dict[Any, Any] = {}
    depth: dict[Any, int] = {}
    best = view["best"]["node"] if view["best"] else None
    console = _console()
    for n in view["nodes"]:
        what = (n.get("meta") or {}).get("label")
        screen = (f" (screen {n['screen_status']} {_fmt_ms(n['screen_ms'])})" if n.get("screen_status") else "")
        label = (f"#{n['id']} {n['proposer']}{f' ({what})' if what else ''}{screen} {n['status']} "
                 f"{_fmt_ms(n['runtime_ms'])} {_node_clocks(n)}"
                 f"{_fmt_x(n['speedup_eager'])} vs eager {_fmt_x(n['speedup_compile'])} vs compile"
                 f"{' (cached)' if n['cached'] else ''}{' ← best' if n['id'] == best else ''}  ")
        depth[n["id"]] = depth.get(n["parent"], 0) + 1
        # the reason gets what the terminal has left on the line (the tree indents 4 columns a level), at least 60
        room = max(60, console.width - len(label) - 4 * depth[n["id"]] - 1)
        reason = " ".join(n["reason"].split())
        parent = branches.get(n["parent"], tree)
        branches[n["id"]] = parent.add(label + (reason if len(reason) <= room else reason[:room - 1] + "…"))
    console.print(tree)
    console.print(f"best.py: {view['best']['why']}", markup=False, soft_wrap=True)
    return EXIT_OK


def _node_clocks(n: dict[str, Any]) -> str:
    """A node's device, host and graph times in brackets (GPU timings only), a launch-bound call named."""
    if n.get("device_ms") is None and n.get("graph_ms") is None:
        return ""
    parts = [f"device {_fmt_ms(n.get('device_ms'))}", f"host {_fmt_ms(n.get('host_ms'))}"]
    if n.get("launch_bound"):
        parts.append("LAUNCH-BOUND")
    if n.get("graph_ms") is not None:
        parts.append(f"graph {_fmt_ms(n['graph_ms'])}")
    return f"[{', '.join(parts)}] "


def _show_diff(store: Any, run_ref: str, node_id: int) -> int:
    from kernelevolve.candidate import diff_text
    from kernelevolve.report import start_of

    history = store.nodes(store.run(run_ref).id)
    node = next((n for n in history if n.id == node_id), None)
    if node is None:
        raise UsageError(f"run {run_ref} has no node {node_id}")
    root = start_of(node, history)
    base = root if root is not None and root.id != node.id else next(
        (n for n in history if n.id == node.parent), None)
    if base is None:
        raise UsageError(f"node {node_id} has no start kernel or parent to compare with")
    old = f"{base.meta['start']} (start), node {base.id}" if base.meta.get("start") else f"node {base.id}"
    print(diff_text(base.source, node.source, labels=(old, f"node {node.id}"))
          or f"node {node_id} is identical to {old}\n", end="")
    return EXIT_OK


def cmd_report(args: argparse.Namespace) -> int:
    from kernelevolve.report import write_outputs
    from kernelevolve.store import Store

    store = Store(args.db)
    files, why = write_outputs(store, store.run(args.run).id, Path(args.out))
    print(why)
    for name, path in files.items():
        print(f"{name}: {path}")
    return EXIT_OK


# --- service mode: submit / serve / jobs ----------------------------------------------------------------------------
def cmd_submit(args: argparse.Namespace) -> int:
    from kernelevolve.problem import read_source
    from kernelevolve.propose import DEFAULT_PROPOSERS
    from kernelevolve.service import submit
    from kernelevolve.store import Store

    read_source(args.problem)  # a missing or broken file fails before the store is touched
    if args.device is None and args.proposer is None:  # the serving machine's device is not known yet: the stock pair
        args.proposer = ",".join(DEFAULT_PROPOSERS["cuda"])
    config = dict(optimize_config(args, args.device or "cpu").to_dict(), device=args.device)  # None: the server's
    store = Store(args.db)
    print(submit(store, args.problem, config, args.out_root, args.out, args.priority))
    return EXIT_OK


def cmd_serve(args: argparse.Namespace) -> int:
    from kernelevolve.service import serve

    if args.lease <= 0 or args.poll <= 0 or (args.max_jobs is not None and args.max_jobs < 1):
        raise UsageError("--lease and --poll take a positive number of seconds, --max-jobs a positive count")
    try:
        n = serve(args.db, once=args.once, poll_s=args.poll, max_jobs=args.max_jobs, lease_s=args.lease,
                  say=lambda line: print(line, flush=True))
    except KeyboardInterrupt:
        _exit_interrupted("a job in progress is back in the queue and continues from its run")
    print(f"served {n} job(s)" + ("; the queue is drained" if args.once and n != args.max_jobs else ""), flush=True)
    return EXIT_OK


def cmd_jobs(args: argparse.Namespace) -> int:
    from kernelevolve.service import cancel, local_devices, requeue, requeue_stale
    from kernelevolve.store import Store

    store = Store(args.db)
    if args.cancel is not None:
        cancel(store, args.cancel)
        print(f"cancelled job {args.cancel}")
    elif args.requeue is not None:
        print(f"queued job {requeue(store, args.requeue)}: job {args.requeue} again")
    elif args.requeue_stale:
        if args.device == "cuda" and "cuda" not in local_devices():
            raise UsageError("--device cuda: no CUDA device is available to compare with")
        queued = requeue_stale(store, (args.device,) if args.device else None)
        for old, new, why in queued:
            print(f"queued job {new} to re-optimize job {old}: {why}")
        if not queued:
            print("no finished job is stale on this machine")
    else:
        _print_jobs(store.jobs(args.status), args.json)
    return EXIT_OK


def _job_view(j: dict[str, Any]) -> dict[str, Any]:
    speedup = j["eager_ms"] / j["best_ms"] if j["eager_ms"] and j["best_ms"] else None
    return {"id": j["id"], "problem": j["problem_name"], "problem_path": j["problem_path"], "status": j["status"],
            "owner": j["owner"], "attempts": j["attempts"], "run_id": j["run_id"], "best_ms": j["best_ms"],
            "evaluated": j["evaluated"], "max_evals": j["config"].get("max_evals"),
            "speedup_eager": speedup, "device": j["device"], "run_device": j["run_device"],
            "device_key": j["device_key"], "versions": j["versions"], "priority": j["priority"],
            "out_dir": j["out_dir"], "error": j["error"], "requeued_from": j["requeued_from"], "note": j["note"],
            "created": j["created"], "started": j["started"], "finished": j["finished"]}


def _print_jobs(jobs: list[dict[str, Any]], as_json: bool) -> None:
    views = [_job_view(j) for j in jobs]
    if as_json:
        print(json.dumps(views))
        return
    from rich.table import Table

    def when(stamp: str | None) -> str:
        return (stamp or "")[5:19].replace("T", " ")  # MM-DD HH:MM:SS, UTC

    table = Table("job", "problem", "status", "owner", "tries", "run", "evals", "best", "device", "created (UTC)",
                  "started", "finished")
    for v in views:
        best = ""
        if v["best_ms"]:  # so far, while the job runs
            best = f"{_fmt_x(v['speedup_eager'])} vs eager ({_fmt_ms(v['best_ms'])})"
        elif v["status"] == "finished":
            best = "untimed"
        evals = f"{v['evaluated']}/{v['max_evals']}" if v["run_id"] else ""
        table.add_row(str(v["id"]), v["problem"], v["status"] + (f": {v['error'][:80]}" if v["error"] else ""),
                      v["owner"] or "", str(v["attempts"]), str(v["run_id"] or ""), evals, best,
                      v["device_key"] or v["device"] or "any", when(v["created"]), when(v["started"]),
                      when(v["finished"]))
    console = _console()
    if not console.is_terminal:
        console.width = 200  # piped: no terminal to fit, so keep each job on one line
    console.print(table)


# --- parser ---------------------------------------------------------------------------------------------------------
class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Each option's default after its help, where it has one worth showing and the help does not already say it;
    epilogs as written."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if "(default" in text or default is None or default is False or default == [] or default is argparse.SUPPRESS:
            return text
        return f"{text} (default: %(default)s)"


OPTIMIZE_EXIT_CODES = """exit codes:
  0    a candidate was verified. best.py is the best answer: the reference
       itself (or torch.compile's kernel) where no candidate beat it, as the
       last lines say
  1    no candidate was verified; best.py is the reference itself
  2    a usage error, a bad problem file, or a start kernel (--start) that
       failed the judge
  130  interrupted; every finished evaluation is stored (--resume latest)"""

CHECK_EXIT_CODES = """exit codes:
  0    the candidate is verified (ok)
  1    any other status (incorrect, compile_error, runtime_error, timeout,
       crashed, rejected)
  2    a usage error or a bad problem file"""


def add_db_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", default=DEFAULT_DB, help="the SQLite store of runs and their search trees")


def add_optimize_args(p: argparse.ArgumentParser, device_help: str = "default: cuda when available, else cpu") -> None:
    """The flags of optimize that define a search (also those of submit): the problem, device, proposers, budgets,
    executor and language-model settings."""
    p.add_argument("problem", help="the problem file (KernelBench format: Model, get_inputs, get_init_inputs)")
    p.add_argument("--device", choices=["cpu", "cuda"], help=device_help)
    p.add_argument("--proposer",
                   help="comma-separated proposer names: template (the Triton template library), inductor "
                        "(torch.compile configurations), llm (a language model: --llm-model), manual (you answer "
                        "the prompts: --manual-dir) (default: template,inductor; on the CPU inductor,template, the "
                        "template proposer's untimed candidates at most a quarter of --max-evals)")
    p.add_argument("--start", action="append", metavar="FILE", default=[],
                   help="your own kernel (a candidate file) to start from: judged first, then tuned (its autotune "
                        "configs, constexpr launch settings, num_warps/num_stages) and improved; repeatable")
    add_db_arg(p)
    sc = p.add_argument_group(GROUPS["screen"])
    add_flags(p, {"screen": sc})
    add_effort_flags(p)
    sc.add_argument("--judge-all-finalists", action="store_true",
                    help="judge every finalist of a batch; by default those after its fastest are backups, judged "
                         f"only if an earlier one failed the judge or was timed there more than "
                         f"{DEFAULTS.backup_agree * 100:.0f}%% off what its screen time predicts (the screen time times the "
                         "run's median ratio of judge to screen time)")
    g = p.add_argument_group("language models (--proposer llm) and prompts (llm, manual)")
    g.add_argument("--llm-model", metavar="NAME[=W],...", help="model names, with optional sampling weights")
    g.add_argument("--llm-base-url", metavar="URL", help="an OpenAI-compatible server (vLLM, SGLang, Ollama, ...)")
    g.add_argument("--llm-provider", choices=["openai", "anthropic"], default="openai",
                   help="the SDK that --llm-model's models are called through")
    g.add_argument("--llm-key-env", metavar="VAR", help="the environment variable holding the API key "
                   "(default: the SDK's own, OPENAI_API_KEY or ANTHROPIC_API_KEY)")
    g.add_argument("--llm-config", metavar="FILE", help="a JSON file of models and settings (mixes providers)")
    g.add_argument("--llm-timeout", type=float, default=120.0, help="seconds per call")
    g.add_argument("--llm-retries", type=int, default=3, help="retries with backoff on 429, 5xx and lost connections")
    g.add_argument("--llm-concurrency", type=int, default=4, help="calls in flight at once")
    g.add_argument("--llm-max-tokens", type=int, default=8192, help="reply budget per call")
    g.add_argument("--llm-price", metavar="IN,OUT", help="USD per million input and output tokens, for the cost")
    g.add_argument("--llm-calls", type=int, metavar="N",
                   help="the run's budget of model calls (llm and manual); 0: no limit (default 60; with --resume, "
                        "the run's own unless given)")
    g.add_argument("--llm-tokens", type=int, metavar="N",
                   help="the run's budget of input plus output tokens; 0: no limit (default 1000000)")
    g.add_argument("--llm-cost", type=float, metavar="USD",
                   help="the run's budget in USD, counted where --llm-price or the config gives prices; 0: no limit "
                        "(default 10)")
    g.add_argument("--knowledge", action="append", metavar="DIR", help="a folder of your own notes (*.md); repeatable")
    g.add_argument("--prompts", metavar="DIR", help="prompt templates that replace the built-in ones by file name")
    g.add_argument("--prompt-tokens", type=int, default=PROMPT_TOKENS, help="prompt budget; low-priority sections go first")
    g.add_argument("--manual-dir", default="kernelevolve-prompts", help="where --proposer manual writes prompts")
    g.add_argument("--manual-timeout", type=float, default=3600.0, help="seconds to wait for each reply file")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kernelevolve", description="Find faster, verified kernels for PyTorch operators.",
                                formatter_class=HelpFormatter)
    p.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    sub = p.add_subparsers(dest="command", required=True)

    o = sub.add_parser("optimize", help="search for a faster verified kernel", epilog=OPTIMIZE_EXIT_CODES)
    add_optimize_args(o)
    o.add_argument("--out", default=DEFAULT_OUT, help="where best.py, report.html and the run's work files go")
    o.add_argument("--resume", metavar="RUN", help="continue run RUN (an id or 'latest') from the store")
    o.set_defaults(func=cmd_optimize)

    m = sub.add_parser("optimize-model", help="profile a whole model, optimize its hot regions, compose and judge it")
    add_optimize_args(m)
    m.add_argument("--out", default="kernelevolve-model",
                   help="where the region problem files, their runs, best_model.py and model_report.json go "
                        "(default: kernelevolve-model)")
    m.add_argument("--min-share", type=float, default=MIN_SHARE,
                   help=f"regions under this share of the model's time are left alone (default {MIN_SHARE})")
    m.add_argument("--resume", action="store_true",
                   help="run the same command again and go on: problems whose runs finished in --db keep their "
                        "answers, stopped ones resume; the whole is composed and judged again")
    m.add_argument("--hosts", default=None, metavar="HOST[,HOST]",
                   help="how best_model.py runs the kernels: eager (the generated forward as it stands), compile "
                        "(under torch.compile, each kernel an opaque custom op), or both, each judged and the faster "
                        "kept (default: both on a GPU, eager on the CPU)")
    m.add_argument("--region-head-to-head", action="store_true",
                   help="each region's run also holds its own head-to-head against the region's baselines (by "
                        "default only the whole model's is held: it decides which kernels stay, and a region's "
                        "costs about as much as its search)")
    m.set_defaults(func=cmd_optimize_model)

    c = sub.add_parser("check", help="verify and time one candidate file", epilog=CHECK_EXIT_CODES)
    c.add_argument("problem", help="the problem file")
    c.add_argument("candidate", help="the candidate file (a ModelNew)")
    c.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda when available, else cpu")
    add_flags(c, only=("timeout_s", "timing_budget_ms", "timing"))
    c.add_argument("--json", action="store_true", help="print one JSON object")
    c.add_argument("--no-baseline", action="store_true", help="skip timing the reference (no speedups)")
    c.add_argument("-v", "--verbose", action="store_true", help="print the error text of a failed candidate")
    c.set_defaults(func=cmd_check)

    i = sub.add_parser("inspect", help="print the profile of a problem")
    i.add_argument("problem", help="the problem file")
    i.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda when available, else cpu")
    i.add_argument("--measure", action="store_true", help="measure the device's ceilings instead of reading them")
    i.add_argument("--ncu", action="store_true", help="read each kernel's hardware counters with Nsight Compute "
                   "and name its bound (CUDA; one line says why where it cannot)")
    i.add_argument("--candidate", metavar="FILE", help="with --ncu: a candidate file's kernels too")
    i.set_defaults(func=cmd_inspect)

    q = sub.add_parser("prompt", help="print the prompt a language model would get next (no model is called)")
    q.add_argument("problem", help="the problem file")
    q.add_argument("--device", choices=["cpu", "cuda"], help="default: the run's, else cuda when available, else cpu")
    q.add_argument("--run", help="build it from this stored run's tree (an id or 'latest'), as its next step would")
    add_db_arg(q)
    q.add_argument("--no-profile", action="store_true", help="skip profiling the reference (without --run)")
    q.add_argument("--device-name", metavar="NAME", help="the device the facts are for, without a profile "
                   "(e.g. 'NVIDIA H200'); default: the profile's device")
    q.add_argument("--knowledge", action="append", metavar="DIR", help="a folder of your own notes; repeatable")
    q.add_argument("--prompts", metavar="DIR", help="prompt templates that replace the built-in ones by file name")
    q.add_argument("--prompt-tokens", type=int, default=PROMPT_TOKENS, help="prompt budget; low-priority sections go first")
    q.add_argument("--seed", type=int, default=0, help="seeds the choice of step")
    q.add_argument("--proposer", choices=["llm", "manual"], default="llm", help="whose step, with --run")
    q.set_defaults(func=cmd_prompt)

    a = sub.add_parser("approve", help="approve a run's best candidate (or --candidate ID) for export")
    a.add_argument("run", help="run id or 'latest'")
    a.add_argument("--candidate", type=int, help="a node id of the run (default: its best verified node)")
    a.add_argument("--note", required=True, help="what was reviewed, and why it may ship")
    a.add_argument("--by", help="who approves (default: the current user)")
    add_db_arg(a)
    a.set_defaults(func=cmd_approve)

    x = sub.add_parser("export", help="write an approved kernel as a standalone, shape-guarded custom-op module")
    x.add_argument("run", help="run id or 'latest'")
    x.add_argument("--candidate", type=int, help="a node id of the run (default: its best verified node)")
    x.add_argument("--out", required=True, help="the module to write (FILE.py); test_FILE.py is written beside it")
    add_db_arg(x)
    x.add_argument("--auto-approve", action="store_true", help="approve it now (unattended pipelines)")
    x.add_argument("--device", choices=["cpu", "cuda"], help="where to verify the shapes (default: the run's)")
    x.add_argument("--dispatch", choices=["wins", "verified"], default="wins",
                   help="run the kernel only where it was faster (wins), or wherever it was verified")
    x.add_argument("--timeout", type=float, default=600.0, help="hard limit per shape, seconds")
    x.add_argument("--aoti", action="store_true",
                   help="Inductor candidates: also write an AOTInductor package (FILE.pt2), loaded by load_aoti()")
    x.add_argument("--register", nargs="?", const="", metavar="DIR",
                   help="also add it to the registry (default: $KERNELEVOLVE_REGISTRY or ~/.kernelevolve/registry)")
    x.set_defaults(func=cmd_export)

    r = sub.add_parser("runs", help="list runs in the store")
    add_db_arg(r)
    r.add_argument("--json", action="store_true", help="one JSON list, with each run's screened and evaluated counts")
    r.set_defaults(func=cmd_runs)

    s = sub.add_parser("show", help="print a run's search tree")
    s.add_argument("run", help="run id or 'latest'")
    add_db_arg(s)
    s.add_argument("--diff", type=int, metavar="NODE", help="print node NODE's source as a diff against the start "
                   "kernel it tunes (or against its parent)")
    s.set_defaults(func=cmd_show)

    w = sub.add_parser("report", help="write best.py and report.html for a run")
    w.add_argument("run", help="run id or 'latest'")
    add_db_arg(w)
    w.add_argument("--out", default=DEFAULT_OUT, help="where best.py and report.html go")
    w.set_defaults(func=cmd_report)

    sm = sub.add_parser("submit", help="queue an optimization job for `kernelevolve serve`; prints its id")
    add_optimize_args(sm, "default: cuda when the serving machine has it, else cpu")
    sm.add_argument("--out", help="the job's out dir (default: OUT_ROOT/job-ID)")
    sm.add_argument("--out-root", default="kernelevolve-jobs", help="where jobs' out dirs go by default")
    sm.add_argument("--priority", type=int, default=0, help="higher runs first; equal priorities run oldest first")
    sm.set_defaults(func=cmd_submit)

    sv = sub.add_parser("serve", help="run queued jobs until interrupted (several servers may share one queue)")
    add_db_arg(sv)
    sv.add_argument("--once", action="store_true", help="exit once no job is left to claim")
    sv.add_argument("--poll", type=float, default=5.0, help="seconds between looks at an empty queue")
    sv.add_argument("--max-jobs", type=int, help="exit after running this many jobs")
    sv.add_argument("--lease", type=float, default=60.0,
                    help="seconds without a heartbeat after which another server takes a running job over "
                         "(the heartbeat comes every lease/3)")
    sv.set_defaults(func=cmd_serve)

    jb = sub.add_parser("jobs", help="list the job queue, or cancel or re-queue jobs")
    add_db_arg(jb)
    jb.add_argument("--json", action="store_true", help="print one JSON list")
    jb.add_argument("--status", choices=["queued", "running", "finished", "failed", "cancelled"],
                    help="only the jobs in this state")
    act = jb.add_mutually_exclusive_group()
    act.add_argument("--cancel", metavar="ID", help="cancel a queued job")
    act.add_argument("--requeue", metavar="ID", help="queue job ID again (a new job, whatever ID's state)")
    act.add_argument("--requeue-stale", action="store_true",
                     help="queue a new job for each finished job whose run was measured on another device model or "
                          "with other torch or triton versions than this machine's (once per job)")
    jb.add_argument("--device", choices=["cpu", "cuda"], help="with --requeue-stale: judge only runs on this device")
    jb.set_defaults(func=cmd_jobs)
    for sp in sub.choices.values():
        sp.formatter_class = HelpFormatter
        # SUPPRESS: given after the subcommand it sets debug; absent there, it leaves the value given before it
        sp.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
    return p


DEBUG_HELP = "show tracebacks and debug logs (before or after the subcommand)"


def main(argv: Sequence[str] | None = None) -> int:
    from kernelevolve.engine import ExecutorError
    from kernelevolve.optimize import StartError
    from kernelevolve.problem import ProblemError
    from kernelevolve.propose import ProposerError
    from kernelevolve.service import JobError
    from kernelevolve.store import StoreError

    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if hasattr(args, "db") and args.command in ("runs", "show", "report", "serve", "jobs") \
            and not Path(args.db).exists():
        print(f"kernelevolve: error: {args.db}: no such store", file=sys.stderr)
        return EXIT_USAGE
    try:
        return args.func(args)
    except (ProblemError, ProposerError, UsageError, StoreError, JobError, ExecutorError, StartError) as e:
        if args.debug:
            traceback.print_exc()
        print(f"kernelevolve: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        if getattr(args, "func", None) is cmd_optimize_model:
            _exit_interrupted("every finished evaluation is stored: run the same command with --resume to go on")
        _exit_interrupted("every finished evaluation is stored: resume with --resume latest")


def _exit_interrupted(what: str) -> None:
    print(f"kernelevolve: interrupted; {what}", file=sys.stderr)
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(130)  # do not wait for in-flight evaluations; their processes end when their channel closes


if __name__ == "__main__":
    sys.exit(main())

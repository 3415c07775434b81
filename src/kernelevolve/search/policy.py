"""The search's decisions about its candidates: whether they go to the screen, which screened ones go on to the
judge and which wait as backups, when to stop and why, and what the closing round judges. Each is a plain function of
the configuration and the state (state.py); the proposers' turns are in turns.py, and the driver (loop.py) only moves
work and results."""
from __future__ import annotations

import math
import statistics
from collections import deque

from kernelevolve.candidate import Candidate
from kernelevolve.evaluate.result import Baseline, Result, ScreenResult
from kernelevolve.rows import Node
from kernelevolve.search.state import (CLOSING_MARGIN, FINALIST_SLACK, HOPELESS, RATIO_PAIRS, SearchConfig,
                                       SearchState, Stop)


def screen_on(cfg: SearchConfig, state: SearchState, can_screen: bool) -> bool:
    """Whether new candidates go to the screen (else straight to the judge)."""
    if cfg.screen_batch <= 0 or not can_screen:
        return False
    if cfg.max_screened is not None and state.screened + state.screening >= cfg.max_screened:
        return False
    return cfg.time_budget_s is None or state.screen_s < cfg.screen_share * cfg.time_budget_s


def evals_left(cfg: SearchConfig, state: SearchState) -> int:
    """Judge evaluations left, less those the screen batches in flight will likely ask for."""
    return (cfg.max_evals - state.evaluated - len(state.judging) - len(state.finalists)
            - cfg.finalists * len(state.batches))


def best_speedup(baseline: Baseline | None, best_ms: float) -> float:
    if baseline is None or baseline.eager is None or not math.isfinite(best_ms):
        return 0.0
    return baseline.eager.median_ms / best_ms


def stop_reason(cfg: SearchConfig, state: SearchState, now: float, speedup: float) -> Stop | None:
    """Why the search stops now, or None while it goes on. The budget buys search: its clock starts with the first
    proposal, and it never ends a search before the first judged evaluation (past the screen's share of it,
    candidates go to the judge directly)."""
    started = state.evaluated + len(state.judging)
    if started >= cfg.max_evals:
        return Stop.MAX_EVALS
    if cfg.time_budget_s is not None and state.start is not None and started > 0 \
            and now - state.start >= cfg.time_budget_s:
        return Stop.TIME_BUDGET
    if cfg.target_speedup is not None and speedup >= cfg.target_speedup:
        return Stop.TARGET
    if cfg.stall is not None and state.since_best >= cfg.stall:
        return Stop.STALL
    if state.exhausted and not state.queue and not state.finalists and not state.batches:
        return Stop.EXHAUSTED
    return None


def wait_limit(cfg: SearchConfig, state: SearchState, now: float) -> float | None:
    """How long to wait for work to finish: while screen batches are in flight, not past the end of the time budget
    (a batch must not outlast it); else, or once it has ended, as long as it takes (None)."""
    if not state.batches or state.cancelled or cfg.time_budget_s is None or state.start is None:
        return None
    left = state.start + cfg.time_budget_s - now
    return left + 0.01 if left > 0 else None


def describe(stop: Stop, cfg: SearchConfig, why: list[str]) -> str:
    """The stop reason as the run records it; ``why`` holds what the proposers that stopped said."""
    if stop is Stop.MAX_EVALS:
        return f"reached --max-evals {cfg.max_evals}"
    if stop is Stop.TIME_BUDGET:
        return f"reached --time-budget {cfg.time_budget_s:g} s"
    if stop is Stop.TARGET:
        return f"reached the target speedup {cfg.target_speedup:g}x"
    if stop is Stop.STALL:
        return f"no improvement in {cfg.stall} evaluations"
    return "the proposers have nothing left to try" + (f" ({'; '.join(why)})" if why else "")


def count_result(state: SearchState, result: Result, judged: bool) -> None:
    """Take a verdict into the counts: a new best resets the stall count, any other judged one adds to it."""
    state.recorded += 1
    if result.ok and result.timed and result.runtime_ms is not None and result.runtime_ms < state.best_ms:
        state.best_ms, state.since_best = result.runtime_ms, 0
    elif judged:
        state.since_best += 1


def baseline_ms(baseline: Baseline, name: object) -> float | None:
    """The time of the baseline named ``name`` (a Baseline field: "eager", "compiled"), None if it has none."""
    timing = {"eager": baseline.eager, "compiled": baseline.compiled}.get(str(name))
    return None if timing is None else timing.median_ms


def hopeless_ms(baseline: Baseline | None) -> float | None:
    """A screen time past which a candidate is not worth judging: HOPELESS times the faster baseline (eager or
    torch.compile, by the judge). The clocks differ by a few percent, the factor by far more."""
    times = [t.median_ms for t in (baseline.eager, baseline.compiled) if t is not None] if baseline is not None else []
    return HOPELESS * min(times) if times else None


def screen_bar(history: list[Node]) -> float | None:
    """The fastest screen time among the nodes the judge verified (None before the first)."""
    times = [n.screen.ms for n in history if n.ok and n.screen is not None and n.screen.ms is not None]
    return min(times) if times else None


def pick_finalists(cfg: SearchConfig, state: SearchState, screened: list[tuple[Node, ScreenResult]],
                   bar: float | None, hopeless: float | None) -> list[int]:
    """The ids of a screened batch's finalists, the fastest first: the first batch's best always, a later batch's
    only where the screen timed them near the fastest kernel the judge has verified (``bar``), never one past
    ``hopeless``, and no more than the judge evaluations left."""
    passed = sorted(((n, r) for n, r in screened if r.ok),
                    key=lambda nr: math.inf if nr[1].ms is None else nr[1].ms)  # untimed last, in proposal order
    room = max(0, cfg.max_evals - state.evaluated - len(state.judging) - len(state.finalists))
    passed = [(n, r) for n, r in passed if r.ms is None or hopeless is None or r.ms <= hopeless]
    return [n.id for n, r in passed[:min(cfg.finalists, room)]
            if bar is None or r.ms is None or r.ms <= bar * (1 + FINALIST_SLACK)]


def backups_of(chosen: list[int]) -> dict[int, list[int]]:
    """Each finalist's backups: the finalists of its batch after it."""
    return {node_id: chosen[i + 1:] for i, node_id in enumerate(chosen[:-1])}


def queue_finalists(state: SearchState, finalists: list[Node], unscreened: list[Node], screened: int) -> None:
    """Take a screened batch into the state: its finalists (the fastest first) wait for the judge, each with the ones
    after it as its backups, then the candidates the screen failed to screen; a batch of ``screened`` candidates
    that sent none on counts as an evaluation without a new best."""
    state.finalists.extend(finalists)
    state.backups.update(backups_of([n.id for n in finalists]))
    state.finalists.extend(unscreened)
    if screened and not finalists:
        state.since_best += 1
    if screened:
        state.recorded += 1  # the tree holds new screen times: a proposer that had nothing may have some now


def next_finalist(state: SearchState) -> Node | None:
    """The first waiting finalist that is not a backup of one the judge is still timing (with several workers,
    a backup waits for its batch's verdict rather than going to a free worker at once)."""
    for node in state.finalists:
        if not any(node.id in state.backups.get(j, ()) for j in state.judging):
            return node
    return None


def judge_ratio(history: list[Node], leave_out: int) -> float:
    """The median ratio of the judge's time to the screen's over the run's verified nodes other than
    ``leave_out``, once there are RATIO_PAIRS of them; 1 before."""
    ratios = [n.runtime_ms / n.screen.ms for n in history
              if n.id != leave_out and n.runtime_ms is not None and n.screen is not None and n.screen.ms]
    return statistics.median(ratios) if len(ratios) >= RATIO_PAIRS else 1.0


def screen_agrees(agree: float | None, node: Node, result: Result, history: list[Node]) -> bool:
    """Whether the judge timed finalist ``node`` within ``agree`` of what its screen time predicts: the screen then
    ranked its batch right, and the backups behind it need no verdict. The prediction is the screen time times the
    run's usual ratio of the two (judge_ratio): on some kernels the judge's longer timing is steadily slower for
    every candidate alike (a GPU's power cap lowering its clock), which leaves the screen's ranking right."""
    screen_ms = node.screen.ms if node.screen is not None else None
    if agree is None or not (result.ok and result.timed) or result.runtime_ms is None or not screen_ms:
        return False
    return abs(result.runtime_ms / (screen_ms * judge_ratio(history, node.id)) - 1) <= agree


def drop_backups(cfg: SearchConfig, state: SearchState, node: Node, result: Result, history: list[Node]) -> list[Node]:
    """The backups of finalist ``node`` that are not judged now that the judge has timed it as its screen time
    predicts (screen_agrees), taken off the waiting finalists: slower on the screen, their screen result is their
    last word. A finalist that failed the judge, or whose times disagree, leaves them waiting."""
    later = state.backups.pop(node.id, None)
    if not later or not screen_agrees(cfg.backup_agree, node, result, history):
        return []
    waiting = {n.id: n for n in state.finalists if n.id in later}
    state.finalists = deque(n for n in state.finalists if n.id not in waiting)
    for node_id in waiting:
        state.backups.pop(node_id, None)
    return list(waiting.values())


def closes(cfg: SearchConfig, state: SearchState, stop: Stop, speedup: float) -> bool:
    """Whether the closing round is held: once, when on, unless the search stopped on --max-evals or the target."""
    target = cfg.target_speedup
    return not state.closed and cfg.closing and stop is not Stop.MAX_EVALS \
        and not (target is not None and speedup >= target)


def closing_room(cfg: SearchConfig, state: SearchState) -> int:
    return min(cfg.finalists, cfg.max_evals - state.evaluated - len(state.judging))


def closing_picks(state: SearchState, fallbacks: list[tuple[Candidate, float]],
                  bar: float | None) -> list[Node | Candidate]:
    """What the closing round may judge, the fastest first: waiting finalists and the proposers' fallbacks (with
    the baseline's time of their kernel) timed at least CLOSING_MARGIN under the best judged time. A screen time is
    held against the best judged time and against ``bar``, the fastest screen time of a verified node (the same
    clock); a baseline's time, taken the judge's way, against the best judged time alone."""
    limit = min(state.best_ms, bar or math.inf) * (1 - CLOSING_MARGIN)
    known: list[tuple[float, Node | Candidate]] = [
        (n.screen.ms, n) for n in state.finalists if n.screen is not None and n.screen.ms is not None
        and n.screen.ms < limit]
    known += [(ms, c) for c, ms in fallbacks if ms < state.best_ms * (1 - CLOSING_MARGIN)]
    return [item for _, item in sorted(known, key=lambda k: k[0])]

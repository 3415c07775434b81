"""The search's decisions: which proposer goes next and with how many candidates, which screened candidates go on to
the judge and which wait as backups, when to stop and why, and what the closing round judges. Each is a plain
function of the configuration and the state (state.py); the driver (loop.py) only moves work and results."""
from __future__ import annotations

import math
import statistics
from collections import Counter
from typing import TYPE_CHECKING, Sequence

from kernelevolve.candidate import Candidate
from kernelevolve.evaluate.result import Baseline, Result, ScreenResult
from kernelevolve.rows import Experience, Node
from kernelevolve.search.state import (CLOSING_MARGIN, FINALIST_SLACK, HOPELESS, RATIO_PAIRS, SearchConfig,
                                       SearchState, Stop)

if TYPE_CHECKING:
    from kernelevolve.profile import Profile

Seats = Sequence[tuple[str, int]]  # (name, weight) of each proposer, in the order they were given


def rank_experience(entries: list[Experience], profile: Profile | None) -> list[Experience]:
    """Earlier winners from problems like this one first: the same dtype, then the nearest size bucket (log2 of the
    bytes the problem moves), then the largest speedup over eager."""
    dtype, nbytes = (profile.dtype, profile.bytes) if profile else (None, None)

    def key(e: Experience) -> tuple[bool, int, float]:
        size = abs(math.log2(e.bytes / nbytes)) if e.bytes and nbytes else 64.0
        return (not (dtype and e.dtype == dtype), round(size), -(e.speedup_eager or 0.0))

    return sorted(entries, key=key)


def proposer_promise(history: list[Node], names: list[str], per: int) -> dict[str, float]:
    """How much of the next ask each proposer gets, against its weight: twice for the one whose kernel is the run's
    fastest (by the judge, else by the screen) among those it proposed, half for one whose last ``2 * per``
    candidates all failed. A kernel the run was handed (``reused``: a baseline's, an earlier run's winner) says
    nothing of how its proposer will do here: a run that starts from max-autotune's kernel would otherwise give the
    Inductor proposer, whose configurations rarely beat it, the turns after the template's first batch."""
    def ms(n: Node) -> float | None:
        if n.runtime_ms is not None:
            return n.runtime_ms
        return n.screen.ms if n.result is None and n.screen is not None and n.screen.ok else None

    out = dict.fromkeys(names, 1.0)
    timed = [n for n in history if ms(n) is not None and not n.meta.get("reused")]
    judged = [n for n in timed if n.runtime_ms is not None]
    pool = judged or timed
    if pool:
        leader = min(pool, key=lambda n: ms(n)).proposer
        if leader in out and len(names) > 1:
            out[leader] = 2.0
    for name in names:
        mine = [n for n in history if n.proposer == name and (n.result is not None or n.screen is not None)]
        recent = mine[-2 * per:]
        if len(recent) >= 2 * per and not any(n.ok or (n.screen is not None and n.screen.ok) for n in recent):
            out[name] = min(out[name], 0.5)
    return out


def promise(history: list[Node], seats: Seats, wanted: int) -> tuple[int, dict[str, float]]:
    """(candidates per proposer of an ask for ``wanted``, each proposer's promise: see proposer_promise)."""
    per = max(1, math.ceil(wanted / max(1, len(seats))))
    return per, proposer_promise(history, [name for name, _ in seats], per)


def batch_size(cfg: SearchConfig, seats: Seats, name: str) -> int:
    """A screen batch of ``name``'s candidates: ``screen_batch`` for the heaviest proposer, smaller in proportion
    to its weight for a slower one."""
    weights = dict(seats)
    top = max(weights.values(), default=1)
    return max(1, round(cfg.screen_batch * weights.get(name, top) / top))


def ask_sizes(cfg: SearchConfig, seats: Seats, history: list[Node], wanted: int, screening: bool) -> list[int]:
    """How many candidates to ask each proposer for, in the order of ``seats``: a batch's worth by its weight while
    the screen is on, else its share of ``wanted`` by its weight; either times its promise."""
    per, promised = promise(history, seats, wanted)
    return [max(1, round((batch_size(cfg, seats, name) if screening else per * weight) * promised[name]))
            for name, weight in seats]


def may_ask(state: SearchState) -> bool:
    """After an ask made while evaluations were in flight came back empty, the next waits for a new result:
    proposers that build on results (tuning around the best) may have more to offer once those are in."""
    return not state.exhausted and state.empty_at != state.recorded


def whom_to_ask(state: SearchState, seats: Seats, screening: bool) -> list[str]:
    """The proposers an ask goes to. With the screen on, those with candidates queued are left out, so that the
    queue does not fill with one slow proposer's candidates while another waits for its turn, and no proposer is
    asked again before its last answer is in the tree (it would propose the same sources again)."""
    skip = {c.proposer for c in state.queue} if screening else set()
    return [name for name, _ in seats if name not in skip]


def take_proposal(state: SearchState, cands: list[Candidate], proposers: int) -> None:
    """Queue an ask's answer: the proposers it went to that gave nothing are dry until the next result; an ask to
    everyone that gave nothing ends the proposals, unless it was made before some results were in (then the next
    ask waits for one)."""
    recorded, partial = state.asked_at
    got = {c.proposer for c in cands}
    for name in state.asked_for:
        if name not in got:
            state.dry[name] = recorded
    everyone = len(state.asked_for) == proposers  # a partial ask's silence is its proposers' (dry)
    if cands:
        state.empty_at = None
    elif partial and everyone:
        state.empty_at = recorded
    elif everyone and not state.queue:
        state.exhausted = True
    state.queue.extend(cands)


def next_proposer(cfg: SearchConfig, state: SearchState, history: list[Node], seats: Seats) -> str | None:
    """The proposer whose batch goes next: the fewest batches sent against its weight times its promise (the
    leader's is twice), so that the proposer holding the fastest kernel gets most batches and a slow one
    (Inductor's, tens of seconds a batch) gets its turn without holding the GPU from the others. A proposer
    counts if it has candidates queued or may still have some (it is not dry)."""
    _, promised = promise(history, seats, cfg.screen_batch)
    queued = Counter(c.proposer for c in state.queue)
    best: tuple[float, int, str] | None = None
    for i, (name, weight) in enumerate(seats):
        if not queued[name] and state.dry.get(name) == state.recorded:
            continue
        score = (state.batches_sent[name] + 1) / (weight * promised[name])
        if best is None or (score, i) < best[:2]:
            best = (score, i, name)
    return None if best is None else best[2]


def batch_room(cfg: SearchConfig, state: SearchState, seats: Seats, name: str) -> int:
    """How many of ``name``'s queued candidates its next screen batch holds."""
    room = batch_size(cfg, seats, name)
    if cfg.max_screened is not None:
        room = min(room, cfg.max_screened - state.screened - state.screening)
    return room


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

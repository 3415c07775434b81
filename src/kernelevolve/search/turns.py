"""The proposers' turns: who is asked, for how many candidates, and whose batch goes to the screen next. Plain
functions of the configuration and the state (state.py), like the rest of the policy (policy.py)."""
from __future__ import annotations

import math
from collections import Counter
from typing import TYPE_CHECKING, Sequence

from kernelevolve.candidate import Candidate
from kernelevolve.rows import Experience, Node
from kernelevolve.search.state import MAX_REPEATS, SearchConfig, SearchState, Step

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


def after_repeat(state: SearchState) -> Step:
    """Whether the search goes on after the proposers repeated a source the run holds: DONE once they have done so
    MAX_REPEATS times in a row."""
    return Step.TOOK if state.repeats < MAX_REPEATS else Step.DONE

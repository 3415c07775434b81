"""The ``manual`` proposer: a person or an external coding agent answers the prompts.

Each step writes ``DIR/run<R>-<NNN>.prompt.md`` (the system text, then the prompt) and waits for
``DIR/run<R>-<NNN>.reply.md``, which is parsed like a model's reply: a fenced ```python block defining ``ModelNew``.
A reply written as ``.reply.md.tmp`` and renamed is never read half-written. When no reply comes within the timeout
the proposer stops, and the search ends as usual; ``kernelevolve optimize --resume RUN`` picks the run up again, and a
reply that arrived meanwhile is used. Numbering follows the run's recorded calls, so a resumed run asks for the same
files.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from kernelevolve.propose.llm import PromptedProposer, Reply
from kernelevolve.propose.prompt import Prompt

log = logging.getLogger(__name__)

POLL_S = 0.5


class ManualProposer(PromptedProposer):
    name = "manual"

    def __init__(self, device: str, directory: str | Path, timeout_s: float = 3600.0, **kw: Any):
        super().__init__(device, concurrency=1, **kw)
        self.dir = Path(directory)
        self.timeout_s = timeout_s
        self.asked = 0
        self.timed_out = False

    def propose(self, ctx, n):  # one prompt at a time: a person answers them in order
        return [] if self.timed_out else super().propose(ctx, 1)

    def done(self) -> bool:
        return self.timed_out

    def _stem(self) -> str:
        done = len(self.store.llm_calls(self.run_id)) if self.store is not None and self.run_id is not None else 0
        return f"run{self.run_id or 0}-{max(done, self.asked) + 1:03d}"

    def answer(self, prompt: Prompt, index: int) -> Reply:
        self.dir.mkdir(parents=True, exist_ok=True)
        stem = self._stem()
        self.asked += 1
        prompt_path, reply_path = self.dir / f"{stem}.prompt.md", self.dir / f"{stem}.reply.md"
        if not prompt_path.exists():
            text = (f"<!-- strategy: {prompt.strategy}; answer in {reply_path.name} -->\n\n"
                    f"# System\n\n{prompt.system}\n\n# Prompt\n\n{prompt.user}")
            tmp = prompt_path.with_name(prompt_path.name + ".tmp")
            tmp.write_text(text)
            tmp.replace(prompt_path)
        log.warning("manual: waiting up to %.0f s for %s (the prompt is %s)", self.timeout_s, reply_path, prompt_path)
        start = time.monotonic()
        while not reply_path.exists():
            if time.monotonic() - start >= self.timeout_s:
                self.timed_out = True
                self.asked -= 1  # the same file is asked for again on resume
                return Reply(None, "manual", f"timeout: no {reply_path.name} within {self.timeout_s:g} s")
            time.sleep(POLL_S)
        text = reply_path.read_text()
        return Reply(text, "manual", "", latency_s=time.monotonic() - start)

    def _candidate(self, strategy, parent, prompt, reply):
        if self.timed_out and reply.text is None:
            return None  # not a failed call: nobody answered yet, and resume will ask for the same file
        return super()._candidate(strategy, parent, prompt, reply)


__all__ = ["ManualProposer"]

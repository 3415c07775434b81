"""The ``manual`` proposer: a person or an external coding agent answers the prompts.

Each step writes ``DIR/run<R>-<NNN>.prompt.md`` (the system text, then the prompt) and waits for
``DIR/run<R>-<NNN>.reply.md``, which is parsed like a model's reply: a fenced ```python block defining ``ModelNew``.
A reply written as ``.reply.md.tmp`` and renamed is never read half-written. Once the reply is judged (or found
without code, or a repeat of a known candidate) its verdict is written beside it as ``run<R>-<NNN>.verdict.json``
and a short ``run<R>-<NNN>.verdict.md``; the next prompt is written only after that, and a repair prompt carries the
same findings. When no reply comes within the timeout the proposer stops, and the search ends as usual;
``kernelevolve optimize --resume RUN`` picks the run up again, and a reply that arrived meanwhile is used. Numbering
follows the run's recorded calls, so a resumed run asks for the same files.
"""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from kernelevolve.propose.llm import PromptedProposer, Reply
from kernelevolve.propose.prompt import Prompt, estimate_tokens, verdict_of
from kernelevolve.rows import Node

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
        return self.timed_out or super().done()

    def _stem(self) -> str:
        done = len(self.store.llm_calls(self.run_id)) if self.store is not None and self.run_id is not None else 0
        return f"run{self.run_id or 0}-{max(done, self.asked) + 1:03d}"

    def answer(self, prompt: Prompt, index: int) -> Reply:
        self.dir.mkdir(parents=True, exist_ok=True)
        stem = self._stem()
        self.asked += 1
        prompt_path, reply_path = self.dir / f"{stem}.prompt.md", self.dir / f"{stem}.reply.md"
        if not prompt_path.exists():
            text = (f"<!-- strategy: {prompt.strategy}; answer in {reply_path.name}: one ```python block holding the "
                    f"whole file, defining class ModelNew; the verdict comes back as {stem}.verdict.md -->\n\n"
                    f"# System\n\n{prompt.system}\n\n# Prompt\n\n{prompt.user}")
            _write(prompt_path, text)
        log.warning("manual: waiting up to %.0f s for %s (the prompt is %s)", self.timeout_s, reply_path, prompt_path)
        start = time.monotonic()
        while not reply_path.exists():
            if time.monotonic() - start >= self.timeout_s:
                self.timed_out = True
                self.stopped = f"no {reply_path.name} within {self.timeout_s:g} s (resume the run to wait again)"
                self.asked -= 1  # the same file is asked for again on resume
                return Reply(None, "manual", f"timeout: no {reply_path.name} within {self.timeout_s:g} s")
            time.sleep(POLL_S)
        text = reply_path.read_text()
        # tokens as estimated for the prompt budget: a person's answer has no meter, but it has a size
        return Reply(text, "manual", "", estimate_tokens(prompt.system) + estimate_tokens(prompt.user),
                     estimate_tokens(text), latency_s=time.monotonic() - start, ref=reply_path.name)

    def _candidate(self, strategy, parent, prompt, reply, known=None):
        if self.timed_out and reply.text is None:
            return None  # not a failed call: nobody answered yet, and resume will ask for the same file
        return super()._candidate(strategy, parent, prompt, reply, known)

    def on_call(self, reply: Reply, status: str, detail: str) -> None:
        """A reply that will not be judged gets its verdict at once."""
        if reply.ref and status != "candidate":
            why = {"no_code": "no candidate in the reply", "repeat": "not judged", "error": "the call failed"}
            self._write_verdict(reply.ref, {"status": status, "reason": f"{why.get(status, status)}: {detail}",
                                            "judged": False}, f"**{status}**: {why.get(status, status)}: {detail}")

    def observe(self, node: Node) -> None:
        ref = node.meta.get("reply")
        if ref and ref.startswith(f"run{self.run_id or 0}-"):  # a reply of this run's, never an earlier run's
            payload, text = verdict_of(node)
            self._write_verdict(ref, payload, text)

    def _write_verdict(self, ref: str, payload: dict[str, Any], text: str) -> None:
        stem = ref.removesuffix(".reply.md")
        _write(self.dir / f"{stem}.verdict.json", json.dumps(payload, indent=1, default=str) + "\n")
        _write(self.dir / f"{stem}.verdict.md", f"# Verdict on {ref}\n\n{text.strip()}\n")


def _write(path: Path, text: str) -> None:
    """Whole or not at all: whoever watches the folder never reads a file half-written."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


__all__ = ["ManualProposer"]

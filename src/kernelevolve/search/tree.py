"""The run's search tree in memory: read from the store once (a resumed run's nodes), then kept as the store holds it
with every write the search makes."""
from __future__ import annotations

import hashlib
from dataclasses import replace

from kernelevolve.candidate import Candidate
from kernelevolve.evaluate.result import Result, ScreenResult
from kernelevolve.rows import Node
from kernelevolve.search.state import KNOWN_SEEDS
from kernelevolve.store import Store


class Tree:
    def __init__(self, store: Store, run_id: int, problem_sha: str, device_key: str):
        self.store, self.run_id, self.problem_sha, self.device_key = store, run_id, problem_sha, device_key
        self.nodes = store.nodes(run_id)  # oldest first
        self.position = {n.id: i for i, n in enumerate(self.nodes)}

    def add(self, cand: Candidate) -> Node:
        """Store ``cand`` as a node of the run and append it to the tree."""
        node = self.store.add_node(self.run_id, self.problem_sha, self.device_key, cand)
        self.position[node.id] = len(self.nodes)
        self.nodes.append(node)
        return node

    def find(self, sha: str) -> Node | None:
        return next((n for n in self.nodes if n.sha == sha), None)

    def current(self, node: Node) -> Node:
        """``node`` as the tree holds it now."""
        return self.nodes[self.position[node.id]] if node.id in self.position else node

    def put(self, node: Node) -> Node:
        self.nodes[self.position[node.id]] = node
        return node

    def save_result(self, node: Node, result: Result) -> Node:
        self.store.save_result(node.id, result)
        return self.put(replace(node, result=result))  # as the store now holds it

    def save_screen(self, node: Node, result: ScreenResult, finalist: bool) -> Node:
        self.store.save_screen(node.id, result, finalist)
        return self.put(replace(node, screen=result, finalist=finalist))

    def drop_finalist(self, backup: Node) -> Node:
        """A backup finalist left unjudged: its screen result is its last word."""
        assert backup.screen is not None  # a backup is one of its batch's screened finalists
        screen = replace(backup.screen, details={**backup.screen.details, "backup": "not judged"})
        self.store.drop_finalist(backup.id, screen)
        return self.put(replace(backup, finalist=False, screen=screen))

    def pending(self) -> list[Node]:
        """Nodes a killed run left without a verdict: finalists, and those it had not screened yet."""
        return [n for n in self.nodes if n.result is None and not n.screened_out]

    def known_seeds(self) -> list[Candidate]:
        """The fastest kernels already verified for this problem on this device model (a baseline stored beside the
        run, or an earlier run's winners) that the tree does not hold yet, as candidates of this run."""
        held = {n.sha for n in self.nodes}
        out = []
        for known in self.store.fastest_known(self.problem_sha, self.device_key, KNOWN_SEEDS):
            if hashlib.sha256(known.source.encode()).hexdigest() in held:  # a start kernel of this run, say
                continue
            # what made it that run's (its call and reply file, its start-file role) stays with that run
            meta = {k: v for k, v in known.meta.items() if k not in ("llm_call", "reply", "start", "root")}
            out.append(Candidate(known.source, proposer=known.proposer, language=known.language,
                                 meta={**meta, "reused": True}))
        return out

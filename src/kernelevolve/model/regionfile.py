"""A region of a whole model as a problem file of its own, in the KernelBench format.

The file's ``Model`` computes the region's ops, written as the ATen calls they were traced as, with the region's
weights taken from the model (built from its own ``get_init_inputs()`` with a fixed seed). Its ``get_inputs()`` runs
the model's own ``get_inputs()`` through the part of the graph before the region: indices stay in range, offsets
monotone and masks as the model makes them, and every draw of the model's inputs is a fresh draw of the region's.
The model's file is copied beside the region files, which read it by that name; a region file runs alone with
``kernelevolve optimize``.
"""
from __future__ import annotations

import math
from pathlib import Path

import torch.fx as fx

from kernelevolve.analyze.graph import CapturedGraph, dtype, op_name, shape
from kernelevolve.model.partition import Region
from kernelevolve.templates.program import Namer, node_line

# the model's parameters and buffers, saved beside its copy where they are large (save_state)
STATE_FILE = "model_state.pt"
SAVE_STATE_BYTES = 256 << 20

# how a file written from a model finds it (beside it, else where it was written) and builds it: shared by the region
# and part files (model/parts.py)
SOURCE_LOADER = '''SOURCE = Path(__file__).with_name({source!r})  # the whole model this file comes from
if not SOURCE.exists():  # a copy of this file elsewhere (a candidate's, say) reads the model where it was
    SOURCE = Path({where!r})


@functools.lru_cache(maxsize=None)
def _source():
    spec = importlib.util.spec_from_file_location("_kernelevolve_source_" + SOURCE.stem, SOURCE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.lru_cache(maxsize=None)
def _source_model():
    """The model as its file builds it, with a fixed seed, on the CPU; the caller's random state is left alone."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed({init_seed})
        return _source().Model(*_source().get_init_inputs())'''

HEADER = '''"""{doc}"""
import functools
import hashlib
import importlib.util
from pathlib import Path

import torch
import torch.nn as nn

@SOURCE_LOADER@


@functools.lru_cache(maxsize=None)
def _source_state():
    """The model's parameters and buffers: from the file of them saved beside the model where it was saved from this
    very model file and seed (a large model is built once, not in every process), else the model built."""
    saved = SOURCE.with_name({state!r})
    if saved.exists():
        kept = torch.load(saved, mmap=True, weights_only=True)
        if kept.get("source_sha") == hashlib.sha256(SOURCE.read_bytes()).hexdigest() and \\
                kept.get("init_seed") == {init_seed}:
            return kept["state"]
    model = _source_model()
    return {{**dict(model.named_parameters()), **dict(model.named_buffers())}}
'''

MODEL = '''

class Model(nn.Module):
    """{doc}"""

    def __init__(self):
        super().__init__()
        state = _source_state()
{weights}

    def forward(self{params}):
{body}
'''

INPUTS = '''

def get_inputs():
    """The model's own inputs run through the graph up to this region."""
    args = list(_source().get_inputs())
    _dev = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
    _w = {{k: v.to(_dev) for k, v in _source_state().items() if k in {needed!r}}}
    with torch.no_grad():
{body}


def get_init_inputs():
    return []
'''


def _indent(lines: list[str], n: int = 8) -> str:
    return "\n".join(" " * n + line for line in lines)


def _state_inputs(graph: CapturedGraph) -> dict[fx.Node, str]:
    return dict(zip(graph.placeholders(), graph.state_names))


def _weight_closure(graph: CapturedGraph, region: Region) -> list[fx.Node]:
    """The nodes outside the region that compute its inputs from the weights alone (a transpose of a weight matrix,
    a constant): they join the region's forward, so that every input the file draws depends on the model's inputs."""
    state = set(_state_inputs(graph))
    forward_inputs = set(graph.placeholders()[len(graph.state_names):])
    pure: dict[fx.Node, bool] = {}

    def weights_only(n: fx.Node) -> bool:
        if n not in pure:
            if n in forward_inputs:
                pure[n] = False
            elif n in state or n.op == "get_attr":
                pure[n] = True
            else:
                pure[n] = all(weights_only(a) for a in n.all_input_nodes)
        return pure[n]

    extra: set[fx.Node] = set()

    def pull(n: fx.Node) -> None:
        if n in state or n in extra or n.op != "call_function" and n.op != "get_attr":
            return
        extra.add(n)
        for a in n.all_input_nodes:
            pull(a)

    for n in region.inputs:
        if n not in state and weights_only(n):
            pull(n)
    order = {n: i for i, n in enumerate(graph.graph.nodes)}
    return sorted(extra, key=order.__getitem__)


def _ancestors(nodes: list[fx.Node]) -> set[fx.Node]:
    seen: set[fx.Node] = set()
    stack = list(nodes)
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        stack.extend(n.all_input_nodes)
    return seen


def region_parts(graph: CapturedGraph, region: Region) -> tuple[list[fx.Node], list[fx.Node], list[fx.Node]]:
    """What the region's file computes: its nodes with the weight-only ones before it (graph order), the weights
    they read (the file's ``w0, w1, ...``) and the activations (its forward's ``x0, x1, ...``), in first-use order.
    Every instance of one signature gives the same lists, position by position."""
    state = _state_inputs(graph)
    order = {n: i for i, n in enumerate(graph.graph.nodes)}
    closure = _weight_closure(graph, region)
    nodes = sorted(set(region.nodes) | set(closure), key=order.__getitem__)
    inside = set(nodes)
    inputs = []
    for n in nodes:
        for a in n.all_input_nodes:
            if a not in inside and a not in inputs:
                inputs.append(a)
    return nodes, [a for a in inputs if a in state], [a for a in inputs if a not in state]


def region_source(graph: CapturedGraph, region: Region, source_name: str, doc: str, init_seed: int = 0,
                  source_path: Path | None = None) -> str:
    """The problem file of ``region`` (its first instance: the others share its signature); ``source_path``, the
    model's absolute path, is where a copy of the file elsewhere finds the model."""
    state = _state_inputs(graph)
    order = {n: i for i, n in enumerate(graph.graph.nodes)}
    nodes, weights, activations = region_parts(graph, region)

    # the region's forward
    name = Namer()
    lines_w = []
    for k, w in enumerate(weights):
        name.names[w] = f"self.w{k}"
        lines_w.append(f"self.w{k} = _keep(state[{state[w]!r}])  # {tuple(shape(w))} {dtype(w)}")
    for k, a in enumerate(activations):
        name.names[a] = f"x{k}"
    body = []
    if any("_dev" in _const_hint(n) for n in nodes):
        body.append("_dev = x0.device" if activations else "_dev = self.w0.device")
    for n in nodes:
        name.names[n] = f"v_{n.name}"
        body.append(node_line(graph.gm, n, name))
    outs = [name(n) for n in region.outputs]
    body.append(f"return {outs[0]}" if len(outs) == 1 else f"return ({', '.join(outs)})")
    params = "".join(f", x{k}" for k in range(len(activations)))

    # get_inputs: the graph before the region, from the model's own inputs
    before = sorted(_ancestors(activations), key=order.__getitem__)
    pname = Namer()
    needed = []
    forward_inputs = graph.placeholders()[len(graph.state_names):]
    for k, p in enumerate(forward_inputs):
        pname.names[p] = f"args[{k}]"
    prefix = []
    for n in before:
        if n in state:
            pname.names[n] = f"_w[{state[n]!r}]"
            needed.append(state[n])
        elif n.op == "placeholder":
            continue
        else:
            pname.names[n] = f"v_{n.name}"
            prefix.append(node_line(graph.gm, n, pname))
    prefix.append(f"return [{', '.join(pname(a) + '.detach().clone()' for a in activations)}]")

    ops = ", ".join(dict.fromkeys(op_name(n) for n in region.nodes))
    text = HEADER.replace("@SOURCE_LOADER@", SOURCE_LOADER).format(
        doc=doc, source=source_name, init_seed=init_seed, where=str(source_path or source_name), state=STATE_FILE)
    text += KEEP
    text += MODEL.format(doc=f"{region.kind} region: {ops}"[:110], weights=_indent(lines_w) or "        pass",
                         params=params, body=_indent(body))
    text += INPUTS.format(needed=sorted(set(needed)), body=_indent(prefix, 8))
    return text


KEEP = '''

def _keep(t):
    """A copy of one of the model's weights, a parameter where the model holds a parameter."""
    t = t.detach().clone()
    return nn.Parameter(t, requires_grad=False) if t.is_floating_point() else nn.Buffer(t)
'''


def _const_hint(n: fx.Node) -> str:
    """Whether a node names a device (written as ``_dev``): a device argument, or a traced constant made on it."""
    import torch

    if n.op == "get_attr":
        return "_dev"
    leaves = [*n.args, *n.kwargs.values()]
    return "_dev" if any(isinstance(a, torch.device) for a in leaves) else ""


def state_bytes(graph: CapturedGraph) -> int:
    """What the model's parameters and buffers take."""
    nodes = graph.placeholders()[:len(graph.state_names)]
    return sum(math.prod(shape(n)) * dtype(n).itemsize for n in nodes if dtype(n) is not None)


def save_state(out_dir: Path, source_name: str, init_seed: int = 0) -> Path:
    """The model (the copy in ``out_dir``) built as its region files build it, its parameters and buffers saved
    beside it with the hash of its file and the seed: each region file's process then maps them from the file
    instead of building the model again (seconds for a DLRM's 2 GB of embedding tables)."""
    import hashlib
    import importlib.util

    import torch

    source = out_dir / source_name
    spec = importlib.util.spec_from_file_location(f"_kernelevolve_state_{source.stem}", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(init_seed)
        model = module.Model(*module.get_init_inputs())
    state = {k: v.detach() for k, v in [*model.named_parameters(), *model.named_buffers()]}
    path = out_dir / STATE_FILE
    torch.save({"source_sha": hashlib.sha256(source.read_bytes()).hexdigest(), "init_seed": init_seed,
                "state": state}, path)
    return path


def write_region(graph: CapturedGraph, region: Region, out_dir: Path, source_name: str, doc: str,
                 init_seed: int = 0) -> Path:
    path = out_dir / f"region_{region.name}.py"
    path.write_text(region_source(graph, region, source_name, doc, init_seed, (out_dir / source_name).resolve()))
    return path


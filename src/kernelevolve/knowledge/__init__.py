"""Hardware and optimization notes (markdown with a small front matter) and their retrieval for prompts.

A note file starts with a block such as::

    ---
    title: Online softmax and row reductions in Triton
    families: row_reduction, attention
    bottlenecks: memory
    devices: any
    ---

``families`` takes the template families' names (FAMILIES, from ``kernelevolve.templates.registry``), the names
the prompted proposers pass to ``retrieve``; ``bottlenecks`` takes names from BOTTLENECKS; both also take ``any``.
``devices`` takes ``any`` (any GPU), architecture tags from ARCHITECTURES, ``cpu``, or device names matched as whole
words against the device's name ("H100"). A run on the CPU takes only the notes that name ``cpu``: the others speak
of GPUs.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from kernelevolve.templates.registry import NAMES

NOTES_DIR = Path(__file__).resolve().parent / "notes"

FAMILIES = NAMES
BOTTLENECKS = ("memory", "compute", "latency")
ARCHITECTURES = ("hopper", "ampere", "cdna3")
ANY = "any"
CPU = "cpu"  # the notes of a run on the CPU, and only those

# Device names as torch reports them ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "AMD Instinct MI300X"), and
# ROCm arch names for builds that report only those. First match wins; patterns are case-insensitive whole words.
_DEVICE_PATTERNS: list[tuple[str, str]] = [
    ("hopper", r"GH200|H100|H200|H800|H20"),
    ("ampere", r"A100|A800|A30|A40|A10G?|A16|A2|RTX A\d{4}|RTX 30[5-9]0(?: Ti)?"),
    ("cdna3", r"MI300[AX]?|MI308X|MI325X|gfx94[0-2]"),
]
_DEVICE_RES = [(tag, re.compile(rf"(?<![A-Za-z0-9])(?:{pat})(?![A-Za-z0-9])", re.IGNORECASE))
               for tag, pat in _DEVICE_PATTERNS]
_KEYS = ("title", "families", "bottlenecks", "devices")


class KnowledgeError(Exception):
    """A note folder is missing or a note file is malformed; the message names the path."""


@dataclass(frozen=True)
class Note:
    name: str  # file stem
    title: str
    families: tuple[str, ...]
    bottlenecks: tuple[str, ...]
    devices: tuple[str, ...]
    text: str  # the body, without front matter
    path: str


def device_tag(device_name: str | None) -> str | None:
    """The architecture tag of a device name ("NVIDIA H200" -> "hopper"), or None for an unknown device."""
    if not device_name:
        return None
    name = device_name.strip()
    if name.lower() in ARCHITECTURES:
        return name.lower()
    for tag, pattern in _DEVICE_RES:
        if pattern.search(name):
            return tag
    return None


def parse_note(path: str | Path) -> Note:
    """Read one note file; raise KnowledgeError naming the file when its front matter is malformed."""
    path = Path(path)
    try:
        raw = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise KnowledgeError(f"{path}: cannot read: {e}") from e
    lines = raw.splitlines()
    if not lines or lines[0].strip() != "---":
        raise KnowledgeError(f"{path}: no front matter (the first line must be '---')")
    try:
        end = next(i for i in range(1, len(lines)) if lines[i].strip() == "---")
    except StopIteration:
        raise KnowledgeError(f"{path}: front matter is not closed by a '---' line") from None
    fields: dict[str, str] = {}
    for n, line in enumerate(lines[1:end], start=2):
        if not line.strip():
            continue
        key, sep, value = line.partition(":")
        key = key.strip().lower()
        if not sep or key not in _KEYS:
            raise KnowledgeError(f"{path}:{n}: expected one of {', '.join(_KEYS)} as 'key: value', got {line!r}")
        if key in fields:
            raise KnowledgeError(f"{path}:{n}: {key} given twice")
        fields[key] = value.strip()
    missing = [k for k in _KEYS if not fields.get(k)]
    if missing:
        raise KnowledgeError(f"{path}: front matter lacks {', '.join(missing)}")
    text = "\n".join(lines[end + 1:]).strip()
    if not text:
        raise KnowledgeError(f"{path}: the note has no body")
    return Note(name=path.stem, title=fields["title"],
                families=_names(path, "families", fields["families"], FAMILIES),
                bottlenecks=_names(path, "bottlenecks", fields["bottlenecks"], BOTTLENECKS),
                devices=_devices(path, fields["devices"]), text=text, path=str(path))


def _split(value: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(v.strip() for v in value.split(",") if v.strip()))


def _names(path: Path, key: str, value: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
    names = tuple(v.lower() for v in _split(value))
    unknown = [v for v in names if v != ANY and v not in allowed]
    if unknown:
        raise KnowledgeError(f"{path}: unknown {key} {', '.join(unknown)} (allowed: {ANY}, {', '.join(allowed)})")
    if ANY in names and len(names) > 1:
        raise KnowledgeError(f"{path}: {key} mixes '{ANY}' with other names")
    return names


def _devices(path: Path, value: str) -> tuple[str, ...]:
    devices = tuple(v.lower() if v.lower() in (ANY, CPU, *ARCHITECTURES) else v for v in _split(value))
    if ANY in devices and len(devices) > 1:
        raise KnowledgeError(f"{path}: devices mixes '{ANY}' with other names")
    return devices


def load_notes(extra_dirs: Sequence[str | Path] = ()) -> list[Note]:
    """The package notes, then each folder's ``*.md`` in order; a note replaces an earlier one of the same name."""
    notes: dict[str, Note] = {}
    for folder in (NOTES_DIR, *extra_dirs):
        folder = Path(folder).expanduser()
        if not folder.is_dir():
            raise KnowledgeError(f"{folder}: notes folder not found")
        for path in sorted(folder.glob("*.md")):
            note = parse_note(path)
            notes.pop(note.name, None)  # a replacement takes the position of its folder
            notes[note.name] = note
    return list(notes.values())


def applies_to(note: Note, device_name: str | None) -> bool:
    """Whether a note's ``devices`` admit this device (an unknown device admits only ``any`` notes)."""
    if note.devices == (ANY,):
        return True
    tag = device_tag(device_name)
    for entry in note.devices:
        if entry in ARCHITECTURES:
            if entry == tag:
                return True
        elif device_name and re.search(rf"(?<![A-Za-z0-9]){re.escape(entry)}(?![A-Za-z0-9])", device_name,
                                       re.IGNORECASE):
            return True
    return False


def _rank(note: Note, families: set[str], bound: str | None) -> tuple | None:
    """Sort key of a note the device admits, or None when it is off topic.

    Tiers: 0 the device's architecture notes (device-specific, any family), 1 notes on one of the families,
    2 general notes on the bottleneck, 3 general notes. A note on other families is dropped; so is a general note
    on another bottleneck.
    """
    specific = note.devices != (ANY,)
    general = note.families == (ANY,)
    shared = len(families.intersection(note.families))
    bound_hit = bound is not None and bound in note.bottlenecks
    bound_ok = bound is None or bound_hit or note.bottlenecks == (ANY,)
    if shared:
        tier = 1
    elif not general or not bound_ok:
        return None
    elif specific:
        tier = 0
    else:
        tier = 2 if bound_hit else 3
    return (tier, -shared, not bound_hit, not specific, len(note.families), note.name)


def retrieve(device_name: str | None, families: Sequence[str], bound: str | None,
             extra_dirs: Sequence[str | Path] = (), max_chars: int = 8000, cpu: bool = False,
             exclude: Sequence[str] = ()) -> list[Note]:
    """Notes for a prompt, best first, whose ``render`` is at most ``max_chars`` long.

    Order: the device's architecture note, notes on the families, general notes on the bottleneck, general notes.
    Notes whose devices exclude this device are dropped; with ``cpu``, every note that does not name ``cpu``.
    ``exclude``: note names to leave out. Adding stops at the first note that would overflow ``max_chars``, except
    that an architecture note too large on its own is skipped rather than ending the list.
    """
    wanted = set(families) - {ANY}
    bound = bound if bound in BOTTLENECKS else None
    ranked = []
    for note in load_notes(extra_dirs):
        if note.name in exclude:
            continue
        if (CPU in note.devices) if cpu else applies_to(note, device_name):
            key = _rank(note, wanted, bound)
            if key is not None:
                ranked.append((key, note))
    ranked.sort(key=lambda pair: pair[0])
    chosen: list[Note] = []
    used = 0
    for key, note in ranked:
        size = len(_block(note)) + (2 if chosen else 0)
        if used + size > max_chars:
            if key[0] == 0 and not chosen:
                continue
            break
        chosen.append(note)
        used += size
    return chosen


def _block(note: Note) -> str:
    return f"## {note.title}\n\n{note.text}"


def render(notes: Sequence[Note]) -> str:
    """The notes as markdown sections: ``## {title}`` and the body, separated by blank lines."""
    return "\n\n".join(_block(n) for n in notes)

from pathlib import Path

import pytest

from kernelevolve.knowledge import (ANY, ARCHITECTURES, CPU, BOTTLENECKS, FAMILIES, NOTES_DIR, KnowledgeError, Note,
                                    applies_to, device_tag, load_notes, parse_note, render, retrieve)
from kernelevolve.templates.registry import NAMES

H200 = "NVIDIA H200"
MI300X = "AMD Instinct MI300X"


def write_note(folder: Path, name: str, body: str = "Body text.", title: str = "A user note",
               families: str = "any", bottlenecks: str = "any", devices: str = "any") -> Path:
    path = folder / f"{name}.md"
    path.write_text(f"---\ntitle: {title}\nfamilies: {families}\nbottlenecks: {bottlenecks}\n"
                    f"devices: {devices}\n---\n{body}\n")
    return path


def by_name(notes: list[Note]) -> dict[str, Note]:
    return {n.name: n for n in notes}


# --- the shipped notes ---------------------------------------------------------------------------------------------

def test_package_notes_parse_with_valid_fields():
    notes = load_notes()
    assert len(notes) >= 12
    assert all(Path(n.path).parent == NOTES_DIR for n in notes)
    for note in notes:
        assert note.title and note.text and not note.text.startswith("---"), note.name
        assert set(note.families) <= {ANY, *FAMILIES}, note.name
        assert set(note.bottlenecks) <= {ANY, *BOTTLENECKS}, note.name
        for device in note.devices:
            assert device in (ANY, CPU, *ARCHITECTURES) or device_tag(device) is not None, (note.name, device)
        assert 25 <= len(note.text.splitlines()) <= 130, note.name


def test_note_vocabulary_is_the_template_families():
    assert FAMILIES == NAMES


def test_package_notes_cover_families_architectures_and_bottlenecks():
    notes = load_notes()
    families = {f for n in notes for f in n.families}
    assert set(FAMILIES) <= families
    assert {t for n in notes for t in n.devices} >= set(ARCHITECTURES)
    assert {b for n in notes for b in n.bottlenecks} >= set(BOTTLENECKS)
    names = by_name(notes)
    assert names["harness-rules"].families == (ANY,) and names["harness-rules"].devices == (ANY,)


# --- device names ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, tag", [
    ("NVIDIA H200", "hopper"),
    ("NVIDIA H100 80GB HBM3", "hopper"),
    ("NVIDIA H100 PCIe", "hopper"),
    ("NVIDIA GH200 480GB", "hopper"),
    ("cuda:NVIDIA H200", "hopper"),
    ("NVIDIA A100-SXM4-80GB", "ampere"),
    ("NVIDIA A100-PCIE-40GB", "ampere"),
    ("NVIDIA A10G", "ampere"),
    ("AMD Instinct MI300X", "cdna3"),
    ("AMD Instinct MI300X VF", "cdna3"),
    ("AMD Instinct MI325X", "cdna3"),
    ("gfx942:sramecc+:xnack-", "cdna3"),
    ("hopper", "hopper"),
    ("NVIDIA L4", None),
    ("NVIDIA GeForce RTX 4090", None),
    ("AMD Instinct MI250X", None),
    ("Intel(R) Xeon(R) Platinum 8480+", None),
    ("", None),
    (None, None),
])
def test_device_tag(name, tag):
    assert device_tag(name) == tag


def test_device_names_in_front_matter_match_whole_words(tmp_path):
    note = parse_note(write_note(tmp_path, "h100", devices="H100"))
    assert applies_to(note, "NVIDIA H100 PCIe")
    assert not applies_to(note, H200)
    assert not applies_to(note, None)
    assert not applies_to(parse_note(write_note(tmp_path, "h20", devices="H20")), H200)


# --- retrieval -----------------------------------------------------------------------------------------------------

def test_hopper_attention_compute_ranking():
    notes = retrieve(H200, ["attention"], "compute")
    assert notes[0].name == "hopper"
    assert "attention" in by_name(notes)
    assert len(render(notes)) <= 8000
    wide = retrieve(H200, ["attention"], "compute", max_chars=100_000)
    names = [n.name for n in wide]
    assert names[:2] == ["hopper", "attention"]
    assert {"triton-idioms", "harness-rules"} <= set(names[2:])
    assert "memory-bound" not in names and "latency-bound" not in names  # general notes on other bottlenecks
    assert "row-reductions" not in names  # another family


def test_ranking_family_then_bottleneck_then_general():
    names = [n.name for n in retrieve("NVIDIA A100-SXM4-80GB", ["row_reduction"], "memory", max_chars=100_000)]
    assert names[0] == "ampere"
    assert names.index("row-reductions") < names.index("memory-bound") < names.index("triton-idioms")
    assert "harness-rules" in names


def test_other_device_drops_hopper_notes():
    for device in (MI300X, "NVIDIA L4", None):
        notes = retrieve(device, ["matmul"], "compute", max_chars=100_000)
        assert all("hopper" not in n.devices for n in notes), device
    assert retrieve(MI300X, ["matmul"], "compute")[0].name == "cdna3"
    unknown = retrieve(None, ["matmul"], "compute", max_chars=100_000)
    assert all(n.devices == (ANY,) for n in unknown)
    assert unknown[0].name == "compute-bound-gemm"


def test_template_family_names_retrieve_their_notes():
    assert retrieve(None, ["interaction"], "memory")[0].name == "feature-interactions"
    assert retrieve(None, ["segment"], None)[0].name == "jagged-embedding"


@pytest.mark.parametrize("max_chars", [0, 500, 3000, 5000, 8000, 12000, 20000])
def test_max_chars_respected(max_chars):
    notes = retrieve(H200, ["attention", "matmul"], "compute", max_chars=max_chars)
    assert len(render(notes)) <= max_chars
    names = [n.name for n in notes]
    full = [n.name for n in retrieve(H200, ["attention", "matmul"], "compute", max_chars=100_000)]
    if "hopper" not in names:  # too large for this budget: skipped, and the ranking goes on without it
        full.remove("hopper")
    assert names == full[:len(names)]


def test_device_note_included_when_it_fits_alone():
    hopper = by_name(load_notes())["hopper"]
    size = len(render([hopper]))
    assert [n.name for n in retrieve(H200, ["attention"], "compute", max_chars=size)] == ["hopper"]
    smaller = retrieve(H200, ["attention"], "compute", max_chars=size - 1)
    assert "hopper" not in by_name(smaller) and len(render(smaller)) <= size - 1


def test_render_format():
    a = Note("a", "First", (ANY,), (ANY,), (ANY,), "one", "a.md")
    b = Note("b", "Second", (ANY,), (ANY,), (ANY,), "two", "b.md")
    assert render([a, b]) == "## First\n\none\n\n## Second\n\ntwo"
    assert render([]) == ""


# --- user folders ----------------------------------------------------------------------------------------------------

def test_user_folder_adds_and_overrides(tmp_path):
    write_note(tmp_path, "attention", body="Our own attention advice.", title="House attention notes",
               families="attention", bottlenecks="compute")
    write_note(tmp_path, "house-h200", body="Measured on our H200s.", title="House H200 numbers",
               families="attention", devices="H200")
    notes = load_notes([tmp_path])
    names = by_name(notes)
    assert names["attention"].text == "Our own attention advice."
    assert len([n for n in notes if n.name == "attention"]) == 1
    assert "house-h200" in names and "hopper" in names
    got = by_name(retrieve(H200, ["attention"], "compute", extra_dirs=[str(tmp_path)], max_chars=100_000))
    assert got["attention"].title == "House attention notes"
    assert "house-h200" in got
    assert "house-h200" not in by_name(retrieve("NVIDIA H100 80GB HBM3", ["attention"], "compute",
                                                extra_dirs=[tmp_path], max_chars=100_000))


def test_later_folder_wins(tmp_path):
    first, second = tmp_path / "one", tmp_path / "two"
    first.mkdir()
    second.mkdir()
    write_note(first, "extra", body="first")
    write_note(second, "extra", body="second")
    assert by_name(load_notes([first, second]))["extra"].text == "second"


def test_missing_folder_raises(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(KnowledgeError, match="nope"):
        load_notes([missing])


@pytest.mark.parametrize("content, why", [
    ("no front matter here\n", "no front matter"),
    ("---\ntitle: x\nfamilies: any\nbottlenecks: any\ndevices: any\nbody\n", "not closed"),
    ("---\ntitle: x\nfamilies: any\ndevices: any\n---\nbody\n", "lacks bottlenecks"),
    ("---\ntitle: x\nfamilies: softmax\nbottlenecks: any\ndevices: any\n---\nbody\n", "unknown families softmax"),
    ("---\ntitle: x\nfamilies: any\nbottlenecks: io\ndevices: any\n---\nbody\n", "unknown bottlenecks io"),
    ("---\ntitle: x\nfamilies: any, matmul\nbottlenecks: any\ndevices: any\n---\nbody\n", "mixes"),
    ("---\ntitle: x\nfamilies: any\nbottlenecks: any\ndevices: any\nauthor: me\n---\nbody\n", "author"),
    ("---\ntitle: x\nfamilies: any\nbottlenecks: any\ndevices: any\n---\n\n", "no body"),
])
def test_bad_front_matter_names_the_file(tmp_path, content, why):
    path = tmp_path / "broken-note.md"
    path.write_text(content)
    with pytest.raises(KnowledgeError, match="broken-note.md") as err:
        load_notes([tmp_path])
    assert why in str(err.value)


def test_a_cpu_run_takes_only_the_notes_that_name_the_cpu():
    on_cpu = retrieve("AMD EPYC 7B13", ["matmul", "row_reduction"], "memory", cpu=True, max_chars=100000)
    assert [n.name for n in on_cpu] == ["cpu"]
    on_gpu = retrieve("NVIDIA H200", ["matmul"], "compute", max_chars=100000)
    assert "cpu" not in [n.name for n in on_gpu] and "hopper" in [n.name for n in on_gpu]
    assert "harness-rules" not in [n.name for n in retrieve("NVIDIA H200", [], None, max_chars=100000,
                                                            exclude=("harness-rules",))]

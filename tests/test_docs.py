"""The README, the docs pages and the measured results link only to files that exist and to headings they have, and
every docs page is in the site's navigation: checked here without mkdocs (CI also runs `mkdocs build --strict`)."""
from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md")), ROOT / "bench" / "results" / "README.md"]

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+).*?\1")
LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)  # http:, https:, mailto:, ...


def prose_lines(text: str) -> list[tuple[int, str]]:
    """Numbered lines outside fenced code blocks."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append((number, line))
    return lines


def _plain(heading: str) -> str:
    """A heading's text as rendered: code spans, emphasis and links reduced to their text."""
    heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    return heading.replace("`", "").replace("*", "")


def _slug_toc(text: str) -> str:  # Python-Markdown's toc extension, which mkdocs uses
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _slug_github(text: str) -> str:  # GitHub's rendering of the README
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    for slug in (_slug_toc, _slug_github):
        seen: dict[str, int] = {}
        for _, line in prose_lines(path.read_text()):
            m = HEADING.match(line)
            if m:
                base = slug(_plain(m.group(2)))
                n = seen.get(base, 0)
                seen[base] = n + 1
                found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(path: Path) -> list[tuple[int, str]]:
    return [(number, m.group(1)) for number, line in prose_lines(path.read_text())
            for m in LINK.finditer(CODE_SPAN.sub("", line))]


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """One line per relative link of ``path`` whose file or heading does not exist (paths shown from ``root``)."""
    broken = []
    for number, target in links(path):
        if EXTERNAL.match(target):
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        where = f"{path.relative_to(root)}:{number}: {target}"
        if not dest.exists():
            broken.append(f"{where}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{where}: no heading #{anchor} in {dest.relative_to(root)}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    assert broken_links(page) == []


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    (tmp_path / "there.md").write_text("# A page\n\n## Its part\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md) [ok](there.md#its-part) [ok](#here) [web](https://example.com)\n"
                    "```\n[in code](nowhere.md)\n```\n`[in a span](nowhere.md)`\n\n## Here\n"
                    "[gone](missing.md) [no heading](there.md#other-part)\n")
    assert broken_links(page, tmp_path) == ["page.md:8: missing.md: no such file",
                     "page.md:8: there.md#other-part: no heading #other-part in there.md"]


def test_every_docs_page_is_in_the_site_navigation() -> None:
    nav = set(re.findall(r"^\s*-\s[^:\n]+:\s*(\S+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M))
    assert nav == {p.name for p in DOCS.glob("*.md")}

"""The user-facing docs (README.md, docs/*.md) as a newcomer meets them: every relative
link and anchor leads somewhere, no issue numbers stand in for feature names, and the
README stays a one-minute read."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from e2e.cluster.layout import REPO_ROOT

README = REPO_ROOT / "README.md"
DOCS = sorted((REPO_ROOT / "docs").glob("*.md"))
USER_FACING = [README, *DOCS]
# [text](target) outside code; images too. A target with a scheme is not ours to check.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")


def prose(text: str) -> str:
    """``text`` without fenced blocks and inline code, where brackets are not links."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but ``-`` and ``_``
    dropped, spaces to ``-``."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out: set[str] = set()
    for line in FENCE.sub("", path.read_text()).splitlines():
        m = re.match(r"^#{1,6} (.*)$", line)
        if not m:
            continue
        base = slug(m[1])
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")  # GitHub numbers repeated headings
    return out


def broken_links(path: Path) -> list[str]:
    wrong: list[str] = []
    for target in LINK.findall(prose(path.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue  # https:, mailto:
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            wrong.append(f"{target}: no {dest.relative_to(REPO_ROOT)}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            wrong.append(f"{target}: no heading #{anchor} in {dest.name}")
    return wrong


@pytest.mark.parametrize("path", USER_FACING, ids=lambda p: p.name)
def test_relative_links_and_anchors_resolve(path: Path) -> None:
    assert LINK.findall(prose(path.read_text())) or path.name != "README.md"
    assert not broken_links(path), broken_links(path)


@pytest.mark.parametrize("path", USER_FACING, ids=lambda p: p.name)
def test_no_issue_numbers_in_user_facing_docs(path: Path) -> None:
    found = re.findall(r"(?i).{0,40}\bissues?\s+#?\d+.{0,20}", path.read_text())
    assert not found, f"{path.name} names features by issue number: {found}"


def test_readme_reads_in_a_minute_and_links_every_doc() -> None:
    text = README.read_text()
    assert len(text.splitlines()) < 150
    linked = {Path(t.partition("#")[0]).name for t in LINK.findall(prose(text))}
    assert {p.name for p in DOCS} <= linked, {p.name for p in DOCS} - linked
    # The test command README promises is the one CI runs.
    assert "make test" in (REPO_ROOT / ".ci" / "run").read_text().splitlines()[-1]
    assert "make test " in text and "make demo " in text


def test_slug_follows_github() -> None:
    assert slug("Silent faults (`tests/e2e/test_silent_faults.py`)") == (
        "silent-faults-testse2etest_silent_faultspy"
    )
    assert slug("16. A rank that stops") == "16-a-rank-that-stops"
    assert slug("The demo: `make demo`") == "the-demo-make-demo"

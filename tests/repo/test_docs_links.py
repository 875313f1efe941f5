"""The documentation stands alone: every relative Markdown link in README.md and docs/ resolves to a
file of the repository (and to a heading of it when the link names an anchor), and the hand-written
reference pages name every check, symptom kind and metric the code has."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest

from tests.helpers.fake_rig import ROOT

PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
# [text](target) outside code: inline links only (the docs use no reference-style links).
LINK = re.compile(r"(?<!\!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|\[|\]\([^)]*\)", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading anchor of ``page`` (a repeated heading gets GitHub's -1, -2 suffixes)."""
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", page.read_text()).splitlines():
        m = re.match(r"#{1,6} (.+)", line)
        if m:
            s = slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
    return out


def relative_links(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text())
    text = re.sub(r"`[^`\n]*`", "", text)  # inline code is not a link
    return [t for t in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path):
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with anchor #{anchor}")
    assert broken == [], f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_link_check_sees_links_and_anchors(tmp_path: Path):
    page = tmp_path / "p.md"
    page.write_text("# A `b` title: c + d\n[x](p.md#a-b-title-c--d) `[no](link)`\n```\n[no](either)\n```\n")
    assert relative_links(page) == ["p.md#a-b-title-c--d"]
    assert anchors(page) == {"a-b-title-c--d"}


def test_every_page_under_docs_is_reachable_from_the_map():
    """docs/README.md (the map) links every page of docs/, directly or through the reference index."""
    linked = {(ROOT / "docs" / t.partition("#")[0]).resolve() for t in relative_links(ROOT / "docs" / "README.md")}
    pages = {p.resolve() for p in (ROOT / "docs").rglob("*.md")} - {(ROOT / "docs" / "README.md").resolve()}
    assert sorted(str(p.relative_to(ROOT)) for p in pages - linked) == []


def _reference(name: str) -> str:
    return (ROOT / "docs" / "reference" / name).read_text()


def test_checks_page_names_every_required_check():
    from rig.judge.counter_rules import HEALTHY_NAME, NAME
    from rig.judge.verdict import REQUIRED

    names = {c for checks in REQUIRED.values() for c in checks} | {NAME, HEALTHY_NAME, "preempted",
                                                                   "spec-drafted", "stream-complete",
                                                                   "released-by-d", "metrics"}
    from rig.config.expectations import OptionalCheck
    names |= set(typing.get_args(OptionalCheck))
    page = _reference("checks.md")
    assert sorted(n for n in names if f"`{n}`" not in page) == []


def test_signatures_page_names_every_symptom_kind():
    from rig.config.expectations import Signature

    union = typing.get_args(typing.get_args(Signature)[0])  # Annotated[A | B | ..., Field(discriminator)]
    kinds = {typing.get_args(m.model_fields["kind"].annotation)[0] for m in union}
    page = _reference("signatures.md")
    assert kinds and sorted(k for k in kinds if f"`{k}`" not in page) == []


def test_metrics_page_names_every_metric_the_rig_reads():
    from rig.observe import metrics, store_metrics

    names = {v for mod in (metrics, store_metrics) for k, v in vars(mod).items()
             if k.isupper() and isinstance(v, str) and v.startswith(("vllm:", "process_"))}
    names |= set(store_metrics.STORE_OP_METRICS.values())
    page = _reference("metrics.md")
    assert names and sorted(n for n in names if not re.search(f"`{re.escape(n)}[`{{]", page)) == []

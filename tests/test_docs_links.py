"""Every link in the documentation resolves: relative links name files that exist, `#anchors` name a
heading (or an explicit `<a id>`) of the page they point at, and absolute links are well-formed URLs.
Repository paths cited in code spans (`docs/results.md`, `results/x/y.json`) must exist too: a page
that cites data as evidence is broken when the file is gone."""

from __future__ import annotations

import pathlib
import re
import urllib.parse

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Schemes a reader's browser opens; anything else in a link is a typo or a local path.
SCHEMES = {"http", "https", "mailto"}

_FENCE = re.compile(r"^\s*(```|~~~)")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# [text](target "title") and ![alt](target); the target may be wrapped in <...>.
_INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(\S+)")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
# A code span is taken as a cited file when it is one path with a directory and a data, doc or code
# extension; commands, globs and placeholders are left out.
_CITED = re.compile(r"[\w.-]+(?:/[\w.+-]+)+\.(?:md|py|json|jsonl|csv|png|toml|sh|txt|log|yml|yaml)")
_NOT_A_CITATION = ("/tmp/", "site-packages", "~", "$")


def doc_files() -> list[pathlib.Path]:
    files = [ROOT / "README.md", *ROOT.glob("docs/**/*.md")]
    files += ROOT.glob("packages/*/README.md")
    files += ROOT.glob("apps/*/README.md")
    return sorted(f for f in files if f.is_file())


def _prose_lines(text: str):
    """(line number, line) outside fenced code blocks, with inline code spans blanked."""
    fenced = False
    for number, line in enumerate(text.splitlines(), start=1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, _CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)


def links(text: str) -> list[tuple[int, str]]:
    """(line number, target) of every inline, image and reference-style link in a Markdown text."""
    found = []
    for number, line in _prose_lines(text):
        found += [(number, m.group(1).strip("<>")) for m in _INLINE.finditer(line)]
        found += [(number, m.group(1).strip("<>")) for m in _REFERENCE.finditer(line)]
    return found


def cited_paths(text: str) -> list[tuple[int, str]]:
    """(line number, path) of code spans outside fenced blocks that name one repository file."""
    fenced, found = False, []
    for number, line in enumerate(text.splitlines(), start=1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        for m in _CODE_SPAN.finditer(line):
            span = m.group(2).strip().split("::")[0]
            if _CITED.fullmatch(span) and not any(s in span for s in _NOT_A_CITATION):
                found.append((number, span))
    return found


def citation_problem(page: pathlib.Path, path: str, root: pathlib.Path = ROOT) -> str | None:
    """None when `path` exists from the repository root, the page's folder or the page's package."""
    bases = [root, page.parent]
    bases += [p for p in page.parents if (p / "pyproject.toml").is_file() and p != root]
    if any((base / path).exists() for base in bases):
        return None
    return "cited file does not exist"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: link text kept, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Anchors a page defines: its headings' slugs (repeats numbered as GitHub does) and `<a id>`."""
    seen: dict[str, int] = {}
    found = set(_HTML_ANCHOR.findall(text))
    for _, line in _prose_lines(text):
        m = _HEADING.match(line)
        if m is None:
            continue
        base = slug(m.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def link_problem(page: pathlib.Path, target: str, root: pathlib.Path = ROOT) -> str | None:
    """Why `target`, linked from `page`, does not resolve; None when it does."""
    parts = urllib.parse.urlsplit(target)
    if parts.scheme:
        if parts.scheme not in SCHEMES:
            return f"scheme {parts.scheme!r} is not one of {sorted(SCHEMES)}"
        if parts.scheme == "mailto":
            return None if "@" in parts.path else "mailto link without an address"
        host = parts.hostname or ""
        if "." not in host or " " in target:
            return f"malformed URL (host {host!r})"
        return None
    if target.startswith("//"):
        return "protocol-relative URL: write the scheme"
    path, _, anchor = target.partition("#")
    path = urllib.parse.unquote(path)
    if path.startswith("/"):
        dest = (root / path.lstrip("/")).resolve()
    else:
        dest = (page.parent / path).resolve() if path else page
    if root.resolve() not in (dest, *dest.parents):
        return f"points outside the repository ({dest})"
    if not dest.exists():
        return f"no such file: {dest.relative_to(root.resolve())}"
    if anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
        return f"no heading with anchor #{anchor} in {dest.relative_to(root.resolve())}"
    return None


@pytest.mark.parametrize("page", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve(page: pathlib.Path) -> None:
    problems = [
        f"{page.relative_to(ROOT)}:{number}: ({target}) {why}"
        for number, target in links(page.read_text())
        if (why := link_problem(page, target)) is not None
    ]
    assert not problems, "broken links:\n" + "\n".join(problems)


@pytest.mark.parametrize("page", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_cited_files_exist(page: pathlib.Path) -> None:
    problems = [
        f"{page.relative_to(ROOT)}:{number}: `{path}` {why}"
        for number, path in cited_paths(page.read_text())
        if (why := citation_problem(page, path)) is not None
    ]
    assert not problems, "cited files missing:\n" + "\n".join(problems)


def test_pages_found() -> None:
    names = {str(p.relative_to(ROOT)) for p in doc_files()}
    assert {"README.md", "docs/results.md", "docs/README.md"} <= names


def test_slug_matches_github() -> None:
    assert slug("Grid estimation") == "grid-estimation"
    assert slug("Spava, 2x H200, 256K (2026-11-23)") == "spava-2x-h200-256k-2026-11-23"
    assert slug("The `BlockMask` [format](x.md)") == "the-blockmask-format"
    assert slug("H_KV & D") == "h_kv--d"


def test_checker_reports_each_kind(tmp_path: pathlib.Path) -> None:
    (tmp_path / "b.md").write_text("# Title\n\n## Same\n\n## Same\n")
    page = tmp_path / "a.md"
    text = (
        "[ok](b.md#title) [dup](b.md#same-1) [self](#here) ![img](b.md)\n"
        "[missing](c.md) [anchor](b.md#nope) [scheme](ftp://x.org/a) [host](https://localhost/a)\n"
        "`[code](c.md)`\n```\n[fenced](c.md)\n```\n# Here\n[ref]: ../../outside.md\n"
    )
    page.write_text(text)
    found = links(text)
    assert [t for _, t in found] == [
        "b.md#title",
        "b.md#same-1",
        "#here",
        "b.md",
        "c.md",
        "b.md#nope",
        "ftp://x.org/a",
        "https://localhost/a",
        "../../outside.md",
    ]
    problems = {t: link_problem(page, t, root=tmp_path) for _, t in found}
    assert [t for t, why in problems.items() if why is None] == [
        "b.md#title",
        "b.md#same-1",
        "#here",
        "b.md",
    ]
    assert "no such file" in problems["c.md"]
    assert "#nope" in problems["b.md#nope"]
    assert "scheme" in problems["ftp://x.org/a"]
    assert "malformed" in problems["https://localhost/a"]
    assert "outside" in problems["../../outside.md"]


def test_citation_check(tmp_path: pathlib.Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "pyproject.toml").write_text("")
    (tmp_path / "pkg" / "tests").mkdir()
    (tmp_path / "pkg" / "tests" / "test_x.py").write_text("")
    page = tmp_path / "pkg" / "README.md"
    text = (
        "`tests/test_x.py` `pkg/tests/test_x.py` `docs/gone.json` `python -m x` `x.json`\n"
        "`results/*/a.json` `/tmp/a/b.json` `pkg/tests/test_x.py::test_a`\n```\n`docs/fenced.md`\n```\n"
    )
    found = [path for _, path in cited_paths(text)]
    assert found == [
        "tests/test_x.py",
        "pkg/tests/test_x.py",
        "docs/gone.json",
        "pkg/tests/test_x.py",
    ]
    missing = [p for p in found if citation_problem(page, p, root=tmp_path) is not None]
    assert missing == ["docs/gone.json"]

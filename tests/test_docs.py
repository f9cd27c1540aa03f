"""The README and the manual under docs/ hold together: every relative link and image points at
a file that exists, every `#anchor` into a Markdown file names one of its headings (under both
GitHub's and mkdocs' heading ids, so it works in either), every repository path named in code
exists, and the README stays a front door of at most 200 lines.

Those checks parse the Markdown only and run in well under a second. The last one builds the
site as `mkdocs build --strict` does (in process, into a temporary folder, a few seconds) and
checks every relative `href` and `src` of its HTML, `#fragment` included, against the files and
ids of the built site; it is skipped where the `docs` extra is not installed (CI installs `dev`).
"""

from __future__ import annotations

import importlib.util
import logging
import posixpath
import re
import unicodedata
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = REPO / "docs"
README_MAX_LINES = 200


def pages() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def _ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(REPO)) for p in paths]


# ---------------------------------------------------------------------------------------------
# Markdown, as far as links and headings need it

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


def split_code(text: str) -> tuple[list[tuple[int, str]], list[str]]:
    """(prose lines with their line numbers, fenced code blocks): fences of ``` or ~~~, closed
    by a fence of the same character at least as long."""
    prose: list[tuple[int, str]] = []
    blocks: list[str] = []
    fence: str | None = None
    block: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if fence is None:
            if m:
                fence = m.group(1)
                block = []
            else:
                prose.append((number, line))
        elif m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not line.strip()[len(m.group(1)) :]:
            fence = None
            blocks.append("\n".join(block))
        else:
            block.append(line)
    return prose, blocks


CODE_SPAN = re.compile(r"(`+)(.+?)(?<!`)\1(?!`)")
HTML_COMMENT = re.compile(r"<!--.*?-->")
# [text](target "title") and ![alt](target); the text may hold one level of brackets
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
REFERENCE_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
HTML_ATTR = re.compile(r"<(?:a|img)\b[^>]*?\b(?:href|src)\s*=\s*[\"']([^\"']+)[\"']", re.IGNORECASE)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def links(path: Path) -> list[tuple[int, str]]:
    """Every link and image target in the page's prose, with its line number."""
    prose, _ = split_code(path.read_text(encoding="utf-8"))
    found: list[tuple[int, str]] = []
    for number, line in prose:
        line = CODE_SPAN.sub(lambda m: "x" * len(m.group(0)), HTML_COMMENT.sub("", line))
        for regex in (INLINE_LINK, REFERENCE_DEF, HTML_ATTR):
            for m in regex.finditer(line):
                found.append((number, m.group(1).strip("<>")))
    return found


HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")


def heading_texts(path: Path) -> list[str]:
    """The rendered text of each ATX heading (code spans keep their content, links their text)."""
    prose, _ = split_code(path.read_text(encoding="utf-8"))
    texts = []
    for _, line in prose:
        m = HEADING.match(line)
        if m:
            text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", m.group(2))
            text = re.sub(r"<[^>]+>", "", text)
            texts.append(text.replace("`", "").replace("*", ""))
    return texts


def github_slug(text: str) -> str:
    """GitHub's heading id: lower case, punctuation dropped, each space a hyphen."""
    text = text.strip().lower()
    text = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LMN")
    return text.replace(" ", "-")


def mkdocs_slug(text: str) -> str:
    """Python-Markdown's toc `slugify` (mkdocs' default heading id)."""
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(path: Path) -> tuple[set[str], set[str]]:
    """The heading ids of a page under GitHub's rules and under mkdocs' (duplicates numbered)."""
    github: set[str] = set()
    mkdocs: set[str] = set()
    for text in heading_texts(path):
        for slug, taken, sep in ((github_slug(text), github, "-"), (mkdocs_slug(text), mkdocs, "_")):
            unique, n = slug, 0
            while unique in taken:
                n += 1
                unique = f"{slug}{sep}{n}"
            taken.add(unique)
    return github, mkdocs


# ---------------------------------------------------------------------------------------------
# The checks


def test_the_manual_exists() -> None:
    assert DOCS.is_dir()
    for name in ("index", "cli", "configuration", "privacy", "architecture", "operations", "benchmarks", "development"):
        assert (DOCS / f"{name}.md").is_file(), name
    assert not (REPO / "ARCHITECTURE.md").exists(), "the design notes live in docs/architecture.md"


def test_the_readme_is_a_front_door() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail into docs/"


@pytest.mark.parametrize("page", pages(), ids=_ids(pages()))
def test_links_resolve(page: Path) -> None:
    broken = []
    for number, target in links(page):
        if SCHEME.match(target) or target.startswith("//"):
            continue  # a URL: not checked offline
        where = f"{page.relative_to(REPO)}:{number}: {target}"
        path_part, _, anchor = target.partition("#")
        path_part = path_part.split("?", 1)[0]
        if path_part.startswith("/"):
            broken.append(f"{where} (absolute: write it relative to the page)")
            continue
        resolved = (page.parent / path_part).resolve() if path_part else page
        if REPO not in resolved.parents and resolved != REPO:
            broken.append(f"{where} (outside the repository)")
            continue
        if not resolved.exists():
            broken.append(f"{where} (no such file)")
            continue
        if anchor and resolved.suffix == ".md":
            github, mkdocs = anchors(resolved)
            if anchor not in github or anchor not in mkdocs:
                broken.append(f"{where} (no heading with that id on GitHub and in mkdocs)")
    assert not broken, "\n".join(broken)


# Repository paths named in code (`src/privflow/...`, `benchmarks/...`, `infra/...`, `docs/...`).
REPO_PATH = re.compile(r"(?<![\w./$<>-])((?:src/privflow|benchmarks|infra|docs)/[\w./*-]*)")
# Source files named without the src/ prefix: paths in the manual are written from the repository root.
BARE_SOURCE = re.compile(r"(?<![\w./-])(?:privflow|tasks|privacy|flows|models|data|serving|core)/[\w/.-]*\.py\b")


@pytest.mark.parametrize("page", pages(), ids=_ids(pages()))
def test_paths_named_in_code_exist(page: Path) -> None:
    prose, blocks = split_code(page.read_text(encoding="utf-8"))
    spans = [m.group(2) for _, line in prose for m in CODE_SPAN.finditer(line)]
    missing = []
    for text in spans + blocks:
        for m in REPO_PATH.finditer(text):
            path = m.group(1).rstrip(".,;:")
            if "*" in path:
                if not list(REPO.glob(path)):
                    missing.append(path)
            elif not (REPO / path).exists():
                missing.append(path)
    bare = [m.group(0) for text in spans for m in BARE_SOURCE.finditer(text)]
    assert not missing, f"{page.relative_to(REPO)} names paths that do not exist: {sorted(set(missing))}"
    assert not bare, f"{page.relative_to(REPO)}: write source paths from the repository root (src/privflow/...): {bare}"


def test_the_parser_sees_what_it_should(tmp_path: Path) -> None:
    """The checks above are only as good as the parsing: links in code are not links, titles and
    images are, and both heading-id rules agree on the manual's kind of heading."""
    page = tmp_path / "p.md"
    page.write_text(
        "# Top `x` heading\n\n"
        '[a](one.md#top-x-heading) ![i](img.png "title") `[not](a-link.md)`\n\n'
        "```bash\n[not](either.md)\n```\n\n"
        '[ref]: two.md\n<img src="three.png">\n',
        encoding="utf-8",
    )
    assert [t for _, t in links(page)] == ["one.md#top-x-heading", "img.png", "two.md", "three.png"]
    assert anchors(page) == ({"top-x-heading"}, {"top-x-heading"})
    assert github_slug("Privacy rules (what makes the epsilon true)") == "privacy-rules-what-makes-the-epsilon-true"
    assert mkdocs_slug("Privacy rules (what makes the epsilon true)") == "privacy-rules-what-makes-the-epsilon-true"
    # where the two rules part: a heading like this one cannot be linked from both
    assert github_slug("What --init-from does") != mkdocs_slug("What --init-from does")


# ---------------------------------------------------------------------------------------------
# The built site

DOCS_EXTRA = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python")


class _SiteLinks(HTMLParser):
    """The href and src attributes of an HTML page, and its element ids."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.urls: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value is None:
                continue
            if name in ("href", "src"):
                self.urls.append(value)
            elif name in ("id", "name"):
                self.ids.add(value)


def _parsed(page: Path) -> _SiteLinks:
    parser = _SiteLinks()
    parser.feed(page.read_text(encoding="utf-8"))
    return parser


def dead_links(site: Path) -> list[str]:
    """Every relative href/src of the site's HTML pages whose file is not in the site, or whose
    `#fragment` names no id of the HTML page it points at. Absolute paths (404.html's, which
    mkdocs writes for the site's root) and URLs with a scheme are not checked."""
    pages = {page: _parsed(page) for page in site.rglob("*.html")}
    dead = []
    for page, parsed in sorted(pages.items()):
        for url in parsed.urls:
            scheme, netloc, path, _, fragment = urlsplit(url)
            if scheme or netloc or path.startswith("/") or url.startswith("#") and not fragment:
                continue
            where = f"{page.relative_to(site)}: {url}"
            target = page if not path else Path(posixpath.normpath(posixpath.join(page.parent, unquote(path))))
            if path.endswith("/") or target.is_dir():
                target = target / "index.html"
            if site not in target.parents:
                dead.append(f"{where} (outside the site)")
            elif not target.is_file():
                dead.append(f"{where} (no such file in the site)")
            elif fragment and target.suffix == ".html" and unquote(fragment) not in pages[target].ids:
                dead.append(f"{where} (no id '{fragment}' there)")
    return dead


def test_the_site_builds_strictly_with_no_dead_link(tmp_path: Path) -> None:
    """The manual as `mkdocs build --strict` builds it (warnings fail the build: a link to a page,
    heading or repository file that is not in the site is one, mkdocs.yml's `validation`), then
    every relative link of the built HTML, the theme's assets and the API reference included."""
    missing = [name for name in DOCS_EXTRA if importlib.util.find_spec(name.split(".")[0]) is None]
    if missing:
        pytest.skip(f"the docs extra is not installed ({', '.join(missing)}): pip install -e '.[docs]'")
    from mkdocs.commands.build import build
    from mkdocs.config import load_config
    from mkdocs.exceptions import Abort, BuildError

    warnings: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            warnings.append(f"{record.levelname}: {record.getMessage()}")

    handler = Collect(logging.WARNING)
    logging.getLogger("mkdocs").addHandler(handler)
    site = tmp_path / "site"
    try:
        config = load_config(str(REPO / "mkdocs.yml"), site_dir=str(site), strict=True)
        config.plugins.on_startup(command="build", dirty=False)
        try:
            build(config)
        finally:
            config.plugins.on_shutdown()
    except (Abort, BuildError) as error:
        pytest.fail(f"mkdocs build --strict failed ({error}):\n" + "\n".join(warnings))
    finally:
        logging.getLogger("mkdocs").removeHandler(handler)
    assert not warnings, "\n".join(warnings)
    assert (site / "index.html").is_file()
    # the repository files the manual cites are pages of the site (docs/hooks.py)
    assert (site / "repo" / "benchmarks" / "results" / "peers" / "index.html").is_file()
    assert (site / "reference" / "api" / "index.html").is_file()
    dead = dead_links(site)
    assert not dead, f"{len(dead)} dead links in the built site:\n" + "\n".join(dead)


def test_the_site_checker_sees_dead_links(tmp_path: Path) -> None:
    """`dead_links` finds a missing file, a missing fragment and a link out of the site, and
    passes directory URLs, fragments of the same page, assets and URLs with a scheme."""
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "index.html").write_text('<h2 id="here">x</h2>', encoding="utf-8")
    (tmp_path / "style.css").write_text("", encoding="utf-8")
    (tmp_path / "index.html").write_text(
        '<a href="a/">ok</a> <a href="a/#here">ok</a> <a href="#top" id="top">ok</a> '
        '<link href="style.css"> <a href="https://example.org/x">ok</a> <img src="/abs.png"> '
        '<a href="b/">dead</a> <a href="a/#nowhere">dead</a> <script src="../out.js"></script>',
        encoding="utf-8",
    )
    assert dead_links(tmp_path) == [
        "index.html: b/ (no such file in the site)",
        "index.html: a/#nowhere (no id 'nowhere' there)",
        "index.html: ../out.js (outside the site)",
    ]

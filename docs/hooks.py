"""Build hooks of the manual (registered in mkdocs.yml under `hooks:`).

The pages under docs/ link to repository files outside docs/ (the README, benchmarks/results/*.md,
infra/README.md, a schema, a source file) with paths that work in a checkout and on the code host:
`../benchmarks/results/peers.md`. These hooks make the same links work in the built site:

- `on_files`: every repository file the manual cites, followed from page to page (a results file
  citing another one brings that one too), joins the site under `repo/`, at its repository path:
  Markdown files as pages, other text files (Python, YAML) as a page that shows the file, images
  and anything else as they are. None of them is in the nav.
- a Markdown tree processor, run before mkdocs resolves links, rewrites each relative link of a
  page from its repository path to the site's path (`../benchmarks/results/peers.md` on a page of
  docs/ becomes `repo/benchmarks/results/peers.md`; `docs/cli.md` in the README becomes
  `../cli.md`), so that mkdocs checks it, anchors included, like any link between pages.

A link to a file that does not exist is left as written, and mkdocs reports it (mkdocs.yml's
`validation`), which fails `mkdocs build --strict`.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit
from xml.etree.ElementTree import Element

from markdown import Extension, Markdown
from markdown.treeprocessors import Treeprocessor
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files, InclusionLevel
from mkdocs.structure.pages import Page

REPO = Path(__file__).resolve().parent.parent
DOCS = "docs"
SITE_PREFIX = "repo"  # the site folder that holds the repository files the manual cites

# Link targets in Markdown: [text](target), [ref]: target, and href/src attributes of raw HTML.
# Over-inclusive on purpose (a path in a code block counts too): a file brought in needlessly costs
# a page, a file left out is a dead link.
_TARGET = re.compile(
    r"\]\(\s*<?([^)\s>]+)>?"
    r"|^ {0,3}\[[^\]]+\]:\s*<?([^\s>]+)>?"
    r"|\b(?:href|src)\s*=\s*[\"']([^\"']+)[\"']",
    re.MULTILINE,
)
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_IMAGES = {".png", ".jpg", ".jpeg", ".gif", ".svg", ".webp"}
_SHOWN_MAX_BYTES = 1_000_000
_LANGUAGES = {".py": "python", ".yaml": "yaml", ".yml": "yaml", ".toml": "toml", ".json": "json", ".sh": "bash"}

# repository path (posix, relative to REPO) -> site path (src_uri), for every file outside docs/ in the site
_site_paths: dict[str, str] = {}


def _cited(markdown_file: Path) -> list[Path]:
    """The existing repository files outside docs/ that a Markdown file links to."""
    found = []
    for m in _TARGET.finditer(markdown_file.read_text(encoding="utf-8")):
        target = next(g for g in m.groups() if g)
        if _SCHEME.match(target) or target.startswith(("/", "#")):
            continue
        path = unquote(urlsplit(target).path)
        if not path:
            continue
        resolved = (markdown_file.parent / path).resolve()
        if REPO in resolved.parents and resolved.is_file() and (REPO / DOCS) not in resolved.parents:
            found.append(resolved)
    return found


def _page_showing(repo_path: str) -> str | None:
    """A page that shows a repository text file as a code block; None for an image, a file over
    `_SHOWN_MAX_BYTES` or one that is not UTF-8 text."""
    path = REPO / repo_path
    if path.suffix.lower() in _IMAGES or path.stat().st_size > _SHOWN_MAX_BYTES:
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return None
    fence = "`" * max([3, *(len(run) + 1 for run in re.findall(r"`{3,}", text))])
    language = _LANGUAGES.get(Path(repo_path).suffix, "text")
    return (
        f"# {Path(repo_path).name}\n\n"
        f"The repository's `{repo_path}`, as it was when this manual was built.\n\n"
        f"{fence}{language}\n{text.rstrip()}\n{fence}\n"
    )


def on_files(files: Files, config: MkDocsConfig) -> Files:
    _site_paths.clear()
    todo = [Path(f.abs_src_path) for f in files.documentation_pages() if f.abs_src_path]
    seen: set[Path] = set(todo)
    while todo:
        for cited in _cited(todo.pop()):
            if cited in seen:
                continue
            seen.add(cited)
            repo_path = cited.relative_to(REPO).as_posix()
            site_path = f"{SITE_PREFIX}/{repo_path}"
            if cited.suffix == ".md":
                todo.append(cited)
                file = File.generated(config, site_path, abs_src_path=str(cited), inclusion=InclusionLevel.NOT_IN_NAV)
            elif (page := _page_showing(repo_path)) is not None:
                site_path += ".md"
                file = File.generated(config, site_path, content=page, inclusion=InclusionLevel.NOT_IN_NAV)
            else:  # an image, or a file too large or not text: copied as it is
                file = File.generated(config, site_path, abs_src_path=str(cited), inclusion=InclusionLevel.NOT_IN_NAV)
            _site_paths[repo_path] = site_path
            files.append(file)
    return files


class _RepositoryLinks(Treeprocessor):
    """Rewrites the current page's relative links from repository paths to site paths (see the module)."""

    def run(self, root: Element) -> None:
        if _current_page is None:
            return
        src_uri = _current_page.file.src_uri
        repo_path = src_uri[len(SITE_PREFIX) + 1 :] if src_uri.startswith(SITE_PREFIX + "/") else f"{DOCS}/{src_uri}"
        for element in root.iter():
            attribute = {"a": "href", "img": "src"}.get(element.tag)
            value = element.get(attribute) if attribute else None
            if attribute and value:
                element.set(attribute, _rewrite(value, repo_path, src_uri))


def _rewrite(url: str, repo_path: str, src_uri: str) -> str:
    """`url`, written on the file at `repo_path`, as a link from the site's `src_uri`."""
    scheme, netloc, path, query, fragment = urlsplit(url)
    if scheme or netloc or not path or path.startswith("/"):
        return url
    target = posixpath.normpath(posixpath.join(posixpath.dirname(repo_path), unquote(path)))
    if target == DOCS or target.startswith(DOCS + "/"):
        site_target = target[len(DOCS) + 1 :] or "."
    elif target in _site_paths:
        site_target = _site_paths[target]
    else:
        return url  # not a file of the site: mkdocs reports it
    relative = posixpath.relpath(site_target, posixpath.dirname(src_uri) or ".")
    if path.endswith("/") and not relative.endswith("/"):
        relative += "/"
    return urlunsplit(("", "", relative, query, fragment))


class _RepositoryLinksExtension(Extension):
    def extendMarkdown(self, md: Markdown) -> None:  # noqa: N802 (Python-Markdown's name)
        md.treeprocessors.register(_RepositoryLinks(md), "privflow_repository_links", 1)  # before mkdocs' relpath (0)


_current_page: Page | None = None


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    config.markdown_extensions.append(_RepositoryLinksExtension())  # type: ignore[arg-type]
    return config


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    # mkdocs renders the page right after this event: the tree processor rewrites its links
    global _current_page
    _current_page = page
    return markdown

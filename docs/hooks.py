"""MkDocs hook: the benchmark results (``benchmarks/RESULTS.md`` and its pictures) become pages of the site, and the
docs' links to them work both on GitHub and in the site.

A page links to a file of the repository outside ``docs/`` the way GitHub resolves it, relative to the page's own
file (``../benchmarks/RESULTS.md#speed`` from ``docs/ner.md``). MkDocs only knows files under ``docs/``, so
:func:`on_files` adds the files of :data:`INCLUDED` to the site at their place in the repository (``benchmarks/...``
beside the docs' own pages), and :func:`on_page_markdown` rewrites each link that reaches one of them into the link
between the two places in the site. A link to any other file outside ``docs/`` is left alone, and
``mkdocs build --strict`` reports it.
"""

from __future__ import annotations

import os
import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
INCLUDED = ["benchmarks/RESULTS.md", "benchmarks/results/*.png"]
LINK = re.compile(r"(\]\()([^)\s#]+)([^)\s]*\))")


def included() -> set[str]:
    return {path.relative_to(ROOT).as_posix() for pattern in INCLUDED for path in ROOT.glob(pattern)}


def on_files(files, config):
    for path in sorted(included()):
        files.append(File(path, str(ROOT), config["site_dir"], config["use_directory_urls"]))
    return files


def on_page_markdown(markdown, page, config, files):
    docs = Path(config["docs_dir"]).resolve()
    real = Path(page.file.abs_src_path).resolve().parent  # where GitHub resolves the page's links
    if docs not in (real, *real.parents):
        return markdown  # an included file: its links are relative to its own place already
    here = posixpath.dirname(page.file.src_uri)
    targets = included()

    def rewrite(m: re.Match) -> str:
        target = m[2]
        if "://" in target or target.startswith(("/", "mailto:")):
            return m[0]
        path = Path(os.path.normpath(real / target))
        try:
            repo_path = path.relative_to(ROOT).as_posix()
        except ValueError:
            return m[0]
        if repo_path not in targets or docs in (path, *path.parents):
            return m[0]
        return m[1] + posixpath.relpath(repo_path, here or ".") + m[3]

    return LINK.sub(rewrite, markdown)

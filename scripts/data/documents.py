"""Whole documents for completion prompts: books, manuals, code, licences.

build_gemma_prompts.py cuts these into prompt prefixes for a base model
(one with no chat template), so every reader here returns whole documents
rather than questions. A document is a `Doc`: the group it belongs to (a
budget in the builder), a stable key (registry, package and path; the
train/dev/test split is decided by it), its kind (`prose`, `code` or
`structured`), the package it came from and its text.

Readers take either a directory of packages unpacked by fetch_sources.sh or
read Debian packages installed on the building machine; every reader walks
sorted file lists, so its output is deterministic for given inputs.
"""

from __future__ import annotations

import dataclasses
import html.parser
import os
import re
import subprocess
from pathlib import Path

from sources import read_text


@dataclasses.dataclass(frozen=True)
class Doc:
    group: str    # budget group, e.g. "books", "python-code"
    key: str      # stable document key, e.g. "debian:perl-doc:perlretut"
    kind: str     # "prose", "code" or "structured"
    package: str  # registry package the text ships in
    text: str


def tidy(text: str) -> str:
    """Unix newlines, no trailing blanks, at most two blank lines in a row."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\t", "    ")
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    return re.sub(r"\n{4,}", "\n\n\n", text).strip("\n") + "\n"


# ---------------------------------------------------------------------------
# HTML books (debian-handbook, debian-reference, developers-reference, ...)


class _HtmlText(html.parser.HTMLParser):
    """Text of an HTML page with its block structure: a blank line between
    paragraphs and headings, list items as "- ", <pre> kept verbatim; page
    chrome (navigation, banners, tables of contents, scripts) dropped."""

    BLOCK = {"p", "div", "h1", "h2", "h3", "h4", "h5", "h6", "table", "tr", "dl", "dt", "dd",
             "ul", "ol", "blockquote", "section", "article"}
    SKIP_TAGS = {"script", "style", "head", "nav"}
    SKIP_CLASS = re.compile(r"\b(docnav|navheader|navfooter|toc|banner)\b")
    VOID = {"br", "img", "hr", "meta", "link", "input", "col", "area", "base", "wbr"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self.pre = 0
        self.skip: list[str] = []  # open tags since skipping began (a stack)

    def _block(self):
        if not "".join(self.out[-2:]).endswith("- "):
            self.out.append("\n\n")

    def handle_starttag(self, tag, attrs):
        if tag in self.VOID:
            if tag == "br" and not self.skip:
                self.out.append("\n")
            return
        a = dict(attrs)
        if self.skip or tag in self.SKIP_TAGS or self.SKIP_CLASS.search(
                f"{a.get('class') or ''} {a.get('id') or ''}"):
            self.skip.append(tag)
            return
        if tag == "pre":
            self.pre += 1
            self._block()
        elif tag == "li":
            self.out.append("\n- ")
        elif tag in ("td", "th"):
            self.out.append(" | ")
        elif tag in self.BLOCK:
            self._block()

    def handle_endtag(self, tag):
        if self.skip:
            if tag in self.skip:
                while self.skip and self.skip.pop() != tag:
                    pass
            return
        if tag == "pre":
            self.pre = max(0, self.pre - 1)
            self.out.append("\n\n")
        elif tag in self.BLOCK:
            self._block()

    def handle_data(self, data):
        if self.skip:
            return
        self.out.append(data if self.pre else re.sub(r"\s+", " ", data))

    def text(self) -> str:
        raw = "".join(self.out)
        lines = [ln.strip() if not ln.startswith("  ") else ln.rstrip() for ln in raw.split("\n")]
        return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def html_text(markup: str) -> str:
    p = _HtmlText()
    p.feed(markup)
    p.close()
    return p.text()


HTML_BOOKS = {
    # package: (directory in the unpacked package, glob of its English pages)
    "debian-handbook": ("usr/share/doc/debian-handbook/html/en-US", "*.html"),
    "debian-reference-en": ("usr/share/debian-reference", "*.en.html"),
    "developers-reference": ("usr/share/developers-reference", "*.html"),
    "maint-guide": ("usr/share/doc/maint-guide/html", "*.en.html"),
}


def html_books(src: Path) -> list[Doc]:
    """The English HTML pages of Debian's books, one document per page."""
    docs = []
    for pkg, (sub, pattern) in HTML_BOOKS.items():
        root = src / pkg / sub
        for f in sorted(root.rglob(pattern)) if root.is_dir() else []:
            if f.name.split(".")[0] in ("index", "search", "genindex", pkg):
                continue  # tables of contents and the one-page copy of the book
            text = html_text(read_text(f))
            if len(text) >= 800:
                docs.append(Doc("books", f"debian:{pkg}:{f.relative_to(root)}", "prose", pkg,
                                tidy(text)))
    return docs


# ---------------------------------------------------------------------------
# Other fetched manuals


PYDOC_SRC = "python3.11-doc/usr/share/doc/python3.11/html/_sources"


def python_docs(src: Path) -> list[Doc]:
    """reStructuredText sources of the Python 3.11 documentation (tutorial,
    HOWTOs, FAQ, library and language reference), index/label directives
    removed."""
    docs = []
    root = src / PYDOC_SRC
    for f in sorted(root.rglob("*.rst.txt")):
        rel = str(f.relative_to(root))
        if rel.startswith(("whatsnew/changelog", "license", "bugs", "copyright")):
            continue
        lines = [ln for ln in f.read_text(encoding="utf-8").split("\n")
                 if not re.match(r"\s*\.\. (index|_[^:]*:|sectionauthor|moduleauthor|highlight)", ln)]
        docs.append(Doc("python-docs", f"debian:python3.11-doc:{rel[:-8]}", "prose",
                        "python3.11-doc", tidy("\n".join(lines))))
    return docs


def perl_pods(src: Path) -> list[Doc]:
    """Perl's manual pages in POD (perlfaq, perlintro, perlretut, ...)."""
    docs = []
    for f in sorted((src / "perl-doc").rglob("*.pod")):
        if re.fullmatch(r"perl\d+delta", f.stem):
            continue  # release notes of old versions
        docs.append(Doc("perl-docs", f"debian:perl-doc:{f.stem}", "prose", "perl-doc",
                        tidy(read_text(f))))
    return docs


def git_docs(src: Path) -> list[Doc]:
    """git's AsciiDoc manuals (git-*.txt, gitglossary, user manual, howtos)."""
    docs = []
    root = src / "git-doc/usr/share/doc/git-doc"
    for f in sorted(root.rglob("*.txt")):
        docs.append(Doc("git-docs", f"debian:git-doc:{f.relative_to(root)}", "structured", "git-doc",
                        tidy(read_text(f))))
    return docs


def gnu_standards(src: Path) -> list[Doc]:
    """The GNU Coding Standards and maintainer guide (Info), one document per node."""
    docs = []
    for f in sorted((src / "gnu-standards").rglob("*.info*")):
        for i, node in enumerate(read_text(f).split("\x1f")):
            m = re.search(r"Node: ([^,\n]+)", node)
            if m and len(node) > 800:
                body = node.split("\n", 2)[-1]
                docs.append(Doc("gnu-standards", f"debian:gnu-standards:{f.name.split('.')[0]}/{m.group(1)}",
                                "prose", "gnu-standards", tidy(body)))
    return docs


# ---------------------------------------------------------------------------
# Installed Debian packages (read in place; owners from dpkg)


def python_stdlib_code(root=Path("/usr/lib/python3.11")) -> list[Doc]:
    """Modules of the Python standard library (test suites excluded)."""
    docs = []
    for f in sorted(root.rglob("*.py")):
        rel = f.relative_to(root)
        if rel.parts[0] in ("test", "idlelib", "lib2to3", "site-packages", "dist-packages") or \
                "tests" in rel.parts or rel.parts[0].startswith("config-"):
            continue
        try:
            text = f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        docs.append(Doc("python-code", f"installed:python3.11:{rel}", "code", "libpython3.11-stdlib",
                        tidy(text)))
    return docs


def js_code(owners: dict[str, str], root=Path("/usr/lib/node_modules/npm")) -> list[Doc]:
    """JavaScript sources of the npm client and its bundled modules (Debian nodejs)."""
    docs = []
    for f in sorted(root.rglob("*.js")):
        if any(p in ("test", "tests", "dist") for p in f.parts) or f.name.endswith(".min.js"):
            continue
        try:
            text = f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if text.count("\n") < 15 or max(map(len, text.split("\n"))) > 300:
            continue  # stubs and bundled/minified files
        docs.append(Doc("js-code", f"installed:npm:{f.relative_to(root)}", "code",
                        owners.get(str(f), "nodejs"), tidy(text)))
    return docs


def c_headers(owners: dict[str, str], root=Path("/usr/include")) -> list[Doc]:
    """C headers of installed -dev packages (glibc, zlib, ...), top level only."""
    docs = []
    for f in sorted(root.glob("*.h")) + sorted(root.glob("*/*.h")):
        pkg = owners.get(str(f))
        if not pkg:
            continue
        try:
            text = f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        docs.append(Doc("c-code", f"installed:{pkg}:{f.relative_to(root)}", "code", pkg, tidy(text)))
    return docs


def scripts(owners: dict[str, str], roots=(Path("/usr/bin"), Path("/usr/sbin"))) -> list[Doc]:
    """Shell, Perl and Python programs that Debian packages install."""
    docs = []
    for root in roots:
        for f in sorted(root.iterdir()):
            pkg = owners.get(str(f))
            if not pkg or f.is_symlink() or not f.is_file() or f.stat().st_size > 400_000:
                continue
            head = f.open("rb").read(64)
            if not re.match(rb"#! ?/(usr/)?bin/(env )?(sh|bash|dash|perl|python3?)\b", head):
                continue
            try:
                text = f.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue
            docs.append(Doc("scripts", f"installed:{pkg}:{f}", "code", pkg, tidy(text)))
    return docs


def man_page_text(path: Path) -> str:
    """A man page rendered as plain text, 80 columns."""
    env = dict(os.environ, MANWIDTH="80", LC_ALL="C.UTF-8", MAN_KEEP_FORMATTING="")
    try:
        r = subprocess.run(["man", "--nh", "--nj", "-P", "cat", "-l", str(path)], env=env,
                           capture_output=True, text=True, timeout=20, errors="replace")
    except subprocess.TimeoutExpired:
        return ""
    return re.sub(r".\x08", "", r.stdout) if r.returncode == 0 else ""


def licences(owners: dict[str, str]) -> list[Doc]:
    """The licence texts of /usr/share/common-licenses and every installed
    package's copyright file."""
    docs = []
    for f in sorted(Path("/usr/share/common-licenses").iterdir()):
        if f.is_file() and not f.is_symlink():
            docs.append(Doc("licences", f"installed:base-files:common-licenses/{f.name}", "structured",
                            "base-files", tidy(read_text(f))))
    for f in sorted(Path("/usr/share/doc").glob("*/copyright")):
        if f.is_file() and not f.is_symlink():
            pkg = owners.get(str(f), f.parent.name)
            docs.append(Doc("licences", f"installed:{pkg}:copyright", "structured", pkg,
                            tidy(read_text(f))))
    return docs


def changelogs(owners: dict[str, str]) -> list[Doc]:
    """Debian changelogs and upstream NEWS files of installed packages."""
    docs = []
    for pattern in ("*/changelog.Debian.gz", "*/NEWS.gz", "*/NEWS.Debian.gz"):
        for f in sorted(Path("/usr/share/doc").glob(pattern)):
            if not f.is_file() or f.is_symlink():
                continue
            pkg = owners.get(str(f), f.parent.name)
            try:
                text = read_text(f)
            except (OSError, EOFError):
                continue
            docs.append(Doc("changelogs", f"installed:{pkg}:{f.name}", "structured", pkg,
                            tidy(text[:60_000])))
    return docs

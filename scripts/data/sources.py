"""Readers for the real texts that prompts are built from.

Two groups:
  * registry packages unpacked by fetch_sources.sh (Python documentation,
    FOLDOC, the Jargon File, fortunes, an npm interview-question set);
  * Debian packages installed on the building machine (package descriptions,
    README files, man pages, Python standard library sources, shipped example
    scripts).

Every reader returns plain data (lists of tuples/dicts) in a deterministic
order (sorted file lists); the prompt builders sample from them with seeded
RNGs. Only the Python standard library is used.
"""

from __future__ import annotations

import ast
import base64
import gzip
import json
import os
import re
import subprocess
import textwrap
from pathlib import Path

# ---------------------------------------------------------------------------
# Text utilities


def clean_ws(text: str) -> str:
    """Collapses runs of whitespace into single spaces."""
    return re.sub(r"\s+", " ", text).strip()


def prose_ratio(text: str) -> float:
    """Fraction of characters that are letters or spaces (prose vs. code/tables)."""
    if not text:
        return 0.0
    return sum(c.isalpha() or c == " " for c in text) / len(text)


def is_prose(par: str, lo: int, hi: int) -> bool:
    """A paragraph of ordinary sentences between lo and hi characters."""
    if not (lo <= len(par) <= hi) or prose_ratio(par) < 0.8:
        return False
    if not par[0].isupper() or par[-1] not in ".!?":
        return False
    if re.search(r"https?://|www\.|@\w+\.\w|[{}<>|\\]|\$ |--|\.\.\.\.|Copyright|copyright|GNU General|License",
                 par):
        return False
    return par.count(".") >= 2


def read_text(path: Path) -> str:
    """Reads a (possibly gzipped) text file as UTF-8, replacing bad bytes."""
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    return data.decode("utf-8", errors="replace")


def paragraphs(text: str) -> list[str]:
    """Blank-line separated paragraphs, each with whitespace collapsed."""
    return [clean_ws(p) for p in re.split(r"\n\s*\n", text) if p.strip()]


# ---------------------------------------------------------------------------
# Registry packages (fetch_sources.sh)

PYDOC = "python3.11-doc/usr/share/doc/python3.11/html/_sources"


def _rst_inline(text: str) -> str:
    """Strips reStructuredText roles and markup: :func:`x` -> x, ``y`` -> y."""
    text = re.sub(r":[a-z:]+:`~?([^`<]*?)(?:\s*<[^>]*>)?`", r"\1", text)
    text = re.sub(r"``([^`]*)``", r"\1", text)
    text = re.sub(r"`([^`<]*?)(?:\s*<[^>]*>)?`_*", r"\1", text)
    return text.replace("\\", "")


def python_faq_questions(src: Path) -> list[tuple[str, str]]:
    """(file stem, question) for every FAQ heading that is a question."""
    out = []
    for f in sorted((src / PYDOC / "faq").glob("*.rst.txt")):
        lines = f.read_text(encoding="utf-8").splitlines()
        for a, b in zip(lines, lines[1:]):
            if a.strip().endswith("?") and re.fullmatch(r"[-=~^\"']{3,}", b.strip() or "x"):
                out.append((f.name.split(".")[0], _rst_inline(a.strip())))
    return out


def python_glossary(src: Path) -> list[tuple[str, str]]:
    """(term, first sentence of its definition) from the Python glossary."""
    text = (src / PYDOC / "glossary.rst.txt").read_text(encoding="utf-8")
    out = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = re.fullmatch(r"   (\S.*)", line)
        if not m or i + 1 >= len(lines) or not lines[i + 1].startswith("      "):
            continue
        term = _rst_inline(m.group(1)).strip()
        body = []
        for nxt in lines[i + 1:]:
            if nxt.startswith("      ") or not nxt.strip():
                if not nxt.strip() and body:
                    break
                body.append(nxt.strip())
            else:
                break
        definition = _rst_inline(clean_ws(" ".join(body)))
        if re.fullmatch(r"[A-Za-z][A-Za-z0-9 _.\-()]{1,40}", term):
            out.append((term, definition))
    return out


def python_modules(src: Path) -> list[tuple[str, str]]:
    """(module, synopsis) from the library reference headings."""
    out = []
    for f in sorted((src / PYDOC / "library").glob("*.rst.txt")):
        for line in f.read_text(encoding="utf-8").splitlines()[:12]:
            m = re.match(r":mod:`!?([\w.]+)`\s+---\s+(.+)", line.strip())
            if m:
                out.append((m.group(1), _rst_inline(m.group(2)).strip()))
                break
    return out


def python_doc_paragraphs(src: Path) -> list[tuple[str, str]]:
    """(document, paragraph) prose paragraphs of the tutorial, HOWTOs and FAQ."""
    out = []
    for sub in ("tutorial", "howto", "faq"):
        for f in sorted((src / PYDOC / sub).glob("*.rst.txt")):
            for par in re.split(r"\n\s*\n", f.read_text(encoding="utf-8")):
                if par.startswith((" ", "..", ":")):
                    continue  # code blocks, directives, field lists
                p = _rst_inline(clean_ws(par))
                if is_prose(p, 250, 700):
                    out.append((f"{sub}/{f.name.split('.')[0]}", p))
    return out


def _dictd_b64(s: str) -> int:
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    n = 0
    for c in s:
        n = n * 64 + alphabet.index(c)
    return n


def dictd_entries(src: Path, package: str, name: str) -> list[tuple[str, str]]:
    """(headword, definition text) of a dictd database shipped by `package`."""
    base = src / package / "usr/share/dictd"
    data = gzip.decompress((base / f"{name}.dict.dz").read_bytes())
    out = []
    seen = set()
    for line in (base / f"{name}.index").read_text(encoding="utf-8", errors="replace").splitlines():
        parts = line.split("\t")
        if len(parts) != 3 or parts[0].startswith("00-database") or parts[0] in seen:
            continue
        seen.add(parts[0])
        off, size = _dictd_b64(parts[1]), _dictd_b64(parts[2])
        body = data[off:off + size].decode("utf-8", errors="replace")
        out.append((parts[0], body))
    return out


def foldoc_terms(src: Path) -> list[tuple[str, str]]:
    """(term, definition) from FOLDOC, cross-reference braces removed."""
    out = []
    for head, body in dictd_entries(src, "dict-foldoc", "foldoc"):
        # The headword and its aliases come first, up to the first blank line.
        _, _, rest = body.partition("\n\n")
        text = clean_ws(rest)
        text = re.sub(r"[{}]", "", text)
        text = re.sub(r"\(\d{4}-\d{2}-\d{2}\)\s*$", "", text).strip()
        text = re.sub(r"<[a-z ,/\-]+>\s*", "", text)  # subject tags: <programming, tool>
        if len(text) < 60:
            continue
        out.append((head, text))
    return out


def jargon_terms(src: Path) -> list[tuple[str, str]]:
    """(term, definition) from the Jargon File."""
    out = []
    for head, body in dictd_entries(src, "dict-jargon", "jargon"):
        _, _, rest = body.partition("\n\n")
        text = re.sub(r"[{}]", "", clean_ws(rest))
        if len(text) < 60:
            continue
        out.append((head, text))
    return out


def fortunes(src: Path) -> list[tuple[str, str]]:
    """(file, text) of short fortune-cookie entries (fortunes, literature)."""
    out = []
    for name in ("fortunes", "literature"):
        text = (src / "fortunes-min/usr/share/games/fortunes" / name).read_text(encoding="utf-8",
                                                                                errors="replace")
        for entry in re.split(r"\n%\n", text):
            e = entry.strip("%\n ")
            flat = clean_ws(e)
            if 30 <= len(flat) <= 280 and prose_ratio(flat) > 0.75:
                out.append((name, e))
    return out


def js_interview_questions(src: Path) -> list[dict]:
    """The npm interview-questions set: dicts with title, level, theme."""
    path = src / "interview-questions/package/question.json"
    return json.loads(path.read_text(encoding="utf-8"))


# ---------------------------------------------------------------------------
# Debian packages installed on the building machine


def dpkg_owners() -> dict[str, str]:
    """Path -> owning package, from dpkg's file lists."""
    owners = {}
    info = Path("/var/lib/dpkg/info")
    for f in sorted(info.glob("*.list")):
        pkg = f.name[:-5].split(":")[0]
        for line in f.read_text(encoding="utf-8", errors="replace").splitlines():
            owners.setdefault(line, pkg)
    return owners


def installed_packages() -> dict[str, dict]:
    """Installed packages: name -> {version, summary, description}."""
    fmt = "${Package}\\t${Version}\\t${db:Status-Abbrev}\\t${Description}\\n@@END@@\\n"
    out = subprocess.run(["dpkg-query", "-W", "-f", fmt], check=True, capture_output=True,
                         text=True).stdout
    pkgs = {}
    for rec in out.split("\n@@END@@\n"):
        if not rec.strip():
            continue
        head, _, rest = rec.partition("\n")
        cols = head.split("\t")
        if len(cols) < 4 or not cols[2].startswith("ii"):
            continue
        body = []
        for line in rest.splitlines():
            line = line[1:] if line.startswith(" ") else line
            body.append("" if line.strip() == "." else line)
        pkgs[cols[0]] = {"version": cols[1], "summary": cols[3].strip(),
                         "description": "\n".join(body).strip()}
    return dict(sorted(pkgs.items()))


def package_licence(pkg: str) -> str:
    """First License field of a package's machine-readable copyright file."""
    path = Path("/usr/share/doc") / pkg / "copyright"
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "unknown"
    m = re.search(r"^License:[ \t]*(\S[^\n]*)", text, re.M)
    if m and re.fullmatch(r"[\w.+\-]+(?: (?:or|and|with|[\w.+\-]+)){0,4}", m.group(1).strip()):
        return m.group(1).strip()
    for key, name in (("Python Software Foundation", "PSF"), ("GNU General Public License", "GPL"), ("Apache License", "Apache-2.0"),
                      ("BSD", "BSD"), ("MIT", "MIT"), ("public domain", "public-domain"),
                      ("Artistic", "Artistic"), ("LGPL", "LGPL"), ("Python Software Foundation", "PSF")):
        if key in text:
            return name
    return "see copyright file"


def readme_paragraphs(owners: dict[str, str]) -> list[tuple[str, str, str]]:
    """(package, file, paragraph) prose paragraphs of /usr/share/doc/*/README*."""
    out = []
    for f in sorted(Path("/usr/share/doc").glob("*/README*")):
        if not f.is_file() or f.suffix not in ("", ".gz", ".txt", ".md", ".Debian", ".rst"):
            continue
        try:
            text = read_text(f)
        except (OSError, EOFError, gzip.BadGzipFile):
            continue
        pkg = owners.get(str(f), f.parent.name)
        for par in paragraphs(text):
            par = re.sub(r"[*_#`]", "", par).strip()
            if is_prose(par, 200, 650):
                out.append((pkg, f.name, par))
    return out


_MAN_OPT = re.compile(r"^ {7}(-{1,2}[A-Za-z0-9][\w\-]*)(?:[ =,\[]|$)")


def man_page(path: Path) -> dict | None:
    """Renders a man page with man(1) and returns its name, one-line summary,
    first DESCRIPTION paragraph and options [(flag, text)], or None."""
    env = dict(os.environ, MANWIDTH="100", LC_ALL="C.UTF-8", MAN_KEEP_FORMATTING="")
    try:
        r = subprocess.run(["man", "--nh", "--nj", "-P", "cat", "-l", str(path)], env=env,
                           capture_output=True, text=True, timeout=20, errors="replace")
    except subprocess.TimeoutExpired:
        return None
    if r.returncode != 0:
        return None
    text = re.sub(r".\x08", "", r.stdout)
    sections, cur = {}, None
    for line in text.splitlines():
        if re.fullmatch(r"[A-Z][A-Z ]+", line.strip()) and not line.startswith(" "):
            cur = line.strip()
            sections[cur] = []
        elif cur:
            sections[cur].append(line)
    name = clean_ws(" ".join(sections.get("NAME", [])))
    m = re.match(r"([\w.+\-]+)(?:,.*?)?\s+[-\u2010\u2013\u2014]+\s+(.+)", name)
    if not m:
        return None
    desc_pars = paragraphs("\n".join(sections.get("DESCRIPTION", [])))
    options = []
    for sec in ("OPTIONS", "DESCRIPTION"):
        lines = sections.get(sec, [])
        for i, line in enumerate(lines):
            om = _MAN_OPT.match(line)
            if not om:
                continue
            body = []
            rest = line[7 + len(om.group(1)):].strip()
            if len(rest) > 25 and "  " in rest:  # "-a     text" on one line
                body.append(rest.split("  ", 1)[1])
            for nxt in lines[i + 1:]:
                if nxt.startswith(" " * 14) and nxt.strip():
                    body.append(nxt.strip())
                else:
                    break
            text_opt = clean_ws(" ".join(body))
            if len(text_opt) >= 20:
                options.append((om.group(1), text_opt))
    return {"command": m.group(1), "summary": m.group(2).strip(),
            "description": [p for p in desc_pars if is_prose(p, 120, 700)], "options": options}


def man_pages(section_dirs=("man1", "man8")) -> list[Path]:
    """English man pages of the given sections, sorted."""
    pages = []
    for sec in section_dirs:
        pages.extend(sorted(Path("/usr/share/man", sec).glob("*.gz")))
    return pages


def stdlib_functions(root: Path, min_lines=5, max_lines=28) -> list[tuple[str, str]]:
    """(module file, source) of top-level functions and methods of the Python
    standard library, docstrings removed, between min_lines and max_lines."""
    out = []
    for f in sorted(root.glob("*.py")):
        try:
            src = f.read_text(encoding="utf-8")
            tree = ast.parse(src)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        lines = src.splitlines()
        nodes = []
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                nodes.append(node)
            elif isinstance(node, ast.ClassDef):
                nodes.extend(n for n in node.body if isinstance(n, ast.FunctionDef))
        for node in nodes:
            if node.name.startswith("__") or node.decorator_list:
                continue
            body_start = node.body[0]
            skip = None
            if isinstance(body_start, ast.Expr) and isinstance(getattr(body_start, "value", None),
                                                                ast.Constant) \
                    and isinstance(body_start.value.value, str):
                skip = (body_start.lineno, body_start.end_lineno)
                if len(node.body) == 1:
                    continue
            seg = []
            for ln in range(node.lineno, node.end_lineno + 1):
                if skip and skip[0] <= ln <= skip[1]:
                    continue
                seg.append(lines[ln - 1])
            code = textwrap.dedent("\n".join(seg)).strip("\n")
            n = code.count("\n") + 1
            if min_lines <= n <= max_lines and len(code) <= 1100 and "\t" not in code:
                out.append((f.name, code))
    return out


def doc_example_scripts(owners: dict[str, str]) -> list[tuple[str, str, str, str]]:
    """(package, path, language, chunk) of shell/Python example scripts under
    /usr/share/doc: whole files of 6-30 lines, or the first function-sized chunk."""
    out = []
    exts = {".sh": "bash", ".py": "python", ".pl": "perl"}
    for f in sorted(Path("/usr/share/doc").rglob("*")):
        lang = exts.get(f.suffix)
        if not lang or not f.is_file() or "/t/" in str(f):
            continue
        try:
            text = f.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        lines = [ln.rstrip() for ln in text.splitlines()]
        while lines and (lines[0].startswith("#") or not lines[0].strip()):
            lines.pop(0)  # shebang and licence headers
        chunk = "\n".join(lines[:30]).strip()
        if 6 <= chunk.count("\n") + 1 <= 30 and len(chunk) <= 1200:
            out.append((owners.get(str(f), f.parts[4]), str(f), lang, chunk))
    return out

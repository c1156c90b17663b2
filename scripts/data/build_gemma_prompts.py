#!/usr/bin/env python3
"""Builds completion prompts for a base model (Gemma 3 270M): prefixes of
real documents that the target continues with `dspark regen --raw`.

    python3 scripts/data/build_gemma_prompts.py \
        [--sources ~/.cache/dspark/data/sources] [--out data/gemma-prompts] \
        [--model gemma3] [--seed 20250301]

Documents (documents.py) are books and manuals fetched by fetch_sources.sh
and texts of installed Debian packages: Python documentation, Debian books,
Perl and git manuals, the GNU coding standards, Python/JavaScript/C/shell
code, man pages, licences and changelogs. Each document is cut into prompts
of MIN_TOKENS..MAX_TOKENS target tokens (lengths drawn log-uniformly) that
start at a paragraph or line start and end at a line or sentence end.

Split rule: a document belongs to train, dev or test by a hash of its key
(so all its prompts go to one split, and a document keeps its split when
budgets change). Prompts whose normalized text equals, contains or is
contained in a held-out prompt (data/dev-prompts.jsonl, test-prompts.jsonl,
completion-prompts.jsonl) are dropped, as are normalized duplicates.
Ids are `gm-<kind>-<first 12 hex digits of the SHA-1 of the prompt>`.

Writes OUT/{train,dev,test}.jsonl ({"id", "kind", "prompt", "source"}, one a
line, shuffled with the seed) and OUT/sources.json. Needs the dspark Python
package (for the target's tokenizer) and `man`.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import concurrent.futures
import hashlib
import json
import math
import os
import random
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import documents  # noqa: E402
import sources  # noqa: E402
from build_prompts import normalize, sub_rng, write_jsonl  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
HELD_OUT = ("data/dev-prompts.jsonl", "data/test-prompts.jsonl", "data/completion-prompts.jsonl")
MIN_TOKENS, MAX_TOKENS = 64, 256
PER_DOC = 16          # most prompts one document gives
DEV_SHARE = TEST_SHARE = 0.03

# Prompts per group (all splits together; a group with fewer candidates
# gives what it has).
BUDGETS = {
    "python-docs": 2000,
    "books": 2200,
    "perl-docs": 1000,
    "git-docs": 700,
    "gnu-standards": 250,
    "python-code": 1900,
    "js-code": 700,
    "c-code": 700,
    "scripts": 700,
    "man-pages": 1400,
    "licences": 700,
    "changelogs": 600,
}
MAN_PAGES = 2400      # man pages rendered (sampled) for the man-pages group

LICENCES = {
    "python3.11-doc": "PSF-2.0 (Python Software Foundation License)",
    "debian-handbook": "GPL-2+ or CC-BY-SA-3.0 (The Debian Administrator's Handbook)",
    "debian-reference-en": "GPL-2+ (Debian Reference, Osamu Aoki)",
    "developers-reference": "MIT (Debian Developer's Reference)",
    "maint-guide": "MIT or GPL-2+ (Debian New Maintainers' Guide)",
    "perl-doc": "GPL-1+ or Artistic (Perl documentation)",
    "git-doc": "GPL-2 (git documentation)",
    "gnu-standards": "GFDL-1.3+, no invariant sections (GNU Coding Standards, GNU Maintainer Information)",
}

_SENTENCE_END = re.compile(r"[.!?][\"')\]]?(?= +[A-Z(\"'])")


class Tokenizer:
    """Counts target tokens (no BOS) with the dspark Python package."""

    def __init__(self, model: str):
        import dspark
        self.model = dspark.Model(model)
        self.name = Path(self.model.model_path).name

    def count(self, text: str) -> int:
        return len(self.model.tokenize(text, add_bos=False, special=False))


def cut_points(text: str, kind: str) -> tuple[list[int], list[int]]:
    """(starts, ends): offsets where a prompt may begin (a paragraph start;
    any line start in code and structured text with few blank lines) and end
    (after a line's newline, or after a sentence's full stop in prose)."""
    par_starts, line_starts, ends = [0], [0], []
    prev_blank = True
    pos = 0
    for line in text.split("\n"):
        nxt = pos + len(line) + 1
        blank = not line.strip()
        if not blank and pos:
            line_starts.append(pos)
            if prev_blank:
                par_starts.append(pos)
        if not blank:
            ends.append(nxt)
            if kind == "prose":
                ends.extend(pos + m.end() for m in _SENTENCE_END.finditer(line))
        prev_blank = blank
        pos = nxt
    few = len(par_starts) * 2000 < len(text)
    starts = line_starts if kind != "prose" and few else par_starts
    return starts, sorted(set(ends))


def doc_windows(doc: documents.Doc, tok: Tokenizer, rng: random.Random, cap: int) -> list[str]:
    """Non-overlapping prompts of one document, at most `cap`, in document order."""
    text = doc.text
    starts, ends = cut_points(text, doc.kind)
    if not ends:
        return []
    out = []
    # Walk the document; each prompt starts at a start point at least a few
    # hundred characters after the previous prompt's end (the part the
    # target is asked to continue is not the next prompt).
    s_idx = 0
    tries = 0
    while s_idx < len(starts) and len(out) < 4 * cap and tries < 12 * cap:
        tries += 1
        start = starts[s_idx]
        want = math.exp(rng.uniform(math.log(MIN_TOKENS), math.log(MAX_TOKENS)))
        # First guess at 3.5 characters a token, then fix it with the tokenizer.
        end_i = bisect.bisect_left(ends, start + int(want * 3.5))
        end_i = min(end_i, len(ends) - 1)
        window = None
        for _ in range(4):
            end = ends[end_i]
            if end <= start:
                break
            cand = text[start:end].rstrip(" ")
            n = tok.count(cand)
            if MIN_TOKENS <= n <= MAX_TOKENS and abs(n - want) < 0.35 * want:
                window = cand
                break
            # Move the end by the character estimate of the token error.
            chars_per_tok = max(1.5, len(cand) / max(n, 1))
            target = start + int(want * chars_per_tok)
            new_i = min(max(bisect.bisect_left(ends, target), 0), len(ends) - 1)
            if new_i == end_i:
                if MIN_TOKENS <= n <= MAX_TOKENS:
                    window = cand
                break
            end_i = new_i
        if window is not None and window.strip() and ends[end_i] < len(text):  # text is left to continue
            out.append(window)
            gap = start + len(window) + rng.randint(400, 3000)
        else:
            gap = start + 200
        s_idx = bisect.bisect_left(starts, gap)
    if len(out) > cap:
        out = sorted(rng.sample(out, cap), key=text.index)
    return out


def split_of(seed: int, key: str) -> str:
    u = int.from_bytes(hashlib.sha256(f"{seed}:split:{key}".encode()).digest()[:8], "little") / 2**64
    return "test" if u < TEST_SHARE else "dev" if u < TEST_SHARE + DEV_SHARE else "train"


class Exclusion:
    """Held-out prompts (exact and normalized containment either way) and
    normalized duplicates."""

    def __init__(self, held_out: list[str]):
        self.exact = set(held_out)
        self.norm = [normalize(t) for t in held_out]
        self.seen: set[str] = set()
        self.removed = collections.Counter()

    def keep(self, text: str) -> bool:
        norm = normalize(text)
        if not norm:
            self.removed["empty"] += 1
            return False
        padded = f" {norm} "
        if text in self.exact or any(f" {h} " in padded or padded in f" {h} " for h in self.norm):
            self.removed["held_out"] += 1
            return False
        if norm in self.seen:
            self.removed["duplicate"] += 1
            return False
        self.seen.add(norm)
        return True


def man_docs(seed: int, owners: dict[str, str]) -> list[documents.Doc]:
    pages = [p for p in sources.man_pages(("man1", "man5", "man8"))
             if not owners.get(str(p), "").startswith("google-cloud")]
    pages = sorted(sub_rng(seed, "man").sample(pages, min(MAN_PAGES, len(pages))))
    with concurrent.futures.ThreadPoolExecutor(max(1, min(4, os.cpu_count() or 1))) as ex:
        texts = list(ex.map(documents.man_page_text, pages))
    # The key names the owner of the page's path ("unknown" for a link that
    # update-alternatives manages, e.g. awk.1), the package the owner of the
    # file it resolves to.
    return [documents.Doc("man-pages", f"installed:{owners.get(str(p), 'unknown')}:man/{p.parent.name}/{p.name[:-3]}",
                          "structured", owners.get(str(p)) or owners.get(os.path.realpath(p), "unknown"),
                          documents.tidy(t))
            for p, t in zip(pages, texts) if len(t) > 400]


def load_documents(src: Path, seed: int) -> list[documents.Doc]:
    owners = sources.dpkg_owners()
    docs = []
    for reader in (documents.python_docs, documents.html_books, documents.perl_pods,
                   documents.git_docs, documents.gnu_standards):
        got = reader(src)
        print(f"  {reader.__name__}: {len(got)} documents", file=sys.stderr)
        docs += got
    docs += documents.python_stdlib_code()
    for reader in (documents.js_code, documents.c_headers, documents.scripts,
                   documents.licences, documents.changelogs):
        got = reader(owners)
        print(f"  {reader.__name__}: {len(got)} documents", file=sys.stderr)
        docs += got
    got = man_docs(seed, owners)
    print(f"  man pages: {len(got)} documents", file=sys.stderr)
    return docs + got


def registry_versions(src: Path) -> dict[str, str]:
    out = {}
    path = src / "versions.tsv"
    if path.exists():
        for line in path.read_text().splitlines():
            reg, name, version = line.split("\t")
            out[name] = version
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    dspark_home = Path(os.environ.get("DSPARK_HOME", Path.home() / ".cache/dspark"))
    ap.add_argument("--sources", type=Path, default=dspark_home / "data/sources")
    ap.add_argument("--out", type=Path, default=ROOT / "data/gemma-prompts")
    ap.add_argument("--model", default="gemma3", help="target whose tokenizer measures prompts")
    ap.add_argument("--seed", type=int, default=20250301)
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every group's budget")
    args = ap.parse_args()

    tok = Tokenizer(args.model)
    docs = load_documents(args.sources, args.seed)
    held_out = [json.loads(line)["prompt"] for f in HELD_OUT
                for line in (ROOT / f).read_text(encoding="utf-8").splitlines() if line.strip()]
    excl = Exclusion(held_out)

    by_group = collections.defaultdict(list)
    for d in docs:
        by_group[d.group].append(d)
    rows = {"train": [], "dev": [], "test": []}
    stats = {}
    installed = sources.installed_packages()
    versions = registry_versions(args.sources)
    packages: dict[str, dict] = {}
    for group in sorted(by_group):
        budget = int(BUDGETS[group] * args.scale)
        rng = sub_rng(args.seed, f"group:{group}")
        group_docs = sorted(by_group[group], key=lambda d: d.key)
        rng.shuffle(group_docs)
        # Visit documents in a seeded order, taking up to a share of each, so a
        # group's budget spreads over many documents.
        share = max(1, min(PER_DOC, math.ceil(2 * budget / max(1, len(group_docs)))))
        n_group = collections.Counter()
        used_docs = collections.Counter()
        for d in group_docs:
            if sum(n_group.values()) >= budget:
                break
            split = split_of(args.seed, d.key)
            wins = doc_windows(d, tok, sub_rng(args.seed, f"doc:{d.key}"), share)
            for w in wins:
                if not excl.keep(w):
                    continue
                rows[split].append({"id": f"gm-{d.kind}-{hashlib.sha1(w.encode('utf-8')).hexdigest()[:12]}",
                                    "kind": d.kind, "prompt": w, "source": d.key})
                n_group[split] += 1
                pk = packages.setdefault(d.package, {"prompts": 0, "documents": set()})
                pk["prompts"] += 1
                pk["documents"].add(d.key)
            if wins:
                used_docs[split] += 1
        stats[group] = {"budget": budget, "documents_available": len(group_docs),
                        "documents_used": dict(used_docs), "prompts": dict(n_group)}
        print(f"  {group}: {dict(n_group)} from {dict(used_docs)} documents", file=sys.stderr)

    args.out.mkdir(parents=True, exist_ok=True)
    for split, rs in rows.items():
        rs.sort(key=lambda r: r["id"])
        sub_rng(args.seed, f"shuffle:{split}").shuffle(rs)
        write_jsonl(args.out / f"{split}.jsonl", rs)

    pkg_info = {}
    for name in sorted(packages):
        info = packages[name]
        if name in versions:
            reg = {"registry": "debian (fetched)", "version": versions[name],
                   "licence": LICENCES.get(name, "see copyright file")}
        else:
            reg = {"registry": "debian (installed)",
                   "version": installed.get(name, {}).get("version", "unknown"),
                   "licence": sources.package_licence(name)}
        pkg_info[name] = {**reg, "documents": len(info["documents"]), "prompts": info["prompts"]}
    kinds = {s: dict(collections.Counter(r["kind"] for r in rs)) for s, rs in rows.items()}
    meta = {
        "seed": args.seed, "tokenizer": tok.name, "prompt_tokens": [MIN_TOKENS, MAX_TOKENS],
        "per_document": PER_DOC, "split_shares": {"dev": DEV_SHARE, "test": TEST_SHARE},
        "held_out": list(HELD_OUT), "removed": dict(excl.removed),
        "counts": {s: len(rs) for s, rs in rows.items()}, "kinds": kinds,
        "groups": stats, "packages": pkg_info,
    }
    tmp = args.out / "sources.json.tmp"
    tmp.write_text(json.dumps(meta, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    tmp.replace(args.out / "sources.json")
    print(json.dumps({"counts": meta["counts"], "kinds": kinds, "removed": meta["removed"]}), file=sys.stderr)


if __name__ == "__main__":
    main()

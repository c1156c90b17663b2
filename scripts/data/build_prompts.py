#!/usr/bin/env python3
"""Builds the drafter-training prompt set data/train-prompts/.

  build_prompts.py meta  --out FILE [--repeats N] [--first-repeat K]
      writes the self-instruct meta-prompts (few-shot frames x topics) that
      `dspark regen --raw --save-text` completes;
  build_prompts.py extend --self-instruct DIR --out FILE [--seed S]
      writes the new prompts of a further self-instruct run (another
      sampling seed) that are in none of the prompt files already built
      (prompts.jsonl, heldout.jsonl) nor the dev or test set: more data
      for a drafter that has fitted the first set;
  build_prompts.py build --sources DIR [--self-instruct DIR] [--seed S] [--out-dir DIR]
      assembles prompts.jsonl, heldout.jsonl and sources.json from
        * registry packages unpacked by fetch_sources.sh (DIR),
        * Debian packages installed on this machine,
        * programmatic math and code generators,
        * the self-instruct run's responses (a `dspark regen` directory).

Deterministic: the same seed, sources and machine give the same files. The
prompts of data/dev-prompts.jsonl are excluded (exact text, normalized text,
and normalized containment either way). Only the standard library is used.
See docs/training-data.md and scripts/data/make_prompts.sh.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import hashlib
import json
import random
import re
import struct
import sys
import unicodedata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gen_code  # noqa: E402
import gen_math  # noqa: E402
import gen_text  # noqa: E402
import sources  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
KINDS = ("chat", "instruct", "code", "math")

# Licences of the registry packages (from their copyright files / package.json).
REGISTRY_LICENCES = {
    "python3.11-doc": "PSF-2.0 (Python Software Foundation License; docs also under the PSF licence)",
    "dict-foldoc": "GFDL-1.1-or-later (FOLDOC, Denis Howe), no invariant sections",
    "dict-jargon": "public domain (The Jargon File 4.4.7)",
    "fortunes-min": "BSD-3-Clause (fortune-mod, University of California; the entries are short quotations)",
    "interview-questions": "ISC",
}


def normalize(text: str) -> str:
    """Lowercase alphanumeric words separated by single spaces (NFKC first)."""
    text = unicodedata.normalize("NFKC", text).lower()
    return " ".join(re.findall(r"[a-z0-9]+", text))


def prompt_id(kind: str, text: str) -> str:
    return f"{kind}-{hashlib.sha1(text.encode('utf-8')).hexdigest()[:12]}"


def sub_rng(seed: int, name: str) -> random.Random:
    """An RNG per generator, so adding one generator does not shift the others."""
    return random.Random(int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little"))


class Collector:
    """Deduplicating accumulator with the dev-prompt exclusion."""

    def __init__(self, dev: list[str], banned_extra: list[str]):
        self.dev_exact = set(dev)
        self.dev_norm = [normalize(d) for d in dev]
        self.banned = {normalize(b) for b in banned_extra}
        self.seen: set[str] = set()
        self.records: list[dict] = []
        self.removed = collections.Counter()

    def is_dev(self, text: str, norm: str) -> bool:
        if text in self.dev_exact:
            self.removed["dev_exact"] += 1
            return True
        for d in self.dev_norm:
            if norm == d or (len(norm) >= 12 and (f" {d} " in f" {norm} " or f" {norm} " in f" {d} ")):
                self.removed["dev_normalized"] += 1
                return True
        return False

    def add(self, kind: str, text: str, source: str) -> bool:
        assert kind in KINDS, kind
        text = text.strip()
        norm = normalize(text)
        if not norm or self.is_dev(text, norm):
            return False
        if norm in self.seen or norm in self.banned:
            self.removed["duplicate"] += 1
            return False
        self.seen.add(norm)
        self.records.append({"id": prompt_id(kind, text), "kind": kind, "prompt": text, "source": source})
        return True


# ---------------------------------------------------------------------------
# Source groups


def add_registry(c: Collector, src: Path, seed: int, counts: collections.Counter):
    r = sub_rng(seed, "registry")
    for stem, q in sources.python_faq_questions(src):
        text = q if "python" in q.lower() else f"Python question: {q}"
        counts["python3.11-doc"] += c.add("code", text, f"debian:python3.11-doc:faq/{stem}")
    for term, definition in sources.python_glossary(src):
        text = r.choice([f"In Python, what is meant by \"{term}\"?",
                         f"Explain the Python term \"{term}\" with a short example."])
        counts["python3.11-doc"] += c.add("code", text, "debian:python3.11-doc:glossary")
    for mod, synopsis in sources.python_modules(src):
        text = r.choice([f"What is the Python module `{mod}` used for? Show a small example.",
                         f"The Python standard library module `{mod}` provides: {synopsis}. "
                         f"Explain when you would use it.",
                         f"Give a short example that uses Python's `{mod}` module."])
        counts["python3.11-doc"] += c.add("code", text, f"debian:python3.11-doc:library/{mod}")
    pars = [(f"debian:python3.11-doc:{doc}", p) for doc, p in sources.python_doc_paragraphs(src)]
    for topic, text, origin in gen_text.paragraph_requests(r, pars, 380):
        counts["python3.11-doc"] += c.add("instruct", text, origin)

    for topic, text, head in gen_text.term_requests(r, sources.foldoc_terms(src), 1000, "computing", 0.3):
        kind = "instruct" if topic == "definition" else "chat"
        counts["dict-foldoc"] += c.add(kind, text, f"debian:dict-foldoc:{head}")
    for topic, text, head in gen_text.term_requests(r, sources.jargon_terms(src), 300, "jargon", 0.3):
        kind = "instruct" if topic == "definition" else "chat"
        counts["dict-jargon"] += c.add(kind, text, f"debian:dict-jargon:{head}")
    for topic, text, origin in gen_text.quote_requests(r, sources.fortunes(src), 450):
        counts["fortunes-min"] += c.add("chat", text, f"debian:fortunes-min:{origin}")

    for q in sources.js_interview_questions(src):
        title = q["title"].strip().rstrip("?").strip()
        if len(title) < 8:
            continue
        text = r.choice([f"{title}?", f"JavaScript interview question: {title}?",
                         f"{title}? Explain with a short JavaScript example."])
        if not re.match(r"(?i)(what|how|why|when|which|is|are|can|does|do|explain|list|describe)\b", title):
            text = f"JavaScript: explain \"{title}\" with a short example."
        counts["interview-questions"] += c.add("code", text, "npm:interview-questions")


def render_man_pages(pages, workers=2):
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as ex:
        return list(ex.map(sources.man_page, pages))


def add_installed(c: Collector, seed: int, man_budget: int, used: collections.Counter):
    """Texts of Debian packages installed on this machine."""
    r = sub_rng(seed, "installed")
    owners = sources.dpkg_owners()
    pkgs = sources.installed_packages()

    # Package descriptions.
    names = [p for p, v in pkgs.items() if len(v["description"]) >= 80 and not p.startswith("lib")
             and not p.startswith("google-cloud")]
    names += r.sample([p for p, v in pkgs.items() if p.startswith("lib") and len(v["description"]) >= 150], 80)
    for p in sorted(set(names)):
        d = pkgs[p]
        desc = sources.clean_ws(d["description"])[:700]
        text = r.choice([
            f"Explain what the Debian package \"{p}\" does, based on its description:\n\n{desc}",
            f"In one or two sentences, what is {p} ({d['summary']}) used for?",
            f"Who would want to install the package {p}? Here is its description:\n\n{desc}",
            f"Rewrite this software package description so a non-technical person can understand it:\n\n{desc}",
            f"What is {p}? The package summary says: \"{d['summary']}\".",
        ])
        kind = "instruct" if "\n\n" in text else "chat"
        used[p] += c.add(kind, text, f"debian-local:dpkg:{p}")

    # README paragraphs.
    readmes = sources.readme_paragraphs(owners)
    for pkg, fname, par in r.sample(readmes, min(520, len(readmes))):
        text = r.choice(gen_text.PARAGRAPH_REQUESTS).format(p=par)
        used[pkg] += c.add("instruct", text, f"debian-local:readme:{pkg}/{fname}")

    # Man pages: commands, options and descriptions.
    pages = [p for p in sources.man_pages()
             if not owners.get(str(p), "google-cloud").startswith("google-cloud")
             and str(p) in owners]
    pages = r.sample(pages, min(man_budget, len(pages)))
    pages.sort()
    for path, page in zip(pages, render_man_pages(pages)):
        if not page:
            continue
        pkg = owners[str(path)]
        cmd = page["command"]
        src = f"debian-local:man:{cmd}({pkg})"
        n = 0
        n += c.add("code", r.choice([f"What does the `{cmd}` command do on Linux?",
                                     f"What is `{cmd}` ({page['summary']}) and when would I use it?",
                                     f"Show a typical example of using the `{cmd}` command."]), src)
        for flag, desc in r.sample(page["options"], min(2, len(page["options"]))):
            n += c.add("code", r.choice([f"What does the {flag} option of `{cmd}` do?",
                                         f"When would I use `{cmd} {flag}`?",
                                         f"The manual of `{cmd}` says that {flag} means: \"{desc[:300]}\". "
                                         f"Explain this in plain words with an example."]), src)
        if page["description"] and r.random() < 0.5:
            n += c.add("instruct", r.choice(gen_text.PARAGRAPH_REQUESTS).format(p=page["description"][0]), src)
        used[pkg] += n

    # Python standard library functions and shipped example scripts.
    stdlib = Path(sorted(Path("/usr/lib").glob("python3.[0-9]*"))[-1])
    pypkg = owners.get(str(stdlib / "os.py"), "python3-minimal")
    funcs = sources.stdlib_functions(stdlib)
    for topic, text, module in gen_code.snippet_requests(r, funcs, 520):
        used[pypkg] += c.add("code", text, f"debian-local:{stdlib.name}:{module}")
    for topic, text, pkg in gen_code.script_requests(r, sources.doc_example_scripts(owners)):
        used[pkg] += c.add("code", text, f"debian-local:example:{pkg}")
    return pkgs


def add_generated(c: Collector, seed: int, counts: collections.Counter):
    for topic, text in gen_math.generate(seed, 3300):
        counts["generated-math"] += c.add("math", text, f"generated:math/{topic}")
    r = sub_rng(seed, "code")
    for topic, text in (gen_code.function_requests(r, 760) + gen_code.sql_requests(r, 240) + gen_code.misc_requests(r)):
        counts["generated-code"] += c.add("code", text, f"generated:code/{topic}")
    r = sub_rng(seed, "text")
    for topic, text in gen_text.templated_instruct(r, 850):
        counts["generated-text"] += c.add("instruct", text, f"generated:instruct/{topic}")
    for topic, text in gen_text.templated_chat(r):
        counts["generated-text"] += c.add("chat", text, f"generated:chat/{topic}")


def read_regen_texts(directory: Path) -> list[tuple[str, str]]:
    """(prompt id, response text) of a `dspark regen --save-text` directory,
    read with the standard library (safetensors header = u64 length + JSON)."""
    manifest = json.loads((directory / "manifest.json").read_text(encoding="utf-8"))
    out = []
    for shard in manifest["shards"]:
        with open(directory / shard["file"], "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            meta = json.loads(f.read(n)).get("__metadata__", {})
        if "responses" not in meta:
            raise SystemExit(f"{directory / shard['file']}: no responses (regenerate with --save-text)")
        out.extend(zip(json.loads(meta["prompt_ids"]), json.loads(meta["responses"])))
    return out


def add_self_instruct(c: Collector, directory: Path, counts: collections.Counter) -> dict:
    manifest = json.loads((directory / "manifest.json").read_text(encoding="utf-8"))
    responses = read_regen_texts(directory)
    parsed = 0
    for pid, response in responses:
        kind = gen_text.FRAME_KIND[pid.split("-")[1]]
        for item in gen_text.parse_self_instruct(response):
            parsed += 1
            counts["self-instruct"] += c.add(kind, item, f"self-instruct:{manifest['target_path']}")
    return {"target_id": manifest["target_id"], "target_path": manifest["target_path"],
            "sampling": manifest["sampling"], "generations": len(responses), "items_parsed": parsed}


# ---------------------------------------------------------------------------


def cmd_meta(args):
    rows = [r for r in gen_text.self_instruct_meta(args.repeats, args.frames)
            if int(r["id"].rsplit("-", 1)[1]) >= args.first_repeat]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"{args.out}: {len(rows)} meta-prompts")


def write_jsonl(path: Path, rows: list[dict]):
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def cmd_build(args):
    src = Path(args.sources)
    versions = {}
    for line in (src / "versions.tsv").read_text().splitlines():
        reg, name, ver = line.split("\t")
        versions[name] = (reg, ver)
    dev_path = Path(args.dev)
    dev = read_prompts(dev_path)
    c = Collector(dev, frame_examples())
    counts: collections.Counter = collections.Counter()
    used_local: collections.Counter = collections.Counter()

    add_generated(c, args.seed, counts)
    add_registry(c, src, args.seed, counts)
    pkgs = add_installed(c, args.seed, args.man_pages, used_local)
    si_info = None
    if args.self_instruct:
        si_info = add_self_instruct(c, Path(args.self_instruct), counts)

    records = c.records
    sub_rng(args.seed, "shuffle").shuffle(records)
    # Held-out split: a fixed fraction of every kind.
    by_kind = collections.defaultdict(list)
    for rec in records:
        by_kind[rec["kind"]].append(rec)
    held_ids = set()
    for kind, recs in sorted(by_kind.items()):
        n = max(1, round(len(recs) * args.heldout_frac))
        held_ids.update(rec["id"] for rec in recs[:n])
    train = [rec for rec in records if rec["id"] not in held_ids]
    held = [rec for rec in records if rec["id"] in held_ids]
    assert len({r["id"] for r in records}) == len(records), "prompt id collision"

    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(out / "prompts.jsonl", train)
    write_jsonl(out / "heldout.jsonl", held)

    local = []
    for p, n in sorted(used_local.items()):
        if n and p in pkgs:
            local.append({"package": p, "version": pkgs[p]["version"], "licence": sources.package_licence(p),
                          "prompts": n})
    registry = []
    for name, (reg, ver) in sorted(versions.items()):
        registry.append({"name": name, "registry": reg, "version": ver,
                         "licence": REGISTRY_LICENCES.get(name, "see package"), "prompts": counts[name]})
    manifest = {
        "generated_by": "scripts/data/build_prompts.py build",
        "seed": args.seed,
        "files": {"prompts.jsonl": len(train), "heldout.jsonl": len(held)},
        "by_kind": {k: {"train": sum(r["kind"] == k for r in train), "heldout": sum(r["kind"] == k for r in held)}
                    for k in KINDS},
        "excluded": {"dev_prompts": str(dev_path.relative_to(ROOT)) if dev_path.is_absolute() and
                     ROOT in dev_path.parents else str(dev_path),
                     "removed_dev_exact": c.removed["dev_exact"],
                     "removed_dev_normalized": c.removed["dev_normalized"],
                     "removed_duplicates": c.removed["duplicate"]},
        "sources": {
            "registry_packages": registry,
            "generated": [
                {"name": "generated-math", "what": "seeded arithmetic, algebra, units, geometry, percentages, "
                 "probability templates (scripts/data/gen_math.py)", "licence": "project licence",
                 "prompts": counts["generated-math"]},
                {"name": "generated-code", "what": "write-a-function, SQL, shell, git, regex and concept "
                 "templates (scripts/data/gen_code.py)", "licence": "project licence",
                 "prompts": counts["generated-code"]},
                {"name": "generated-text", "what": "instruction and advice templates over a topic list "
                 "(scripts/data/gen_text.py)", "licence": "project licence", "prompts": counts["generated-text"]},
            ],
            "self_instruct": dict(si_info or {}, prompts=counts["self-instruct"],
                                  licence="generated by SmolLM2-135M-Instruct (Apache-2.0)"),
            "installed_debian_packages": {
                "what": "package descriptions (dpkg), README paragraphs (/usr/share/doc), man pages "
                        "(man1, man8), Python standard library functions, shipped example scripts",
                "prompts": sum(used_local.values()),
                "packages": local,
            },
        },
    }
    (out / "sources.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(json.dumps({"train": len(train), "heldout": len(held), "by_kind": manifest["by_kind"],
                      "excluded": manifest["excluded"]}, indent=1))


def read_prompts(path: Path) -> list[str]:
    return [json.loads(line)["prompt"] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def frame_examples() -> list[str]:
    """The self-instruct frames' own examples: not new prompts."""
    return [ln[2:] for frames in gen_text.FRAME_SETS.values() for t in frames.values()
            for ln in t.splitlines() if ln.startswith("- ")]


def cmd_extend(args):
    built = Path(args.built_dir)
    held_out_sets = [Path(args.dev), Path(args.test)]
    c = Collector([p for f in held_out_sets for p in read_prompts(f)],
                  frame_examples() + [p for f in ("prompts.jsonl", "heldout.jsonl") for p in read_prompts(built / f)]
                  + [p for f in args.exclude for p in read_prompts(Path(f))])
    counts: collections.Counter = collections.Counter()
    info = add_self_instruct(c, Path(args.self_instruct), counts)
    records = c.records
    sub_rng(args.seed, "shuffle-extend").shuffle(records)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_jsonl(out, records)
    print(json.dumps({"out": str(out), "prompts": len(records),
                      "by_kind": {k: sum(r["kind"] == k for r in records) for k in KINDS},
                      "generations": info["generations"], "items_parsed": info["items_parsed"],
                      "removed": dict(c.removed)}, indent=1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("meta", help="write the self-instruct meta-prompts")
    m.add_argument("--out", required=True)
    m.add_argument("--repeats", type=int, default=3)
    m.add_argument("--first-repeat", type=int, default=0,
                   help="leave out the repeats before this one (a further run after one of that many)")
    m.add_argument("--frames", choices=sorted(gen_text.FRAME_SETS), default="v1",
                   help="the few-shot frames: v1 (question, instruction) or v3 (request, task)")
    b = sub.add_parser("build", help="assemble the prompt files")
    b.add_argument("--sources", required=True, help="directory filled by fetch_sources.sh")
    b.add_argument("--self-instruct", help="`dspark regen --save-text` directory of the meta-prompts")
    b.add_argument("--seed", type=int, default=20250101)
    b.add_argument("--out-dir", default=str(ROOT / "data/train-prompts"))
    b.add_argument("--dev", default=str(ROOT / "data/dev-prompts.jsonl"))
    b.add_argument("--heldout-frac", type=float, default=0.03)
    b.add_argument("--man-pages", type=int, default=650, help="man pages to sample")
    e = sub.add_parser("extend", help="new prompts of a further self-instruct run")
    e.add_argument("--self-instruct", required=True, help="`dspark regen --save-text` directory of the meta-prompts")
    e.add_argument("--out", required=True, help="the prompts file to write")
    e.add_argument("--seed", type=int, default=20250101)
    e.add_argument("--built-dir", default=str(ROOT / "data/train-prompts"), help="the prompt files built before")
    e.add_argument("--dev", default=str(ROOT / "data/dev-prompts.jsonl"))
    e.add_argument("--test", default=str(ROOT / "data/test-prompts.jsonl"))
    e.add_argument("--exclude", action="append", default=[],
                   help="a prompts file of an earlier extension whose prompts are not new (repeatable)")
    args = ap.parse_args()
    {"meta": cmd_meta, "build": cmd_build, "extend": cmd_extend}[args.cmd](args)


if __name__ == "__main__":
    main()

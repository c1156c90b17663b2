"""The completion-prompt builder (scripts/data/build_gemma_prompts.py) and the
prompt set it wrote (data/gemma-prompts/)."""

import hashlib
import json
import random
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "data"))

import build_gemma_prompts as bgp  # noqa: E402
from build_prompts import normalize  # noqa: E402
from documents import Doc, html_text  # noqa: E402

DATA = ROOT / "data" / "gemma-prompts"


class WordTokenizer:
    """One token per whitespace-separated word: an oracle simple enough to
    check window lengths by hand."""

    def count(self, text):
        return len(text.split())


def test_cut_points_prose_and_code():
    text = "Alpha beta. Gamma delta.\nsecond line\n\nThird par. End.\n"
    starts, ends = bgp.cut_points(text, "prose")
    # Paragraph starts only: offset 0 and "Third" after the blank line.
    assert starts == [0, text.index("Third")]
    # Line ends (after "\n") and sentence ends ("beta." and "par."), but not
    # "delta." or "End." which end their lines anyway.
    assert ends == sorted([text.index("beta.") + 5, text.index("\nsecond") + 1,
                           text.index("\n\nThird") + 1, text.index("par.") + 4, len(text)])
    short = "def f():\n    return 1.\n"
    # A paragraph per 2000 characters or more: code starts at paragraphs too,
    # and has no sentence ends.
    assert bgp.cut_points(short, "code") == ([0], [9, len(short)])
    code = "def f():\n" + "    x = 1. Y\n" * 200
    starts, ends = bgp.cut_points(code, "code")
    # Fewer blank lines: any line may start a code prompt.
    assert starts == [0] + [9 + 13 * i for i in range(200)]
    assert ends == [9 + 13 * i for i in range(201)]


def test_doc_windows_respect_bounds_and_boundaries():
    rng = random.Random(3)
    words = [f"w{i}" for i in range(4000)]
    lines = [" ".join(words[i:i + 10]) + "." for i in range(0, len(words), 10)]
    text = "\n\n".join(lines) + "\n"
    doc = Doc("books", "test:doc", "prose", "pkg", text)
    wins = bgp.doc_windows(doc, WordTokenizer(), rng, cap=5)
    assert 1 <= len(wins) <= 5
    starts, ends = bgp.cut_points(text, "prose")
    last_end = -1
    for w in wins:
        n = len(w.split())
        assert bgp.MIN_TOKENS <= n <= bgp.MAX_TOKENS
        at = text.index(w)
        assert at in starts and at > last_end  # a paragraph start, after the previous window
        assert at + len(w) in ends or at + len(w) + 1 in ends  # a line or sentence end
        assert at + len(w) < len(text)  # something is left to continue
        last_end = at + len(w)
    # Same seed, same windows.
    assert bgp.doc_windows(doc, WordTokenizer(), random.Random(3), cap=5) == wins


def test_split_is_a_function_of_the_document_key():
    splits = [bgp.split_of(7, f"key{i}") for i in range(4000)]
    assert splits == [bgp.split_of(7, f"key{i}") for i in range(4000)]
    share = {s: splits.count(s) / len(splits) for s in ("train", "dev", "test")}
    assert abs(share["dev"] - bgp.DEV_SHARE) < 0.015
    assert abs(share["test"] - bgp.TEST_SHARE) < 0.015


def test_exclusion_drops_held_out_text_either_way_and_duplicates():
    ex = bgp.Exclusion(["The capital of France is"])
    assert not ex.keep("Geography.\nTHE CAPITAL of France, is Paris.")  # contains it
    assert not ex.keep("capital of France")  # contained in it
    assert ex.keep("The capital of Spain is Madrid.")
    assert not ex.keep("the capital of spain is madrid")  # normalized duplicate
    assert ex.keep("capitalist")  # whole words only
    assert ex.removed == {"held_out": 2, "duplicate": 1}


def test_html_text_keeps_blocks_and_drops_navigation():
    page = ('<html><head><title>T</title></head><body><ul class="docnav"><li>Prev</li></ul>'
            "<h2>1. Intro</h2><p>Some <b>bold</b>\n text.</p><ul><li><p>one</p></li><li>two</li></ul>"
            "<pre>a  b\n  c</pre></body></html>")
    assert html_text(page) == "1. Intro\n\nSome bold text.\n\n- one\n\n- two\n\na  b\n  c"


def _rows(split):
    return [json.loads(line) for line in (DATA / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()]


@pytest.mark.skipif(not DATA.is_dir(), reason="no data/gemma-prompts")
def test_committed_prompt_set_is_split_by_document_and_held_out_free():
    rows = {s: _rows(s) for s in ("train", "dev", "test")}
    meta = json.loads((DATA / "sources.json").read_text(encoding="utf-8"))
    assert meta["counts"] == {s: len(r) for s, r in rows.items()}
    docs = {s: {r["source"] for r in rs} for s, rs in rows.items()}
    assert not docs["train"] & docs["dev"] and not docs["train"] & docs["test"] \
        and not docs["dev"] & docs["test"]
    held = [normalize(json.loads(line)["prompt"]) for f in bgp.HELD_OUT
            for line in (ROOT / f).read_text(encoding="utf-8").splitlines() if line.strip()]
    seen = set()
    for split, rs in rows.items():
        for r in rs:
            assert r["id"] == f"gm-{r['kind']}-{hashlib.sha1(r['prompt'].encode()).hexdigest()[:12]}"
            assert bgp.split_of(meta["seed"], r["source"]) == split
            norm = normalize(r["prompt"])
            assert norm not in seen
            seen.add(norm)
            padded = f" {norm} "
            assert not any(f" {h} " in padded or padded in f" {h} " for h in held), r["id"]

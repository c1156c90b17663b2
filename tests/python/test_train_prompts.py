"""The drafter-training prompt builder (scripts/data/build_prompts.py): the
`extend` step that adds a further self-instruct run's prompts, and the
shipped files it wrote (data/train-prompts/self-instruct-v2.jsonl and -v3)."""

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "data" / "build_prompts.py"
sys.path.insert(0, str(ROOT / "scripts" / "data"))

from build_prompts import normalize  # noqa: E402


def write_jsonl(path: Path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def write_self_instruct_dir(path: Path, ids, responses):
    """A `dspark regen --save-text` directory as build_prompts.py reads it:
    a manifest and one shard whose safetensors header carries the ids and
    responses (no tensor data is read)."""
    path.mkdir()
    header = json.dumps({"__metadata__": {"prompt_ids": json.dumps(ids), "responses": json.dumps(responses)}})
    with open(path / "data-00000.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header.encode())
    (path / "manifest.json").write_text(json.dumps({
        "target_id": "llama/t", "target_path": "t.gguf", "sampling": {"seed": 8},
        "shards": [{"file": "data-00000.safetensors"}]}))


def test_extend_keeps_only_prompts_no_file_has(tmp_path):
    built = tmp_path / "built"
    built.mkdir()
    write_jsonl(built / "prompts.jsonl", [{"prompt": "How do I keep basil alive indoors?"}])
    write_jsonl(built / "heldout.jsonl", [{"prompt": "Write a short poem about the sea at night."}])
    write_jsonl(tmp_path / "dev.jsonl", [{"prompt": "What should I consider before adopting a cat?"}])
    write_jsonl(tmp_path / "test.jsonl", [{"prompt": "Explain how a rainbow forms after the rain."}])
    questions = (" How do I keep BASIL alive indoors?\n"          # in prompts.jsonl (normalized)
                 "- What should I consider before adopting a cat at home?\n"  # contains a dev prompt
                 "- Explain how a rainbow forms after the rain.\n"  # a test prompt
                 "- How long should I boil an egg to get a soft yolk?\n"  # the frame's own example
                 "- Why do onions make people cry when cut?\n"     # new
                 "- Why do onions make people cry when cut?\n")    # new, twice
    tasks = (" Write a short poem about the sea at night.\n"    # in heldout.jsonl
             "- Write a thank-you note to a patient teacher.\n")  # new
    si = tmp_path / "si"
    write_self_instruct_dir(si, ["meta-question-000-2", "meta-instruction-000-2"], [questions, tasks])
    out = tmp_path / "out" / "extra.jsonl"
    subprocess.run([sys.executable, str(SCRIPT), "extend", "--self-instruct", str(si), "--out", str(out),
                    "--built-dir", str(built), "--dev", str(tmp_path / "dev.jsonl"),
                    "--test", str(tmp_path / "test.jsonl")], check=True, capture_output=True)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted((r["kind"], r["prompt"]) for r in rows) == [
        ("chat", "Why do onions make people cry when cut?"),
        ("instruct", "Write a thank-you note to a patient teacher."),
    ]
    assert all(r["source"] == "self-instruct:t.gguf" for r in rows)


def test_meta_first_repeat_leaves_out_the_earlier_repeats(tmp_path):
    def meta(*extra):
        out = tmp_path / "m.jsonl"
        subprocess.run([sys.executable, str(SCRIPT), "meta", "--out", str(out), *extra], check=True,
                       capture_output=True)
        return [json.loads(line) for line in out.read_text().splitlines()]

    every = meta("--repeats", "3")
    later = meta("--repeats", "3", "--first-repeat", "1")
    assert later == [r for r in every if not r["id"].endswith("-0")]
    assert len(later) == 2 * len(every) // 3


def test_v3_frames_map_to_kinds_and_later_sets_are_excluded(tmp_path):
    built = tmp_path / "built"
    built.mkdir()
    write_jsonl(built / "prompts.jsonl", [])
    write_jsonl(built / "heldout.jsonl", [])
    write_jsonl(tmp_path / "dev.jsonl", [])
    write_jsonl(tmp_path / "test.jsonl", [])
    write_jsonl(tmp_path / "v2.jsonl", [{"prompt": "Why do onions make people cry when cut?"}])
    requests = (" Why do onions make people cry when cut?\n"   # in the earlier extension
                "- Suggest three simple ways to make iced coffee at home.\n"  # the v3 frame's own example
                "- Give me a few ideas for a rainy Sunday afternoon.\n")  # new
    tasks = " Put these words in alphabetical order: pear, apple, fig.\n"  # new
    si = tmp_path / "si"
    write_self_instruct_dir(si, ["meta-request-004-0", "meta-task-004-0"], [requests, tasks])
    out = tmp_path / "v3.jsonl"
    subprocess.run([sys.executable, str(SCRIPT), "extend", "--self-instruct", str(si), "--out", str(out),
                    "--built-dir", str(built), "--dev", str(tmp_path / "dev.jsonl"),
                    "--test", str(tmp_path / "test.jsonl"), "--exclude", str(tmp_path / "v2.jsonl")],
                   check=True, capture_output=True)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted((r["kind"], r["prompt"]) for r in rows) == [
        ("chat", "Give me a few ideas for a rainy Sunday afternoon."),
        ("instruct", "Put these words in alphabetical order: pear, apple, fig."),
    ]


def test_meta_v3_frames_are_their_own_set(tmp_path):
    out = tmp_path / "m.jsonl"
    subprocess.run([sys.executable, str(SCRIPT), "meta", "--out", str(out), "--repeats", "1", "--frames", "v3"],
                   check=True, capture_output=True)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["id"].split("-")[1] for r in rows} == {"request", "task"}
    assert all(r["prompt"].endswith("\n-") and "Topic: office work" in r["prompt"]
               for r in rows if r["kind"] == "task")


@pytest.mark.parametrize("name,count", [("self-instruct-v2.jsonl", 8960), ("self-instruct-v3.jsonl", 4780)])
def test_shipped_extensions_overlap_no_other_prompt_file(name, count):
    data = ROOT / "data"
    files = ["train-prompts/prompts.jsonl", "train-prompts/heldout.jsonl", "dev-prompts.jsonl",
             "test-prompts.jsonl", "train-prompts/self-instruct-v2.jsonl", "train-prompts/self-instruct-v3.jsonl"]
    extra = [json.loads(line) for line in (data / "train-prompts" / name).open()]
    assert len(extra) == count
    assert {r["kind"] for r in extra} == {"chat", "instruct"}
    assert len({r["id"] for r in extra}) == len(extra)
    others = set()
    for f in files:
        if f != "train-prompts/" + name:
            others |= {normalize(json.loads(line)["prompt"]) for line in (data / f).open()}
    norms = [normalize(r["prompt"]) for r in extra]
    assert len(set(norms)) == len(norms)
    assert not set(norms) & others

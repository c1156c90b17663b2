"""Generation through dspark.Model: parity with the CLI, losslessness,
streaming, argument errors, cancellation and concurrency."""

import _thread
import signal
import subprocess
import threading
import time

import pytest

import dspark

PROMPTS = [
    "Explain why the sky looks blue during the day.",
    "Write a haiku about autumn leaves.",
    "What is 12 times 7? Answer briefly.",
]


def chat(text):
    return [{"role": "user", "content": text}]


def text_of(result):
    choice = result["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"]


def wait_idle(model, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        load = model.load()
        if load["active"] == 0 and load["queued"] == 0:
            return load
        time.sleep(0.02)
    raise AssertionError(f"the engine still holds requests: {model.load()}")


def cli_generate(binary, prompt, n, extra=()):
    out = subprocess.run([binary, "generate", "-m", "smollm2", "-p", prompt, "-n", str(n), "--temp", "0", *extra],
                         capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.endswith("\n")
    return out.stdout[:-1]


def test_greedy_text_equals_cli(dspark_binary, spec_model, plain_model):
    prompt = PROMPTS[0]
    want_raw = cli_generate(dspark_binary, prompt, 24, ["--drafter", "none"])
    assert text_of(plain_model.generate(prompt, max_tokens=24, temperature=0)) == want_raw
    assert text_of(spec_model.generate(prompt, max_tokens=24, temperature=0)) == want_raw
    want_chat = cli_generate(dspark_binary, prompt, 32, ["--chat"])
    assert text_of(spec_model.create_chat_completion(chat(prompt), max_tokens=32, temperature=0)) == want_chat


def test_speculative_equals_plain(spec_model, plain_model):
    for prompt in PROMPTS:
        spec = spec_model.create_chat_completion(chat(prompt), max_tokens=48, temperature=0)
        plain = plain_model.create_chat_completion(chat(prompt), max_tokens=48, temperature=0)
        assert text_of(spec) == text_of(plain)
        assert spec["usage"] == plain["usage"]
        stats = spec["dspark"]
        assert stats["speculative"] is True
        assert stats["tau"] >= 1.0
        assert len(stats["acceptance_by_position"]) >= 1
        assert plain["dspark"]["speculative"] is False


def test_result_shape(spec_model):
    r = spec_model.create_chat_completion(chat("Say hello."), max_tokens=8, temperature=0)
    assert r["object"] == "chat.completion"
    assert r["choices"][0]["message"]["role"] == "assistant"
    assert r["choices"][0]["finish_reason"] in ("stop", "length")
    u = r["usage"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    c = spec_model.generate("The capital of France is", max_tokens=8, temperature=0)
    assert c["object"] == "text_completion"
    assert c["usage"]["prompt_tokens"] == len(spec_model.tokenize("The capital of France is"))


def test_stream_concatenates_to_the_full_text(spec_model):
    for kind in ("chat", "text"):
        if kind == "chat":
            full = spec_model.create_chat_completion(chat(PROMPTS[1]), max_tokens=40, temperature=0)
            chunks = list(spec_model.create_chat_completion(chat(PROMPTS[1]), max_tokens=40, temperature=0,
                                                            stream=True))
            assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
            pieces = [c["choices"][0]["delta"].get("content", "") for c in chunks]
        else:
            full = spec_model.generate(PROMPTS[1], max_tokens=40, temperature=0)
            chunks = list(spec_model.generate(PROMPTS[1], max_tokens=40, temperature=0, stream=True))
            pieces = [c["choices"][0]["text"] for c in chunks]
        assert len(chunks) > 3
        assert "".join(pieces) == text_of(full)
        last = chunks[-1]
        assert last["choices"][0]["finish_reason"] == full["choices"][0]["finish_reason"]
        assert last["usage"] == full["usage"]
        assert last["dspark"]["tau"] >= 1.0


def test_stop_strings(plain_model):
    full = text_of(plain_model.create_chat_completion(chat(PROMPTS[0]), max_tokens=32, temperature=0))
    word = full.split()[3]
    cut = text_of(plain_model.create_chat_completion(chat(PROMPTS[0]), max_tokens=32, temperature=0, stop=[word]))
    assert cut == full[: full.index(word)]


def cli_error(binary, *args):
    out = subprocess.run([binary, "generate", "-m", "smollm2", "-p", "x", *args], capture_output=True, text=True)
    assert out.returncode == 2
    return out.stderr.strip().removeprefix("error: ")


def test_bad_arguments_raise_with_the_cpp_message(dspark_binary, plain_model):
    with pytest.raises(ValueError) as e:
        plain_model.generate("x", top_p=1.5)
    assert str(e.value) == cli_error(dspark_binary, "--top-p", "1.5")
    with pytest.raises(ValueError) as e:
        plain_model.generate("x", min_p=2.0)
    assert str(e.value) == cli_error(dspark_binary, "--min-p", "2")
    with pytest.raises(ValueError, match="temperature"):
        plain_model.generate("x", temperature=float("nan"))
    with pytest.raises(ValueError, match="max_tokens"):
        plain_model.generate("x", max_tokens=0)
    with pytest.raises(ValueError, match="max_tokens must be a positive count below 2\\^63, got 10{30}"):
        plain_model.generate("x", max_tokens=10**30)
    with pytest.raises(ValueError, match="role"):
        plain_model.create_chat_completion([{"role": "robot", "content": "hi"}])
    with pytest.raises(ValueError, match="at least one message"):
        plain_model.create_chat_completion([])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        plain_model.detokenize([-1])
    with pytest.raises(TypeError):
        plain_model.generate("x", max_tokens="5")
    with pytest.raises(TypeError):
        plain_model.generate(3.5)
    with pytest.raises(TypeError):
        plain_model.create_chat_completion([{"role": "user"}])
    with pytest.raises(TypeError):
        plain_model.generate("x", stop=[1])
    with pytest.raises(ValueError, match="compute"):
        dspark.Model("smollm2", compute="fp8")
    with pytest.raises(dspark.DsparkError):
        dspark.Model("/nonexistent/model.gguf")


def test_tokenize_round_trip(plain_model):
    ids = plain_model.tokenize("Hello world, héllo!", add_bos=False)
    assert plain_model.detokenize(ids) == "Hello world, héllo!".encode()
    assert plain_model.tokenize(b"Hello world, h\xc3\xa9llo!", add_bos=False) == ids


def test_closed_generator_frees_its_slot(spec_model):
    gen = spec_model.create_chat_completion(chat(PROMPTS[0]), max_tokens=400, temperature=0, stream=True)
    next(gen)
    next(gen)
    assert spec_model.load()["active"] == 1
    gen.close()
    wait_idle(spec_model)
    # The engine keeps serving afterwards.
    assert text_of(spec_model.generate("Hi", max_tokens=4, temperature=0))


def test_keyboard_interrupt_stops_generation(plain_model):
    # Ctrl-C as Python delivers it, even when the suite was started with
    # SIGINT ignored (nohup, a background job), where interrupt_main is a no-op.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.5, _thread.interrupt_main)
    timer.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            plain_model.generate("Count from 1 to 1000: 1, 2, 3, 4,", max_tokens=4000, temperature=0)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - t0 < 20
    wait_idle(plain_model)


def test_two_threads_with_different_seeds_get_their_solo_results(spec_model):
    args = dict(max_tokens=40, temperature=0.9, top_k=40, top_p=0.95)
    solo = {seed: text_of(spec_model.create_chat_completion(chat(PROMPTS[1]), seed=seed, **args)) for seed in (1, 2)}
    assert solo[1] != solo[2]
    got = {}

    def run(seed):
        got[seed] = text_of(spec_model.create_chat_completion(chat(PROMPTS[1]), seed=seed, **args))

    threads = [threading.Thread(target=run, args=(seed,)) for seed in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == solo


def test_lookup_drafts_alone_equal_plain(plain_model):
    import dspark

    prompt = "Write a poem where every line starts with 'The sea is'."
    with dspark.Model("smollm2", drafter=None, threads=2, lookup_ngram=2) as lookup:
        got = lookup.create_chat_completion(chat(prompt), max_tokens=48, temperature=0)
    want = plain_model.create_chat_completion(chat(prompt), max_tokens=48, temperature=0)
    assert text_of(got) == text_of(want)
    assert got["dspark"]["speculative"] is True
    assert got["dspark"]["lookup_rounds"] > 0
    assert got["dspark"]["lookup_accepted"] > 0
    with pytest.raises(ValueError, match="lookup_ngram"):
        dspark.Model("smollm2", drafter=None, lookup_ngram=-1)


def test_request_checks_are_the_servers(plain_model):
    # The same checks as `dspark serve` (dspark/serve/request_checks.hpp).
    with pytest.raises(ValueError, match=r"^max_tokens: prompt \(\d+ tokens?\) \+ max_tokens \(1000000000000\) exceeds"):
        plain_model.generate("x", max_tokens=10**12)
    with pytest.raises(ValueError, match="^stop: expected at most 16 stop strings, got 20$"):
        plain_model.generate("x", max_tokens=2, stop=[str(i) for i in range(20)])
    with pytest.raises(ValueError, match=r"^seed: expected -1 \(a random seed\) or an integer in \[0, 2\^64\), got '18446744073709551617'$"):
        plain_model.generate("x", max_tokens=2, temperature=1, seed=2**64 + 1)
    with pytest.raises(ValueError, match="^top_k: expected -1 or 0"):
        plain_model.generate("x", max_tokens=2, top_k=-2)
    sampled = dict(max_tokens=8, temperature=1.5, top_p=1.0, min_p=0.0)
    prompt = "Once upon a time"
    # top_k -1 means off, as 0 does (and as on the command line and the server).
    assert text_of(plain_model.generate(prompt, top_k=-1, seed=5, **sampled)) == text_of(
        plain_model.generate(prompt, top_k=0, seed=5, **sampled))
    # 2^64 + 1 used to wrap to seed 1; 2^64 - 1 is a seed of its own.
    one = text_of(plain_model.generate(prompt, top_k=0, seed=1, **sampled))
    top = text_of(plain_model.generate(prompt, top_k=0, seed=2**64 - 1, **sampled))
    assert one != top


def test_abandoned_stream_frees_its_slot():
    # A stream iterator still referenced but no longer read: its request is
    # cancelled after unread_timeout and the slot is free for others.
    with dspark.Model("smollm2", drafter=None, threads=2, parallel=1, unread_timeout=1) as m:
        gen = m.create_chat_completion(chat(PROMPTS[0]), max_tokens=400, temperature=0, stream=True)
        next(gen)
        next(gen)
        assert m.load()["active"] == 1
        wait_idle(m, timeout=30)
        assert text_of(m.generate("Hi", max_tokens=3, temperature=0))
        with pytest.raises(dspark.DsparkError, match="not read"):
            for _ in gen:
                pass


def test_generation_cut_inside_a_character_drops_it(plain_model):
    # 3 tokens end after the first bytes of a character: dropped, not U+FFFD.
    q = chat("こんにちは、元気ですか？")
    r = plain_model.create_chat_completion(q, max_tokens=3, temperature=0)
    assert text_of(r) == "こ" and r["usage"]["completion_tokens"] == 3, r
    pieces = [c["choices"][0]["delta"].get("content", "")
              for c in plain_model.create_chat_completion(q, max_tokens=3, temperature=0, stream=True)]
    assert "".join(pieces) == "こ", pieces


def test_gemma3_drafts_with_its_shipped_drafter():
    # "gemma3" finds drafters/gemma3 as the CLI does, drafts with it and prompt
    # lookup, and gives plain decoding's text (a base model: completions).
    import dspark

    prompt = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
    with dspark.Model("gemma3", threads=2) as spec, dspark.Model("gemma3", drafter=None, threads=2) as plain:
        assert spec.drafter is not None and spec.drafter.rstrip("/").endswith("drafters/gemma3"), spec.drafter
        assert plain.drafter is None
        got = spec.generate(prompt, max_tokens=64, temperature=0)
        want = plain.generate(prompt, max_tokens=64, temperature=0)
        assert text_of(got) == text_of(want)
        stats = got["dspark"]
        assert stats["speculative"] is True
        assert stats["accepted"] + stats["lookup_accepted"] > 0, stats
        assert stats["target_calls"] < 64, stats

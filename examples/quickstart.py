"""dspark quickstart: chat, streaming, statistics and a plot.

    make python                      # or: pip install .
    python examples/quickstart.py
"""

import os

import dspark
from dspark import plots

tokens = int(os.environ.get("DSPARK_EXAMPLE_TOKENS", "96"))
out_dir = os.environ.get("DSPARK_EXAMPLE_OUT", ".")

# A GGUF path or an alias; drafter="auto" picks the drafter shipped for the model.
with dspark.Model("smollm2", drafter="auto", threads=2) as llm:
    messages = [{"role": "user", "content": "Explain in three sentences why the sky is blue."}]

    # One OpenAI-shaped response; greedy decoding (temperature 0) is lossless:
    # the same text as plain decoding, produced in fewer target calls.
    r = llm.create_chat_completion(messages, max_tokens=tokens, temperature=0)
    print(r["choices"][0]["message"]["content"])
    stats = r["dspark"]
    print(f"tau {stats['tau']:.2f}, {r['usage']['completion_tokens']} tokens in {stats['target_calls']} target calls")
    print("acceptance by position:", " ".join(f"{a:.2f}" for a in stats["acceptance_by_position"]))

    # Streaming: chunks as the engine produces them.
    for chunk in llm.create_chat_completion(messages, max_tokens=tokens, temperature=0.7, seed=1, stream=True):
        print(chunk["choices"][0]["delta"].get("content", "") if chunk["choices"] else "", end="", flush=True)
    print()

    path = os.path.join(out_dir, "acceptance.png")
    plots.acceptance_by_position(r, path=path)
    print("wrote", path)

"""llama.cpp built from source (../shared/tools/build-llamacpp.sh, or any build
whose bin directory is given by $LLAMACPP_BIN, default ~/.cache/llamacpp/build/bin)
as an independent oracle: llama-tokenize for token ids, llama-server for greedy
continuations with token probabilities. Python standard library only.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import struct
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def bin_dir() -> Path:
    return Path(os.environ.get("LLAMACPP_BIN", Path.home() / ".cache" / "llamacpp" / "build" / "bin"))


def binary(name: str) -> str:
    path = bin_dir() / name
    if not path.exists():
        raise SystemExit(f"{path} not found (run ../shared/tools/build-llamacpp.sh or set LLAMACPP_BIN)")
    return str(path)


def build_id() -> str:
    """The llama.cpp commit the binaries were built from (git describe of the source tree)."""
    src = bin_dir().parents[1]
    try:
        return subprocess.run(["git", "-C", str(src), "log", "-1", "--format=%h"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        return "unknown"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def default_model(name: str = "gemma-3-270m-q4_k_m.gguf") -> Path:
    home = Path(os.environ.get("DSPARK_HOME", Path.home() / ".cache" / "dspark"))
    return home / "models" / name


def tokenize(model: Path, text: str, parse_special: bool) -> list[int]:
    """llama-tokenize's ids for `text` (read verbatim from stdin, no BOS)."""
    cmd = [binary("llama-tokenize"), "-m", str(model), "--stdin", "--no-escape", "--ids", "--no-bos",
           "--log-disable"]
    if not parse_special:
        cmd.append("--no-parse-special")
    out = subprocess.run(cmd, input=text.encode("utf-8", "surrogatepass"), capture_output=True, check=True)
    line = out.stdout.decode().strip().splitlines()[-1]
    return json.loads(line)


def tokenize_batch(model: Path, items: list[tuple[str, bool]]) -> list[list[int]]:
    """llama_tokenize's ids (no BOS) for many (text, parse_special) pairs in one
    process: llamacpp_tokenize_batch.cpp, compiled against the llama.cpp tree
    the binaries were built from (the same call llama-tokenize makes)."""
    src_tree = bin_dir().parents[1]
    exe = Path(tempfile.mkdtemp()) / "llamacpp_tokenize_batch"
    subprocess.run(["g++", "-std=c++17", "-O1", "-o", str(exe), str(Path(__file__).parent / "llamacpp_tokenize_batch.cpp"),
                    f"-I{src_tree / 'include'}", f"-I{src_tree / 'ggml' / 'include'}", f"-L{bin_dir()}", "-lllama",
                    f"-Wl,-rpath,{bin_dir()}"], check=True)
    data = bytearray()
    for text, parse in items:
        b = text.encode("utf-8", "surrogatepass")
        data += struct.pack("<IB", len(b), 1 if parse else 0) + b
    out = subprocess.run([str(exe), str(model)], input=bytes(data), capture_output=True, check=True)
    lines = out.stdout.decode().splitlines()
    if len(lines) != len(items):
        raise SystemExit(f"tokenize_batch: {len(lines)} results for {len(items)} texts")
    return [json.loads(l) for l in lines]


class Server:
    """A running llama-server on 127.0.0.1 (one slot, no prompt cache reuse)."""

    def __init__(self, port: int):
        self.url = f"http://127.0.0.1:{port}"

    def post(self, route: str, body: dict) -> dict:
        req = urllib.request.Request(self.url + route, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=3600) as r:
            return json.loads(r.read())

    def get(self, route: str) -> dict:
        with urllib.request.urlopen(self.url + route, timeout=60) as r:
            return json.loads(r.read())


@contextlib.contextmanager
def server(model: Path, threads: int, ctx: int, extra: list[str] = ()):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [binary("llama-server"), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
           "-t", str(threads), "-tb", str(threads), "-c", str(ctx), "-np", "1", "--no-webui", "--log-disable", *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    srv = Server(port)
    try:
        for _ in range(600):
            if proc.poll() is not None:
                raise SystemExit(f"llama-server exited with {proc.returncode}: {' '.join(cmd)}")
            try:
                if srv.get("/health").get("status") == "ok":
                    break
            except OSError:
                pass
            time.sleep(0.5)
        else:
            raise SystemExit("llama-server did not become ready")
        yield srv
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()

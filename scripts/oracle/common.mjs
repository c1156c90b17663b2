// Shared setup for the llama.cpp oracle scripts: argument parsing, prompt
// formatting and loading the GGUF through node-llama-cpp on the CPU only,
// using the prebuilt binary shipped in @node-llama-cpp/linux-x64 (never
// downloading or compiling llama.cpp).
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import crypto from "node:crypto";
import {fileURLToPath} from "node:url";
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

export const oracleDir = path.dirname(fileURLToPath(import.meta.url));
export const repoRoot = path.resolve(oracleDir, "..", "..");

export const dsparkHome = process.env.DSPARK_HOME || path.join(os.homedir(), ".cache", "dspark");
export const defaultModel = path.join(dsparkHome, "models", "SmolLM2-135M-Instruct.Q4_1.gguf");
export const defaultPrompts = path.join(repoRoot, "data", "dev-prompts.jsonl");

// One user message in ChatML plus the generation prompt. The GGUF's
// tokenizer.chat_template inserts a default system message when the first
// message is not a system message; that system message is deliberately left out.
export const TEMPLATE = "<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n";
export function formatPrompt(prompt) {
    return "<|im_start|>user\n" + prompt + "<|im_end|>\n<|im_start|>assistant\n";
}

// --name value / --name=value options; `defaults` gives names and default values.
export function parseArgs(defaults, usage) {
    const out = {...defaults};
    const argv = process.argv.slice(2);
    for (let i = 0; i < argv.length; i++) {
        let a = argv[i];
        if (a === "-h" || a === "--help") {
            console.log(usage);
            process.exit(0);
        }
        if (!a.startsWith("--")) throw new Error(`unexpected argument '${a}'\n${usage}`);
        a = a.slice(2);
        let value;
        const eq = a.indexOf("=");
        if (eq >= 0) {
            value = a.slice(eq + 1);
            a = a.slice(0, eq);
        } else {
            value = argv[++i];
        }
        const key = a.replace(/-([a-z])/g, (_, c) => c.toUpperCase());
        if (!(key in defaults)) throw new Error(`unknown option --${a}\n${usage}`);
        if (value === undefined) throw new Error(`option --${a} needs a value`);
        out[key] = typeof defaults[key] === "number" ? Number(value) : value;
        if (typeof defaults[key] === "number" && !Number.isFinite(out[key]))
            throw new Error(`option --${a} needs a number, got '${value}'`);
    }
    return out;
}

export function readPrompts(file, limit = 0) {
    const rows = fs.readFileSync(file, "utf8").split("\n").filter((l) => l.trim() !== "").map((l) => JSON.parse(l));
    return limit > 0 ? rows.slice(0, limit) : rows;
}

export function sha256File(file) {
    const h = crypto.createHash("sha256");
    const fd = fs.openSync(file, "r");
    const buf = Buffer.alloc(1 << 20);
    try {
        let n;
        while ((n = fs.readSync(fd, buf, 0, buf.length, null)) > 0) h.update(buf.subarray(0, n));
    } finally {
        fs.closeSync(fd);
    }
    return h.digest("hex");
}

export function nodeLlamaCppVersion() {
    const pkg = path.join(oracleDir, "node_modules", "node-llama-cpp", "package.json");
    return JSON.parse(fs.readFileSync(pkg, "utf8")).version;
}

export async function loadModel({model, threads, contextSize}) {
    if (!fs.existsSync(model))
        throw new Error(`model not found: ${model} (run scripts/fetch_model.sh smollm2)`);
    const llama = await getLlama({
        gpu: false,
        build: "never",
        usePrebuiltBinaries: true,
        skipDownload: true,
        progressLogs: false,
        maxThreads: threads,
        logLevel: LlamaLogLevel.error
    });
    if (llama.gpu !== false) throw new Error(`expected a CPU-only llama.cpp, got gpu=${llama.gpu}`);
    const llamaModel = await llama.loadModel({modelPath: model, gpuLayers: 0});
    const context = await llamaModel.createContext({
        contextSize,
        batchSize: Math.min(512, contextSize),
        sequences: 1,
        threads: {ideal: threads, min: threads}
    });
    return {llama, model: llamaModel, context, sequence: context.getSequence()};
}

export function llamaCppBuild(llama) {
    const r = llama.llamaCppRelease;
    return r ? `${r.repo}@${r.release}` : null;
}

// Prompt tokens: special tokens parsed (so <|im_start|> is one token); a BOS
// token is prepended only if the GGUF asks for one (SmolLM2's does not).
export function tokenizePrompt(model, text) {
    const tokens = model.tokenize(text, true);
    const bos = model.tokens.bos;
    if (model.tokens.shouldPrependBosToken && bos != null && tokens[0] !== bos) tokens.unshift(bos);
    return tokens;
}

// JSON with one-space indentation, but arrays of numbers kept on one line.
export function toJson(value) {
    return JSON.stringify(value, null, 1)
        .replace(/\[\n\s*(-?[\d.e+-]+(?:,\n\s*-?[\d.e+-]+)*)\n\s*\]/g, (_, body) => "[" + body.replace(/,\n\s*/g, ", ") + "]") + "\n";
}

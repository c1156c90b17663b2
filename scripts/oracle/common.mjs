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
import {Template} from "@huggingface/jinja";

export const oracleDir = path.dirname(fileURLToPath(import.meta.url));
export const repoRoot = path.resolve(oracleDir, "..", "..");

export const dsparkHome = process.env.DSPARK_HOME || path.join(os.homedir(), ".cache", "dspark");
export const defaultModel = path.join(dsparkHome, "models", "SmolLM2-135M-Instruct.Q4_1.gguf");
export const defaultPrompts = path.join(repoRoot, "data", "dev-prompts.jsonl");

// The text placeholder used to record the rendered template in output files.
export const PROMPT_PLACEHOLDER = "{prompt}";

// The GGUF's own `tokenizer.chat_template` (Jinja), rendered with the Jinja
// engine node-llama-cpp itself uses (@huggingface/jinja) for one user message
// plus the generation prompt, exactly as the template renders it. For
// SmolLM2 that includes the default system turn the template inserts when the
// conversation does not start with a system message. Returns the template
// source, `format(prompt)` and the rendered pattern with PROMPT_PLACEHOLDER
// in place of the user text.
export function chatFormatter(model) {
    const source = model.fileInfo.metadata?.tokenizer?.chat_template;
    if (typeof source !== "string" || source === "")
        throw new Error("the GGUF declares no tokenizer.chat_template");
    const template = new Template(source);
    const format = (prompt) => template.render({
        messages: [{role: "user", content: prompt}],
        add_generation_prompt: true,
        bos_token: model.tokens.bosString ?? "",
        eos_token: model.tokens.eosString ?? ""
    });
    const pattern = format(PROMPT_PLACEHOLDER);
    const at = pattern.indexOf(PROMPT_PLACEHOLDER);
    if (at < 0 || pattern.indexOf(PROMPT_PLACEHOLDER, at + 1) >= 0)
        throw new Error("the chat template does not insert the user message verbatim exactly once");
    // Every prompt must render as the pattern with the user text substituted
    // (no trimming or escaping by the template); checked per prompt.
    const checkedFormat = (prompt) => {
        const text = format(prompt);
        if (text !== pattern.slice(0, at) + prompt + pattern.slice(at + PROMPT_PLACEHOLDER.length))
            throw new Error("the chat template altered the user message");
        return text;
    };
    return {source, pattern, format: checkedFormat};
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

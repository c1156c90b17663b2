// llama.cpp prefill and greedy decode speed on the dev prompts (CPU, fixed thread count).
// Usage: node bench_llamacpp.mjs [N] [--new-tokens N] [--threads 2] [--limit 0] [--model F] [--prompts F]
// Prints JSON to stdout: per-prompt figures and medians.
import {
    chatFormatter, defaultModel, defaultPrompts, llamaCppBuild, loadModel, nodeLlamaCppVersion,
    parseArgs, readPrompts, sha256File, tokenizePrompt
} from "./common.mjs";
import path from "node:path";
import os from "node:os";

const usage = "usage: node bench_llamacpp.mjs [N] [--new-tokens N] [--threads 2] [--limit N] [--warmup 1] [--model GGUF] [--prompts JSONL]";
// A bare number as the first argument is the number of new tokens.
if (/^\d+$/.test(process.argv[2] ?? "")) process.argv.splice(2, 1, "--new-tokens", process.argv[2]);
const args = parseArgs({
    model: defaultModel,
    prompts: defaultPrompts,
    newTokens: 128,
    threads: 2,
    limit: 0,
    warmup: 1
}, usage);
if (args.newTokens < 2) throw new Error("--new-tokens must be at least 2");

const prompts = readPrompts(args.prompts, args.limit);

const median = (xs) => {
    const s = [...xs].sort((a, b) => a - b);
    const m = s.length >> 1;
    return s.length === 0 ? null : s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};
const round = (x, d = 2) => Math.round(x * 10 ** d) / 10 ** d;

const loadavgStart = round(os.loadavg()[0]);
const tLoad = performance.now();
const {llama, model, context, sequence} = await (async () => {
    // Size the context from the longest prompt: its byte count bounds its token
    // count; 256 more tokens leave room for the chat template's own text.
    const longest = Math.max(...prompts.map((p) => Buffer.byteLength(p.prompt)));
    const contextSize = Math.max(512, Math.ceil((longest + args.newTokens + 256) / 256) * 256);
    return loadModel({model: args.model, threads: args.threads, contextSize});
})();
const loadSeconds = (performance.now() - tLoad) / 1000;
// Prompts rendered by the GGUF's chat template, as the engine's --chat does.
const chat = chatFormatter(model);
const formatted = prompts.map((p) => ({...p, text: chat.format(p.prompt)}));

// One run: prefill = evaluating the prompt up to the first sampled token;
// decode = the remaining newTokens-1 single-token steps (evaluate + greedy
// sample). End-of-generation tokens do not stop the run.
async function runOne(promptTokens, newTokens) {
    await sequence.clearHistory();
    let n = 0;
    let tFirst = 0;
    const t0 = performance.now();
    for await (const token of sequence.evaluate(promptTokens, {temperature: 0, yieldEogToken: true})) {
        void token;
        n++;
        if (n === 1) tFirst = performance.now();
        if (n >= newTokens) break;
    }
    const tEnd = performance.now();
    return {prefillSeconds: (tFirst - t0) / 1000, decodeSeconds: (tEnd - tFirst) / 1000, decodeTokens: n - 1};
}

for (let i = 0; i < args.warmup && formatted.length > 0; i++)
    await runOne(tokenizePrompt(model, formatted[0].text), Math.min(16, args.newTokens));

const perPrompt = [];
for (const p of formatted) {
    const promptTokens = tokenizePrompt(model, p.text);
    if (promptTokens.length + args.newTokens >= context.contextSize)
        throw new Error(`prompt ${p.id} too long for the context`);
    const r = await runOne(promptTokens, args.newTokens);
    perPrompt.push({
        id: p.id,
        prompt_tokens: promptTokens.length,
        prefill_s: round(r.prefillSeconds, 4),
        prefill_tok_s: round(promptTokens.length / r.prefillSeconds),
        decode_tokens: r.decodeTokens,
        decode_s: round(r.decodeSeconds, 4),
        decode_tok_s: round(r.decodeTokens / r.decodeSeconds)
    });
    process.stderr.write(`${p.id}: prefill ${perPrompt.at(-1).prefill_tok_s} tok/s, decode ${perPrompt.at(-1).decode_tok_s} tok/s\n`);
}

console.log(JSON.stringify({
    model_file: path.basename(args.model),
    model_sha256: sha256File(args.model),
    node_llama_cpp_version: nodeLlamaCppVersion(),
    llama_cpp_build: llamaCppBuild(llama),
    backend: "cpu",
    threads: args.threads,
    context_threads: context.idealThreads,
    host_cpus: os.cpus().length,
    // 1-minute load average before and after: decode speed with 2 threads on a
    // 2-core machine collapses when other processes compete for the cores.
    loadavg_1min_start: loadavgStart,
    loadavg_1min_end: round(os.loadavg()[0]),
    context_size: context.contextSize,
    template: chat.pattern,
    new_tokens: args.newTokens,
    warmup_runs: args.warmup,
    load_s: round(loadSeconds, 3),
    definition: "prefill_tok_s = prompt tokens / time from submitting the prompt to the first greedy token; decode_tok_s = (new_tokens - 1) / time from the first to the last greedy token (one-token evaluate + argmax per step, end-of-generation tokens do not stop the run)",
    prompts: perPrompt.length,
    median_prefill_tok_s: median(perPrompt.map((r) => r.prefill_tok_s)),
    median_decode_tok_s: median(perPrompt.map((r) => r.decode_tok_s)),
    total_decode_tok_s: round(perPrompt.reduce((a, r) => a + r.decode_tokens, 0) / perPrompt.reduce((a, r) => a + r.decode_s, 0)),
    per_prompt: perPrompt
}, null, 1));

await context.dispose();
await model.dispose();
await llama.dispose();

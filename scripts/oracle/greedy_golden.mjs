// Greedy (argmax) reference continuations from llama.cpp for the dev prompts.
// Usage: node greedy_golden.mjs [--model F] [--prompts F] [--out F] [--max-tokens 32] [--threads 2] [--limit 0]
import fs from "node:fs";
import path from "node:path";
import {
    chatFormatter, defaultModel, defaultPrompts, llamaCppBuild, loadModel, nodeLlamaCppVersion, PROMPT_PLACEHOLDER,
    parseArgs, readPrompts, repoRoot, sha256File, toJson, tokenizePrompt
} from "./common.mjs";

const usage = "usage: node greedy_golden.mjs [--model GGUF] [--prompts JSONL] [--out JSON] [--max-tokens 32] [--threads 2] [--limit N]";
const args = parseArgs({
    model: defaultModel,
    prompts: defaultPrompts,
    out: path.join(repoRoot, "tests", "golden", "llamacpp_greedy.json"),
    maxTokens: 32,
    threads: 2,
    limit: 0
}, usage);

const t0 = performance.now();
const prompts = readPrompts(args.prompts, args.limit);
const {llama, model, context, sequence} = await loadModel({model: args.model, threads: args.threads, contextSize: 1024});
// Prompts rendered by the GGUF's own chat template (one user message plus the
// generation prompt), as the engine's --chat renders them.
const chat = chatFormatter(model);

// Token probabilities are exposed by LlamaContextSequence.evaluateWithMetadata
// (node-llama-cpp >= 3.7); older versions only return the sampled token.
const withProbabilities = typeof sequence.evaluateWithMetadata === "function";
const results = [];
for (const p of prompts) {
    const text = chat.format(p.prompt);
    const promptTokens = tokenizePrompt(model, text);
    if (promptTokens.length + args.maxTokens >= context.contextSize)
        throw new Error(`prompt ${p.id} too long for the context`);
    await sequence.clearHistory();
    const generated = [];
    const top2 = [];
    let stoppedAtEog = false;
    // temperature 0 makes the sampler chain a single llama.cpp greedy (argmax) sampler.
    const options = {temperature: 0, yieldEogToken: true};
    const steps = withProbabilities
        ? sequence.evaluateWithMetadata(promptTokens, {probabilities: true}, options)
        : sequence.evaluate(promptTokens, options);
    for await (const step of steps) {
        const token = withProbabilities ? step.token : step;
        generated.push(token);
        if (withProbabilities) {
            // probabilities: Map token -> softmax probability, sorted by decreasing probability.
            const [first, second] = step.probabilities.entries();
            if (first[0] !== token && step.probabilities.get(token) !== first[1])
                throw new Error(`prompt ${p.id}: greedy token ${token} is not the most probable`);
            top2.push([first, second].map(([t, prob]) => [t, Number(prob.toPrecision(7))]));
        }
        if (model.isEogToken(token)) {
            stoppedAtEog = true;
            break;
        }
        if (generated.length >= args.maxTokens) break;
    }
    const textTokens = stoppedAtEog ? generated.slice(0, -1) : generated;
    results.push({
        id: p.id,
        kind: p.kind,
        prompt: p.prompt,
        prompt_tokens: promptTokens,
        generated_tokens: generated,
        generated_text: model.detokenize(textTokens, false),
        stopped_at_eog: stoppedAtEog,
        ...(withProbabilities ? {top2} : {})
    });
    process.stderr.write(`${p.id}: ${promptTokens.length} prompt tokens, ${generated.length} generated${stoppedAtEog ? " (EOG)" : ""}\n`);
}

const out = {
    model_file: path.basename(args.model),
    model_sha256: sha256File(args.model),
    node_llama_cpp_version: nodeLlamaCppVersion(),
    llama_cpp_build: llamaCppBuild(llama),
    backend: "cpu",
    threads: args.threads,
    chat_template: chat.source,
    template: chat.pattern,
    template_note: `The GGUF's tokenizer.chat_template (chat_template above, Jinja) rendered with @huggingface/jinja for messages = [{role: "user", content: prompt}] and add_generation_prompt = true; template is that rendering with ${PROMPT_PLACEHOLDER} in place of the user text, so it includes the default system turn the GGUF template inserts when the first message is not a system message.`,
    tokenization: "llama.cpp tokenizer with special tokens parsed; no BOS (tokenizer.ggml.add_bos_token is false)",
    decoding: `greedy argmax (temperature 0, no repetition penalty), at most ${args.maxTokens} new tokens; stops early only when an end-of-generation token is produced, which is then the last entry of generated_tokens (stopped_at_eog: true)`,
    generated_text_note: "detokenized generated_tokens without the final end-of-generation token, special tokens not rendered",
    eog_tokens: [...new Set([model.tokens.eos, model.tokens.eot].filter((t) => t != null))],
    max_new_tokens: args.maxTokens,
    top2: withProbabilities,
    top2_note: withProbabilities
        ? "top2[i] = [[token, probability], [token, probability]]: the two most probable tokens at generated position i with their softmax probabilities over the full vocabulary (llama.cpp logits, before sampling); logits themselves are not exposed, but ln(p1 / p2) is llama.cpp's top-1/top-2 logit gap"
        : "not recorded: the node-llama-cpp version used exposes no logits or token probabilities (evaluateWithMetadata needs node-llama-cpp >= 3.7)",
    prompts: results
};
fs.mkdirSync(path.dirname(args.out), {recursive: true});
fs.writeFileSync(args.out, toJson(out));
process.stderr.write(`wrote ${path.relative(process.cwd(), args.out)} (${results.length} prompts) in ${((performance.now() - t0) / 1000).toFixed(1)} s\n`);

await context.dispose();
await model.dispose();
await llama.dispose();

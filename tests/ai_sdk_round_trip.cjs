// A tool round trip through the Vercel AI SDK's OpenAI-compatible provider, the client code
// opencode, Kilo and Cline run for any OpenAI-compatible server: `streamText` with one tool,
// streamed (tool-call deltas parsed by @ai-sdk/openai-compatible), the tool run by the SDK
// and its result sent back as a `tool` message, up to 3 steps. Prints one JSON line.
//
//   node tests/ai_sdk_round_trip.cjs <node_modules dir> <base URL> <model>
const { createRequire } = require("node:module");
const [modules, baseURL, model] = process.argv.slice(2);
const load = createRequire(`${modules}/`);
const { streamText, tool, stepCountIs, jsonSchema } = load("ai");
const { createOpenAICompatible } = load("@ai-sdk/openai-compatible");

const SECRET = "The secret word is: pelican-42";

async function main() {
  const provider = createOpenAICompatible({ name: "llamaserve", baseURL, apiKey: "sk-local",
                                            includeUsage: true });
  const result = streamText({
    model: provider(model),
    temperature: 0,
    maxOutputTokens: 96,
    prompt: "Use the read_file tool to read hello.txt, then tell me the secret word.",
    tools: {
      read_file: tool({
        description: "Read a file of the repository and return its text.",
        inputSchema: jsonSchema({ type: "object", properties: { path: { type: "string" } },
                                  required: ["path"] }),
        execute: async ({ path }) => (path.endsWith("hello.txt") ? SECRET : "no such file"),
      }),
    },
    stopWhen: stepCountIs(3),
  });
  const parts = [];
  for await (const part of result.fullStream) {
    if (part.type === "error") throw part.error;
    parts.push(part.type);
  }
  const steps = await result.steps;
  console.log(JSON.stringify({
    parts: [...new Set(parts)],
    steps: steps.map((s) => ({
      finishReason: s.finishReason,
      toolCalls: s.toolCalls.map((c) => ({ id: c.toolCallId, name: c.toolName, input: c.input })),
      toolResults: s.toolResults.map((r) => ({ id: r.toolCallId, output: r.output })),
      text: s.text,
      usage: s.usage,
    })),
  }));
}

main().catch((err) => {
  console.log(JSON.stringify({ error: String(err && err.stack ? err.stack : err) }));
  process.exit(1);
});

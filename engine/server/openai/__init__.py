"""The OpenAI API: /v1/chat/completions and /v1/completions (schema, conversion to the neutral request, routes) and
logprobs in its two shapes."""

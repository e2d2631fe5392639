"""From an API-neutral request to the engine and back: the prompt and sampling parameters, structured output and tool
choice as a Constraint, logits processors, image parts, shared checks, and a generation seen from asyncio."""

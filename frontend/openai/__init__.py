"""The OpenAI-compatible HTTP app: routes, request parsing, generation, response shapes, errors."""

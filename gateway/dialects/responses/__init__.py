"""OpenAI's Responses API: its wire models, the translation to and from chat completions, the
native pass-through and its stream."""

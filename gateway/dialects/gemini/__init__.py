"""Google's Gemini API (and Vertex AI, which serves the same shapes) behind the gateway's chat
completions: :mod:`~gateway.dialects.gemini.request` (chat -> ``generateContent``),
:mod:`~gateway.dialects.gemini.schema` (JSON Schema as Gemini takes it),
:mod:`~gateway.dialects.gemini.response` (answers, streams and errors -> chat completions).
The adapter is :mod:`gateway.providers.gemini`."""

"""OpenAI's wire format: request models and their validation."""

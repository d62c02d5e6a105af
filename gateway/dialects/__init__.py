"""Translations between the client-facing API dialects and the upstream ones."""

"""Routing: from the model name a client sent to the deployments that may answer it."""

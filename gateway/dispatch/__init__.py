"""Dispatch: attempts on upstreams, bounded by timeouts (see ``dispatcher``)."""

"""Prompt shaping for prefix caches: the policy section, the shaper, the stability model (see ``service``)."""

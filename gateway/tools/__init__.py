"""Client-side programs that are not request stages: ``switchyard batch`` and ``switchyard bench``."""

"""STAND-IN for vLLM (tests only; README.md)."""

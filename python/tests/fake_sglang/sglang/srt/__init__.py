"""STAND-IN for sglang.srt (kvferry tests)."""

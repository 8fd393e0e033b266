"""STAND-IN for sglang.srt.disaggregation (kvferry tests)."""

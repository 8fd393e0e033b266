"""STAND-IN for SGLang (kvferry tests): see ../README.md."""

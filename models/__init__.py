"""The model zoo: attention cores, layers, encoders, heads, the builder."""

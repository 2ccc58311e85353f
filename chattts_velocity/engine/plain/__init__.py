"""Engine: the plain transformers path: upstream's batched loop, the oracle."""

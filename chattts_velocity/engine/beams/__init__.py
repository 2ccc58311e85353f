"""Engine: beam search: the scoring shared by both paths and its driver on the velocity engine."""

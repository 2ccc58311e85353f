"""Engine: sampling: the host sampler, the logits processors, the device sampler."""

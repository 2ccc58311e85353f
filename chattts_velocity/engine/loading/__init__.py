"""Engine: what an engine builds once at load: the GPT in its precision, the KV pool sized from a budget."""

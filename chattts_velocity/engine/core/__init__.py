"""Engine: the engine's core: scheduler, block manager, sequences, step types, model runner, LLMEngine."""

"""The scheduler's side: sequences, block manager, admission, scheduler, the persistent decode batch, the step
hand-off types (ScheduledBatch, StepOutput) and retry. Host bookkeeping only; imports nothing else in engine/."""

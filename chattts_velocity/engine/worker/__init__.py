"""The worker: a ScheduledBatch -> a StepOutput on the device (model runner, step inputs, backends, sampling).

Imports only the scheduler's hand-off types from engine/sched/; nothing in engine/sched/ imports it.
"""

"""vLLM-backed rollout workers: generation, token capture into the data plane, attempt events.

Modules: `engine` (the only one that imports vLLM), `worker` (RolloutWorker), `agents` (calls
per attempt and rewards, by agent name), `faults` (failure injection), `sampling` (the
engine-facing types), `tiny_model` (a deterministic local test model). Nothing is imported
here, so `import eventlog.rollout.worker` never loads vLLM.
"""

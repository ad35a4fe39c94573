"""Rule-based rewards that ship with the pipeline: functions `rlhf ppo --reward python:...` calls
(pipeline/models/code_rewards.py), each with the prompts of the task it verifies."""

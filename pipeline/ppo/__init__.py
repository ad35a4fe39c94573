"""The PPO trainer: pure math (core), schedules, diagnostics, critic, config, rollout, loop."""

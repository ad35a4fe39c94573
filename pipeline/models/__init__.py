"""The shared model code every stage uses: where and in what precision a model runs
(`compute`), loading and sampling a policy (`policy`), checking a model folder (`model_folders`),
how a prompt becomes text (`text`: plain or a chat template), who judges (`judges`), LoRA
adapters (`lora`) and what scores a response for PPO and eval (`scoring`: the scorer interface
and `load_scorer`; `code_rewards`: a reward that is a Python function or a server). No stage lives here (the stages are pipeline/'s other modules and packages).

    python -c "from rlhf.pipeline.models.compute import resolve; print(resolve(stage='ppo'))"
"""

"""Do both RMs lose their ranking on the policy's own samples? Each RM's Spearman against the
gold judge on 4 samples per ppo prompt (temperature 0.8, top-p 0.95, 48 tokens) of the SFT
policy and of the trained PPO policy (whether the strong RM, the light RM's teacher,
can re-label for RM evolution).

    cd <a clone after make run> && .venv/bin/python <repo>/bench/rm_drift.py
"""
def main() -> None:
    from rlhf.pipeline.models.policy import load_policy
    from rlhf.pipeline.reward import load_ensemble
    from rlhf.pipeline.reward.onpolicy import onpolicy_set, spearman
    from rlhf.pipeline.samplers import load_prompts
    prompts=[t for _,t in load_prompts('artifacts/store/pool')]
    strong=load_ensemble('artifacts/models/rm_strong')
    light=load_ensemble('artifacts/models/rm_light')
    for name in ['artifacts/models/sft','artifacts/ppo/policy']:
        pol,tok=load_policy(name)
        d=onpolicy_set(pol,tok,prompts,4,0.8,0.95,48,7,64)
        s=strong(d.prompts,d.responses)[0].tolist(); l=light(d.prompts,d.responses)[0].tolist()
        print(name, len(d), 'gold', round(sum(d.gold)/len(d),4), 'strong vs gold', round(spearman(s,d.gold),3), 'light vs gold', round(spearman(l,d.gold),3))


if __name__ == "__main__":
    main()

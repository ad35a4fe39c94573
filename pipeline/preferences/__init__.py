"""Preference data: k >= 3 SFT-policy responses per reward-split prompt, ranked by the annotators.

Seed 000 §3.4: pairwise RM training with at least three responses per prompt. For each prompt of
the pool's `reward` split, the SFT policy samples `k` responses and the world's `AnnotatorPool`
ranks them at a labelling time that advances through the campaign (so the annotators' drift,
seed 001 §3.1, shows up in the data). External human rankings are read too when the real-data
folder is given: hh-rlhf chosen/rejected pairs and OpenAssistant ranked sibling replies. Every
ranking is stored with its annotator id and timestamp in the `preferences` table, one row per
ranked response; `expand_pairs` turns each ranking into all its (chosen, rejected) pairs.

    rlhf preferences --pool artifacts/store/pool --policy artifacts/models/sft \
        --realdata ../shared/realdata --out artifacts/store/preferences \
        --metrics artifacts/metrics/preferences.json

Without a pool (`--demos` instead of `--pool`), the prompts of the demonstrations are used.

Human labels only (`preferences.labels: human`, the realdata profile: no world, no simulated
annotators): the rankings are the human preference pairs ingest kept with their prompts
(`external_pairs`: hh-rlhf chosen/rejected, OpenAssistant ranks) plus any annotation-queue JSONL
files (`--queue`, the format in `read_queue`), each checked against the store's `prompts`; a
label that fails a check goes to the `rejected_labels` quarantine with reason codes, so
input = kept + rejected per source. `gold_fraction` of the labelled prompts go to split `gold`:
only the held-out gold RM (`rlhf judge`, pipeline/models/judges.py) trains on them.

    rlhf preferences --labels-from artifacts/store --queue data/queue.jsonl \
        --out artifacts/store/preferences --rejected-out artifacts/store/rejected_labels

The package, one concern per module: `simulated` (annotator mode: sample, annotate, `run`),
`human` (human-label mode: `run_human`), `external` (hh-rlhf / OpenAssistant rankings of the
real-data folder), `prompts` (which prompts), `pairs` (rankings -> pairs), `config`.
"""

from rlhf.pipeline.preferences.config import (
    AnnotatorConfig,
    PreferencesConfig,
    heldout_or_train,
    split_of,
)
from rlhf.pipeline.preferences.external import (
    HH_FILE,
    OASST_FILE,
    external_rows,
    read_hh_pairs,
    read_oasst_groups,
)
from rlhf.pipeline.preferences.human import (
    QUEUE_PROVENANCE,
    _pool_splits,
    human_rows,
    label_split,
    read_queue,
    run_human,
)
from rlhf.pipeline.preferences.pairs import expand_pairs
from rlhf.pipeline.preferences.prompts import (
    FALLBACK_SPLITS,
    fallback_split,
    prompts_from_demonstrations,
    reward_prompts_from_pool,
)
from rlhf.pipeline.preferences.simulated import (
    annotate,
    default_world,
    demo_candidates,
    run,
    topic_of,
)

# What other modules import from `rlhf.pipeline.preferences` (`_pool_splits`: the demos stage
# reads the same prompt -> cluster split map).
__all__ = [
    "FALLBACK_SPLITS", "HH_FILE", "OASST_FILE", "QUEUE_PROVENANCE", "AnnotatorConfig",
    "PreferencesConfig", "_pool_splits", "annotate", "default_world", "demo_candidates",
    "expand_pairs", "external_rows", "fallback_split", "heldout_or_train", "human_rows",
    "label_split", "prompts_from_demonstrations", "read_hh_pairs", "read_oasst_groups",
    "read_queue", "reward_prompts_from_pool", "run", "run_human", "split_of", "topic_of",
]

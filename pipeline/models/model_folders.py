"""Is this folder the model a stage asks for? Cheap checks, before anything heavy is loaded.

    python -c "from rlhf.pipeline.models.model_folders import check_policy; check_policy('artifacts/models/sft')"

A stage given a policy or reward-model folder that is missing, truncated (an interrupted copy or
download) or of the wrong kind (an RM where a policy belongs, a tokenizer folder, a PPO run)
used to fail deep inside transformers, torch or safetensors with a traceback that does not name
the folder. These checks read only what is cheap (config.json, scorer.json, the safetensors
header and the file sizes it implies, a zip's central directory) and raise one
`ModelFolderError` that names the path and says what is wrong; the CLI prints it as one
`error:` line. `load_policy` and `load_ensemble` run them too, so every caller gets them.

Where a stage takes "any HF name or local path" (`sft.base_model`, and a stage's policy option:
`rlhf ppo --policy`, `rlhf preferences --policy`, `rlhf reward --sft`, `rlhf difficulty
--policy`, `rlhf eval --sft`; the CLI's `need_model("hub_policy", ...)`),
`policy_folder` turns a hub name (`org/name`) into its snapshot folder in the Hugging Face cache,
downloaded first where the hub can be reached (`HF_HUB_OFFLINE` unset), and checks that folder
the same way; a name the cache does not hold is one error naming the cache.
"""

from __future__ import annotations

import json
import os
import struct
import zipfile
from pathlib import Path
from typing import Any

from rlhf.pipeline.reward.scorer import SCORER_FILE

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "tokenizer.model")
# the files of a hub model a stage loads (config, safetensors weights, tokenizer, chat template):
# what is downloaded, so a repo's other formats (.bin, gguf, onnx) are not
HUB_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken"]


class ModelFolderError(ValueError):
    """A model folder that cannot be what the stage needs; the message names the path."""


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ModelFolderError(f"{what}: {path} is not readable JSON (truncated or damaged?): "
                               f"{exc}") from None


def _folder(path: str | Path, what: str) -> Path:
    path = Path(path)
    if not path.exists():
        raise ModelFolderError(f"{what}: {path} does not exist")
    if not path.is_dir():
        raise ModelFolderError(f"{what}: {path} is a file, not a model folder")
    return path


def _check_safetensors(path: Path, what: str) -> None:
    """The header parses and the file is as long as the tensors it lists."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise ValueError("shorter than the 8-byte header length")
            (n,) = struct.unpack("<Q", head)
            if n > size - 8:
                raise ValueError(f"header of {n:,} bytes in a {size:,}-byte file")
            header = json.loads(fh.read(n))
        end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"),
                  default=0)
    except (OSError, ValueError, KeyError, TypeError, IndexError, struct.error) as exc:
        raise ModelFolderError(f"{what}: {path} is not a readable safetensors file "
                               f"(truncated or damaged?): {exc}") from None
    if 8 + n + end != size:
        raise ModelFolderError(f"{what}: {path} is truncated or damaged: its header lists "
                               f"{8 + n + end:,} bytes, the file has {size:,}")


def check_torch_file(path: Path, what: str) -> None:
    """A torch.save file (a zip archive): its central directory, at the end, is there."""
    try:
        with zipfile.ZipFile(path) as zf:
            zf.namelist()
    except (OSError, zipfile.BadZipFile) as exc:
        raise ModelFolderError(f"{what}: {path} is not a readable torch file (truncated or "
                               f"damaged?): {exc}") from None


def _check_weights(path: Path, what: str) -> None:
    single = {"model.safetensors": _check_safetensors, "pytorch_model.bin": check_torch_file}
    for name, check in single.items():
        if (path / name).is_file():
            check(path / name, what)
            return
    for index, check in (("model.safetensors.index.json", _check_safetensors),
                         ("pytorch_model.bin.index.json", check_torch_file)):
        if (path / index).is_file():
            shards = sorted(set((_read_json(path / index, what).get("weight_map") or {}).values()))
            if not shards:
                raise ModelFolderError(f"{what}: {path / index} lists no weight files")
            for shard in shards:
                if not (path / shard).is_file():
                    raise ModelFolderError(f"{what}: weight shard {path / shard} is missing")
                check(path / shard, what)
            return
    raise ModelFolderError(f"{what}: no weights in {path} (model.safetensors or "
                           "pytorch_model.bin): an incomplete copy, or not a saved model")


def _check_tokenizer(path: Path, what: str) -> None:
    present = [name for name in TOKENIZER_FILES if (path / name).is_file()]
    if not present:
        raise ModelFolderError(f"{what}: no tokenizer in {path} (tokenizer.json or "
                               "tokenizer_config.json)")
    for name in present:
        if name.endswith(".json"):
            _read_json(path / name, what)


def _architectures(path: Path, what: str) -> list[str]:
    config = path / "config.json"
    if not config.is_file():
        raise ModelFolderError(f"{what}: no config.json in {path}: not a saved model folder "
                               "(save_pretrained)")
    data = _read_json(config, what)
    if not isinstance(data, dict) or "model_type" not in data:
        raise ModelFolderError(f"{what}: {config} is not a transformers model config")
    return list(data.get("architectures") or [])


def check_tokenizer(path: str | Path, what: str = "tokenizer") -> Path:
    """A folder a tokenizer was saved to (save_pretrained)."""
    path = _folder(path, what)
    _check_tokenizer(path, what)
    return path


def check_model_config(path: str | Path, what: str = "model config") -> Path:
    """A folder with a transformers config.json (the embedded default's model_config)."""
    path = _folder(path, what)
    _architectures(path, what)
    return path


def check_pretrained(path: str | Path, what: str = "model") -> Path:
    """Any saved transformers model (config.json + weights), whatever its head: a backbone."""
    path = _folder(path, what)
    _architectures(path, what)
    _check_weights(path, what)
    return path


def check_policy(path: str | Path, what: str = "policy") -> Path:
    """A causal-LM `save_pretrained` folder with its tokenizer (what load_policy reads)."""
    path = _folder(path, what)
    if (path / SCORER_FILE).is_file():
        raise ModelFolderError(f"{what}: {path} is a reward-model folder ({SCORER_FILE}), "
                               "not a policy")
    if (path / "checkpoints").is_dir() and not (path / "config.json").is_file():
        raise ModelFolderError(f"{what}: {path} is a PPO run folder; its policy is in "
                               f"{path / 'policy'}")
    arch = _architectures(path, what)
    if arch and not any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in arch):
        raise ModelFolderError(f"{what}: {path} holds a {', '.join(arch)}, not a causal language "
                               "model (a policy)")
    _check_weights(path, what)
    _check_tokenizer(path, what)
    return path


def hub_name(text: str) -> bool:
    """Whether `text` can name a hub model (`org/name` or `name`) rather than only a path."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if text.startswith((".", "/", "~")):
        return False
    try:
        validate_repo_id(text)
    except HFValidationError:
        return False
    return True


def hub_cache() -> str:
    """The Hugging Face hub cache: $HF_HUB_CACHE as the environment says now, else
    huggingface_hub's own (HF_HOME/hub, ~/.cache/huggingface/hub by default)."""
    from huggingface_hub import constants

    return os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE


def policy_folder(name_or_path: str | Path, what: str = "policy") -> Path:
    """The local folder of a policy given as a folder or a hub name: `name_or_path` itself when
    it exists, else the hub model's snapshot in the Hugging Face cache (fetched first where the
    hub can be reached; HF_HUB_OFFLINE=1: the cache only); `check_policy`ed either way. A hub
    name the cache does not hold is a ModelFolderError naming the cache."""
    text = str(name_or_path)
    if Path(text).exists() or not hub_name(text):
        return check_policy(text, what)
    from huggingface_hub import constants, snapshot_download

    cache = hub_cache()
    try:
        folder = snapshot_download(text, allow_patterns=HUB_FILES, cache_dir=cache)
    except (OSError, ValueError) as exc:  # not cached offline, unknown or gated repo, network
        reason = (f"HF_HUB_OFFLINE is set, so nothing is downloaded: fetch it where the hub is "
                  f"reachable with `hf download {text}`, or give a local folder"
                  if constants.HF_HUB_OFFLINE else " ".join(str(exc).split())[:200])
        raise ModelFolderError(f"{what} {text}: no such folder, and the Hugging Face cache "
                               f"{cache} has no snapshot of the hub model {text} ({reason})"
                               ) from None
    return check_policy(folder, f"{what} {text}")


def check_reward_member(path: str | Path, what: str = "reward model") -> Path:
    """One sequence-classification checkpoint (a scorer member, or a plain HF reward model)."""
    path = _folder(path, what)
    arch = _architectures(path, what)
    if arch and not any(a.endswith("ForSequenceClassification") for a in arch):
        raise ModelFolderError(f"{what}: {path} holds a {', '.join(arch)}, not a sequence "
                               "classifier (a reward model)")
    _check_weights(path, what)
    return path


def check_scorer(path: str | Path, what: str = "reward model",
                 plain_allowed: bool = False) -> Path:
    """A reward stage scorer folder (scorer.json + members), or with `plain_allowed` also a plain
    sequence-classification checkpoint (what the PPO / eval scorer loader accepts)."""
    path = _folder(path, what)
    meta_path = path / SCORER_FILE
    if not meta_path.is_file():
        if plain_allowed and (path / "config.json").is_file():
            check_reward_member(path, what)
            _check_tokenizer(path, what)
            return path
        raise ModelFolderError(f"{what}: no {SCORER_FILE} in {path}: not a reward-model folder "
                               "(the reward stage writes rm_strong / rm_light)")
    meta = _read_json(meta_path, what)
    members = meta.get("members") if isinstance(meta, dict) else None
    if not isinstance(members, list) or not members or not all(isinstance(m, str) for m in members):
        raise ModelFolderError(f"{what}: {meta_path} has no list of members")
    for key in ("references", "temperature", "aggregation", "max_length"):
        if key not in meta:
            raise ModelFolderError(f"{what}: {meta_path} lacks {key!r} (truncated or damaged?)")
    for m in members:
        check_reward_member(path / m, f"{what} member {m}")
    _check_tokenizer(path / members[0], what)
    return path


def check_ppo_run(path: str | Path, what: str = "PPO run") -> list[Path]:
    """A PPO run folder: every checkpoints/step-*/ holds a readable policy (policy.pt or a
    save_pretrained folder). Returns the checkpoint folders."""
    path = _folder(path, what)
    root = path / "checkpoints"
    if not root.is_dir():
        raise ModelFolderError(f"{what}: no checkpoints/ in {path}: not a PPO run folder")
    steps = sorted(p for p in root.glob("step-*") if p.is_dir())
    for step in steps:
        if (step / "config.json").is_file():
            check_policy(step, f"{what} checkpoint {step.name}")
        elif (step / "policy.pt").is_file():
            check_torch_file(step / "policy.pt", f"{what} checkpoint {step.name}")
        else:
            raise ModelFolderError(f"{what}: checkpoint {step} has no policy.pt")
    return steps

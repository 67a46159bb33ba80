"""Hugging Face Hub names where a checkpoint or a text is taken: judged and resolved here only.

A model, ``ORG/NAME[@REVISION]``, becomes its snapshot folder in the Hugging Face cache, holding only
what a checkpoint is read from, then read like any folder. A dataset, ``ORG/NAME[:CONFIG[:SPLIT]][@REVISION]``,
is read through ``datasets``: its ``text`` column, split ``train`` unless one is named. Offline or with
the Hub out of reach, what the caches hold is used, as transformers does.

A path that exists always wins, and a ``Path`` object is always a path. Nothing here imports torch or
transformers, so a bad name is refused at once.
"""

import fnmatch
import json
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from ..errors import MixLNError, warn
from .checkpoint_files import CARD_FILE, EXTRA_FILE_PATTERNS, WEIGHT_FILES

_PART = r"[\w.-]+"
_REVISION = r"(?:@(?P<revision>[^\s@:]+))?"  # git forbids ':' in ref names, so none is taken for a dataset's parts
GRAMMARS = {
    "model": re.compile(rf"(?P<repo>{_PART}/{_PART}){_REVISION}", re.ASCII),
    "dataset": re.compile(rf"(?P<repo>{_PART}/{_PART})(?::(?P<config>{_PART})?(?::(?P<split>{_PART}))?)?{_REVISION}",
                          re.ASCII),
}
DEFAULT_SPLIT = "train"


@dataclass(frozen=True)
class HubName:
    """A Hub name as given (``text``) and its parts."""

    text: str
    repo: str
    revision: str | None = None
    config: str | None = None  # None: the dataset's default
    split: str = DEFAULT_SPLIT

    def __str__(self) -> str:
        return self.text


def hub_name(value, kind: str) -> HubName | None:
    """``value`` as a Hub name of ``kind`` ("model" or "dataset"), or None where it is a path."""
    if not isinstance(value, str) or os.path.exists(os.path.expanduser(value)):
        return None
    match = GRAMMARS[kind].fullmatch(value)
    if match is None or not _allowed(match["repo"]):
        return None
    parts = match.groupdict()
    return HubName(value, parts["repo"], parts["revision"], parts.get("config"), parts.get("split") or DEFAULT_SPLIT)


def _allowed(repo: str) -> bool:
    """The Hub's own rule for a repo id (no '--' or '..', no '-' or '.' at either end, 96 characters)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo)
    except HFValidationError:
        return False
    return True


def _reason(error: Exception) -> str:
    first = (str(error).strip().splitlines() or [""])[0][:300]
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


def model_snapshot(name: HubName, flag: str) -> str:
    """The snapshot folder of the Hub model ``name`` with the files a checkpoint is read from, fetched into
    the Hugging Face cache; offline or with the Hub out of reach, as the cache holds it."""
    from huggingface_hub import HfApi, hf_hub_download, snapshot_download
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    where = f"{flag} {name}"
    try:
        info = HfApi().model_info(name.repo, revision=name.revision)
    except GatedRepoError:
        raise MixLNError(f"{where}: a gated model; ask for access on its Hub page, then log in "
                         "(hf auth login)") from None
    except RepositoryNotFoundError:
        raise MixLNError(f"{where}: no such file or folder, nor a model on the Hugging Face Hub (a private one needs "
                         "a login: hf auth login)") from None
    except RevisionNotFoundError:
        raise MixLNError(f"{where}: the Hugging Face Hub has no revision {name.revision} of {name.repo}") from None
    except Exception as e:  # offline, or the Hub out of reach (requests', httpx's or the Hub's own types, by version)
        return _cached_snapshot(name, where, e)
    listing = [file.rfilename for file in info.siblings or []]
    gguf = _lone_gguf(listing, where)
    if gguf is not None:
        return _fetching(where, hf_hub_download, name.repo, gguf, revision=name.revision)
    files = _checkpoint_files(listing, lambda index: Path(_fetching(
        where, hf_hub_download, name.repo, index, revision=name.revision)), where)
    return _fetching(where, snapshot_download, name.repo, revision=name.revision, allow_patterns=files)


def _fetching(where: str, fetch, *args, **kwargs):
    """``fetch(*args, **kwargs)``; a failure (the network, the disk, the Hub) is one line naming ``where``."""
    try:
        return fetch(*args, **kwargs)
    except Exception as e:  # requests', httpx's, the Hub's and the file system's types, by version
        raise MixLNError(f"{where}: fetching it from the Hugging Face Hub failed ({_reason(e)})") from None


def _cached_snapshot(name: HubName, where: str, error: Exception) -> str:
    """The snapshot of ``name`` the Hugging Face cache holds, when the Hub could not be asked (``error``)."""
    from huggingface_hub import constants, try_to_load_from_cache
    from huggingface_hub.errors import OfflineModeIsEnabled

    offline = isinstance(error, OfflineModeIsEnabled)
    why = "offline mode: HF_HUB_OFFLINE" if offline else f"the Hub is out of reach: {_reason(error)}"
    config = try_to_load_from_cache(name.repo, "config.json", revision=name.revision)
    if not isinstance(config, str):
        snapshot = _cached_folder(name)
        if snapshot is not None:  # the repo is cached, without a transformers config: a GGUF repo reads as its file
            gguf = _lone_gguf([p.name for p in snapshot.iterdir()], f"{where}: the cached snapshot {snapshot}")
            if gguf is None:
                raise MixLNError(f"{where}: the cached snapshot {snapshot} holds no config.json and no .gguf file "
                                 f"({why})")
            if not offline:
                warn(f"{where}: {why}; using the cached {snapshot / gguf}")
            return str(snapshot / gguf)
        at = f" at revision {name.revision}" if name.revision else ""
        raise MixLNError(f"{where}: no such file or folder, and the Hugging Face cache {constants.HF_HUB_CACHE} holds "
                         f"no model {name.repo}{at} ({why})")
    folder = Path(config).parent
    files = _checkpoint_files([p.name for p in folder.iterdir()], lambda index: folder / index, where)
    missing = [file for file in files if file != CARD_FILE and not (folder / file).is_file()]  # a card: optional
    if missing:
        raise MixLNError(f"{where}: the cached snapshot {folder} lacks {missing[0]} ({why})")
    if not offline:  # said: a branch may have moved on the Hub since the cache was filled
        warn(f"{where}: {why}; using the cached snapshot {folder}")
    return str(folder)


def _cached_folder(name: HubName) -> Path | None:
    """The snapshot folder the Hugging Face cache holds of ``name``'s revision (a branch, tag or commit), if any."""
    from huggingface_hub import constants

    repo = Path(constants.HF_HUB_CACHE) / f"models--{name.repo.replace('/', '--')}"
    ref = repo / "refs" / (name.revision or "main")
    try:
        commit = ref.read_text().strip() if ref.is_file() else name.revision
    except (OSError, UnicodeDecodeError):
        return None
    folder = repo / "snapshots" / commit if commit and "/" not in commit and commit not in (".", "..") else None
    return folder if folder is not None and folder.is_dir() else None


def snapshot_model(path) -> tuple[str, str] | None:
    """(repo, commit) of the Hub model whose Hugging Face cache snapshot ``path`` is (the folder, or a .gguf
    at its top); None for any other path. Only the path is read: a provenance names it after the cache is gone."""
    path = Path(path)
    folder = path.parent if path.suffix.lower() == ".gguf" else path
    repo_dir = folder.parent.parent.name
    if folder.parent.name != "snapshots" or not repo_dir.startswith("models--") or not folder.name:
        return None
    repo = repo_dir.removeprefix("models--").replace("--", "/")  # a repo id holds no '--' (_allowed)
    return (repo, folder.name) if _allowed(repo) else None


def _lone_gguf(listing: list[str], where: str) -> str | None:
    """The .gguf file a repo's ``listing`` is read as when it holds no config.json but one GGUF at its top;
    None where it holds a config.json or no GGUF; several: an error naming them (which one is the user's)."""
    top = {file for file in listing if "/" not in file}
    ggufs = sorted(file for file in top if file.lower().endswith(".gguf"))
    if "config.json" in top or not ggufs:
        return None
    if len(ggufs) > 1:
        raise MixLNError(f"{where}: holds no config.json but {len(ggufs)} .gguf files ({', '.join(ggufs[:5])}"
                         f"{', ...' if len(ggufs) > 5 else ''}); fetch the one you mean (hf download REPO FILE) "
                         "and give its path")
    return ggufs[0]


def _checkpoint_files(listing: list[str], index_file, where: str) -> list[str]:
    """The files of a repo's ``listing`` a checkpoint folder is read from: config.json, the weights in the first
    format of WEIGHT_FILES it has, the files beside them and the model card (its license); ``index_file(name)``
    is a local copy of an index."""
    top = {file for file in listing if "/" not in file}  # subfolders hold other formats (onnx/, original/)
    if "config.json" not in top:
        raise MixLNError(f"{where}: holds no config.json; expected a transformers checkpoint")
    for index, single in WEIGHT_FILES:
        if index in top:
            weights = [index, *_shards(index_file(index), where)]
            break
        if single in top:
            weights = [single]
            break
    else:
        raise MixLNError(f"{where}: holds none of {', '.join(name for pair in WEIGHT_FILES for name in pair)}")
    extras = sorted(file for file in top if any(fnmatch.fnmatch(file, p) for p in EXTRA_FILE_PATTERNS))
    return ["config.json", *weights, *extras, *([CARD_FILE] if CARD_FILE in top else [])]


def _shards(index: Path, where: str) -> list[str]:
    """The shard files an index names (the loader then checks each against the tensors it holds)."""
    try:
        return sorted(set(json.loads(index.read_text())["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise MixLNError(f"{where}: {index.name} is not a weight index ({_reason(e)})") from None


class HubDataset:
    """One split of a Hub dataset, read through ``datasets``; its builder is loaded once per process."""

    def __init__(self, name: HubName):
        self.name = name

    def __str__(self) -> str:
        return str(self.name)

    def builder(self, flag: str | None = None):
        """The dataset's builder, its split and 'text' column checked where its info knows them."""
        import datasets

        where = f"{flag} {self.name}" if flag else str(self.name)
        try:
            builder = _dataset_builder(self.name.repo, self.name.config, self.name.revision,
                                       str(datasets.config.HF_DATASETS_CACHE))
        except Exception as e:  # the Hub, the network, the cache or the dataset's layout: many types in datasets
            raise MixLNError(f"{where}: no such file or folder, and datasets cannot load it from the Hugging Face Hub "
                             f"or its cache ({_reason(e)})") from None
        if builder.name == "cache" and self.name.revision not in (None, builder.hash):
            # what datasets reads offline: the newest version cached, whatever revision was asked for
            raise MixLNError(f"{where}: revision {self.name.revision} of {self.name.repo} is not in the datasets cache "
                             f"(it holds commit {builder.hash}) and the Hub is out of reach")
        splits = builder.info.splits
        if splits and self.name.split not in splits:
            raise MixLNError(f"{where}: no split {self.name.split} (splits: {', '.join(splits)})")
        features = builder.info.features
        if features is not None and "text" not in features:
            raise MixLNError(f"{where}: no 'text' column (columns: {', '.join(features)})")
        return builder

    def record(self) -> dict:
        """What names the text read, for a manifest: the dataset, config, split and commit."""
        builder = self.builder()
        return {"dataset": self.name.repo, "config": builder.config.name, "split": self.name.split,
                "revision": builder.hash}

    def records(self, streaming: bool):
        """The split's rows; ``streaming``: as they come from the Hub (or the cache), never all held or
        prepared on disk; else prepared in the datasets cache first, as ``load_dataset`` does."""
        builder = self.builder()
        try:
            if streaming:
                dataset = builder.as_streaming_dataset(split=self.name.split)
            else:
                builder.download_and_prepare()
                dataset = builder.as_dataset(split=self.name.split)
            if builder.info.features is not None:
                dataset = dataset.select_columns(["text"])
            yield from dataset
        except Exception as e:  # as in builder(): datasets, pyarrow, the network
            raise MixLNError(f"{self.name}: cannot read it through datasets ({_reason(e)})") from None


@lru_cache(maxsize=16)
def _dataset_builder(repo: str, config: str | None, revision: str | None, cache_dir: str):
    from datasets import load_dataset_builder

    return load_dataset_builder(repo, config, revision=revision, cache_dir=cache_dir)

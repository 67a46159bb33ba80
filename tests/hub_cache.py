"""Hugging Face caches built offline: a model and a dataset laid out as huggingface_hub and datasets
leave what they fetched from the Hub, so that a Hub name's resolution, offline, finds them."""

import hashlib
import tempfile
from pathlib import Path

MODEL_COMMIT = "1" * 40
DATASET_COMMIT = "2" * 40


def offline_hub(monkeypatch, hub: Path, data: Path) -> None:
    """The Hub out of reach, the model cache ``hub`` and the datasets cache ``data``, as
    HF_HUB_OFFLINE=1, HF_HUB_CACHE and HF_DATASETS_CACHE do at start-up (each library reads them
    once, on import, so they are set where it keeps them)."""
    import datasets
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", data)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)


def place_model(folder: Path, hub: Path, repo: str, commit: str = MODEL_COMMIT, skip=()) -> Path:
    """The files of ``folder`` (but ``skip``) as huggingface_hub caches a model it downloaded: each
    a blob named by its sha256, the snapshot of ``commit`` a folder of links to them, refs/main
    naming the commit. Returns the snapshot folder."""
    repo_dir = hub / f"models--{repo.replace('/', '--')}"
    snapshot = repo_dir / "snapshots" / commit
    for path in (repo_dir / "blobs", repo_dir / "refs", snapshot):
        path.mkdir(parents=True, exist_ok=True)
    for file in sorted(folder.iterdir()):
        if file.name not in skip:
            digest = hashlib.sha256(file.read_bytes()).hexdigest()
            (repo_dir / "blobs" / digest).write_bytes(file.read_bytes())
            (snapshot / file.name).symlink_to(Path("..", "..", "blobs", digest))
    (repo_dir / "refs" / "main").write_text(commit)
    return snapshot


def place_dataset(texts: list[str], data: Path, repo: str, commit: str = DATASET_COMMIT) -> None:
    """``texts`` as the 'text' column (beside another) of ``repo``'s train split, prepared in the
    datasets cache ``data`` as datasets leaves a Hub dataset it loaded at ``commit`` (what it reads
    offline)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from datasets.packaged_modules.parquet.parquet import Parquet

    org, name = repo.split("/")
    with tempfile.TemporaryDirectory() as work:
        source = Path(work) / "train.parquet"
        pq.write_table(pa.table({"text": texts, "id": list(range(len(texts)))}), source)
        builder = Parquet(cache_dir=work, dataset_name=name, config_name="default", data_files={"train": [str(source)]})
        builder.download_and_prepare(output_dir=str(data / f"{org}___{name}" / "default" / "0.0.0" / commit))

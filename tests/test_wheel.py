"""The wheel is the product: built with `pip wheel`, installed into a fresh venv (no checkout on
its path), it lists its recipes and runs a minimal demo from an empty folder outside the checkout."""

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from mixln_convert.data.corpus import SHARES

REPO = Path(__file__).parent.parent


def run(cmd, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kwargs)
    assert done.returncode == 0, (cmd, done.stdout[-2000:], done.stderr[-4000:])
    return done


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed; its dependencies come from this environment's
    site-packages by a path entry (the editable install of the checkout is not on it)."""
    root = tmp_path_factory.mktemp("wheel")
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", root / "dist", REPO])
    wheel, = (root / "dist").glob("mixln_convert-*.whl")
    run([sys.executable, "-m", "venv", root / "venv"])
    python = root / "venv" / "bin" / "python"
    site = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    (Path(site) / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run([python, "-m", "pip", "install", "--no-deps", "--quiet", wheel])
    return root / "venv"


def test_the_installed_package_is_the_wheel_not_the_checkout(venv, tmp_path):
    where = run([venv / "bin" / "python", "-c", "import mixln_convert; print(mixln_convert.__file__)"],
                cwd=tmp_path).stdout.strip()
    assert Path(where).is_relative_to(venv) and not Path(where).is_relative_to(REPO)


def test_the_wheel_ships_its_recipes_and_accelerate_configs(venv, tmp_path):
    listed = run([venv / "bin" / "mixln-convert", "train", "--list"], cwd=tmp_path).stdout
    for name in ("smollm2-135m-cpu", "smollm2-135m", "llama-1b", "llama-7b-fsdp", "fsdp", "multi_gpu_ddp"):
        assert name in listed
    path = Path(run([venv / "bin" / "mixln-convert", "recipes", "--path", "fsdp"], cwd=tmp_path).stdout.strip())
    assert path.is_file() and path.is_relative_to(venv)
    help_text = run([venv / "bin" / "mixln-convert", "train", "--help"], cwd=tmp_path).stdout
    assert "recipes/" not in help_text  # help names only what a wheel has


def test_a_minimal_demo_runs_from_an_empty_folder(venv, tiny_llama, tmp_path):
    work = tmp_path / "empty"
    work.mkdir()
    env = {**os.environ, "MIXLN_CONVERT_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    done = run([venv / "bin" / "mixln-convert", "demo", "--source", tiny_llama, "--heal-tokens", 1024,
                "--train-tokens", 1024, "--eval-tokens", 256, "--no-prune-curve"], cwd=work, env=env)
    report = work / "mixln-demo" / "report"
    assert (report / "report.md").is_file() and (report / "report.html").is_file()
    comparison = json.loads((report / "comparison.json").read_text())
    # the five stages' analyses, then the train folder's arms with their training curves
    assert [m["label"] for m in comparison["models"]] == ["original", "converted", "healed", "mixln-trained",
                                                           "preln-trained", "train/mixln", "train/preln"]
    swept = [m["label"] for m in comparison["models"][:5] if "deep_layer_drop" in m]
    assert swept == ["original", "mixln-trained", "preln-trained"]  # the intermediate stages: perplexity only
    assert "report:" in done.stdout


def test_the_wheel_ships_its_offline_tasks(venv, tmp_path):
    """The lm-eval tasks (YAML, JSONL and their loader) are found and read from the installed wheel."""
    pytest.importorskip("lm_eval")
    code = ("from mixln_convert.evaluation.downstream import task_manager\n"
            "from mixln_convert.evaluation.tasks import SHIPPED_TASKS, shipped_tasks_dir\n"
            "tasks = task_manager(list(SHIPPED_TASKS)).load(list(SHIPPED_TASKS))['tasks']\n"
            "print(shipped_tasks_dir(), *(len(tasks[name].test_docs()) for name in SHIPPED_TASKS))")
    where, *counts = run([venv / "bin" / "python", "-c", code], cwd=tmp_path).stdout.split()
    assert Path(where).is_relative_to(venv) and counts == ["60", "300"]


def test_the_wheel_ships_the_embedded_corpus_general_english_and_all(venv, tmp_path):
    """The default text is read from the installed wheel, its shipped English checked against the manifest."""
    code = ("import json\n"
            "from mixln_convert.data.corpus import ENGLISH, SPLITS, _shipped_english, embedded_corpus\n"
            "english = {text: source for source, _, text in _shipped_english()}\n"
            "print(json.dumps({'where': str(ENGLISH), 'splits': {s: sorted({english.get(d, 'docstrings')\n"
            "                  for d in embedded_corpus(s)}) for s in SPLITS}}))")
    shown = json.loads(run([venv / "bin" / "python", "-c", code], cwd=tmp_path).stdout)
    assert Path(shown["where"]).is_relative_to(venv)
    assert all(sources == sorted(SHARES) for sources in shown["splits"].values())

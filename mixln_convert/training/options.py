"""The settings of ``mixln-convert train``, ``estimate`` and ``recipes`` beside a recipe's (training/). Torch-free."""

from dataclasses import dataclass

from ..limits import MAX_PROCESSES
from ..options import Options, Output, Overrides, Resume
from ..schema import Choice, Count, Flag, Names, Size, Text, same_as, setting

# workflows/train.py's training arms: the converted Mix-LN model, the Pre-LN control, the LNS retrofit
ARMS = ("mixln", "preln", "lns")
DEFAULT_ARMS = ("mixln", "preln")
ARM_NAMES = Names(ARMS, noun="arm")  # distinct arms, at least one (a string is one name, not a list of them)
PRECISIONS = ("auto", "bf16", "fp32")  # training: auto is bf16 autocast on GPU, fp32 on CPU
# training: transformers' attention implementations; eager is the plain matmul-softmax one, the
# reference to rerun a non-finite bf16 step against (benchmarks/gpu_mission.py)
ATTENTIONS = ("sdpa", "eager")
PARALLELISMS = ("single", "ddp", "fsdp")  # training/memory.py: one process, replicated, sharded
DEVICES = ("gpu", "cpu")  # training/memory.py: what a recipe's hardware is


@dataclass(frozen=True, kw_only=True)
class EstimateOptions(Options):
    """The hardware ``mixln-convert estimate`` sizes a recipe for (training/memory.py)."""
    processes: int | None = setting(None, Count(1, MAX_PROCESSES), "Processes, one per GPU.", metavar="N",
                                    default_help="the recipe's 'Sized for' comment, else 1")
    parallelism: str | None = setting(None, Choice(PARALLELISMS),
                                   "single: one process; ddp: every process holds the whole training state; fsdp: "
                                   "weights, gradients and AdamW state sharded over the processes.",
                                   default_help="the recipe's, else single for one process, ddp for several")
    device: str | None = setting(None, Choice(DEVICES), "gpu: precision auto is bf16 autocast; cpu: fp32.",
                                 default_help="the recipe's, else gpu")
    memory: str | None = setting(None, Size(), "Memory of each GPU (or the RAM of one CPU process), e.g. 80GB, "
                                 "141GB, 24GiB.", metavar="SIZE", default_help="the recipe's, else 80GB")


@dataclass(frozen=True, kw_only=True)
class TrainOptions(Options):
    """``mixln-convert train``'s options beside its RECIPE (workflows/train.py)."""
    overrides: tuple[str, ...] = same_as(Overrides, "overrides")
    arm_names: tuple[str, ...] = setting(
        (), Choice((*ARMS, "both"), "arm"), "An arm to train (repeatable; one after the other, on the same data, "
        "order and budget): mixln (the source converted to Mix-LN), preln (the source itself: the control), lns (the "
        "source retrofitted to LayerNorm Scaling, exactly); both: mixln and preln.", flag="--arm", multiple=True,
        default_help="the recipe's arms key, mixln and preln unless it says otherwise")
    out: str | None = same_as(Output, "out", default=None, default_help="out/<recipe name>")
    resume: bool = same_as(Resume, "resume")
    list_recipes: bool = setting(False, Flag(), "List the shipped recipes and exit.", flag="--list")

    @property
    def arms(self) -> list[str] | None:
        """The arms named, each once ("both": mixln and preln); None: the recipe's."""
        named = (arm for name in self.arm_names for arm in (DEFAULT_ARMS if name == "both" else (name,)))
        return list(dict.fromkeys(named)) or None


@dataclass(frozen=True, kw_only=True)
class RecipesOptions(Options):
    path: str | None = setting(None, Text(), "Print the installed path of the shipped recipe or accelerate config "
                               "NAME.", metavar="NAME")

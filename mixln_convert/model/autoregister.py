"""Register the Mix-LN classes when transformers' auto classes are first imported.

Registering needs torch and transformers' LLaMA and Qwen code (seconds to import), while
``import mixln_convert`` must stay instant for the CLI. So the registration runs right after
``transformers.models.auto.modeling_auto`` is executed -- the module every
``AutoModelForCausalLM`` comes from -- or at once if it is already imported. But that module is
executed in the middle of ``transformers.modeling_layers``, which every model file imports, and
registering imports the Mix-LN modeling module, which imports the model files of its families
(LLaMA's, Qwen2's, Qwen3's) and that one: while any of those is still being executed,
registering waits until the last is complete.
"""

import importlib
import importlib.abc
import importlib.util
import sys

AUTO_MODULE = "transformers.models.auto.modeling_auto"
# half-executed, these would make registering's imports circular
HOSTS = {"transformers.modeling_layers", "transformers.models.llama.modeling_llama",
         "transformers.models.qwen2.modeling_qwen2", "transformers.models.qwen3.modeling_qwen3",
         "mixln_convert.model.modeling_mixln"}
REGISTER_MODULE = "mixln_convert.model.register"


class _RegisterAfterImport(importlib.abc.MetaPathFinder):
    def __init__(self):
        self.watched = {AUTO_MODULE, *HOSTS}
        self.hosts_running = 0

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.watched:
            return None
        self.watched.discard(fullname)
        spec = importlib.util.find_spec(fullname)  # by the other finders: this one no longer watches it
        run_module = spec.loader.exec_module

        def run_then_register(module):
            host = fullname in HOSTS
            self.hosts_running += host
            try:
                run_module(module)
            finally:
                self.hosts_running -= host
            if self.hosts_running == 0 and AUTO_MODULE in sys.modules:
                if self in sys.meta_path:
                    sys.meta_path.remove(self)
                importlib.import_module(REGISTER_MODULE)

        spec.loader.exec_module = run_then_register
        return spec


def install() -> None:
    if AUTO_MODULE in sys.modules:
        importlib.import_module(REGISTER_MODULE)
    elif not any(isinstance(f, _RegisterAfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterImport())

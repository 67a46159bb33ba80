"""Register the Mix-LN classes when transformers' auto classes are first imported.

Registering needs torch and transformers' LLaMA code (seconds to import), while
``import mixln_convert`` must stay instant for the CLI. So the registration runs right after
``transformers.models.auto.modeling_auto`` is executed -- the module every
``AutoModelForCausalLM`` comes from -- or at once if it is already imported.
"""

import importlib
import importlib.abc
import importlib.util
import sys

AUTO_MODULE = "transformers.models.auto.modeling_auto"
REGISTER_MODULE = "mixln_convert.model.register"


class _RegisterAfterImport(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname != AUTO_MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        run_module = spec.loader.exec_module

        def run_then_register(module):
            run_module(module)
            importlib.import_module(REGISTER_MODULE)

        spec.loader.exec_module = run_then_register
        return spec


def install() -> None:
    if AUTO_MODULE in sys.modules:
        importlib.import_module(REGISTER_MODULE)
    elif not any(isinstance(f, _RegisterAfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterImport())

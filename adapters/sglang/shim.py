"""Import-time stand-ins that let the real sglang KV bookkeeping import on a CPU box.

sglang's import graph reaches model-loading, tokenizer, multimodal and GPU-kernel
packages at module top level although the KV bookkeeping never calls into them. Rather
than installing them, `install()` registers a meta-path finder that answers those module
names with inert stand-in modules, and skips `sglang/__init__.py` (the frontend DSL).

Every stand-in counts the calls made on it once `arm()` has run (after imports and
set-up). `calls()` lists them; the runner fails the whole run if any was made, because a
call means real behaviour was replaced by a stand-in.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types

_state = {"armed": False, "calls": []}

# Third-party packages imported at top level on the path of schedule_batch /
# radix_cache / unified_radix_cache and never called by the KV bookkeeping.
THIRD_PARTY = (
    "transformers", "torchvision", "IPython", "tvm_ffi", "huggingface_hub",
    "sentencepiece", "safetensors", "compressed_tensors", "regex", "gguf",
    "partial_json_parser", "xgrammar",
    # managers/scheduler.py (upstream's request entry, adapters/sglang/entry.py): the
    # server process's title, its YAML patch config and HTTP stack
    "setproctitle", "yaml", "aiohttp", "uvicorn", "fastapi",
)
# sglang modules whose import builds pydantic models out of `openai` types; the grammar
# backend only names them in annotations.
SGLANG_INTERNAL = (
    "sglang.srt.entrypoints.openai.protocol",
    "sglang.srt.parser.reasoning_parser",
    # tool-call parsing, reached from the scheduler's grammar manager (entry.py)
    "sglang.srt.function_call",
)


def _record(name: str) -> None:
    if _state["armed"]:
        _state["calls"].append(name)


class Inert:
    """A value that tolerates any use at import time and records calls."""

    def __init__(self, name: str):
        object.__setattr__(self, "_name", name)

    def __call__(self, *args, **kwargs):
        _record(self._name)
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]          # used as a bare decorator
        return Inert(self._name + "()")

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Inert(f"{self._name}.{attr}")

    def __getitem__(self, key):
        return Inert(f"{self._name}[{key!r}]")

    def __setitem__(self, key, value):
        pass

    def __iter__(self):
        return iter(())

    def __len__(self):
        return 0

    def __bool__(self):
        return False

    def __contains__(self, item):
        return False

    def __or__(self, other):
        return self

    __ror__ = __or__

    def __repr__(self):
        return f"<stand-in {self._name}>"


class _InertClassMeta(type):
    def __getattr__(cls, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Inert(f"{cls.__name__}.{attr}")


class InertClass(metaclass=_InertClassMeta):
    """Base for stand-in classes (sglang subclasses e.g. PretrainedConfig)."""

    def __init_subclass__(cls, **kwargs):
        pass

    def __init__(self, *args, **kwargs):
        _record(type(self).__name__ + "()")

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Inert(f"{type(self).__name__}().{attr}")


class InertModule(types.ModuleType):
    def __init__(self, name: str):
        super().__init__(name)
        self.__path__ = []
        self.__file__ = "<kvcheck stand-in>"
        self.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)

    def __getattr__(self, attr):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        full = f"{self.__name__}.{attr}"
        if full in sys.modules:
            return sys.modules[full]
        if attr[:1].isupper() and not attr.isupper():
            value = _InertClassMeta(attr, (InertClass,), {"__module__": self.__name__})
        else:
            value = Inert(full)
        setattr(self, attr, value)
        return value


class _Finder:
    def __init__(self, roots):
        self.roots = tuple(roots)

    def find_spec(self, fullname, path=None, target=None):
        for root in self.roots:
            if fullname == root or fullname.startswith(root + "."):
                return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        mod = InertModule(spec.name)
        if spec.name == "triton":
            mod.__version__ = "3.0.0"   # torch._inductor reads it
        return mod

    def exec_module(self, module):
        parent, _, child = module.__name__.rpartition(".")
        if parent in sys.modules:
            setattr(sys.modules[parent], child, module)


_installed: list = []


def install(stub_triton: bool = False) -> tuple:
    """Skip sglang/__init__ and stand in for the never-called modules. Idempotent."""
    if _installed:
        return _installed[0]
    spec = importlib.util.find_spec("sglang")
    if spec is None:
        raise ImportError("sglang is not installed in this interpreter "
                          f"({sys.executable}); build one with adapters/sglang/make_env.sh VERSION")
    pkg = types.ModuleType("sglang")
    pkg.__path__ = list(spec.submodule_search_locations)
    pkg.__spec__ = spec
    pkg.__file__ = spec.origin
    sys.modules["sglang"] = pkg
    roots = THIRD_PARTY + SGLANG_INTERNAL + (("triton",) if stub_triton else ())
    sys.meta_path.insert(0, _Finder(roots))
    _installed.append(roots)
    return roots


def arm() -> None:
    """From now on every call on a stand-in is recorded."""
    _state["armed"] = True


def calls() -> list:
    return list(_state["calls"])


def stubbed_modules_loaded() -> list:
    return sorted(n for n, m in sys.modules.items() if isinstance(m, InertModule))

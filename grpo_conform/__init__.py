"""grpo-conform: conformance checks, honest timing and signed evidence for GRPO loss kernels."""

__version__ = "0.1.0"


class _CallableCheckModule:
    """Import hook: once `grpo_conform.check` (the module) is executed, make it callable, so that
    `grpo_conform.check(...)` is the documented Python API (grpo_conform/api.py) however and by whom
    the module was imported first (the CLI, a test, the user)."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "grpo_conform.check":
            return None
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            from grpo_conform.api import make_callable

            make_callable(module)

        spec.loader.exec_module = exec_module
        return spec


def _install_hook() -> None:
    import sys

    if not any(isinstance(f, _CallableCheckModule) for f in sys.meta_path):
        sys.meta_path.insert(0, _CallableCheckModule())


_install_hook()


def __getattr__(name: str):
    # `grpo_conform.check(...)` (grpo_conform/api.py) before anything imported the submodule: import it
    # lazily (it pulls torch), so that `import grpo_conform` stays light for the CLI.
    if name in ("check", "testing"):
        import importlib

        return importlib.import_module(f"grpo_conform.{name}")
    raise AttributeError(f"module 'grpo_conform' has no attribute {name!r}")

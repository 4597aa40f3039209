"""Harbor trials inside realized harness environments: ``-e harness.harbor:HarnessEnvironment``.

:class:`~harness.harbor.environment.HarnessEnvironment` implements Harbor's
``BaseEnvironment`` with a native sandbox (:mod:`harness.harbor.sandbox`) whose read-only
``/usr``, ``/etc`` and store paths come from the host and whose root is a folder of the
trial. The task names its environment in ``environment/harness.toml``
(:mod:`harness.harbor.spec`); a missing one is realized on first use
(:mod:`harness.harbor.resolve`), and each session writes a harness record into the trial
directory. See ``docs/src/content/docs/guides/harbor.md``.

Harbor itself needs Python 3.12 or newer (the optional extra ``harbor``: ``pip install -e '.[harbor]'``); only
:class:`HarnessEnvironment` imports it, lazily, so the rest of this package (the spec, the
resolver, the sandbox) works on any Python harness supports.
"""

from __future__ import annotations

from typing import Any

__all__ = ["HarnessEnvironment", "HarnessOptions"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        try:
            from harness.harbor import environment
        except ImportError as exc:  # harbor is an optional extra
            raise ImportError(
                f"harness.harbor.{name} needs Harbor (Python >= 3.12): pip install -e '.[harbor]' from the checkout ({exc})"
            ) from exc
        return getattr(environment, name)
    raise AttributeError(f"module 'harness.harbor' has no attribute {name!r}")

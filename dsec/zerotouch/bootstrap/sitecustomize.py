"""``dsec run`` puts this folder first on the program's ``PYTHONPATH``: every Python process
it starts (torchrun's ranks included) instruments itself here, at start-up, before the
program's first line; then the ``sitecustomize`` this one hides, if any, runs as it would
have.
"""

import os
import sys


def _instrument() -> None:
    try:
        from dsec.zerotouch.session import install
    except Exception as exc:  # another interpreter, without dsec: it runs uninstrumented
        sys.stderr.write(f"dsec run: {sys.executable} is not instrumented: {exc}\n")
        return
    try:
        install()
    except Exception as exc:  # never stop the program from starting
        sys.stderr.write(f"dsec run: instrumentation failed, the program runs without it: "
                         f"{type(exc).__name__}: {exc}\n")


def _run_hidden_sitecustomize() -> None:
    import importlib.machinery

    here = os.path.dirname(os.path.abspath(__file__))
    path = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    import importlib.util  # only when there is one to run: it costs every start-up

    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


_instrument()
_run_hidden_sitecustomize()

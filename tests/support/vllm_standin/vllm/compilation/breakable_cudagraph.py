"""Stand-in for vllm/compilation/breakable_cudagraph.py (vLLM 0.33.0, 0.34.0): ``eager_break_during_capture``.

In vLLM it ends the current graph segment under a breakable capture (VLLM_USE_BREAKABLE_CUDAGRAPH)
and runs the function eagerly; under FULL graphs and outside any capture it just calls it.  The
stand-in has no breakable capture, so it always calls through (the FULL / eager behaviour),
and marks the wrapper so a test can see the decorator is in place.
"""
import functools


def eager_break_during_capture(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)

    wrapper.eager_break = True
    return wrapper

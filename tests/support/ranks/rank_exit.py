"""The end of a group of engine rank processes (the vLLM and SGLang stand-ins' ranks alike)."""
from __future__ import annotations

import subprocess


def finish(processes: list[subprocess.Popen], timeout: float = 60.0) -> list[str]:
    """Each rank's output once it exited (killed after ``timeout``); asserts every one exited 0."""
    outputs = []
    try:
        for process in processes:
            outputs.append(process.communicate(timeout=timeout)[0])
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)
    failed = [(i, p.returncode, out) for i, (p, out) in enumerate(zip(processes, outputs)) if p.returncode != 0]
    assert not failed, "\n".join(f"rank {i} exited {code}:\n{out}" for i, code, out in failed)
    return outputs

"""Where `engramd synth` may write: an empty or new directory, or, with --force, over an old checkpoint.

A checkpoint directory is read as a whole (config.json, then one file or the shards
an index names), so new files beside old ones make a checkpoint that is neither.
Without ``force`` a directory holding anything is refused; with it, only the files
synth itself writes (under any shard count) are removed first, and nothing else.
"""
from __future__ import annotations

import os
import re

from engram_client.core.errors import EngramError

CHECKPOINT_FILE = re.compile(r"^(config\.json|tokenizer\.json|model\.safetensors(\.index\.json)?|"
                             r"model-\d{5}-of-\d{5}\.safetensors)$")
LISTED = 5


class OutdirNotEmptyError(EngramError):
    code = "outdir_not_empty"


def prepare_outdir(outdir: str, force: bool) -> tuple[list[str], list[str]]:
    """Make ``outdir`` ready to receive a checkpoint; returns (removed, kept) file names."""
    try:
        present = sorted(os.listdir(outdir))
    except FileNotFoundError:
        return [], []
    except NotADirectoryError as exc:
        raise OutdirNotEmptyError(f"{outdir} is a file, not a directory") from exc
    if not present:
        return [], []
    if not force:
        shown = ", ".join(present[:LISTED]) + (f" and {len(present) - LISTED} more" if len(present) > LISTED else "")
        raise OutdirNotEmptyError(f"{outdir} is not empty ({shown}); choose an empty directory, or pass --force "
                                  "to replace the checkpoint files there (other files are kept)")
    removed = [name for name in present if CHECKPOINT_FILE.match(name) and
               os.path.isfile(os.path.join(outdir, name))]
    for name in removed:
        os.unlink(os.path.join(outdir, name))
    return removed, [name for name in present if name not in removed]

"""``transduce import ORG/NAME[@REVISION]``: a Hugging Face repository named instead of a directory,
resolved through ``huggingface_hub`` to a snapshot in its cache (``HF_HOME``, ``HF_HUB_CACHE``; with
``HF_HUB_OFFLINE=1`` the cache alone), downloading where the network allows only the files an import
reads (:data:`FILES`, then the weights: ``model.safetensors``, else ``pytorch_model.bin``). The
snapshot is imported as any local directory is; the import records the repository and the commit it
resolved to (:func:`origin_record`: config.yaml's ``origin``).

A directory that exists always wins over a name (``transduce import ./opus-mt-en-de`` is a local
import); a text that is neither a directory nor ``ORG/NAME`` (each part as the Hub spells names),
optionally ``@REVISION`` (a branch, tag or commit), is not looked up (:func:`parse_name`).
"""

from __future__ import annotations

import importlib.util
import logging
import re
from pathlib import Path

from ..errors import one_line, require
from .hf import HFImportError

logger = logging.getLogger(__name__)

# The files an import may read besides its weights: config and generation settings, and each family's
# tokenizer or vocabulary files (absent ones are not an error here: the family says what it needs).
FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
         "special_tokens_map.json", "added_tokens.json", "vocab.json", "target_vocab.json", "vocab.txt",
         "merges.txt", "source.spm", "target.spm", "spiece.model", "sentencepiece.bpe.model")
WEIGHTS = ("model.safetensors", "pytorch_model.bin")  # in the order read_weights prefers them

_PART = re.compile(r"\w(?:[\w.-]{0,94}\w)?")         # an org or a repository name, as the Hub allows
_REVISION = re.compile(r"\w[\w.-]*(?:/\w[\w.-]*)*")  # a branch, tag or commit (refs/pr/1), no '..' step


def parse_name(text: str) -> tuple[str, str | None] | None:
    """``(repo_id, revision or None)`` of ``ORG/NAME`` or ``ORG/NAME@REVISION``, or None if
    ``text`` is not one."""
    name, at, revision = text.partition("@")
    parts = name.split("/")
    if len(parts) != 2 or not all(_PART.fullmatch(p) and "--" not in p and ".." not in p for p in parts):
        return None
    if at and not (_REVISION.fullmatch(revision) and ".." not in revision):
        return None
    return name, revision or None


def snapshot(text: str, repo: str, revision: str | None) -> Path:
    """The local snapshot of ``repo`` at ``revision`` (None: the default branch), from the cache or
    downloaded; ``text`` names it in messages. A one-line HFImportError if it cannot be had."""
    hub = require("huggingface_hub", "export", f"{text}: not a directory; importing it by name from the "
                                                "Hugging Face Hub")
    errors, constants = require("huggingface_hub.utils", "export"), require("huggingface_hub.constants", "export")
    cli, login = _commands()
    download = f"`{cli} download {repo}{f' --revision {revision}' if revision else ''}`"
    try:
        where = _fetch(hub, errors, repo, revision, WEIGHTS[0])
        if not (where / WEIGHTS[0]).is_file():  # older checkpoints have pytorch_model.bin alone
            where = _fetch(hub, errors, repo, where.name, WEIGHTS[1])
    except errors.RevisionNotFoundError:
        raise HFImportError(f"{text}: the Hugging Face repository {repo} has no revision {revision!r} (a branch, "
                            "tag or commit of it)") from None
    except errors.GatedRepoError:
        raise HFImportError(f"{text}: the Hugging Face repository {repo} is gated: accept its terms on its page "
                            f"and log in (`{login}`)") from None
    except errors.RepositoryNotFoundError:
        raise HFImportError(f"{text}: not a directory, and no Hugging Face repository {repo} (or a private one: "
                            f"log in with `{login}`)") from None
    except errors.LocalEntryNotFoundError as e:
        cache = constants.HF_HUB_CACHE
        if not constants.HF_HUB_OFFLINE:
            raise HFImportError(f"{text}: not a directory, not in the Hugging Face cache ({cache}), and the Hub "
                                f"cannot be reached ({one_line(e.__cause__ or e)})") from None
        what = (f"revision {revision or 'main'!r} of {repo} is" if _cached(cache, repo)
                else f"not a directory, and {repo} is")
        raise HFImportError(f"{text}: {what} not in the Hugging Face cache ({cache}) and HF_HUB_OFFLINE=1: "
                            f"download it with HF_HUB_OFFLINE=0 or {download}") from None
    except (errors.HfHubHTTPError, OSError) as e:
        raise HFImportError(f"{text}: downloading from the Hugging Face Hub failed ({one_line(e)})") from None
    return where


def _fetch(hub, errors, repo: str, revision: str | None, weights: str) -> Path:
    """snapshot_download of :data:`FILES` and ``weights``; a cached snapshot huggingface_hub knows to
    lack some of them (offline) as it is: the import names what it needs."""
    try:
        return Path(hub.snapshot_download(repo, revision=revision, allow_patterns=[*FILES, weights]))
    except errors.LocalEntryNotFoundError as e:
        partial = getattr(e, "snapshot_path", None)  # IncompleteSnapshotError
        if partial is None:
            raise
        logger.warning("%s", one_line(e))
        return Path(partial)


def _commands() -> tuple[str, str]:
    """huggingface_hub's commands to download and to log in: ``hf`` from 0.34 on, ``huggingface-cli``
    before."""
    if importlib.util.find_spec("huggingface_hub.cli") is not None:
        return "hf", "hf auth login"
    return "huggingface-cli", "huggingface-cli login"


def _cached(cache: str, repo: str) -> bool:
    """Whether the cache ``cache`` holds a snapshot of ``repo`` (huggingface_hub's layout:
    ``models--ORG--NAME/snapshots/COMMIT``)."""
    return (Path(cache) / "--".join(["models", *repo.split("/")]) / "snapshots").is_dir()


def origin_record(repo: str, where: Path) -> dict[str, str]:
    """What the import records of a repository imported by name (config.yaml's ``origin``): its id
    and the commit of the snapshot ``where`` (huggingface_hub names a snapshot by its commit)."""
    return {"repo": repo, "revision": where.name}

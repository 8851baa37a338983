"""Multi30k task 1 (Elliott et al., 2016): image captions in English, German, French, Czech.

The raw files ``{split}.{lang}.gz`` come from github.com/multi30k/dataset (commit a3d2e0d,
``data/task1/raw/``). :func:`download` fetches them and checks each against the SHA-256 below;
or point the environment variable ``TRANSDUCE_MULTI30K`` at a directory that already has them.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Sequence

from transduce.atomic import atomic_path
from transduce.checksums import sha256_file
from transduce.config.pairs import MULTI30K_LANGS
from transduce.data.corpus import read_parallel
from transduce.errors import ConfigError, DataError
from transduce.progress import progress_bar

logger = logging.getLogger(__name__)

DEFAULT_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw"
ENV_VAR = "TRANSDUCE_MULTI30K"
MULTI30K_SPLITS = {"train": 29000, "val": 1014, "test_2016_flickr": 1000}
MULTI30K_SHA256 = {
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
    "train.cs.gz": "a65adb8b32e3bc664f21ecba7a6e7f6950fd1f405e135f7c312faabdb6255077",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
    "val.cs.gz": "b63226e05c4bd5dd6a42897d74b86a1b9d2c31498252c572b1ea7f7996927fcc",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
    "test_2016_flickr.cs.gz": "200a4a74cc9560f051924abb9803be008d1908d77f747e9141aeb86dfd2797f1",
}
_CHUNK = 1 << 16


def default_root() -> Path | None:
    """The directory named by ``$TRANSDUCE_MULTI30K``, or None when it is unset or empty."""
    value = os.environ.get(ENV_VAR, "").strip()
    return Path(value).expanduser() if value else None


def root_of(root: str | os.PathLike | None) -> Path:
    """``root`` (``data.root``), or else :func:`default_root`; a DataError when neither is set."""
    root = Path(root) if root else default_root()
    if root is None:
        raise DataError("data.root is not set and $TRANSDUCE_MULTI30K is empty: "
                        "where are the Multi30k files? (transduce data multi30k --dest DIR)")
    return root


def file_name(split: str, lang: str) -> str:
    """``{split}.{lang}.gz``, after checking both names."""
    if split not in MULTI30K_SPLITS:
        raise ConfigError(f"split: unknown Multi30k split {split!r}; "
                          f"expected one of {', '.join(MULTI30K_SPLITS)}")
    if lang not in MULTI30K_LANGS:
        raise ConfigError(f"lang: unknown Multi30k language {lang!r}; "
                          f"expected one of {', '.join(MULTI30K_LANGS)}")
    return f"{split}.{lang}.gz"


def multi30k_files(root: str | os.PathLike, split: str, src_lang: str, tgt_lang: str
                   ) -> tuple[Path, Path]:
    """Paths of the raw source and target files of ``split``; DataError if one is missing."""
    paths = tuple(Path(root) / file_name(split, lang) for lang in (src_lang, tgt_lang))
    for path in paths:
        if not path.is_file():
            raise DataError(f"{path}: Multi30k file not found (run download() or set ${ENV_VAR})")
    return paths


def tok_files(root: str | os.PathLike, split: str, src_lang: str, tgt_lang: str) -> tuple[Path, Path]:
    """Paths of the lowercased, normalised, tokenized files ``tok/{split}.lc.norm.tok.{lang}[.gz]``.

    The dataset ships them beside the raw text: the published Multi30k systems train on them and
    are scored against their test split. DataError if one is missing.
    """
    paths = []
    for lang in (src_lang, tgt_lang):
        file_name(split, lang)  # checks both names
        plain = Path(root) / "tok" / f"{split}.lc.norm.tok.{lang}"
        path = plain if plain.is_file() else plain.with_name(plain.name + ".gz")
        if not path.is_file():
            raise DataError(f"{plain}[.gz]: Multi30k tokenized file not found (the dataset's tok/ folder)")
        paths.append(path)
    return paths[0], paths[1]


def read_split(root: str | os.PathLike, split: str, src_lang: str, tgt_lang: str,
               tokenized: bool = False) -> list[tuple[str, str]]:
    """All ``(source, target)`` lines of ``split``, checking the official line count.

    ``tokenized``: the lowercased Moses-tokenized text of ``tok/`` instead of the raw text.
    """
    src, tgt = (tok_files if tokenized else multi30k_files)(root, split, src_lang, tgt_lang)
    pairs = list(read_parallel(src, tgt))
    if len(pairs) != MULTI30K_SPLITS[split]:
        raise DataError(f"{src}: {len(pairs)} lines, expected {MULTI30K_SPLITS[split]} for "
                        f"Multi30k {split}")
    return pairs


def download(dest: str | os.PathLike, base_url: str = DEFAULT_URL,
             splits: Sequence[str] = tuple(MULTI30K_SPLITS),
             langs: Sequence[str] = MULTI30K_LANGS, timeout: float = 60.0) -> list[Path]:
    """Fetch ``{base_url}/{split}.{lang}.gz`` into ``dest``, verifying each SHA-256.

    Files already present with the right hash are skipped. Each file is written to a temporary
    name and renamed only once its hash matches, so no partial or wrong file is ever left.

    Returns:
        The paths of all requested files.

    Raises:
        DataError: an HTTP or network error, or a hash mismatch.
    """
    out = Path(dest)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for split in splits:
        for lang in langs:
            name = file_name(split, lang)
            target = out / name
            if target.is_file() and sha256_file(target) == MULTI30K_SHA256[name]:
                logger.info("%s: present, hash ok", target)
            else:
                _fetch(f"{base_url.rstrip('/')}/{name}", target, MULTI30K_SHA256[name], timeout)
            paths.append(target)
    return paths


def _fetch(url: str, target: Path, expected_sha256: str, timeout: float) -> None:
    """Download ``url`` to ``target`` through a temporary file, checking its SHA-256."""
    import urllib.request  # lazy: start-up (http.client, ssl: 15 ms; urllib.error with it)

    logger.info("downloading %s", url)
    try:
        with atomic_path(target, ".part") as tmp:
            digest = hashlib.sha256()
            with open(tmp, "wb") as handle, urllib.request.urlopen(url, timeout=timeout) as resp:
                size = resp.headers.get("Content-Length")
                total = int(size) if size and size.isdigit() else None
                with progress_bar(total, unit="B", desc=target.name, bytes_=True) as bar:
                    while chunk := resp.read(_CHUNK):
                        digest.update(chunk)
                        handle.write(chunk)
                        bar.update(len(chunk))
            if digest.hexdigest() != expected_sha256:
                raise DataError(f"{url}: SHA-256 mismatch (got {digest.hexdigest()[:16]}..., "
                                f"expected {expected_sha256[:16]}...); file discarded")
    except urllib.error.HTTPError as err:
        raise DataError(f"{url}: HTTP {err.code} {err.reason}") from err
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", None) or err
        raise DataError(f"{url}: download failed ({reason})") from err

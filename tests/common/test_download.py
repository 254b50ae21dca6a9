"""What a correct download means, checked against a local HTTP server (tests/http_server.py):

- the file appears under its name only whole and, when a digest is given, only if it matches;
- a download cut short keeps its bytes in FILE.part, and the next attempt asks for the rest with
  an HTTP Range request; a server that ignores Range, or a .part longer than the file, starts over;
- failures name the URL: FileNotFoundError for a missing file, ConnectionError for the rest;
- big files show one progress line.
"""

import hashlib

import pytest

from minisbert.common import download as downloads
from minisbert.common.download import download

from ..http_server import closed_port_url

BODY = bytes(range(256)) * 40  # 10,240 bytes
DIGEST = hashlib.sha256(BODY).hexdigest()


def test_download_writes_the_checked_file_and_no_part(server, tmp_path):
    server.files["/file.bin"] = BODY
    path = download(f"{server.url}/file.bin", tmp_path / "file.bin", DIGEST)
    assert path == tmp_path / "file.bin" and path.read_bytes() == BODY
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.bin"]


def test_an_existing_file_is_taken_as_done(server, tmp_path):
    (tmp_path / "file.bin").write_bytes(b"kept")
    download(f"{server.url}/file.bin", tmp_path / "file.bin", DIGEST)
    assert (tmp_path / "file.bin").read_bytes() == b"kept"
    assert server.requests == []


def test_a_wrong_digest_deletes_the_download(server, tmp_path):
    server.files["/file.bin"] = BODY
    with pytest.raises(ValueError, match=rf"/file\.bin: SHA-256 is {DIGEST}, expected {'0' * 64}; the file was deleted"):
        download(f"{server.url}/file.bin", tmp_path / "file.bin", "0" * 64)
    assert list(tmp_path.iterdir()) == []


def test_a_cut_download_keeps_its_bytes_and_resumes_with_range(server, tmp_path):
    server.files["/file.bin"] = BODY
    server.drop_after = 1000
    with pytest.raises(ConnectionError, match=r"interrupted \(got 1,000 of 10,240 bytes\).*file\.bin\.part"):
        download(f"{server.url}/file.bin", tmp_path / "file.bin", DIGEST)
    assert (tmp_path / "file.bin.part").read_bytes() == BODY[:1000]
    assert not (tmp_path / "file.bin").exists()

    server.drop_after = None
    assert download(f"{server.url}/file.bin", tmp_path / "file.bin", DIGEST).read_bytes() == BODY
    assert server.requests[-1] == ("GET", "/file.bin", "bytes=1000-")


def test_a_server_that_ignores_range_starts_the_file_over(server, tmp_path):
    server.files["/file.bin"] = BODY
    server.honour_range = False
    (tmp_path / "file.bin.part").write_bytes(BODY[:5120])
    assert download(f"{server.url}/file.bin", tmp_path / "file.bin", DIGEST).read_bytes() == BODY  # not 1.5x
    assert server.requests == [("GET", "/file.bin", "bytes=5120-")]


def test_a_part_longer_than_the_file_is_discarded(server, tmp_path):
    server.files["/file.bin"] = BODY
    (tmp_path / "file.bin.part").write_bytes(BODY + b"junk")  # the server answers 416 to bytes=10244-
    assert download(f"{server.url}/file.bin", tmp_path / "file.bin", DIGEST).read_bytes() == BODY
    assert [r[2] for r in server.requests] == ["bytes=10244-", None]


def test_failures_name_the_url(server, tmp_path):
    with pytest.raises(FileNotFoundError, match=rf"{server.url}/missing\.bin does not exist \(HTTP 404\)"):
        download(f"{server.url}/missing.bin", tmp_path / "missing.bin")
    url = closed_port_url()
    with pytest.raises(ConnectionError, match=rf"{url}/file\.bin is unreachable"):
        download(f"{url}/file.bin", tmp_path / "file.bin")
    assert list(tmp_path.iterdir()) == []


def test_big_files_show_one_progress_line(server, tmp_path, monkeypatch, capsys):
    server.files["/big.bin"] = BODY
    server.files["/small.bin"] = b"tiny"
    monkeypatch.setattr(downloads, "PROGRESS_MIN_BYTES", len(BODY))

    download(f"{server.url}/big.bin", tmp_path / "big.bin")
    download(f"{server.url}/small.bin", tmp_path / "small.bin")

    stderr = capsys.readouterr().err
    assert "big.bin 0.0/0.0 MB" in stderr  # 10,240 bytes, in MB to one decimal
    assert "small.bin" not in stderr
    assert stderr.endswith("\n")
